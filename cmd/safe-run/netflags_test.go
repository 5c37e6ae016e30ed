package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/safe-run/safe-run/egress"
	"github.com/safe-run/safe-run/runtime/gvisor"
	"github.com/safe-run/safe-run/sandbox"
	"github.com/safe-run/safe-run/snippets"
)

// --allow-net where networked sandboxes cannot be made is refused with the
// backend's reason and fix; without --allow-net the host is not asked.
func TestNetFlagsCheckHost(t *testing.T) {
	saved := networkCheck
	t.Cleanup(func() { networkCheck = saved })
	var asked []gvisor.Config
	for _, tc := range []struct {
		name     string
		flags    netFlags
		check    error
		wantErr  string
		wantLink string
	}{
		{name: "no network", check: errors.New("never asked")},
		{name: "a network the host can make", flags: netFlags{allow: listFlag{"pypi"}, link: "veth", helper: "/opt/safe-run-net"}, wantLink: "veth"},
		{name: "a network the host cannot make", flags: netFlags{allow: listFlag{"pypi"}, link: "auto"},
			check:   errors.New("/dev/net/tun cannot be opened by this user: use the veth link (--net-link veth)"),
			wantErr: "--allow-net needs networked sandboxes, which this host cannot make: /dev/net/tun cannot be opened by this user: use the veth link (--net-link veth)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			asked = nil
			networkCheck = func(cfg gvisor.Config) (string, error) { asked = append(asked, cfg); return cfg.NetLink, tc.check }
			var cfg backendConfig
			tc.flags.configure(&cfg)
			err := tc.flags.checkHost(cfg)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("checkHost = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("checkHost = %v", err)
			}
			if !tc.flags.enabled() {
				if len(asked) != 0 {
					t.Errorf("the host was asked without --allow-net")
				}
				return
			}
			if len(asked) != 1 || asked[0].NetLink != tc.wantLink || asked[0].NetHelper != tc.flags.helper {
				t.Errorf("asked %+v; want link %q and helper %q", asked, tc.wantLink, tc.flags.helper)
			}
		})
	}
}

// After a run, the CLI says on stderr what its output does not: a status
// that is not the program's exit, and for a run with a network one line of
// counts and one of the denials — never the denials twice.
func TestPrintRunSummary(t *testing.T) {
	report := &egress.Report{Allowlist: []string{"pypi"}, Connections: []egress.Connection{
		{ID: 1, Kind: egress.KindTCP, Name: "pypi.org", Port: 443, Decision: egress.Allowed},
		{ID: 2, Kind: egress.KindTCP, Name: "evil.test", Port: 443, Decision: egress.Denied, Reason: "not in the allowlist"},
	}}
	denials := "network: denied evil.test:443 (not in the allowlist)"
	for _, tc := range []struct {
		name string
		res  sandbox.Result
		want string
	}{
		{"ok without a network", sandbox.Result{Status: sandbox.StatusOK}, ""},
		{"a timeout without a network", sandbox.Result{Status: sandbox.StatusTimeout, Message: "timed out after 1s"}, "safe-run: timeout: timed out after 1s\n"},
		{"ok with a network", sandbox.Result{Status: sandbox.StatusOK, Message: denials, Network: report},
			"safe-run: network: 1 connection allowed, 1 denied\nsafe-run: " + denials + "\n"},
		{"ok with a network and no denials", sandbox.Result{Status: sandbox.StatusOK, Network: &egress.Report{Allowlist: []string{"pypi"}}},
			"safe-run: network: 0 connections allowed, 0 denied\n"},
		{"a timeout with a network", sandbox.Result{Status: sandbox.StatusTimeout, Message: "timed out after 1s\n" + denials, Network: report},
			"safe-run: timeout: timed out after 1s\n" + denials + "\nsafe-run: network: 1 connection allowed, 1 denied\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			printRunSummary(&b, tc.res)
			if b.String() != tc.want {
				t.Errorf("printed\n%q\nwant\n%q", b.String(), tc.want)
			}
			if strings.Count(b.String(), denials) > 1 {
				t.Errorf("the denials are printed twice")
			}
		})
	}
}

// check's network= reaches the block's job within --allow-net, and is
// refused outside it and in a block of a session, naming the block.
func TestCheckBlockNetwork(t *testing.T) {
	list, err := egress.Parse([]string{"pypi"})
	if err != nil {
		t.Fatal(err)
	}
	policy := sandbox.Policy{Network: list}
	for _, tc := range []struct {
		name    string
		attrs   snippets.Attrs
		want    []string
		wantErr string
	}{
		{name: "no network"},
		{name: "an allowed preset", attrs: snippets.Attrs{Network: []string{"pypi"}}, want: []string{"pypi"}},
		{name: "an entry not allowed", attrs: snippets.Attrs{Network: []string{"evil.test"}}, wantErr: `doc.md:3: network: network entry "evil.test" is not allowed here; allowed: pypi`},
		{name: "a session", attrs: snippets.Attrs{Network: []string{"pypi"}, Session: "s"}, wantErr: "doc.md:3: network= cannot be given to a block of a session"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := snippets.Block{Line: 3, Language: "python", Code: "print(1)\n", Attrs: tc.attrs}
			job, err := blockJob("doc.md", b, policy, checkConfig{})
			if tc.wantErr != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tc.wantErr) {
					t.Fatalf("blockJob = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || strings.Join(job.Network, ",") != strings.Join(tc.want, ",") {
				t.Errorf("blockJob = network %q, %v; want %q", job.Network, err, tc.want)
			}
		})
	}
}
