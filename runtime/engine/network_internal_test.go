package engine

import (
	"slices"
	"testing"

	"github.com/safe-run/safe-run/egress"
	"github.com/safe-run/safe-run/sandbox"
)

func TestNetworkLine(t *testing.T) {
	denied := func(name, addr string, port uint16, reason string) egress.Connection {
		return egress.Connection{Kind: egress.KindTCP, Name: name, Addr: addr, Port: port, Decision: egress.Denied, Reason: reason}
	}
	allowed := egress.Connection{Kind: egress.KindTCP, Name: "pypi.org", Port: 443, Decision: egress.Allowed}
	for _, tt := range []struct {
		name string
		rep  egress.Report
		want string
	}{
		{"nothing", egress.Report{}, ""},
		{"only allowed", egress.Report{Connections: []egress.Connection{allowed}}, ""},
		{"one denial", egress.Report{Connections: []egress.Connection{allowed, denied("evil.test", "", 443, "not in the allowlist")}},
			"network: denied evil.test:443 (not in the allowlist)"},
		{"an address", egress.Report{Connections: []egress.Connection{denied("", "10.0.0.1:80", 80, "a private address")}},
			"network: denied 10.0.0.1:80 (a private address)"},
		{"repeats once, the rest counted", egress.Report{Connections: []egress.Connection{
			denied("a.test", "", 443, "x"), denied("a.test", "", 443, "x"), denied("b.test", "", 80, "x"),
			denied("c.test", "", 80, "x"), denied("d.test", "", 80, "x"), denied("e.test", "", 80, "x")}},
			"network: denied a.test:443 (x), b.test:80 (x), c.test:80 (x); 2 more"},
		{"a DNS question", egress.Report{Connections: []egress.Connection{{Kind: egress.KindDNS, Name: "evil.test", Decision: egress.Denied, Reason: "not in the allowlist"}}},
			"network: denied evil.test (not in the allowlist)"},
		{"failure", egress.Report{Failure: "the network helper exited"}, "network: the network helper exited"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := networkLine(tt.rep); got != tt.want {
				t.Errorf("networkLine = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestMarkEgress(t *testing.T) {
	connect := func(family, addr, result string) sandbox.NetworkAttempt {
		return sandbox.NetworkAttempt{Op: "connect", Family: family, Address: addr, Result: result}
	}
	rec := func(id uint64, dst, name, decision, reason string) egress.Connection {
		return egress.Connection{ID: id, Kind: egress.KindTCP, Dst: dst, Name: name, Decision: decision, Reason: reason}
	}
	type mark struct{ egress, host, reason string }
	allowed := func(host string) mark { return mark{egress.Allowed, host, ""} }
	denied := func(host, reason string) mark { return mark{egress.Denied, host, reason} }
	named := rec(1, "198.19.0.1:80", "allowed.test", egress.Allowed, "")
	for _, tt := range []struct {
		name     string
		attempts []sandbox.NetworkAttempt
		recs     []egress.Connection
		want     []mark
	}{
		{"a name's address, allowed",
			[]sandbox.NetworkAttempt{connect("inet", "198.19.0.1:80", "ok")},
			[]egress.Connection{named}, []mark{allowed("allowed.test")}},
		{"open and close records are one connection",
			[]sandbox.NetworkAttempt{connect("inet", "198.19.0.1:80", "ok"), connect("inet", "198.19.0.1:80", "ok")},
			[]egress.Connection{named, named}, []mark{allowed("allowed.test"), {}}},
		{"an IP literal denied",
			[]sandbox.NetworkAttempt{connect("inet", "203.0.113.9:80", "ECONNREFUSED")},
			[]egress.Connection{rec(2, "203.0.113.9:80", "", egress.Denied, "IP address not in the allowlist")},
			[]mark{denied("", "IP address not in the allowlist")}},
		{"another port is another destination",
			[]sandbox.NetworkAttempt{connect("inet", "198.19.0.1:81", "ok")},
			[]egress.Connection{named}, []mark{{}}},
		{"the sandbox's ok does not beat the host's denial",
			[]sandbox.NetworkAttempt{connect("inet", "198.19.0.1:8080", "ok")},
			[]egress.Connection{rec(3, "198.19.0.1:8080", "allowed.test", egress.Denied, "not in the allowlist")},
			[]mark{denied("allowed.test", "not in the allowlist")}},
		{"an IPv4-mapped IPv6 address is the IPv4 one",
			[]sandbox.NetworkAttempt{connect("inet6", "[::ffff:198.19.0.1]:80", "ok")},
			[]egress.Connection{named}, []mark{allowed("allowed.test")}},
		{"the host's mapped form too",
			[]sandbox.NetworkAttempt{connect("inet", "198.19.0.1:80", "ok")},
			[]egress.Connection{rec(1, "[::ffff:198.19.0.1]:80", "allowed.test", egress.Allowed, "")}, []mark{allowed("allowed.test")}},
		{"a zoned address matches no record",
			[]sandbox.NetworkAttempt{connect("inet6", "[fe80::1%eth0]:80", "ok")},
			[]egress.Connection{rec(4, "[fe80::1]:80", "", egress.Allowed, "")}, []mark{{}}},
		{"no more attempts allowed than the host allowed connections",
			[]sandbox.NetworkAttempt{connect("inet", "198.19.0.1:80", "ok"), connect("inet", "198.19.0.1:80", "ok"), connect("inet", "198.19.0.1:80", "ok")},
			[]egress.Connection{named, rec(5, "198.19.0.1:80", "allowed.test", egress.Denied, "connection cap of 1 reached")},
			[]mark{allowed("allowed.test"), denied("allowed.test", "connection cap of 1 reached"), {}}},
		{"an attempt takes the record its result agrees with",
			[]sandbox.NetworkAttempt{connect("inet", "198.19.0.1:80", "ECONNREFUSED"), connect("inet", "198.19.0.1:80", "EINPROGRESS")},
			[]egress.Connection{named, rec(6, "198.19.0.1:80", "allowed.test", egress.Denied, "dial 127.0.0.1:80: refused")},
			[]mark{denied("allowed.test", "dial 127.0.0.1:80: refused"), allowed("allowed.test")}},
		{"other calls and families stay unmarked",
			[]sandbox.NetworkAttempt{
				{Op: "socket", Family: "inet", Type: "stream", Result: "ok"},
				{Op: "bind", Family: "inet", Address: "198.19.0.1:80", Result: "ok"},
				connect("unix", "/run/nscd/socket", "ENOENT"),
				connect("inet", "garbage", "ok"), connect("inet", "198.19.0.1:0", "ok")},
			[]egress.Connection{named, rec(7, "198.19.0.1:0", "", egress.Allowed, "")}, []mark{{}, {}, {}, {}, {}}},
		{"DNS and UDP records mark nothing",
			[]sandbox.NetworkAttempt{connect("inet", "198.18.0.1:53", "ok")},
			[]egress.Connection{{ID: 8, Kind: egress.KindDNS, Name: "allowed.test", Port: 53, Decision: egress.Allowed},
				{ID: 9, Kind: egress.KindUDP, Addr: "198.18.0.1:53", Dst: "198.18.0.1:53", Decision: egress.Allowed}},
			[]mark{{}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a := &sandbox.Activity{Network: slices.Clone(tt.attempts)}
			got := markEgress(a, &egress.Report{Allowlist: []string{"allowed.test"}, Connections: tt.recs})
			for i, na := range got.Network {
				if m := (mark{na.Egress, na.EgressHost, na.EgressReason}); m != tt.want[i] {
					t.Errorf("attempt %d (%s %s): %+v, want %+v", i, na.Op, na.Address, m, tt.want[i])
				}
			}
			if !slices.Equal(a.Network, tt.attempts) {
				t.Errorf("the activity given was changed: %+v", a.Network)
			}
		})
	}
	t.Run("a run without a network stays as it is", func(t *testing.T) {
		a := &sandbox.Activity{Network: []sandbox.NetworkAttempt{connect("inet", "203.0.113.9:80", "ENETUNREACH")}}
		if got := markEgress(a, nil); got != a || got.Network[0].Egress != "" {
			t.Errorf("markEgress(a, nil) = %+v", got)
		}
	})
}
