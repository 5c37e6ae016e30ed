package main

// The positive flows of a network by allowlist (issue 16): a run and a
// session with a network reach a pinned test server, and the network
// report shows up everywhere it is promised — `run --json`, the text
// output, run_code's structured output and text, the environment resource,
// the audit record and the metrics. The attacks are threat_network_test.go.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"github.com/safe-run/safe-run/egress"
	"github.com/safe-run/safe-run/sandbox"
)

// allowedRecords counts a report's allowed TCP records for name.
func allowedRecords(rep *egress.Report, name string) (n int, bytesIn int64) {
	if rep == nil {
		return 0, 0
	}
	for _, c := range rep.Connections {
		if c.Kind == egress.KindTCP && c.Name == name && c.Decision == egress.Allowed && !c.Open {
			n++
			bytesIn += c.BytesIn
		}
	}
	return n, bytesIn
}

// allowedAttempts counts the connect attempts of a structured output's
// activity that the host allowed to netAllowed.
func allowedAttempts(activity any) int {
	a, _ := activity.(map[string]any)
	attempts, _ := a["network"].([]any)
	n := 0
	for _, v := range attempts {
		na, _ := v.(map[string]any)
		if na["op"] == "connect" && na["egress"] == egress.Allowed && na["egress_host"] == netAllowed {
			n++
		}
	}
	return n
}

func structuredReport(t *testing.T, out map[string]any) *egress.Report {
	t.Helper()
	return (&threatRun{via: "mcp", mcpOut: out}).report(t)
}

func TestNetworkIntegration(t *testing.T) {
	s := startNetServers(t)
	dir := t.TempDir()
	auditPath := filepath.Join(dir, "audit.log")
	allowed := s.entries()[0]
	args := []string{"--allow-net", strings.Join(s.entries(), ","), "--net-ca", s.caFile}
	fetch := fmt.Sprintf("curl -sS --max-time 10 http://%s:%d/integration", netAllowed, s.httpPort)
	denied := fmt.Sprintf("curl -sS --max-time 10 http://%s/ 2>/dev/null || echo denied", netDenied)

	t.Run("run --json", func(t *testing.T) {
		r := safeRun(t, "", append(append([]string{"run", "--json", "--state-dir", filepath.Join(dir, "cli")}, args...), "--net", allowed, "--lang", "bash", "-c", fetch+"; "+denied)...)
		var res sandbox.Result
		if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
			t.Fatalf("run --json: %v\n%s\n%s", err, r.stdout, r.stderr)
		}
		if !strings.Contains(res.Stdout, netBody) {
			t.Errorf("stdout %q, want the server's answer; stderr %q", res.Stdout, res.Stderr)
		}
		if res.Network == nil {
			t.Fatalf("the result has no network report: %s", r.stdout)
		}
		if want := "allowed.test=127.0.0.1:" + fmt.Sprint(s.httpPort); len(res.Network.Allowlist) != 1 || res.Network.Allowlist[0] != want {
			t.Errorf("report's allowlist %q, want [%s]", res.Network.Allowlist, want)
		}
		if n, in := allowedRecords(res.Network, netAllowed); n != 1 || in == 0 {
			t.Errorf("want one closed allowed connection with bytes in, got %d (%d bytes): %+v", n, in, res.Network.Connections)
		}
		if !strings.Contains(res.Message, "network: denied "+netDenied) {
			t.Errorf("the message does not name the denial: %q", res.Message)
		}
	})
	t.Run("activity marks the host's decisions", func(t *testing.T) {
		code := fmt.Sprintf(`import socket, urllib.request
print(urllib.request.urlopen("http://%s:%d/activity", timeout=10).read().decode())
for host, port in (("%s", 1), ("203.0.113.9", 80)):
    try:
        socket.create_connection((host, port), timeout=10).close()
        print("connected", host, port)
    except OSError as e:
        print("refused", host, port, e)
`, netAllowed, s.httpPort, netAllowed)
		r := safeRun(t, "", append(append([]string{"run", "--json", "--state-dir", filepath.Join(dir, "cli")}, args...), "--net", allowed, "--lang", "python", "-c", code)...)
		var res sandbox.Result
		if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
			t.Fatalf("run --json: %v\n%s\n%s", err, r.stdout, r.stderr)
		}
		if !strings.Contains(res.Stdout, netBody) || strings.Contains(res.Stdout, "connected") {
			t.Errorf("stdout %q, want the server's answer and two refusals; stderr %q", res.Stdout, res.Stderr)
		}
		if res.Activity == nil {
			t.Fatalf("the result has no activity: %s", r.stdout)
		}
		got := map[string]sandbox.NetworkAttempt{}
		for _, na := range res.Activity.Network {
			if na.Op != "connect" || na.Family != "inet" {
				continue
			}
			_, port, _ := strings.Cut(na.Address, ":")
			if port == "53" { // the resolver's UDP socket: the host's DNS records have no address
				continue
			}
			if _, dup := got[port]; dup || na.Egress == "" {
				t.Errorf("connect %+v: a second one to the port, or not marked", na)
			}
			got[port] = na
		}
		for _, want := range []sandbox.NetworkAttempt{
			{Address: fmt.Sprint(s.httpPort), Egress: egress.Allowed, EgressHost: netAllowed},
			{Address: "1", Egress: egress.Denied, EgressHost: netAllowed, EgressReason: "not in the allowlist"},
			{Address: "80", Egress: egress.Denied, EgressReason: "IP address not in the allowlist"},
		} {
			na, ok := got[want.Address]
			if !ok || na.Egress != want.Egress || na.EgressHost != want.EgressHost || na.EgressReason != want.EgressReason {
				t.Errorf("connect to port %s: %+v, want egress %q host %q reason %q", want.Address, na, want.Egress, want.EgressHost, want.EgressReason)
			}
		}
		if sum := res.Activity.Summary(); !strings.Contains(sum, "(1 allowed)") {
			t.Errorf("the activity's line %q does not say one attempt was allowed", sum)
		}
	})
	t.Run("run text", func(t *testing.T) {
		r := safeRun(t, "", append(append([]string{"run", "--state-dir", filepath.Join(dir, "cli")}, args...), "--net", allowed, "--lang", "bash", "-c", denied)...)
		if !strings.Contains(r.stdout+r.stderr, "network: denied "+netDenied) {
			t.Errorf("the text output does not name the denial:\nstdout %s\nstderr %s", r.stdout, r.stderr)
		}
	})

	ts := startServerAt(t, "http", filepath.Join(dir, "state"), nil, append(args, "--audit-log", auditPath)...)
	metrics := strings.TrimSuffix(ts.url, "/mcp") + "/metrics"
	allowedSeries := `safe_run_egress_connections_total{decision="allowed"}`
	deniedSeries := `safe_run_egress_connections_total{decision="denied"}`
	inSeries := `safe_run_egress_bytes_total{direction="in"}`
	before := map[string]float64{}
	for _, m := range []string{allowedSeries, deniedSeries, inSeries} {
		before[m] = max(0, metricValue(t, metrics, m))
	}

	t.Run("mcp run_code", func(t *testing.T) {
		res, out := ts.tool(t, "run_code", map[string]any{"language": "bash", "code": fetch + "; " + denied, "network": []string{allowed}})
		if res.IsError {
			t.Fatalf("run_code: %s", text(res))
		}
		if stdout, _ := out["stdout"].(string); !strings.Contains(stdout, netBody) {
			t.Errorf("stdout %q", stdout)
		}
		if n, _ := allowedRecords(structuredReport(t, out), netAllowed); n != 1 {
			t.Errorf("structured output's network: %d allowed connections, want 1: %v", n, out["network"])
		}
		if n := allowedAttempts(out["activity"]); n != 1 {
			t.Errorf("structured output's activity: %d connect attempts marked allowed, want 1: %v", n, out["activity"])
		}
		if txt := text(res); !strings.Contains(txt, netDenied) || !strings.Contains(txt, "network") {
			t.Errorf("the text content does not show the network line and the denial:\n%s", txt)
		}
	})
	t.Run("mcp session", func(t *testing.T) {
		res, info := ts.tool(t, "create_session", map[string]any{"language": "python", "network": []string{allowed}})
		if res.IsError {
			t.Fatalf("create_session: %s", text(res))
		}
		id := info["session_id"]
		defer ts.tool(t, "close_session", map[string]any{"session_id": id})
		code := fmt.Sprintf("import urllib.request\nprint(urllib.request.urlopen('http://%s:%d/session', timeout=10).read().decode())", netAllowed, s.httpPort)
		for call := range 3 {
			res, out := ts.tool(t, "run_code", map[string]any{"session_id": id, "language": "python", "code": code})
			if res.IsError {
				t.Fatalf("call %d: %s", call, text(res))
			}
			if stdout, _ := out["stdout"].(string); !strings.Contains(stdout, netBody) {
				t.Errorf("call %d: stdout %q", call, stdout)
			}
			t.Logf("call %d: network %v", call, out["network"])
			// Each call reports its own connections, not the session's so far.
			if n, _ := allowedRecords(structuredReport(t, out), netAllowed); n != 1 {
				t.Errorf("call %d: %d allowed connections in its report, want 1: %v", call, n, out["network"])
			}
			// And the call's activity marks its connect with the host's decision.
			if n := allowedAttempts(out["activity"]); n != 1 {
				t.Errorf("call %d: %d connect attempts marked allowed in the activity, want 1: %v", call, n, out["activity"])
			}
		}
	})
	t.Run("environment", func(t *testing.T) {
		req := mcpgo.ReadResourceRequest{}
		req.Params.URI = "safe-run://environment"
		res, err := ts.client.ReadResource(context.Background(), req)
		if err != nil || len(res.Contents) != 1 {
			t.Fatalf("read resource: %v %+v", err, res)
		}
		if body := res.Contents[0].(mcpgo.TextResourceContents).Text; !strings.Contains(body, netAllowed) {
			t.Errorf("the environment resource does not list the allowed entries:\n%s", body)
		}
	})
	t.Run("metrics", func(t *testing.T) {
		for _, m := range []string{allowedSeries, deniedSeries, inSeries} {
			if after := metricValue(t, metrics, m); after <= before[m] {
				t.Errorf("%s did not move: %v → %v", m, before[m], after)
			}
		}
	})
	t.Run("audit", func(t *testing.T) {
		data, err := os.ReadFile(auditPath)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, line := range strings.Split(string(data), "\n") {
			if strings.Contains(line, `"connections"`) && strings.Contains(line, netAllowed) && strings.Contains(line, netDenied) {
				found = true
			}
		}
		if !found {
			t.Errorf("no audit record lists the run's connections:\n%.3000s", data)
		}
	})
}
