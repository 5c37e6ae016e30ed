package egress

import (
	"net/netip"
	"testing"
)

func TestBlocked(t *testing.T) {
	host := []netip.Addr{netip.MustParseAddr("203.0.113.50"), netip.MustParseAddr("2001:db8::50")}
	tests := []struct {
		addr   string
		reason string // "" for an address that is not blocked
	}{
		{"0.0.0.0", `a "this network" address (0.0.0.0/8)`},
		{"0.1.2.3", `a "this network" address (0.0.0.0/8)`},
		{"127.0.0.1", "a loopback address"},
		{"127.255.255.254", "a loopback address"},
		{"10.0.0.1", "a private address (RFC 1918)"},
		{"172.16.0.1", "a private address (RFC 1918)"},
		{"172.31.255.255", "a private address (RFC 1918)"},
		{"192.168.1.1", "a private address (RFC 1918)"},
		{"100.64.0.1", "a shared address (RFC 6598, carrier-grade NAT)"},
		{"100.127.255.255", "a shared address (RFC 6598, carrier-grade NAT)"},
		{"169.254.169.254", "the cloud metadata address"},
		{"169.254.1.1", "a link-local address"},
		{"198.18.0.1", "a benchmarking address (RFC 2544; the sandbox's own link)"},
		{"198.19.0.7", "a benchmarking address (RFC 2544; the sandbox's own link)"},
		{"224.0.0.251", "a multicast address"},
		{"239.255.255.250", "a multicast address"},
		{"255.255.255.255", "the broadcast address"},
		{"240.0.0.1", "a reserved address (240.0.0.0/4)"},
		{"::", "the unspecified address"},
		{"::1", "a loopback address"},
		{"::127.0.0.1", "an IPv4-compatible address (deprecated)"},
		{"fe80::1", "a link-local address"},
		{"fe80::1%eth0", "a link-local address"},
		{"fec0::1", "a site-local address (deprecated)"},
		{"fd00:ec2::254", "the cloud metadata address"},
		{"fd00::1", "a unique local address"},
		{"fc00::1", "a unique local address"},
		{"ff02::1", "a multicast address"},
		// IPv4-mapped addresses are judged as IPv4.
		{"::ffff:127.0.0.1", "a loopback address"},
		{"::ffff:10.1.2.3", "a private address (RFC 1918)"},
		{"::ffff:169.254.169.254", "the cloud metadata address"},
		{"::ffff:0.0.0.0", `a "this network" address (0.0.0.0/8)`},
		// NAT64 and 6to4 carry an IPv4 address a translator would reach.
		{"64:ff9b::7f00:1", "a loopback address inside 64:ff9b::/96"},
		{"64:ff9b::a9fe:a9fe", "the cloud metadata address inside 64:ff9b::/96"},
		{"2002:7f00:1::1", "a loopback address inside 2002::/16"},
		{"2002:c0a8:101::1", "a private address (RFC 1918) inside 2002::/16"},
		// The host's own addresses, however written.
		{"203.0.113.50", "one of the host's own addresses"},
		{"::ffff:203.0.113.50", "one of the host's own addresses"},
		{"2001:db8::50", "one of the host's own addresses"},
		// Public destinations.
		{"203.0.113.51", ""},
		{"198.51.100.7", ""},
		{"8.8.8.8", ""},
		{"172.32.0.1", ""},
		{"100.128.0.1", ""},
		{"198.20.0.1", ""},
		{"::ffff:8.8.8.8", ""},
		{"2001:db8::51", ""},
		{"2606:4700::1111", ""},
		{"64:ff9b::808:808", ""},
		{"2002:808:808::1", ""},
	}
	for _, tt := range tests {
		reason, blocked := Blocked(netip.MustParseAddr(tt.addr), host)
		if reason != tt.reason || blocked != (tt.reason != "") {
			t.Errorf("Blocked(%s) = %q, %v; want %q", tt.addr, reason, blocked, tt.reason)
		}
	}
	if reason, blocked := Blocked(netip.Addr{}, nil); !blocked || reason != "an invalid address" {
		t.Errorf("Blocked(invalid) = %q, %v", reason, blocked)
	}
	// The host's addresses are blocked only when given.
	if _, blocked := Blocked(netip.MustParseAddr("203.0.113.50"), nil); blocked {
		t.Error("203.0.113.50 blocked without being the host's")
	}
	mapped := []netip.Addr{netip.MustParseAddr("::ffff:203.0.113.60")}
	if _, blocked := Blocked(netip.MustParseAddr("203.0.113.60"), mapped); !blocked {
		t.Error("a host address given mapped is not blocked as IPv4")
	}
}

// Each sandbox's link addresses and the synthetic DNS answers are blocked
// destinations themselves.
func TestBlockedLinkAddresses(t *testing.T) {
	for _, a := range []netip.Addr{GatewayAddr, SandboxAddr, SyntheticPrefix.Addr()} {
		if _, blocked := Blocked(a, nil); !blocked {
			t.Errorf("%s is not blocked", a)
		}
	}
}
