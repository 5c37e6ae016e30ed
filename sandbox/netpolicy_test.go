package sandbox_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/safe-run/safe-run/egress"
	"github.com/safe-run/safe-run/sandbox"
)

// netPolicy is a policy with a network: the presets, a pinned mirror, a
// host with one port, and packages allowed by name, by exact version and
// for node.
func netPolicy(t *testing.T, extra ...string) sandbox.Policy {
	t.Helper()
	list, err := egress.Parse(append([]string{"pypi", "npm", "mirror.test=127.0.0.1:8443", "api.example.com:8080"}, extra...))
	if err != nil {
		t.Fatal(err)
	}
	return sandbox.Policy{Network: list, Packages: []string{"requests", "Flask_Login==0.6.3", "lodash", "left-pad@1.3.0"}}
}

// Check narrows the network a job asks for to the policy's entries, in
// canonical form, and refuses the rest with one line naming the entry and
// what is allowed; packages need their language, an allowing pattern and
// a network that reaches the index.
func TestPolicyCheckNetworkAndPackages(t *testing.T) {
	mirror := netPolicy(t)
	mirror.PackageIndex = sandbox.PackageIndex{PipIndexURL: "https://mirror.test:8443/simple", NPMRegistry: "https://mirror.test:8443/npm/"}
	tests := []struct {
		name        string
		policy      sandbox.Policy
		lang        string
		network     []string
		packages    []string
		wantNetwork []string
		wantField   string
		wantMsg     string
	}{
		{name: "no network", policy: netPolicy(t)},
		{name: "a preset", policy: netPolicy(t), network: []string{"pypi"}, wantNetwork: []string{"pypi"}},
		{name: "a host of a preset, spelt otherwise", policy: netPolicy(t), network: []string{"PyPI.org."}, wantNetwork: []string{"pypi.org"}},
		{name: "a pinned host keeps its pin", policy: netPolicy(t), network: []string{"mirror.test"}, wantNetwork: []string{"mirror.test=127.0.0.1:8443"}},
		{name: "a host on its port", policy: netPolicy(t), network: []string{"api.example.com:8080"}, wantNetwork: []string{"api.example.com:8080"}},
		{name: "a host not in the list", policy: netPolicy(t), network: []string{"evil.test"},
			wantField: "network", wantMsg: `network entry "evil.test" is not allowed here; allowed: pypi, npm, mirror.test=127.0.0.1:8443, api.example.com:8080`},
		{name: "a host on another port", policy: netPolicy(t), network: []string{"api.example.com:443"}, wantField: "network", wantMsg: `"api.example.com:443" is not allowed here`},
		{name: "a server with no network", policy: sandbox.Policy{}, network: []string{"pypi"}, wantField: "network", wantMsg: "this server allows no network"},
		{name: "an invalid entry", policy: netPolicy(t), network: []string{"exa mple.com"}, wantField: "network", wantMsg: "exa mple.com"},
		{name: "too many entries", policy: netPolicy(t), network: slices.Repeat([]string{"pypi"}, 65), wantField: "network", wantMsg: "the limit is 64"},

		{name: "an allowed package", policy: netPolicy(t), network: []string{"pypi"}, packages: []string{"requests==2.32.3"}, wantNetwork: []string{"pypi"}},
		{name: "a name allows any version and extras", policy: netPolicy(t), network: []string{"pypi"}, packages: []string{"Requests[socks] >= 2"}, wantNetwork: []string{"pypi"}},
		{name: "an exact pattern, the name spelt otherwise", policy: netPolicy(t), network: []string{"pypi"}, packages: []string{"flask-login==0.6.3"}, wantNetwork: []string{"pypi"}},
		{name: "an exact pattern, another version", policy: netPolicy(t), network: []string{"pypi"}, packages: []string{"flask-login==0.6.2"},
			wantField: "packages", wantMsg: `"flask-login==0.6.2" is not allowed here; allowed: requests, Flask_Login==0.6.3, lodash, left-pad@1.3.0`},
		{name: "an exact pattern, no version", policy: netPolicy(t), network: []string{"pypi"}, packages: []string{"flask-login"}, wantField: "packages", wantMsg: "is not allowed here"},
		{name: "a package not allowed", policy: netPolicy(t), network: []string{"pypi"}, packages: []string{"numpy"}, wantField: "packages", wantMsg: `"numpy" is not allowed here`},
		{name: "a URL", policy: netPolicy(t), network: []string{"pypi"}, packages: []string{"requests @ https://evil.test/r.whl"}, wantField: "packages", wantMsg: "URLs, paths and options are not accepted"},
		{name: "an option", policy: netPolicy(t), network: []string{"pypi"}, packages: []string{"--index-url=https://evil.test"}, wantField: "packages", wantMsg: "not accepted"},
		{name: "no network for the index", policy: netPolicy(t), packages: []string{"requests"}, wantField: "packages", wantMsg: "add the pypi preset to network"},
		{name: "a network without the index", policy: netPolicy(t), network: []string{"npm"}, packages: []string{"requests"}, wantField: "packages", wantMsg: "reach pip's index at pypi.org"},
		{name: "half of a preset", policy: netPolicy(t), network: []string{"pypi.org"}, packages: []string{"requests"}, wantField: "packages", wantMsg: "add the pypi preset"},
		{name: "a mirror", policy: mirror, network: []string{"mirror.test"}, packages: []string{"requests"}, wantNetwork: []string{"mirror.test=127.0.0.1:8443"}},
		{name: "a mirror not asked for", policy: mirror, network: []string{"pypi"}, packages: []string{"requests"}, wantField: "packages", wantMsg: `add "mirror.test" to network`},
		{name: "a node package", policy: netPolicy(t), lang: "node", network: []string{"npm"}, packages: []string{"lodash@4.17.21", "left-pad@1.3.0"}, wantNetwork: []string{"npm"}},
		{name: "a node package through the mirror", policy: mirror, lang: "node", network: []string{"mirror.test"}, packages: []string{"lodash"}, wantNetwork: []string{"mirror.test=127.0.0.1:8443"}},
		{name: "a node package of another version", policy: netPolicy(t), lang: "node", network: []string{"npm"}, packages: []string{"left-pad@1.2.0"}, wantField: "packages", wantMsg: "is not allowed here"},
		{name: "a node alias", policy: netPolicy(t), lang: "node", network: []string{"npm"}, packages: []string{"lodash@npm:evil"}, wantField: "packages", wantMsg: "aliases and options are not accepted"},
		{name: "a git dependency", policy: netPolicy(t), lang: "node", network: []string{"npm"}, packages: []string{"github:evil/pkg"}, wantField: "packages", wantMsg: "not accepted"},
		{name: "bash has no installs", policy: netPolicy(t), lang: "bash", network: []string{"pypi"}, packages: []string{"requests"}, wantField: "packages", wantMsg: "bash has no package installs"},
		{name: "a server without packages", policy: sandbox.Policy{Network: netPolicy(t).Network}, network: []string{"pypi"}, packages: []string{"requests"},
			wantField: "packages", wantMsg: "this server allows no package installs (the operator allows them with --allow-packages)"},
		{name: "any package", policy: sandbox.Policy{Network: netPolicy(t).Network, Packages: []string{"*"}}, network: []string{"pypi"}, packages: []string{"anything==1"}, wantNetwork: []string{"pypi"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lang := tt.lang
			if lang == "" {
				lang = "python"
			}
			job := sandbox.Job{Language: lang, Code: "x", Network: tt.network, Packages: tt.packages}
			got, _, err := tt.policy.Check(job)
			var in *sandbox.InputError
			if tt.wantField != "" {
				if !errors.As(err, &in) || in.Field != tt.wantField || !strings.Contains(in.Msg, tt.wantMsg) || strings.Contains(in.Msg, "\n") {
					t.Fatalf("Check = %v; want one line on %s saying %q", err, tt.wantField, tt.wantMsg)
				}
				return
			}
			if err != nil {
				t.Fatalf("Check = %v", err)
			}
			if !slices.Equal(got.Network, tt.wantNetwork) {
				t.Errorf("network %q, want %q", got.Network, tt.wantNetwork)
			}
			// A checked job passes again unchanged: the engine and the
			// audit log check what the tools checked.
			again, _, err := tt.policy.Check(got)
			if err != nil || !slices.Equal(again.Network, got.Network) {
				t.Errorf("checked again: %q, %v; want %q", again.Network, err, got.Network)
			}
		})
	}
}

// Validate refuses network settings that cannot serve, each in one line
// naming the fix.
func TestPolicyValidateNetwork(t *testing.T) {
	list := netPolicy(t).Network
	tests := []struct {
		name    string
		policy  sandbox.Policy
		wantErr string
	}{
		{"network and packages", netPolicy(t), ""},
		{"a mirror in the list", sandbox.Policy{Network: list, Packages: []string{"*"}, PackageIndex: sandbox.PackageIndex{PipIndexURL: "https://mirror.test:8443/simple"}}, ""},
		{"packages without a network", sandbox.Policy{Packages: []string{"requests"}}, "installs need an allowlist that reaches the index"},
		{"a malformed pattern", sandbox.Policy{Network: list, Packages: []string{"requests; rm -rf"}}, `allowed package "requests; rm -rf" is neither`},
		{"a mirror outside the list", sandbox.Policy{Network: list, PackageIndex: sandbox.PackageIndex{PipIndexURL: "https://other.test/simple"}},
			"the pip index https://other.test/simple is not in the network allowlist; add other.test:443 to it"},
		{"a mirror that is no URL", sandbox.Policy{Network: list, PackageIndex: sandbox.PackageIndex{NPMRegistry: "mirror.test"}}, "the npm registry: \"mirror.test\" is not an http or https URL"},
		{"negative limits", sandbox.Policy{Network: list, NetworkLimits: egress.Limits{MaxConnections: -1}}, "must not be negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.policy.Validate()
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("Validate = %v, want %q", err, tt.wantErr)
			}
		})
	}
}
