package mcp

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/safe-run/safe-run/egress"
	"github.com/safe-run/safe-run/sandbox"
)

// netTestPolicy gives calls the pypi preset, a pinned mirror and one
// package.
func netTestPolicy(t *testing.T) sandbox.Policy {
	t.Helper()
	list, err := egress.Parse([]string{"pypi", "mirror.test=127.0.0.1:8443"})
	if err != nil {
		t.Fatal(err)
	}
	return sandbox.Policy{Network: list, Packages: []string{"requests"}, NetworkLimits: egress.Limits{MaxConnections: 16}}
}

// netTestEnv is testEnv with netTestPolicy's network.
func netTestEnv(t *testing.T) Environment {
	env := testEnv()
	env.Network, env.NetworkAccess = "allowlist", networkAccess(netTestPolicy(t))
	return env
}

// The environment lists the allowlist, its presets, the packages and the
// limits with their defaults; a policy without a network lists none.
func TestNetworkAccess(t *testing.T) {
	if a := networkAccess(sandbox.Policy{Packages: []string{"x"}}); a != nil {
		t.Errorf("no network: access %+v, want nil", a)
	}
	a := networkAccess(netTestPolicy(t))
	data, _ := json.Marshal(a)
	want := `{"allowlist":["pypi","mirror.test=127.0.0.1:8443"],"presets":{"pypi":["pypi.org","files.pythonhosted.org"]},"packages":["requests"],` +
		`"limits":{"max_connections":16,"max_bytes_out":1073741824,"max_bytes_in":1073741824}}`
	if string(data) != want {
		t.Errorf("access\n%s\nwant\n%s", data, want)
	}
}

// run_code's and create_session's schemas list the network and packages
// allowed, and a server without a network leaves both arguments out.
func TestNetworkSchema(t *testing.T) {
	tests := []struct {
		name        string
		env         Environment
		wantNetwork []string // in the network argument's description
		wantPkgs    []string // in the packages argument's description; nil: no argument
	}{
		{"no network", testEnv(), nil, nil},
		{"network and packages", netTestEnv(t), []string{"pypi", "mirror.test=127.0.0.1:8443"}, []string{"allowed: requests"}},
		{"network without packages", func() Environment {
			env := netTestEnv(t)
			env.NetworkAccess.Packages = nil
			return env
		}(), []string{"pypi, mirror.test=127.0.0.1:8443"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.env.Sessions = &SessionLimits{MaxSessions: 1}
			var create *sessionTool
			for _, st := range sessionTools(tt.env) {
				if st.name == "create_session" {
					create = &st
				}
			}
			type schema struct {
				Properties map[string]map[string]any `json:"properties"`
			}
			var createSchema, runSchema schema
			json.Unmarshal(create.input, &createSchema)
			data := runCodeTool(tt.env, time.Hour).RawInputSchema
			json.Unmarshal(data, &runSchema)
			for _, props := range []map[string]map[string]any{runSchema.Properties, createSchema.Properties} {
				network, hasNet := props["network"]
				pkgs, hasPkgs := props["packages"]
				if hasNet != (tt.wantNetwork != nil) || hasPkgs != (tt.wantPkgs != nil) {
					t.Fatalf("network listed %v, packages listed %v; want %v, %v", hasNet, hasPkgs, tt.wantNetwork != nil, tt.wantPkgs != nil)
				}
				for _, w := range tt.wantNetwork {
					if d, _ := network["description"].(string); !strings.Contains(d, w) || network["type"] != "array" {
						t.Errorf("network argument %v; want an array described with %q", network, w)
					}
				}
				for _, w := range tt.wantPkgs {
					if d, _ := pkgs["description"].(string); !strings.Contains(d, w) {
						t.Errorf("packages argument %v; want it described with %q", pkgs, w)
					}
				}
			}
			if tt.wantNetwork == nil {
				return
			}
			sch := compileSchema(t, data)
			for args, valid := range map[string]bool{
				`{"language": "python", "code": "1", "network": ["pypi"]}`:                           true,
				`{"language": "python", "code": "1", "network": ["pypi"], "packages": ["requests"]}`: tt.wantPkgs != nil,
				`{"language": "python", "code": "1", "network": "pypi"}`:                             false,
				`{"language": "python", "code": "1", "network": [1]}`:                                false,
			} {
				inst, _ := jsonschema.UnmarshalJSON(strings.NewReader(args))
				if err := sch.Validate(inst); (err == nil) != valid {
					t.Errorf("schema validation of %s: %v, want valid %v", args, err, valid)
				}
			}
		})
	}
}

// The network arguments reach the runner as the job's; what the policy
// does not allow is a tool error naming the argument and the allowed
// entries, and a session keeps the network it was created with.
func TestRunCodeNetworkArguments(t *testing.T) {
	tests := []struct {
		name     string
		args     map[string]any
		wantJob  []string
		wantText string // of the error; "" for a run
	}{
		{"no network", map[string]any{"language": "python", "code": "1"}, nil, ""},
		{"a preset and a pin", map[string]any{"language": "python", "code": "1", "network": []any{"pypi", "mirror.test"}, "packages": []any{"requests"}},
			[]string{"pypi", "mirror.test"}, ""},
		{"a host not allowed", map[string]any{"language": "python", "code": "1", "network": []any{"evil.test"}}, nil,
			`Invalid argument "network": network entry "evil.test" is not allowed here; allowed: pypi, mirror.test=127.0.0.1:8443`},
		{"a package not allowed", map[string]any{"language": "python", "code": "1", "network": []any{"pypi"}, "packages": []any{"numpy"}}, nil,
			`Invalid argument "packages": "numpy" is not allowed here; allowed: requests`},
		{"network not a list", map[string]any{"language": "python", "code": "1", "network": "pypi"}, nil,
			`argument "network" must be of type array`},
		{"network in a session", map[string]any{"language": "python", "code": "1", "network": []any{"pypi"}, "session_id": "s-1"}, nil,
			"a session keeps the network and packages it was created with"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			runner := &fakeRunner{result: sandbox.Result{Status: sandbox.StatusOK}, policy: netTestPolicy(t)}
			env := netTestEnv(t)
			env.Sessions = &SessionLimits{MaxSessions: 1}
			c := newClient(t, Config{Runner: runner, Environment: env, Sessions: &fakeSessions{}})
			res := callRunCode(t, c, tt.args)
			text := firstText(t, res)
			if tt.wantText != "" {
				if !res.IsError || !strings.Contains(text, tt.wantText) || strings.Contains(text, "\n") || len(runner.Jobs()) != 0 {
					t.Errorf("result %q (error %v, %d runs); want one error line with %q and no run", text, res.IsError, len(runner.Jobs()), tt.wantText)
				}
				return
			}
			if res.IsError || len(runner.Jobs()) != 1 {
				t.Fatalf("result %q; want one run", text)
			}
			if got := runner.Jobs()[0].Network; strings.Join(got, ",") != strings.Join(tt.wantJob, ",") {
				t.Errorf("job network %q, want %q", got, tt.wantJob)
			}
		})
	}
}

// A networked result carries its report in the structured content (valid
// by the output schema) and one network line in the text, with the
// denials the message names shown once.
func TestResultNetwork(t *testing.T) {
	report := &egress.Report{Allowlist: []string{"pypi"}, Connections: []egress.Connection{
		{ID: 1, Kind: egress.KindTCP, Name: "pypi.org", Port: 443, Decision: egress.Allowed, Open: true, BytesOut: 10},
		{ID: 2, Kind: egress.KindDNS, Name: "evil.test", Decision: egress.Denied, Reason: "not in the allowlist"},
		{ID: 3, Kind: egress.KindTCP, Name: "evil.test", Port: 443, Decision: egress.Denied, Reason: "not in the allowlist"},
		{ID: 1, Kind: egress.KindTCP, Name: "pypi.org", Port: 443, Decision: egress.Allowed, BytesOut: 517, BytesIn: 4096},
	}}
	denials := "network: denied evil.test:443 (not in the allowlist)"
	tests := []struct {
		name     string
		res      sandbox.Result
		want     []string
		wantNone []string
	}{
		{"no network", sandbox.Result{Status: sandbox.StatusOK, Stdout: "hi\n"}, nil, []string{"network"}},
		{"ok with a denial", sandbox.Result{Status: sandbox.StatusOK, Message: denials, Network: report},
			[]string{"network: 1 connection allowed, 1 denied; 1 name not answered\n" + denials + "\n"}, nil},
		{"a failed program", sandbox.Result{Status: sandbox.StatusError, ExitCode: 1, Message: "exit code 1\n" + denials, Network: report},
			[]string{"\n" + denials + "\n"}, nil},
		{"a timeout shows the message once", sandbox.Result{Status: sandbox.StatusTimeout, Message: "timed out\n" + denials, Network: report},
			[]string{"status: timeout: timed out\n" + denials}, nil},
		{"a dead helper", sandbox.Result{Status: sandbox.StatusOK, Message: "network: the network helper exited", Network: &egress.Report{Failure: "the network helper exited", Dropped: 3}},
			[]string{"network: 0 connections allowed, 0 denied; 3 more records not kept\nnetwork: the network helper exited\n"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := result(tt.res)
			got := checkStructured(t, r.StructuredContent)
			if _, has := got["network"]; has != (tt.res.Network != nil) {
				t.Errorf("structured network present %v, want %v", has, tt.res.Network != nil)
			}
			s := r.Content[0].(mcpgo.TextContent).Text
			for _, w := range tt.want {
				if !strings.Contains(s, w) {
					t.Errorf("text\n%s\nlacks %q", s, w)
				}
			}
			for _, w := range tt.wantNone {
				if strings.Contains(s, w) {
					t.Errorf("text\n%s\nhas %q", s, w)
				}
			}
			if strings.Count(s, denials) > 1 {
				t.Errorf("text\n%s\nnames the denials twice", s)
			}
		})
	}
}

// The egress metrics count each decision once (a connection's open and
// close records share an ID) and the bytes of its last record.
func TestEgressMetrics(t *testing.T) {
	m := NewMetrics(Gauges{})
	m.observeCall("python", sandbox.Result{Status: sandbox.StatusOK, Network: &egress.Report{Connections: []egress.Connection{
		{ID: 1, Kind: egress.KindTCP, Decision: egress.Allowed, Open: true, BytesOut: 5},
		{ID: 2, Kind: egress.KindDNS, Decision: egress.Denied},
		{ID: 1, Kind: egress.KindTCP, Decision: egress.Allowed, BytesOut: 517, BytesIn: 4096},
		{ID: 3, Kind: egress.KindTCP, Decision: egress.Denied},
	}}}, nil)
	m.observeCall("python", sandbox.Result{Status: sandbox.StatusOK, Cached: true, Network: &egress.Report{Connections: []egress.Connection{
		{ID: 1, Kind: egress.KindTCP, Decision: egress.Allowed, BytesOut: 1},
	}}}, nil)
	for _, tt := range []struct {
		name string
		got  float64
		want float64
	}{
		{"allowed", counter(t, m, "safe_run_egress_connections_total", "allowed"), 1},
		{"denied", counter(t, m, "safe_run_egress_connections_total", "denied"), 2},
		{"bytes out", counter(t, m, "safe_run_egress_bytes_total", "out"), 517},
		{"bytes in", counter(t, m, "safe_run_egress_bytes_total", "in"), 4096},
	} {
		if tt.got != tt.want {
			t.Errorf("%s = %v, want %v", tt.name, tt.got, tt.want)
		}
	}
}

// counter is the value of the counter name with the one label value.
func counter(t *testing.T, m *Metrics, name, label string) float64 {
	t.Helper()
	families, err := m.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, metric := range f.GetMetric() {
			if metric.GetLabel()[0].GetValue() == label {
				return metric.GetCounter().GetValue()
			}
		}
	}
	return -1
}

// specSessions is fakeSessions recording the specs of create_session.
type specSessions struct {
	fakeSessions
	specs []sandbox.SessionSpec
}

func (s *specSessions) CreateSession(ctx context.Context, spec sandbox.SessionSpec) (sandbox.SessionInfo, error) {
	s.specs = append(s.specs, spec)
	return s.fakeSessions.CreateSession(ctx, spec)
}

// create_session hands its network and packages to the sessions, which
// check them with the policy when the session starts.
func TestCreateSessionNetwork(t *testing.T) {
	sessions := &specSessions{}
	env := netTestEnv(t)
	env.Sessions = &SessionLimits{MaxSessions: 1}
	c := newClient(t, Config{Runner: &fakeRunner{policy: netTestPolicy(t)}, Sessions: sessions, Environment: env})
	res := callTool(t, c, "create_session", map[string]any{"language": "python", "network": []any{"pypi"}, "packages": []any{"requests"}})
	if res.IsError || len(sessions.specs) != 1 {
		t.Fatalf("create_session: %s; %d sessions created", firstText(t, res), len(sessions.specs))
	}
	if got := sessions.specs[0]; strings.Join(got.Network, ",") != "pypi" || strings.Join(got.Packages, ",") != "requests" {
		t.Errorf("session spec network %q, packages %q; want pypi, requests", got.Network, got.Packages)
	}
}
