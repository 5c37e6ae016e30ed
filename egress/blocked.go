package egress

import (
	"net/netip"
)

// blockedRange is a destination range no sandbox reaches unless a pin
// names an address in it.
type blockedRange struct {
	prefix netip.Prefix
	reason string
}

// blockedRanges are checked in order: the narrower ranges with reasons of
// their own (the metadata addresses) before the ranges holding them.
var blockedRanges = func() []blockedRange {
	rs := []struct{ p, reason string }{
		{"0.0.0.0/8", `a "this network" address (0.0.0.0/8)`},
		{"127.0.0.0/8", "a loopback address"},
		{"10.0.0.0/8", "a private address (RFC 1918)"},
		{"172.16.0.0/12", "a private address (RFC 1918)"},
		{"192.168.0.0/16", "a private address (RFC 1918)"},
		{"100.64.0.0/10", "a shared address (RFC 6598, carrier-grade NAT)"},
		{"169.254.169.254/32", "the cloud metadata address"},
		{"169.254.0.0/16", "a link-local address"},
		{"198.18.0.0/15", "a benchmarking address (RFC 2544; the sandbox's own link)"},
		{"224.0.0.0/4", "a multicast address"},
		{"255.255.255.255/32", "the broadcast address"},
		{"240.0.0.0/4", "a reserved address (240.0.0.0/4)"},
		{"::/128", "the unspecified address"},
		{"::1/128", "a loopback address"},
		{"::/96", "an IPv4-compatible address (deprecated)"},
		{"fe80::/10", "a link-local address"},
		{"fec0::/10", "a site-local address (deprecated)"},
		{"fd00:ec2::254/128", "the cloud metadata address"},
		{"fc00::/7", "a unique local address"},
		{"ff00::/8", "a multicast address"},
	}
	out := make([]blockedRange, len(rs))
	for i, r := range rs {
		out[i] = blockedRange{netip.MustParsePrefix(r.p), r.reason}
	}
	return out
}()

// embedsV4 are IPv6 ranges that carry an IPv4 address a translator on the
// way may reach (NAT64, 6to4): judged by that address. The offset is the
// byte where it starts.
var embedsV4 = []struct {
	prefix netip.Prefix
	offset int
}{
	{netip.MustParsePrefix("64:ff9b::/96"), 12},
	{netip.MustParsePrefix("64:ff9b:1::/48"), 12},
	{netip.MustParsePrefix("2002::/16"), 2},
}

// Blocked says whether addr is in a range no sandbox reaches unless a pin
// names it — loopback, 0/8, RFC 1918, 100.64/10, link-local (with the
// cloud metadata addresses), unique local, multicast, broadcast and
// reserved, 198.18/15 (the sandbox's own link), or one of the host's own
// addresses — and why, as a phrase ("a loopback address"). IPv4-mapped
// IPv6 addresses are judged as the IPv4 address they map, and so are the
// IPv4 addresses NAT64 and 6to4 addresses carry.
func Blocked(addr netip.Addr, host []netip.Addr) (reason string, blocked bool) {
	if !addr.IsValid() {
		return "an invalid address", true
	}
	addr = addr.Unmap().WithZone("")
	for _, h := range host {
		if h.Unmap().WithZone("") == addr {
			return "one of the host's own addresses", true
		}
	}
	for _, r := range blockedRanges {
		if r.prefix.Contains(addr) {
			return r.reason, true
		}
	}
	if addr.Is6() {
		b := addr.As16()
		for _, e := range embedsV4 {
			if e.prefix.Contains(addr) {
				v4 := netip.AddrFrom4([4]byte(b[e.offset : e.offset+4]))
				if reason, blocked := Blocked(v4, host); blocked {
					return reason + " inside " + e.prefix.String(), true
				}
			}
		}
	}
	return "", false
}

// blockedPrefix says whether every address of p is blocked (p lies inside
// one blocked range), and why.
func blockedPrefix(p netip.Prefix) (string, bool) {
	for _, r := range blockedRanges {
		if r.prefix.Bits() <= p.Bits() && r.prefix.Contains(p.Addr()) {
			return r.reason, true
		}
	}
	for _, e := range embedsV4 {
		if e.prefix.Bits() <= p.Bits() && e.prefix.Contains(p.Addr()) && p.Bits() >= 8*(e.offset+4) {
			if reason, blocked := Blocked(p.Addr(), nil); blocked {
				return reason, true
			}
		}
	}
	return "", false
}
