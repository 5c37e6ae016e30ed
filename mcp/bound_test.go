package mcp

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/mark3labs/mcp-go/client"
	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"github.com/safe-run/safe-run/audit"
	"github.com/safe-run/safe-run/sandbox"
)

func TestCheckSessionID(t *testing.T) {
	tests := []struct {
		id string
		ok bool
	}{
		{"session-1234abcd-12ab", true}, // the runtime's ids so far
		{"session-0123456789abcdef0123456789abcdef", true},
		{"session-" + strings.Repeat("a", 64), true},
		{"session-" + strings.Repeat("a", 65), false},
		{"session-1234abc", false},
		{"session-", false},
		{"s1", false},
		{"", false},
		{"session-0123456789ABCDEF", false},
		{"session--123456789abcdef", false},
		{"session-0123456789abcdef\n", false},
		{"session-../../etc/passwd", false},
		{"session-" + strings.Repeat("0", 9<<20), false},
	}
	for _, tt := range tests {
		err := checkSessionID(tt.id)
		if (err == nil) != tt.ok {
			t.Errorf("checkSessionID(%.40q) = %v; want ok %v", tt.id, err, tt.ok)
		}
		if err != nil && !strings.Contains(errorText(err), `"session_id" is not a session id`) {
			t.Errorf("error %q does not name the argument", errorText(err))
		}
	}
}

// openAuditLog opens a fresh audit log file; the test closes it.
func openAuditLog(t *testing.T) (string, *audit.Log) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "audit.log")
	log, err := audit.Open(audit.Options{Path: path, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { log.Close() })
	return path, log
}

// countingSessions counts the calls that reach the sessions.
type countingSessions struct {
	fakeSessions
	calls atomic.Int32
}

func (s *countingSessions) RunInSession(ctx context.Context, id string, job sandbox.Job) (sandbox.Result, error) {
	s.calls.Add(1)
	return s.fakeSessions.RunInSession(ctx, id, job)
}

func (s *countingSessions) ReadFile(ctx context.Context, id, path string) (sandbox.OutputFile, error) {
	s.calls.Add(1)
	return s.fakeSessions.ReadFile(ctx, id, path)
}

func (s *countingSessions) CloseSession(ctx context.Context, id string) error {
	s.calls.Add(1)
	return nil
}

func (s *countingSessions) WriteFiles(ctx context.Context, id string, files []sandbox.File) error {
	s.calls.Add(1)
	return nil
}

func (s *countingSessions) ListFiles(ctx context.Context, id, dir string) ([]sandbox.OutputFile, error) {
	s.calls.Add(1)
	return nil, nil
}

// A session_id of megabytes is refused by its shape, in one short tool
// error, before any lookup: it reaches neither the sessions nor the audit
// log, which stays one that the next start-up opens.
func TestHugeSessionIDRefusedBeforeLookup(t *testing.T) {
	path, log := openAuditLog(t)
	sessions := &countingSessions{}
	env := testEnv()
	env.Sessions = &SessionLimits{MaxSessions: 2}
	c := newClient(t, withAudit(Config{Sessions: sessions, Environment: env}, log))
	huge := "session-" + strings.Repeat("a", 1<<20) // the threat case sends 9 MiB
	for _, call := range []struct {
		tool string
		args map[string]any
	}{
		{"read_file", map[string]any{"session_id": huge, "path": "a"}},
		{"write_file", map[string]any{"session_id": huge, "path": "a", "content": "x"}},
		{"list_files", map[string]any{"session_id": huge}},
		{"close_session", map[string]any{"session_id": huge}},
		{"run_code", map[string]any{"language": "python", "code": "1", "session_id": huge}},
		{"read_file", map[string]any{"session_id": "s1", "path": "a"}},
	} {
		res := callTool(t, c, call.tool, call.args)
		text := firstText(t, res)
		if !res.IsError || !strings.Contains(text, `"session_id" is not a session id`) || len(text) > maxEchoBytes {
			t.Errorf("%s with a malformed session_id: %d bytes %.200q; want one short refusal", call.tool, len(text), text)
		}
	}
	if n := sessions.calls.Load(); n != 0 {
		t.Errorf("%d calls reached the sessions; want none", n)
	}
	// A lookup of a well-formed but unknown id is recorded, small.
	callTool(t, c, "read_file", map[string]any{"session_id": "session-00000000000000000000000000000000", "path": strings.Repeat("p", 1<<20)})
	log.Close()
	if fi, err := os.Stat(path); err != nil || fi.Size() > 16<<10 {
		t.Fatalf("audit log: %v, %d bytes; want one small record", err, fi.Size())
	}
	again, err := audit.Open(audit.Options{Path: path, Logger: quietLogger()})
	if err != nil {
		t.Fatalf("reopen the audit log: %v", err)
	}
	again.Close()
	if _, err := audit.Verify(path); err != nil {
		t.Errorf("verify: %v", err)
	}
}

// A client name and version far over their caps are cut in every record:
// many calls write a small log. (The threat case sends 4 MB over HTTP.)
func TestHugeClientInfoIsBounded(t *testing.T) {
	path, log := openAuditLog(t)
	cfg := withAudit(Config{Runner: &fakeRunner{result: sandbox.Result{Status: sandbox.StatusOK}}, Environment: testEnv(),
		Logger: quietLogger()}, log)
	c, err := client.NewInProcessClient(NewServer(cfg))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	init := mcpgo.InitializeRequest{}
	init.Params.ProtocolVersion = mcpgo.LATEST_PROTOCOL_VERSION
	init.Params.ClientInfo = mcpgo.Implementation{Name: "evil\x1b[2J" + strings.Repeat("n", 64<<10), Version: strings.Repeat("v", 64<<10)}
	if _, err := c.Initialize(t.Context(), init); err != nil {
		t.Fatal(err)
	}
	const calls = 20
	for range calls {
		callRunCode(t, c, map[string]any{"language": "python", "code": "print(1)"})
	}
	log.Close()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > calls*2048 {
		t.Errorf("%d calls wrote %d bytes; want under 2 KiB a record", calls, fi.Size())
	}
	sum, err := audit.Verify(path)
	if err != nil || sum.Records != calls {
		t.Fatalf("verify: %+v, %v", sum, err)
	}
	data, _ := os.ReadFile(path)
	if strings.Contains(string(data), "\x1b") || !strings.Contains(string(data), `evil\\u001b[2J`) {
		t.Errorf("the escape in the client name is not escaped as text: %.300s", data)
	}
}
