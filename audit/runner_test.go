package audit

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/safe-run/safe-run/sandbox"
)

// memLog keeps records in memory; with err set, Append fails instead.
type memLog struct {
	mu      sync.Mutex
	records []Record
	err     error
	calls   int
}

func (l *memLog) Append(rec Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls++
	if l.err != nil {
		return l.err
	}
	l.records = append(l.records, rec)
	return nil
}

// fakeBackend is a sandbox.Runner and sandbox.Sessions that answers every
// call with result, info, file and err, and counts the calls that reach it.
type fakeBackend struct {
	result sandbox.Result
	info   sandbox.SessionInfo
	file   sandbox.OutputFile
	err    error
	policy sandbox.Policy
	calls  int
}

func (b *fakeBackend) Run(ctx context.Context, job sandbox.Job) (sandbox.Result, error) {
	b.calls++
	return b.result, b.err
}

func (b *fakeBackend) RunInSession(ctx context.Context, id string, job sandbox.Job) (sandbox.Result, error) {
	b.calls++
	return b.result, b.err
}

func (b *fakeBackend) CreateSession(ctx context.Context, spec sandbox.SessionSpec) (sandbox.SessionInfo, error) {
	b.calls++
	return b.info, b.err
}

func (b *fakeBackend) WriteFiles(ctx context.Context, id string, files []sandbox.File) error {
	b.calls++
	return b.err
}

func (b *fakeBackend) ReadFile(ctx context.Context, id, path string) (sandbox.OutputFile, error) {
	b.calls++
	return b.file, b.err
}

func (b *fakeBackend) ListFiles(ctx context.Context, id, dir string) ([]sandbox.OutputFile, error) {
	b.calls++
	return []sandbox.OutputFile{b.file}, b.err
}

func (b *fakeBackend) CloseSession(ctx context.Context, id string) error {
	b.calls++
	return b.err
}

func (b *fakeBackend) ListSessions() []sandbox.SessionInfo { return []sandbox.SessionInfo{b.info} }
func (b *fakeBackend) Policy() sandbox.Policy              { return b.policy }

const sid = "session-0123456789abcdef"

// calls are the decorator's methods that record, by event.
var calls = map[string]func(ctx context.Context, r *Runner) error{
	EventRun: func(ctx context.Context, r *Runner) error {
		_, err := r.Run(ctx, sandbox.Job{Language: "python", Code: "print(1)", Limits: sandbox.Limits{Timeout: 5 * time.Second}})
		return err
	},
	"run in session": func(ctx context.Context, r *Runner) error {
		_, err := r.RunInSession(ctx, sid, sandbox.Job{Language: "python", Code: "x"})
		return err
	},
	EventCreateSession: func(ctx context.Context, r *Runner) error {
		_, err := r.CreateSession(ctx, sandbox.SessionSpec{Language: "bash"})
		return err
	},
	EventWriteFile: func(ctx context.Context, r *Runner) error {
		return r.WriteFiles(ctx, sid, []sandbox.File{{Path: "data/a.csv", Data: []byte("x")}})
	},
	EventReadFile: func(ctx context.Context, r *Runner) error {
		_, err := r.ReadFile(ctx, sid, "out/b.png")
		return err
	},
	EventListFiles: func(ctx context.Context, r *Runner) error {
		_, err := r.ListFiles(ctx, sid, "out")
		return err
	},
	EventCloseSession: func(ctx context.Context, r *Runner) error { return r.CloseSession(ctx, sid) },
	EventSessionEnd: func(ctx context.Context, r *Runner) error {
		r.SessionEnded(sandbox.SessionInfo{ID: sid, Language: "node", Created: time.Now().Add(-time.Minute)}, "idle timeout")
		return nil
	},
}

func TestRunnerRecords(t *testing.T) {
	def, _, _ := sandbox.Policy{}.Limits()
	withTimeout := def
	withTimeout.Timeout = 5 * time.Second
	exit := func(n int) *int { return &n }
	ran := sandbox.Result{Status: sandbox.StatusError, ExitCode: 3, DurationMS: 150, StdoutBytes: 10, StderrBytes: 5,
		MemoryPeakBytes: 40 << 20, Message: "exit 3"}
	failure := sandbox.ErrNoSession
	tests := []struct {
		name, call string
		backend    fakeBackend
		want       Record // Time is checked apart
		client     bool   // the record carries the request id and client
	}{
		{"run", EventRun, fakeBackend{result: ran},
			Record{Event: EventRun, Language: "python", Code: "print(1)", Limits: LimitsOf(withTimeout), Status: "error",
				ExitCode: exit(3), DurationMS: 150, MemoryPeakBytes: 40 << 20, OutputBytes: 15, Message: "exit 3"}, true},
		{"cached run", EventRun, fakeBackend{result: sandbox.Result{Status: sandbox.StatusOK, Cached: true}},
			Record{Event: EventRun, Language: "python", Code: "print(1)", Limits: LimitsOf(withTimeout), Status: "ok",
				ExitCode: exit(0), Cached: true}, true},
		{"refused run", EventRun, fakeBackend{err: errors.New("no runsc")},
			Record{Event: EventRun, Language: "python", Code: "print(1)", Limits: LimitsOf(withTimeout), Status: "refused",
				Message: "no runsc"}, true},
		{"run in session", "run in session", fakeBackend{result: sandbox.Result{Status: sandbox.StatusOK, StdoutBytes: 3}},
			Record{Event: EventRun, SessionID: sid, Language: "python", Code: "x", Limits: LimitsOf(def), Status: "ok",
				ExitCode: exit(0), OutputBytes: 3}, true},
		{"create_session", EventCreateSession, fakeBackend{info: sandbox.SessionInfo{ID: sid, Language: "bash"}},
			Record{Event: EventCreateSession, SessionID: sid, Language: "bash", Status: "ok"}, true},
		{"create_session refused", EventCreateSession, fakeBackend{err: sandbox.ErrTooManySessions},
			Record{Event: EventCreateSession, Language: "bash", Status: "error", Message: sandbox.ErrTooManySessions.Error()}, true},
		{"write_file", EventWriteFile, fakeBackend{},
			Record{Event: EventWriteFile, SessionID: sid, Path: "data/a.csv", Status: "ok"}, true},
		{"read_file of no session", EventReadFile, fakeBackend{err: failure},
			Record{Event: EventReadFile, SessionID: sid, Path: "out/b.png", Status: "error", Message: failure.Error()}, true},
		{"list_files", EventListFiles, fakeBackend{},
			Record{Event: EventListFiles, SessionID: sid, Path: "out", Status: "ok"}, true},
		{"close_session", EventCloseSession, fakeBackend{},
			Record{Event: EventCloseSession, SessionID: sid, Status: "ok"}, true},
		{"session_end", EventSessionEnd, fakeBackend{},
			Record{Event: EventSessionEnd, SessionID: sid, Language: "node", Status: "ok", Message: "idle timeout", DurationMS: 60000}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			log := &memLog{}
			backend := tt.backend
			r := &Runner{Runner: &backend, Sessions: &backend, Log: log, Logger: quiet()}
			ctx := sandbox.WithRequestID(sandbox.WithClient(t.Context(), sandbox.Client{Name: "claude", Version: "2.1"}), "17")
			before := time.Now()
			err := calls[tt.call](ctx, r)
			if !errors.Is(err, tt.backend.err) {
				t.Errorf("error %v; want the backend's, %v", err, tt.backend.err)
			}
			if len(log.records) != 1 {
				t.Fatalf("%d records; want 1", len(log.records))
			}
			got := log.records[0]
			if got.Time.Before(before) || got.Time.After(time.Now()) {
				t.Errorf("time %v; want the time of the call", got.Time)
			}
			got.Time = time.Time{}
			if tt.client {
				tt.want.RequestID, tt.want.ClientName, tt.want.ClientVersion = "17", "claude", "2.1"
			}
			if tt.call == EventSessionEnd && got.DurationMS >= 60000 && got.DurationMS < 61000 {
				got.DurationMS = 60000 // the minute since Created, give or take the test's own time
			}
			if a, b := mustJSON(t, got), mustJSON(t, tt.want); a != b {
				t.Errorf("record\n %s\nwant\n %s", a, b)
			}
		})
	}
}

func mustJSON(t *testing.T, rec Record) string {
	t.Helper()
	line, err := encodeRecord(rec)
	if err != nil {
		t.Fatal(err)
	}
	return string(line)
}

// The first record that cannot be written withholds its call's result;
// every later call that would run code or touch a session is refused,
// before it reaches the backend, with an error of class ErrUnavailable.
func TestRunnerStopsAfterAuditFailure(t *testing.T) {
	for first := range calls {
		t.Run(first, func(t *testing.T) {
			log := &memLog{err: errors.New("no space left on device")}
			backend := &fakeBackend{result: sandbox.Result{Status: sandbox.StatusOK, Stdout: "secret"}, info: sandbox.SessionInfo{ID: sid}}
			var logBuf bytes.Buffer
			r := &Runner{Runner: backend, Sessions: backend, Log: log, Logger: slog.New(slog.NewTextHandler(&logBuf, nil))}
			err := calls[first](t.Context(), r)
			var failed *FailedError
			if first != EventSessionEnd {
				if !errors.As(err, &failed) || !failed.Ran || sandbox.Class(err) != sandbox.ErrUnavailable ||
					!strings.Contains(err.Error(), "no space left on device") {
					t.Fatalf("the call whose record failed: %v (class %v); want a withheld result of class unavailable", err, sandbox.Class(err))
				}
			}
			if log := logBuf.String(); !strings.Contains(log, "level=ERROR") || !strings.Contains(log, "no space left on device") ||
				!strings.Contains(log, "event="+strings.Replace(first, "run in session", EventRun, 1)) {
				t.Errorf("the process log lacks the failure and the record: %s", log)
			}
			reached, appended := backend.calls, log.calls
			for call, do := range calls {
				err := do(t.Context(), r)
				switch call {
				case EventCloseSession, EventSessionEnd:
					continue // they free, and are never refused
				}
				if !errors.As(err, &failed) || failed.Ran || sandbox.Class(err) != sandbox.ErrUnavailable ||
					!strings.Contains(err.Error(), "refused") {
					t.Errorf("%s after the failure: %v (class %v); want a refusal of class unavailable", call, err, sandbox.Class(err))
				}
			}
			if backend.calls != reached+1 { // the close alone
				t.Errorf("%d calls reached the backend after the failure; want only the close", backend.calls-reached)
			}
			if log.calls != appended {
				t.Errorf("%d more appends after the failure; want none", log.calls-appended)
			}
		})
	}
}

// A run of code records its code's hash in the process log when the
// record is lost, and the policy the record's limits come from is the
// wrapped runner's.
func TestRunnerLostRunAndPolicy(t *testing.T) {
	policy := sandbox.Policy{Default: sandbox.Limits{MemoryBytes: 64 << 20}}
	backend := &fakeBackend{policy: policy}
	var logBuf bytes.Buffer
	r := &Runner{Runner: backend, Log: &memLog{err: errors.New("disk full")}, Logger: slog.New(slog.NewTextHandler(&logBuf, nil))}
	if r.Policy().Default.MemoryBytes != 64<<20 {
		t.Errorf("policy %+v; want the runner's", r.Policy())
	}
	if p := (&Runner{Runner: &sandbox.ResultCache{Runner: backend}}).Policy(); p.Default.MemoryBytes != 64<<20 {
		t.Errorf("policy through a result cache %+v; want the runner's", p)
	}
	if _, err := r.Run(t.Context(), sandbox.Job{Language: "bash", Code: "echo hi"}); err == nil {
		t.Fatal("a run whose record failed returned its result")
	}
	if !strings.Contains(logBuf.String(), "code_sha256="+HashCode("echo hi")) {
		t.Errorf("the process log lacks the code's hash: %s", logBuf.String())
	}

	log := &memLog{}
	r = &Runner{Runner: backend, Log: log}
	if _, err := r.Run(t.Context(), sandbox.Job{Language: "bash", Code: "echo hi"}); err != nil {
		t.Fatal(err)
	}
	if got := log.records[0].Limits.MemoryBytes; got != 64<<20 {
		t.Errorf("recorded memory limit %d; want the policy's default, %d", got, 64<<20)
	}
}
