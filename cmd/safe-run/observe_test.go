package main

// End-to-end tests of the audit log and the metrics of the built binary,
// with the real runsc and image (see cli_test.go).

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/safe-run/safe-run/sandbox"
)

func TestMCPAuditLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit", "audit.log")
	ts := startServer(t, "stdio", "--audit-log", path)
	code := "print(6 * 7)"
	if res, out := ts.mustCall(t, map[string]any{"language": "python", "code": code}); res.IsError || out["stdout"] != "42\n" {
		t.Fatalf("run: %v %s", out, text(res))
	}
	_, info := ts.tool(t, "create_session", map[string]any{"language": "bash"})
	id, _ := info["session_id"].(string)
	_, call := ts.tool(t, "run_code", map[string]any{"language": "bash", "session_id": id, "code": "echo hi; /bin/true"})
	closed, tree := ts.tool(t, "close_session", map[string]any{"session_id": id})
	// The call reports its own activity, close_session the session's tree.
	for what, out := range map[string]map[string]any{"the session's call": call, "close_session": tree} {
		if a := activityOf(t, out["activity"]); !ranBinary(a, "true") {
			t.Errorf("%s: activity %+v lacks the true the call started", what, a)
		}
	}
	if !strings.Contains(text(closed), "activity: ") {
		t.Errorf("close_session's text %q has no activity line", text(closed))
	}

	r := safeRun(t, "", "audit", "verify", path)
	if r.code != 0 || !strings.Contains(r.stdout, "ok: 5 records in 1 file(s)") {
		t.Fatalf("verify: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	t.Logf("audit verify: %s", strings.TrimSpace(r.stdout))
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.SplitAfter(data, []byte("\n"))
	var first map[string]any
	json.Unmarshal(lines[0], &first)
	sum := sha256.Sum256([]byte(code))
	if first["event"] != "run" || first["client_name"] != "safe-run-test" || first["client_version"] != "1" ||
		first["language"] != "python" || first["status"] != "ok" || first["exit_code"] != float64(0) ||
		first["code_sha256"] != hex.EncodeToString(sum[:]) || first["code"] != nil || first["request_id"] == nil ||
		first["output_bytes"] != float64(3) || first["memory_peak_bytes"] == nil || first["limits"] == nil {
		t.Errorf("first record: %s", lines[0])
	}
	// The session's end is recorded by the runtime as it happens, before
	// the close_session call that caused it.
	for i, event := range []string{"create_session", "run", "session_end", "close_session"} {
		var rec map[string]any
		json.Unmarshal(lines[i+1], &rec)
		if rec["event"] != event || rec["session_id"] != id {
			t.Errorf("record %d: %s; want %s of %s", i+2, lines[i+1], event, id)
		}
		if event == "session_end" && rec["message"] != "closed" {
			t.Errorf("session_end record: %s; want the reason \"closed\"", lines[i+1])
		}
		if (event == "session_end" || event == "run") && !ranBinary(activityOf(t, rec["activity"]), "true") {
			t.Errorf("%s record: %s; want an activity with the true the call started", event, lines[i+1])
		}
	}

	// Tampering with the first record breaks the chain at the second.
	tampered := append(bytes.Replace(lines[0], []byte(`"status":"ok"`), []byte(`"status":"error"`), 1), bytes.Join(lines[1:], nil)...)
	if err := os.WriteFile(path, tampered, 0o600); err != nil {
		t.Fatal(err)
	}
	r = safeRun(t, "", "audit", "verify", path)
	if r.code != 1 || !strings.Contains(r.stderr, path+":2: ") {
		t.Errorf("verify after tampering: exit %d, stderr %q; want exit 1 naming line 2", r.code, r.stderr)
	}
	t.Logf("audit verify after tampering: %s", strings.TrimSpace(r.stderr))
}

// `safe-run run --audit-log` appends to the same chain from one process
// after another, rotating as asked.
func TestRunAuditLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	for i, code := range []string{"echo one", "echo two; exit 3", "echo three"} {
		r := safeRun(t, "", "run", "--audit-log", path, "--audit-max-size", "600B", "--lang", "bash", "-c", code)
		if r.code != []int{0, 3, 0}[i] {
			t.Fatalf("run %q: exit %d, stderr %q", code, r.code, r.stderr)
		}
	}
	r := safeRun(t, "", "audit", "verify", path)
	if r.code != 0 || !strings.Contains(r.stdout, "ok: 3 records in 3 file(s)") {
		t.Fatalf("verify: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	t.Logf("audit verify: %s", strings.TrimSpace(r.stdout))
	if err := os.Remove(path + ".1"); err != nil {
		t.Fatal(err)
	}
	if r := safeRun(t, "", "audit", "verify", path); r.code != 1 || !strings.Contains(r.stderr, "earlier records are missing") {
		t.Errorf("verify without the oldest file: exit %d, stderr %q", r.code, r.stderr)
	}
}

// metricValue scrapes url and returns the value of the sample named
// exactly series, or -1 if it is absent.
func metricValue(t *testing.T, url, series string) float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindSubmatch(body)
	if m == nil {
		return -1
	}
	v, _ := strconv.ParseFloat(string(m[1]), 64)
	return v
}

// With the default warm pool on: a run moves its counter, sandbox starts
// (the pool's refill, or the run's own start) are counted, and the pool's
// sizes are reported per language.
func TestMCPMetrics(t *testing.T) {
	ts := startServer(t, "http")
	metrics := strings.TrimSuffix(ts.url, "/mcp") + "/metrics"
	runs := `safe_run_runs_total{language="bash",status="ok"}`
	before := max(0, metricValue(t, metrics, runs))
	starts := metricValue(t, metrics, "safe_run_sandbox_start_seconds_count")
	if res, out := ts.mustCall(t, map[string]any{"language": "bash", "code": "echo counted"}); res.IsError {
		t.Fatalf("run: %v %s", out, text(res))
	}
	if after := metricValue(t, metrics, runs); after != before+1 {
		t.Errorf("%s went from %v to %v over one run", runs, before, after)
	}
	waitUntil(t, 60*time.Second, func() bool { return metricValue(t, metrics, "safe_run_sandbox_start_seconds_count") > starts })
	for _, g := range []string{"safe_run_queue_length", "safe_run_runs_in_progress", "safe_run_sessions"} {
		if v := metricValue(t, metrics, g); v != 0 {
			t.Errorf("%s = %v after the run, want 0", g, v)
		}
	}
	for _, g := range []string{"safe_run_live_sandboxes", `safe_run_pool_sandboxes{language="python"}`, `safe_run_pool_sandboxes{language="bash"}`} {
		if v := metricValue(t, metrics, g); v < 0 {
			t.Errorf("%s is missing", g)
		}
	}
}

// Without a pool, the pool's sizes are absent and nothing stays live.
func TestMCPMetricsWithoutPool(t *testing.T) {
	ts := startServer(t, "http", "--pool=")
	metrics := strings.TrimSuffix(ts.url, "/mcp") + "/metrics"
	starts := metricValue(t, metrics, "safe_run_sandbox_start_seconds_count")
	if res, out := ts.mustCall(t, map[string]any{"language": "python", "code": "print(1)"}); res.IsError {
		t.Fatalf("run: %v %s", out, text(res))
	}
	if after := metricValue(t, metrics, "safe_run_sandbox_start_seconds_count"); after != starts+1 {
		t.Errorf("sandbox starts went from %v to %v over one run", starts, after)
	}
	if v := metricValue(t, metrics, `safe_run_runs_total{language="python",status="ok"}`); v != 1 {
		t.Errorf("python runs = %v, want 1", v)
	}
	// The run's sandbox is removed just after its result is sent.
	waitUntil(t, 30*time.Second, func() bool { return metricValue(t, metrics, "safe_run_live_sandboxes") == 0 })
	if v := metricValue(t, metrics, `safe_run_pool_sandboxes{language="python"}`); v != -1 {
		t.Errorf("pool size reported (%v) without a pool", v)
	}
}

// The behaviour monitor's counters move with real runs: trace points by
// kind, and rule hits by rule and action only when a rule fired.
func TestMCPMonitorMetrics(t *testing.T) {
	ts := startServer(t, "http", "--pool=")
	metrics := strings.TrimSuffix(ts.url, "/mcp") + "/metrics"
	execs, shell := `safe_run_monitor_events_total{kind="sentry_exec"}`, `safe_run_monitor_rules_total{action="record",rule="shell-from-python"}`
	if res, out := ts.mustCall(t, map[string]any{"language": "python", "code": "print(1)"}); res.IsError {
		t.Fatalf("run: %v %s", out, text(res))
	}
	quiet := metricValue(t, metrics, execs)
	if quiet != 1 || metricValue(t, metrics, shell) != -1 {
		t.Errorf("after print(1): %s = %v, want 1 (the interpreter); %s = %v, want absent", execs, quiet, shell, metricValue(t, metrics, shell))
	}
	if res, out := ts.mustCall(t, map[string]any{"language": "python", "code": `import subprocess; subprocess.run(["sh", "-c", "true"])`}); res.IsError {
		t.Fatalf("run: %v %s", out, text(res))
	}
	if v := metricValue(t, metrics, execs); v != quiet+2 {
		t.Errorf("after a run starting a shell: %s = %v, want %v (the interpreter and the shell)", execs, v, quiet+2)
	}
	if v := metricValue(t, metrics, shell); v != 1 {
		t.Errorf("%s = %v, want 1", shell, v)
	}
}

// activityOf decodes an activity from a decoded JSON document; nil when
// absent.
func activityOf(t *testing.T, v any) *sandbox.Activity {
	t.Helper()
	if v == nil {
		return nil
	}
	data, err := json.Marshal(v)
	var a sandbox.Activity
	if err == nil {
		err = json.Unmarshal(data, &a)
	}
	if err != nil {
		t.Errorf("activity %v does not decode: %v", v, err)
		return nil
	}
	return &a
}

// ranBinary reports whether a holds a process whose binary's name is name.
func ranBinary(a *sandbox.Activity, name string) bool {
	if a == nil {
		return false
	}
	for _, p := range a.Processes {
		if filepath.Base(p.Binary) == name {
			return true
		}
	}
	return false
}
