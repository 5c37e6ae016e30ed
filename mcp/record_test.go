package mcp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"github.com/safe-run/safe-run/audit"
	"github.com/safe-run/safe-run/sandbox"
)

// memAuditor keeps records in memory, or fails with err.
type memAuditor struct {
	mu      sync.Mutex
	records []audit.Record
	err     error
}

func (a *memAuditor) Append(r audit.Record) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.err != nil {
		return a.err
	}
	a.records = append(a.records, r)
	return nil
}

func (a *memAuditor) Records() []audit.Record {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]audit.Record(nil), a.records...)
}

// withAudit returns cfg with its runner (fakeRunner's default if none) and
// sessions wrapped in an audit.Runner keeping records in log, as serve
// wraps them.
func withAudit(cfg Config, log audit.Appender) Config {
	if cfg.Runner == nil {
		cfg.Runner = &fakeRunner{result: sandbox.Result{Status: sandbox.StatusOK}}
	}
	logger := cfg.Logger
	if logger == nil {
		logger = quietLogger()
	}
	rec := &audit.Runner{Runner: cfg.Runner, Sessions: cfg.Sessions, Log: log, Logger: logger}
	cfg.Runner = rec
	if cfg.Sessions != nil {
		cfg.Sessions = rec
	}
	return cfg
}

// fakeID is the one session fakeSessions knows.
const fakeID = "session-0123456789abcdef"

// fakeSessions is a sandbox.Sessions that knows one session, fakeID.
type fakeSessions struct{}

func (fakeSessions) CreateSession(ctx context.Context, spec sandbox.SessionSpec) (sandbox.SessionInfo, error) {
	return sandbox.SessionInfo{ID: fakeID, Language: spec.Language}, nil
}

func (fakeSessions) RunInSession(ctx context.Context, id string, job sandbox.Job) (sandbox.Result, error) {
	if id != fakeID {
		return sandbox.Result{}, sandbox.ErrNoSession
	}
	return sandbox.Result{Status: sandbox.StatusOK, Stdout: "42\n", StdoutBytes: 3}, nil
}

func (fakeSessions) WriteFiles(ctx context.Context, id string, files []sandbox.File) error {
	return nil
}

func (fakeSessions) ReadFile(ctx context.Context, id, path string) (sandbox.OutputFile, error) {
	return sandbox.OutputFile{}, sandbox.ErrNoSession
}

func (fakeSessions) ListFiles(ctx context.Context, id, dir string) ([]sandbox.OutputFile, error) {
	return nil, nil
}

func (fakeSessions) CloseSession(ctx context.Context, id string) error { return nil }
func (fakeSessions) ListSessions() []sandbox.SessionInfo               { return nil }

func callTool(t *testing.T, c interface {
	CallTool(context.Context, mcpgo.CallToolRequest) (*mcpgo.CallToolResult, error)
}, name string, args map[string]any) *mcpgo.CallToolResult {
	t.Helper()
	req := mcpgo.CallToolRequest{}
	req.Params.Name, req.Params.Arguments = name, args
	res, err := c.CallTool(t.Context(), req)
	if err != nil {
		t.Fatalf("call %s: %v", name, err)
	}
	return res
}

func TestAuditRecordsRunsAndSessionEvents(t *testing.T) {
	aud := &memAuditor{}
	runner := &fakeRunner{result: sandbox.Result{Status: sandbox.StatusError, ExitCode: 3, DurationMS: 150,
		StdoutBytes: 10, StderrBytes: 5, MemoryPeakBytes: 40 << 20, Message: "exit 3"}}
	env := testEnv()
	env.Sessions = &SessionLimits{MaxSessions: 2}
	c := newClient(t, withAudit(Config{Runner: runner, Sessions: fakeSessions{}, Environment: env}, aud))

	callRunCode(t, c, map[string]any{"language": "python", "code": "exit(3)", "timeout_seconds": 5})
	callTool(t, c, "create_session", map[string]any{"language": "python"})
	callTool(t, c, "run_code", map[string]any{"language": "python", "session_id": fakeID, "code": "6*7"})
	callTool(t, c, "write_file", map[string]any{"session_id": fakeID, "path": "a.txt", "content": "x"})
	callTool(t, c, "read_file", map[string]any{"session_id": fakeID, "path": "a.txt"})
	callTool(t, c, "list_sessions", map[string]any{})
	callTool(t, c, "run_code", map[string]any{"language": "python", "code": ""}) // invalid: never runs, not recorded

	recs := aud.Records()
	var events []string
	for _, r := range recs {
		events = append(events, r.Event+"/"+r.Status)
		if r.RequestID == "" || r.ClientName != "safe-run-test" || r.ClientVersion != "0" || r.Time.IsZero() {
			t.Errorf("%s record lacks request id, client or time: %+v", r.Event, r)
		}
	}
	want := []string{"run/error", "create_session/ok", "run/ok", "write_file/ok", "read_file/error"}
	if strings.Join(events, " ") != strings.Join(want, " ") {
		t.Fatalf("events %v, want %v", events, want)
	}
	run := recs[0]
	if run.Language != "python" || run.Code != "exit(3)" || *run.ExitCode != 3 || run.DurationMS != 150 ||
		run.OutputBytes != 15 || run.MemoryPeakBytes != 40<<20 || run.Limits == nil || run.Limits.TimeoutMS != 5000 ||
		run.Limits.MemoryBytes != sandbox.DefaultLimits.MemoryBytes || run.SessionID != "" {
		t.Errorf("run record %+v (limits %+v)", run, run.Limits)
	}
	if recs[1].SessionID != fakeID || recs[1].Language != "python" {
		t.Errorf("create_session record %+v", recs[1])
	}
	if recs[2].SessionID != fakeID || recs[2].OutputBytes != 3 {
		t.Errorf("session run record %+v", recs[2])
	}
	if recs[3].Path != "a.txt" || recs[4].Message == "" {
		t.Errorf("file records %+v, %+v", recs[3], recs[4])
	}
	if recs[0].RequestID == recs[2].RequestID {
		t.Errorf("two calls share request id %q", recs[0].RequestID)
	}
}

// A client cannot choose the request id that goes into the audit log.
func TestRequestIDIsTheServers(t *testing.T) {
	aud := &memAuditor{}
	c := newClient(t, withAudit(Config{}, aud))
	req := runCodeRequest(map[string]any{"language": "bash", "code": "true"})
	req.Params.Meta = &mcpgo.Meta{AdditionalFields: map[string]any{requestIDMeta: "forged"}}
	if _, err := c.CallTool(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	if recs := aud.Records(); len(recs) != 1 || recs[0].RequestID == "forged" || recs[0].RequestID == "" {
		t.Errorf("records %+v", recs)
	}
}

// When a record cannot be written, the call's result is withheld, the
// failure is logged with the record, and no further code runs.
func TestAuditFailureFailsClosed(t *testing.T) {
	aud := &memAuditor{err: errors.New("no space left on device")}
	runner := &fakeRunner{result: sandbox.Result{Status: sandbox.StatusOK, Stdout: "secret result"}}
	var logBuf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logBuf, nil))
	env := testEnv()
	env.Sessions = &SessionLimits{MaxSessions: 2}
	c := newClient(t, withAudit(Config{Runner: runner, Sessions: fakeSessions{}, Environment: env, Logger: logger}, aud))

	res := callRunCode(t, c, map[string]any{"language": "python", "code": "print(1)"})
	text := firstText(t, res)
	if !res.IsError || !strings.Contains(text, "audit record could not be written") || strings.Contains(text, "secret result") {
		t.Errorf("first call: isError %v, text %q; want the result withheld", res.IsError, text)
	}
	if !strings.Contains(logBuf.String(), "level=ERROR") || !strings.Contains(logBuf.String(), "no space left on device") ||
		!strings.Contains(logBuf.String(), "code_sha256="+audit.HashCode("print(1)")) {
		t.Errorf("server log lacks the failure and the record: %s", logBuf.String())
	}
	for _, call := range []struct {
		tool string
		args map[string]any
	}{
		{"run_code", map[string]any{"language": "python", "code": "print(2)"}},
		{"create_session", map[string]any{"language": "python"}},
		{"write_file", map[string]any{"session_id": fakeID, "path": "a", "content": "x"}},
	} {
		res := callTool(t, c, call.tool, call.args)
		if !res.IsError || !strings.Contains(firstText(t, res), "runs no code") {
			t.Errorf("%s after the failure: %q; want a refusal", call.tool, firstText(t, res))
		}
	}
	if n := len(runner.Jobs()); n != 1 {
		t.Errorf("the runner ran %d jobs; want only the one before the failure", n)
	}
	// Reading the server's own table runs nothing and is not refused.
	if res := callTool(t, c, "list_sessions", map[string]any{}); res.IsError {
		t.Errorf("list_sessions after the failure: %q", firstText(t, res))
	}
}

func scrape(t *testing.T, h http.Handler, token string) (int, string) {
	t.Helper()
	req := httptest.NewRequest("GET", "http://127.0.0.1"+MetricsPath, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	body, _ := io.ReadAll(w.Result().Body)
	return w.Code, string(body)
}

func TestMetrics(t *testing.T) {
	gate := sandbox.NewGate(2, 4)
	m := NewMetrics(Gauges{LiveSandboxes: func() int { return 3 }, Sessions: func() int { return 1 }, Gate: gate})
	runner := &fakeRunner{result: sandbox.Result{Status: sandbox.StatusTimeout, DurationMS: 2000}}
	c := newClient(t, Config{Runner: runner, Metrics: m, Gate: gate})
	callRunCode(t, c, map[string]any{"language": "bash", "code": "sleep 9"})
	callRunCode(t, c, map[string]any{"language": "bash", "code": "sleep 9"})
	m.ObserveSandboxStart(180 * time.Millisecond)

	_, body := scrape(t, m.Handler(), "")
	for _, want := range []string{
		`safe_run_runs_total{language="bash",status="timeout"} 2`,
		`safe_run_run_duration_seconds_bucket{language="bash",le="2.5"} 2`,
		`safe_run_run_duration_seconds_bucket{language="bash",le="1"} 0`,
		`safe_run_sandbox_start_seconds_bucket{le="0.2"} 1`,
		`safe_run_sandbox_start_seconds_count 1`,
		"safe_run_live_sandboxes 3", "safe_run_sessions 1", "safe_run_runs_in_progress 0", "safe_run_queue_length 0",
		"go_goroutines", "process_resident_memory_bytes",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if strings.Contains(body, "safe_run_pool_sandboxes") {
		t.Error("pool sizes reported without a pool")
	}

	// A result from the cache is counted apart: nothing ran.
	cachedRunner := &fakeRunner{result: sandbox.Result{Status: sandbox.StatusOK, Cached: true}}
	c2 := newClient(t, Config{Runner: cachedRunner, Metrics: m})
	callRunCode(t, c2, map[string]any{"language": "bash", "code": "echo"})
	_, body = scrape(t, m.Handler(), "")
	if !strings.Contains(body, `safe_run_cached_results_total{language="bash"} 1`) || strings.Contains(body, `status="ok"`) {
		t.Errorf("a cached result was not counted apart from runs:\n%s", body)
	}

	pooled := NewMetrics(Gauges{PoolSizes: func() map[string]int { return map[string]int{"python": 2, "node": 0} }})
	if _, body := scrape(t, pooled.Handler(), ""); !strings.Contains(body, `safe_run_pool_sandboxes{language="python"} 2`) ||
		!strings.Contains(body, `safe_run_pool_sandboxes{language="node"} 0`) {
		t.Errorf("pool sizes missing:\n%s", body)
	}
}

// /metrics sits behind the same checks as /mcp.
func TestMetricsNeedTheToken(t *testing.T) {
	m := NewMetrics(Gauges{})
	h := HTTPHandler(NewServer(Config{Runner: &fakeRunner{}, Environment: testEnv(), Logger: quietLogger()}),
		HTTPConfig{Token: "s3cret", Metrics: m.Handler()})
	if code, _ := scrape(t, h, ""); code != http.StatusUnauthorized {
		t.Errorf("without the token: %d, want 401", code)
	}
	if code, body := scrape(t, h, "s3cret"); code != http.StatusOK || !strings.Contains(body, "go_goroutines") {
		t.Errorf("with the token: %d", code)
	}
	req := httptest.NewRequest("GET", "http://evil.example"+MetricsPath, nil)
	req.Header.Set("Authorization", "Bearer s3cret")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Code != http.StatusForbidden {
		t.Errorf("foreign Host: %d, want 403", w.Code)
	}
}
