package engine

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/safe-run/safe-run/egress"
	"github.com/safe-run/safe-run/sandbox"
)

// maxDenialsNamed is how many denied attempts the result's message names;
// the rest are counted.
const maxDenialsNamed = 3

// withNetwork fills res.Network from a networked sandbox's records (final:
// the sandbox's program has ended; else, a session call has) and appends
// the denials to the message, so that the model reading it learns why a
// request failed. A sandbox without a network leaves res as it is.
func withNetwork(res sandbox.Result, sb Sandbox, final bool) sandbox.Result {
	return addNetwork(res, takeNetwork(sb, final))
}

// takeNetwork takes a sandbox's network records, or nil for a sandbox
// without a network.
func takeNetwork(sb Sandbox, final bool) *egress.Report {
	nr, ok := sb.(NetworkReporter)
	if !ok {
		return nil
	}
	rep := nr.TakeNetwork(final)
	if rep.Allowlist == nil {
		return nil
	}
	return &rep
}

// addNetwork puts rep (if any) into res; see withNetwork.
func addNetwork(res sandbox.Result, rep *egress.Report) sandbox.Result {
	if rep == nil {
		return res
	}
	res.Network = rep
	res.Activity = markEgress(res.Activity, rep)
	if line := networkLine(*rep); line != "" {
		if res.Message != "" {
			res.Message += "\n"
		}
		res.Message += line
	}
	return res
}

// networkLine is the one-line summary of a report's denials and failure,
// e.g. "network: denied evil.test:443 (not in the allowlist); 3 more", or
// "" when there is nothing to say.
func networkLine(rep egress.Report) string {
	var named []string
	more := 0
	seen := map[string]bool{}
	for _, c := range rep.Connections {
		if c.Decision != egress.Denied {
			continue
		}
		what := c.Name
		if what == "" {
			what, _, _ = net.SplitHostPort(c.Addr)
		}
		if c.Port != 0 {
			what = net.JoinHostPort(what, strconv.Itoa(int(c.Port)))
		}
		if c.Reason != "" {
			what += " (" + c.Reason + ")"
		}
		if seen[what] {
			continue
		}
		seen[what] = true
		if len(named) < maxDenialsNamed {
			named = append(named, what)
		} else {
			more++
		}
	}
	var parts []string
	if len(named) > 0 {
		s := "denied " + strings.Join(named, ", ")
		if more > 0 {
			s += fmt.Sprintf("; %d more", more)
		}
		parts = append(parts, s)
	}
	if rep.Failure != "" {
		parts = append(parts, rep.Failure)
	}
	if len(parts) == 0 {
		return ""
	}
	return "network: " + strings.Join(parts, "; ")
}

// markEgress returns a with each IP connect attempt marked with the host's
// decision on it, from rep's TCP records (nil rep: a has no network, and
// stays as it is). The sandbox saw the address it connected to, the host
// recorded the same one as Dst, so they are matched by address and port,
// IPv4-mapped IPv6 forms read as the IPv4 address. Each record (one per ID)
// marks one attempt at most, so no more attempts to an address are marked
// allowed than the host allowed connections there, whatever the sandbox
// reports; of several records for one address, an attempt takes first one
// whose decision agrees with its result (ok or EINPROGRESS: allowed), so
// that a denial the host did not record cannot shift an allowed record to
// the wrong attempt. Attempts without a record stay unmarked.
func markEgress(a *sandbox.Activity, rep *egress.Report) *sandbox.Activity {
	if a == nil || rep == nil || len(a.Network) == 0 {
		return a
	}
	byDst := map[netip.AddrPort][]*egress.Connection{}
	seen := map[uint64]bool{}
	for i := range rep.Connections {
		c := &rep.Connections[i]
		if c.Kind != egress.KindTCP || seen[c.ID] {
			continue
		}
		dst, ok := parseDst(c.Dst)
		if !ok {
			continue
		}
		seen[c.ID] = true
		byDst[dst] = append(byDst[dst], c)
	}
	out := *a
	out.Network = slices.Clone(a.Network)
	for i := range out.Network {
		na := &out.Network[i]
		if na.Op != "connect" || (na.Family != "inet" && na.Family != "inet6") {
			continue
		}
		dst, ok := parseDst(na.Address)
		if !ok {
			continue
		}
		recs := byDst[dst]
		if len(recs) == 0 {
			continue
		}
		want := egress.Denied
		if na.Result == "ok" || na.Result == "EINPROGRESS" {
			want = egress.Allowed
		}
		j := slices.IndexFunc(recs, func(c *egress.Connection) bool { return c.Decision == want })
		if j < 0 {
			j = 0
		}
		c := recs[j]
		byDst[dst] = slices.Delete(recs, j, j+1)
		na.Egress, na.EgressHost = egress.Denied, c.Name
		if c.Decision == egress.Allowed {
			na.Egress = egress.Allowed
		} else {
			na.EgressReason = c.Reason
		}
	}
	return &out
}

// parseDst reads "ip:port" or "[ip6]:port" as one form: an IPv4-mapped
// IPv6 address is its IPv4 address (a dual-stack socket's connect to
// [::ffff:a.b.c.d] leaves the sandbox as IPv4). A zone stays, so a zoned
// address never matches the host's unzoned records.
func parseDst(s string) (netip.AddrPort, bool) {
	ap, err := netip.ParseAddrPort(s)
	if err != nil || ap.Port() == 0 {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), true
}
