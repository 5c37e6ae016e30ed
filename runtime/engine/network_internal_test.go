package engine

import (
	"testing"

	"github.com/safe-run/safe-run/egress"
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
