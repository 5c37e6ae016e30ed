package mcp

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"github.com/safe-run/safe-run/sandbox"
)

// failingSessions fails every session call with err.
type failingSessions struct{ err error }

func (f failingSessions) CreateSession(context.Context, sandbox.SessionSpec) (sandbox.SessionInfo, error) {
	return sandbox.SessionInfo{}, f.err
}
func (f failingSessions) RunInSession(context.Context, string, sandbox.Job) (sandbox.Result, error) {
	return sandbox.Result{}, f.err
}
func (f failingSessions) WriteFiles(context.Context, string, []sandbox.File) error { return f.err }
func (f failingSessions) ReadFile(context.Context, string, string) (sandbox.OutputFile, error) {
	return sandbox.OutputFile{}, f.err
}
func (f failingSessions) ListFiles(context.Context, string, string) ([]sandbox.OutputFile, error) {
	return nil, f.err
}
func (f failingSessions) CloseSession(context.Context, string) error { return f.err }
func (f failingSessions) ListSessions() []sandbox.SessionInfo        { return nil }

// Every tool that reaches the runner or the sessions renders the backend's
// error by its class, in the same words: only invalid input is called an
// invalid argument, and each class carries the hint a model can act on.
func TestToolErrorsByClass(t *testing.T) {
	const id = "session-0123456789abcdef"
	calls := []struct {
		tool string
		args map[string]any
	}{
		{"run_code", map[string]any{"language": "python", "code": "print(1)"}},
		{"run_code", map[string]any{"language": "python", "code": "print(1)", "session_id": id}},
		{"create_session", map[string]any{"language": "python"}},
		{"close_session", map[string]any{"session_id": id}},
		{"write_file", map[string]any{"session_id": id, "path": "a.txt", "content": "x"}},
		{"read_file", map[string]any{"session_id": id, "path": "a.txt"}},
		{"list_files", map[string]any{"session_id": id}},
	}
	tests := []struct {
		name    string
		err     error
		want    []string // substrings of the error text
		invalid bool     // the text calls it an invalid argument
	}{
		{"invalid input", &sandbox.InputError{Field: "language", Msg: "the session runs bash, not python"},
			[]string{`Invalid argument "language": the session runs bash, not python`}, true},
		{"invalid, no field", sandbox.WithClass(errors.New("this language has no sessions"), sandbox.ErrInvalid),
			[]string{"Invalid arguments: this language has no sessions"}, true},
		{"not found", fmt.Errorf("session %q: %w", id, sandbox.ErrNoSession),
			[]string{"no such session", "create_session"}, false},
		{"too many sessions", fmt.Errorf("%w (the limit is 8)", sandbox.ErrTooManySessions),
			[]string{"too many sessions: close one you no longer need", "(the limit is 8)"}, false},
		{"exhausted", sandbox.WithClass(errors.New("the pool's memory is taken"), sandbox.ErrExhausted),
			[]string{"the pool's memory is taken", "try again later or close a session"}, false},
		{"unavailable", sandbox.WithClass(errors.New("start the session's sandbox: runsc create: exit status 1"), sandbox.ErrUnavailable),
			[]string{"the sandbox service failed: start the session's sandbox: runsc create: exit status 1", "not your code's fault"}, false},
		{"cancelled", fmt.Errorf("start sandbox: %w", context.Canceled), []string{"the call was cancelled"}, false},
		{"deadline", fmt.Errorf("start sandbox: %w", context.DeadlineExceeded), []string{"ran out of time", "start sandbox"}, false},
		{"unclassed", errors.New("start the session's sandbox: the agent said hello twice"),
			[]string{"internal error", "start the session's sandbox: the agent said hello twice", "not your code's fault"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := testEnv()
			env.Sessions = &SessionLimits{MaxSessions: 8}
			c := newClient(t, Config{Runner: &fakeRunner{err: tt.err}, Sessions: failingSessions{tt.err}, Environment: env})
			for _, call := range calls {
				var req mcpgo.CallToolRequest
				req.Params.Name, req.Params.Arguments = call.tool, call.args
				ctx, cancel := context.WithTimeout(t.Context(), waitLimit)
				res, err := c.CallTool(ctx, req)
				cancel()
				if err != nil {
					t.Fatalf("%s %v: %v", call.tool, call.args, err)
				}
				text := firstText(t, res)
				if !res.IsError {
					t.Errorf("%s %v: IsError = false; text %q", call.tool, call.args, text)
				}
				if got := strings.Contains(text, "Invalid argument"); got != tt.invalid {
					t.Errorf("%s %v: %q says invalid argument: %v, want %v", call.tool, call.args, text, got, tt.invalid)
				}
				for _, w := range tt.want {
					if !strings.Contains(text, w) {
						t.Errorf("%s %v: %q does not contain %q", call.tool, call.args, text, w)
					}
				}
				if strings.Contains(text, "\n") {
					t.Errorf("%s %v: %q is more than one line", call.tool, call.args, text)
				}
			}
		})
	}
}
