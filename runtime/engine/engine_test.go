package engine_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/safe-run/safe-run/agent"
	"github.com/safe-run/safe-run/runtime/engine"
	"github.com/safe-run/safe-run/sandbox"
)

// TestRunResults drives one-shot runs through every way a run can end, with
// agents that answer, misbehave or die, and checks how each is classified.
func TestRunResults(t *testing.T) {
	run := func(h func(a *fakeAgent, req agent.Request) []agent.Event) func(a *fakeAgent) {
		return serve(replies(h))
	}
	flood := func(a *fakeAgent) bool { // more event data than any request allows
		chunk := stdout(strings.Repeat("x", 64<<10))
		for range 40 {
			if !a.send(chunk) {
				return false
			}
		}
		return true
	}
	for _, tc := range []struct {
		name     string
		agent    func(a *fakeAgent)
		startErr error
		readyErr error
		limits   sandbox.Limits
		cancel   bool // cancel the run once the agent has its request
		status   sandbox.Status
		code     int
		signal   string
		stdout   string
		message  string // a part of the result's message
		class    error  // of Result.Err, for a sandbox_error
	}{
		{name: "ok", agent: run(func(a *fakeAgent, req agent.Request) []agent.Event {
			return append([]agent.Event{stdout("hello\n")}, exit(agent.Exit{StdoutBytes: 6})...)
		}), status: sandbox.StatusOK, stdout: "hello\n"},
		{name: "exit code", agent: run(func(a *fakeAgent, req agent.Request) []agent.Event {
			return exit(agent.Exit{Code: 3})
		}), status: sandbox.StatusError, code: 3, message: "exited with code 3"},
		{name: "timeout reported by the agent", agent: run(func(a *fakeAgent, req agent.Request) []agent.Event {
			return exit(agent.Exit{Code: -1, TimedOut: true, Signal: "SIGKILL"})
		}), status: sandbox.StatusTimeout, code: -1, message: "did not finish within its 30s timeout"},
		{name: "timeout at the host's deadline", agent: run(func(a *fakeAgent, req agent.Request) []agent.Event {
			a.hang()
			return nil
		}), limits: sandbox.Limits{Timeout: 10 * time.Millisecond}, status: sandbox.StatusTimeout, code: -1, message: "within its 10ms timeout"},
		{name: "oom: the sandbox was killed", agent: run(func(a *fakeAgent, req agent.Request) []agent.Event {
			a.oom()
			return nil
		}), status: sandbox.StatusOOM, code: -1, message: "exceeded its memory limit of 512MiB"},
		{name: "oom: the agent still reported", agent: run(func(a *fakeAgent, req agent.Request) []agent.Event {
			a.oom()
			return exit(agent.Exit{Code: -1, Signal: "SIGKILL"})
		}), status: sandbox.StatusOOM, code: -1, message: "memory limit"},
		{name: "killed by a signal", agent: run(func(a *fakeAgent, req agent.Request) []agent.Event {
			return exit(agent.Exit{Code: -1, Signal: "SIGSEGV"})
		}), status: sandbox.StatusKilled, code: -1, signal: "SIGSEGV", message: "killed by SIGSEGV"},
		{name: "cancelled", agent: run(func(a *fakeAgent, req agent.Request) []agent.Event {
			a.hang()
			return nil
		}), cancel: true, status: sandbox.StatusKilled, code: -1, message: "cancelled"},
		{name: "start failure", startErr: errors.New("no runsc"),
			status: sandbox.StatusSandboxError, code: -1, message: "no runsc", class: sandbox.ErrUnavailable},
		{name: "start failure keeps its class", startErr: sandbox.WithClass(errors.New("disk full"), sandbox.ErrExhausted),
			status: sandbox.StatusSandboxError, code: -1, message: "disk full", class: sandbox.ErrExhausted},
		{name: "agent never ready", agent: func(a *fakeAgent) {},
			status: sandbox.StatusSandboxError, code: -1, message: "did not start (fake agent exited)", class: sandbox.ErrUnavailable},
		{name: "garbage instead of Ready", agent: func(a *fakeAgent) { a.raw("hello?\n") },
			status: sandbox.StatusSandboxError, code: -1, message: "did not start", class: sandbox.ErrUnavailable},
		{name: "garbage instead of Ready, and the agent stays", agent: func(a *fakeAgent) { a.raw("hello?\n"); a.hang() },
			status: sandbox.StatusSandboxError, code: -1, message: "did not start", class: sandbox.ErrUnavailable},
		{name: "too much before Ready", agent: func(a *fakeAgent) { flood(a) },
			status: sandbox.StatusSandboxError, code: -1, message: "did not start", class: sandbox.ErrUnavailable},
		{name: "the backend refuses the ready sandbox", agent: serve(printCode), readyErr: errors.New("cannot watch its memory"),
			status: sandbox.StatusSandboxError, code: -1, message: "cannot watch its memory", class: sandbox.ErrUnavailable},
		{name: "died without a report", agent: run(func(a *fakeAgent, req agent.Request) []agent.Event {
			return nil
		}), status: sandbox.StatusSandboxError, code: -1, message: "ended without a report (fake agent exited)", class: sandbox.ErrUnavailable},
		{name: "the agent could not run the program", agent: run(func(a *fakeAgent, req agent.Request) []agent.Event {
			return exit(agent.Exit{Code: -1, Error: "python3: not found"})
		}), status: sandbox.StatusSandboxError, code: -1, message: "could not run the python program: python3: not found", class: sandbox.ErrUnavailable},
		{name: "malformed event, then the agent exits", agent: run(func(a *fakeAgent, req agent.Request) []agent.Event {
			a.raw("{\"exit\": nope}\n")
			return nil
		}), status: sandbox.StatusSandboxError, code: -1, message: "malformed event from the sandbox", class: sandbox.ErrUnavailable},
		{name: "malformed event, and the agent stays", agent: run(func(a *fakeAgent, req agent.Request) []agent.Event {
			a.raw("{\"exit\": nope}\n")
			a.hang()
			return nil
		}), status: sandbox.StatusSandboxError, code: -1, message: "malformed event from the sandbox", class: sandbox.ErrUnavailable},
		{name: "events over budget, then the agent exits", agent: run(func(a *fakeAgent, req agent.Request) []agent.Event {
			flood(a)
			return nil
		}), limits: sandbox.Limits{OutputBytes: sandbox.KiB},
			status: sandbox.StatusSandboxError, code: -1, message: "more event data than the request allows", class: sandbox.ErrUnavailable},
		{name: "events over budget, and the agent goes on", agent: run(func(a *fakeAgent, req agent.Request) []agent.Event {
			for flood(a) {
			}
			return nil
		}), limits: sandbox.Limits{OutputBytes: sandbox.KiB},
			status: sandbox.StatusSandboxError, code: -1, message: "more event data than the request allows", class: sandbox.ErrUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := make(chan struct{}, 1) // the agent has the request
			agentFn := tc.agent
			if agentFn == nil {
				agentFn = serve(printCode)
			}
			b := &fakeBackend{startErr: tc.startErr, readyErr: tc.readyErr, agent: agentFn}
			if tc.cancel {
				b.agent = serve(replies(func(a *fakeAgent, req agent.Request) []agent.Event {
					got <- struct{}{}
					a.hang()
					return nil
				}))
			}
			e := newEngine(t, b, engine.Config{})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.cancel {
				go func() { <-got; cancel() }()
			}
			res, err := e.Run(ctx, sandbox.Job{Language: "python", Code: "print('hello')", Limits: tc.limits})
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if res.Status != tc.status || res.ExitCode != tc.code || res.Signal != tc.signal {
				t.Errorf("status %s, exit code %d, signal %q; want %s, %d, %q (message %q)",
					res.Status, res.ExitCode, res.Signal, tc.status, tc.code, tc.signal, res.Message)
			}
			if !strings.Contains(res.Message, tc.message) {
				t.Errorf("message %q does not say %q", res.Message, tc.message)
			}
			if tc.stdout != "" && res.Stdout != tc.stdout {
				t.Errorf("stdout %q, want %q", res.Stdout, tc.stdout)
			}
			switch {
			case tc.class != nil && sandbox.Class(res.Err) != tc.class:
				t.Errorf("error %v is of class %v, want %v", res.Err, sandbox.Class(res.Err), tc.class)
			case tc.class == nil && res.Err != nil:
				t.Errorf("a %s result carries error %v", res.Status, res.Err)
			}
			if tc.startErr == nil && (res.SandboxID == "" || b.sandbox(res.SandboxID) == nil) {
				t.Errorf("result names sandbox %q, not one the backend started", res.SandboxID)
			}
			if tc.startErr == nil && res.MemoryPeakBytes != 42<<20 && res.Status != sandbox.StatusSandboxError {
				t.Errorf("memory peak %d, want the backend's usage", res.MemoryPeakBytes)
			}
		})
	}
}

// TestRunRequest checks what the agent is asked: the program as its
// language's file, the job's files and stdin, the limits that travel with
// the request, and the output caps.
func TestRunRequest(t *testing.T) {
	var got agent.Request
	var spec engine.StartSpec
	b := newFake(replies(func(a *fakeAgent, req agent.Request) []agent.Event {
		got, spec = req, a.spec
		return exit(agent.Exit{})
	}))
	pol := sandbox.Policy{OutputFiles: sandbox.OutputFileLimits{MaxFiles: 3, MaxFileBytes: 100, MaxTotalBytes: 200}}
	e := newEngine(t, b, engine.Config{Policy: pol})
	job := sandbox.Job{Language: "bash", Code: "cat in.txt", Stdin: []byte("input"), OutputDir: "out",
		Files:  []sandbox.File{{Path: "in.txt", Data: []byte("data")}, {Path: "run.sh", Data: []byte("x"), Executable: true}},
		Limits: sandbox.Limits{Timeout: 5 * time.Second, OutputBytes: 2 * sandbox.KiB, MemoryBytes: 128 * sandbox.MiB}}
	res, err := e.Run(context.Background(), job)
	if err != nil || res.Status != sandbox.StatusOK {
		t.Fatalf("Run: %v, %+v", err, res)
	}
	want := agent.Request{
		Files: []agent.File{{Path: "main.sh", Data: []byte("cat in.txt")}, {Path: "in.txt", Data: []byte("data"), Mode: 0o644},
			{Path: "run.sh", Data: []byte("x"), Mode: 0o755}},
		Argv: []string{"bash", "main.sh"}, Stdin: []byte("input"), Timeout: 5 * time.Second, OutputBytes: 2 * sandbox.KiB,
		Collect: &agent.Collect{Dir: "out", MaxFiles: 3, MaxFileBytes: 100, MaxTotalBytes: 200},
	}
	if g, w := jsonOf(t, got), jsonOf(t, want); g != w {
		t.Errorf("request\n%s\nwant\n%s", g, w)
	}
	if spec.KeepAlive || spec.Job.Limits.MemoryBytes != 128*sandbox.MiB || spec.Job.Language != "bash" {
		t.Errorf("start spec %+v: want a one-shot sandbox with the job's limits", spec)
	}
}

// TestRunOutputCaps checks the assembly of each stream from the agent's
// head events and its tail in Exit, the host's own cap when the agent sends
// more than it may, the truncation markers and the live copies.
func TestRunOutputCaps(t *testing.T) {
	const capBytes = 1024
	head := strings.Repeat("h", capBytes/2)
	tail := strings.Repeat("t", capBytes/2)
	for _, tc := range []struct {
		name      string
		events    []agent.Event
		exit      agent.Exit
		stdout    string
		stderr    string
		truncated bool
		total     int64
	}{
		{name: "within the cap", events: []agent.Event{stdout("ab"), {Output: &agent.Output{Stream: agent.Stderr, Data: []byte("e")}}},
			exit: agent.Exit{StdoutBytes: 2, StderrBytes: 1}, stdout: "ab", stderr: "e", total: 2},
		{name: "the agent dropped the middle", events: []agent.Event{stdout(head)},
			exit:   agent.Exit{StdoutBytes: 5000, StdoutTail: []byte(tail)},
			stdout: head + engine.OmittedMarker(5000-capBytes) + tail, truncated: true, total: 5000},
		{name: "the agent sends more than the cap", events: []agent.Event{stdout(head), stdout(head), stdout(strings.Repeat("z", capBytes))},
			exit:   agent.Exit{StdoutBytes: 0},
			stdout: head + engine.OmittedMarker(capBytes) + strings.Repeat("z", capBytes/2), truncated: true, total: 2 * capBytes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newFake(replies(func(a *fakeAgent, req agent.Request) []agent.Event {
				return append(append([]agent.Event{}, tc.events...), exit(tc.exit)...)
			}))
			e := newEngine(t, b, engine.Config{})
			var liveOut, liveErr bytes.Buffer
			res, err := e.Run(context.Background(), sandbox.Job{Language: "python", Code: "x", Stdout: &liveOut, Stderr: &liveErr,
				Limits: sandbox.Limits{OutputBytes: capBytes}})
			if err != nil || res.Status != sandbox.StatusOK {
				t.Fatalf("Run: %v, %s %s", err, res.Status, res.Message)
			}
			if res.Stdout != tc.stdout || res.StdoutTruncated != tc.truncated || res.StdoutBytes != tc.total {
				t.Errorf("stdout %q truncated %v total %d; want %q %v %d", res.Stdout, res.StdoutTruncated, res.StdoutBytes,
					tc.stdout, tc.truncated, tc.total)
			}
			if res.Stderr != tc.stderr || res.StderrTruncated {
				t.Errorf("stderr %q truncated %v; want %q", res.Stderr, res.StderrTruncated, tc.stderr)
			}
			if liveOut.String() != res.Stdout || liveErr.String() != res.Stderr {
				t.Errorf("live copies %q, %q differ from the result's", liveOut.String(), liveErr.String())
			}
		})
	}
}

// TestRunOutputFiles checks that the engine applies the policy's caps on
// output files itself, whatever the agent returns: per file, in total, in
// number, and names that cannot be in the directory are dropped.
func TestRunOutputFiles(t *testing.T) {
	files := []agent.OutputFile{
		{Path: "a.txt", Size: 5, Data: []byte("aaaaa")},
		{Path: "../escape", Size: 1, Data: []byte("e")},
		{Path: "/etc/passwd", Size: 1, Data: []byte("p")},
		{Path: "big.bin", Size: 11, Data: []byte("bbbbbbbbbbb")},
		{Path: "c.txt", Size: 8, Data: []byte("cccccccc")},
		{Path: "link", Size: 9, Skipped: "symbolic link (not followed)"},
		{Path: "d.txt", Size: 1, Data: []byte("d")},
	}
	b := newFake(replies(func(a *fakeAgent, req agent.Request) []agent.Event {
		return exit(agent.Exit{Files: files})
	}))
	pol := sandbox.Policy{OutputFiles: sandbox.OutputFileLimits{MaxFiles: 4, MaxFileBytes: 10, MaxTotalBytes: 12}}
	e := newEngine(t, b, engine.Config{Policy: pol})
	for _, dir := range []string{"out", ""} {
		res, err := e.Run(context.Background(), sandbox.Job{Language: "python", Code: "x", OutputDir: dir})
		if err != nil || res.Status != sandbox.StatusOK {
			t.Fatalf("Run: %v, %+v", err, res)
		}
		if dir == "" {
			if len(res.Files) != 0 {
				t.Errorf("a job without an output directory got files %+v", res.Files)
			}
			continue
		}
		want := []sandbox.OutputFile{
			{Path: "a.txt", Size: 5, Data: []byte("aaaaa")},
			{Path: "big.bin", Size: 11, Skipped: "larger than the per-file limit"},
			{Path: "c.txt", Size: 8, Skipped: "over the total limit of output files"},
			{Path: "link", Size: 9, Skipped: "symbolic link (not followed)"},
		}
		if g, w := jsonOfFiles(t, res.Files), jsonOfFiles(t, want); g != w {
			t.Errorf("files\n%s\nwant\n%s", g, w)
		}
	}
}

// TestRunRefusesInvalidJobs: an invalid job is an error of class invalid,
// and no sandbox starts for it.
func TestRunRefusesInvalidJobs(t *testing.T) {
	b := newFake(printCode)
	e := newEngine(t, b, engine.Config{})
	for _, job := range []sandbox.Job{
		{Language: "cobol", Code: "x"},
		{Language: "python", Code: " "},
		{Language: "python", Code: "x", Limits: sandbox.Limits{Timeout: time.Nanosecond}},
		{Language: "python", Code: "x", Image: "evil"},
	} {
		if _, err := e.Run(context.Background(), job); sandbox.Class(err) != sandbox.ErrInvalid {
			t.Errorf("Run(%+v): %v, want an error of class invalid", job, err)
		}
	}
	if n := len(b.sandboxes()); n != 0 {
		t.Errorf("%d sandboxes started for invalid jobs", n)
	}
}

// jsonOf renders v for comparison.
func jsonOf(t *testing.T, v any) string {
	t.Helper()
	data, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// jsonOfFiles renders files with their data, which their JSON form omits.
func jsonOfFiles(t *testing.T, files []sandbox.OutputFile) string {
	type file struct {
		sandbox.OutputFile
		Data string
	}
	var out []file
	for _, f := range files {
		out = append(out, file{f, string(f.Data)})
	}
	return jsonOf(t, out)
}

// TestRunCancelledBeforeReady: a run cancelled while its sandbox starts is
// killed, and its sandbox destroyed.
func TestRunCancelledBeforeReady(t *testing.T) {
	started := make(chan struct{})
	b := &fakeBackend{agent: func(a *fakeAgent) { close(started); a.hang() }}
	e := newEngine(t, b, engine.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-started; cancel() }()
	res, err := e.Run(ctx, sandbox.Job{Language: "python", Code: "x"})
	if err != nil || res.Status != sandbox.StatusKilled || !strings.Contains(res.Message, "cancelled") {
		t.Errorf("Run: %v, %s: %s", err, res.Status, res.Message)
	}
	if err := e.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := e.LiveSandboxes(); n != 0 {
		t.Errorf("%d sandboxes live after the run", n)
	}
}

// TestRunObservesStart: ObserveStart hears of each sandbox that came up.
func TestRunObservesStart(t *testing.T) {
	var n atomic.Int32
	e := newEngine(t, newFake(printCode), engine.Config{ObserveStart: func(time.Duration) { n.Add(1) }})
	for range 3 {
		if _, err := e.Run(context.Background(), sandbox.Job{Language: "python", Code: "x"}); err != nil {
			t.Fatal(err)
		}
	}
	if got := n.Load(); got != 3 {
		t.Errorf("ObserveStart heard %d starts of 3", got)
	}
}

// TestRunsInParallel runs many jobs at once, pooled and cold, so that the
// race detector sees the engine's shared state under load.
func TestRunsInParallel(t *testing.T) {
	b := newFakeCheckpointer(printCode)
	e := newEngine(t, b, engine.Config{Pool: engine.PoolConfig{Size: map[string]int{"python": 2, "node": 1}}})
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			lang := []string{"python", "node", "bash"}[i%3]
			code := fmt.Sprintf("job %d", i)
			res, err := e.Run(context.Background(), sandbox.Job{Language: lang, Code: code})
			if err != nil || res.Status != sandbox.StatusOK || res.Stdout != code {
				t.Errorf("job %d: %v, %s %q: %s", i, err, res.Status, res.Stdout, res.Message)
			}
		})
	}
	wg.Wait()
}

// TestRunCleanupFailure: a run whose sandbox could not be removed keeps its
// result as it was, reported before the removal, and the failure is
// logged; Wait returns once the removal is over.
func TestRunCleanupFailure(t *testing.T) {
	for _, tc := range []struct {
		code    string
		status  sandbox.Status
		message string
	}{
		{"x", sandbox.StatusError, "the program exited with code 2"},
		{"fail", sandbox.StatusKilled, "the program was killed by SIGSEGV"},
	} {
		b := newFake(replies(func(a *fakeAgent, req agent.Request) []agent.Event {
			if string(req.Files[0].Data) == "fail" {
				return exit(agent.Exit{Code: -1, Signal: "SIGSEGV"})
			}
			return exit(agent.Exit{Code: 2})
		}))
		b.destroyErr = errors.New("cgroup busy")
		var logged lockedBuffer
		e := newEngine(t, b, engine.Config{Logger: slog.New(slog.NewTextHandler(&logged, nil))})
		res, err := e.Run(context.Background(), sandbox.Job{Language: "python", Code: tc.code})
		if err != nil || res.Status != tc.status || res.Message != tc.message {
			t.Errorf("Run %q: %v, %s: %q; want %s: %q", tc.code, err, res.Status, res.Message, tc.status, tc.message)
		}
		if err := e.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		// Logged just after the backend counts the sandbox gone.
		eventually(t, "the failed removal is logged", func() bool {
			log := logged.String()
			return strings.Contains(log, "clean up sandbox after its run") && strings.Contains(log, "cgroup busy")
		})
	}
}

// TestRunReportsBeforeCleanup: a one-shot run's result comes back while its
// sandbox is still being removed, and Wait waits for the removal.
func TestRunReportsBeforeCleanup(t *testing.T) {
	for _, pool := range []int{0, 1} {
		release := make(chan struct{})
		b := newFake(printCode)
		held := &heldDestroy{fakeBackend: b, release: release}
		e := newEngine(t, held, engine.Config{Pool: engine.PoolConfig{Size: map[string]int{"python": pool}}})
		if pool > 0 {
			eventually(t, "the pool fills", func() bool { return e.PoolSizes()["python"] == 1 })
		}
		done := make(chan sandbox.Result, 1)
		go func() {
			res, _ := e.Run(context.Background(), sandbox.Job{Language: "python", Code: "x"})
			done <- res
		}()
		var res sandbox.Result
		select {
		case res = <-done:
		case <-time.After(10 * time.Second): // only catches a run that waits for the held removal
			close(release)
			t.Fatalf("pool %d: the run waits for its sandbox's removal", pool)
		}
		if res.Status != sandbox.StatusOK {
			t.Fatalf("pool %d: Run: %s: %s", pool, res.Status, res.Message)
		}
		if sb := b.sandbox(res.SandboxID); sb.isDestroyed() {
			t.Errorf("pool %d: the sandbox was removed before the result came back", pool)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		if err := e.Wait(ctx); err == nil {
			t.Errorf("pool %d: Wait returned while a removal was held", pool)
		}
		cancel()
		close(release)
		e.Close()
		if err := e.Wait(context.Background()); err != nil || !b.sandbox(res.SandboxID).isDestroyed() {
			t.Errorf("pool %d: after Wait (%v), the run's sandbox is not destroyed", pool, err)
		}
	}
}

// heldDestroy holds every Destroy of its sandboxes until release closes.
type heldDestroy struct {
	*fakeBackend
	release chan struct{}
}

func (h *heldDestroy) Start(spec engine.StartSpec) (engine.Sandbox, error) {
	sb, err := h.fakeBackend.Start(spec)
	if err != nil {
		return nil, err
	}
	return &heldSandbox{sb.(*fakeSandbox), h.release}, nil
}

type heldSandbox struct {
	*fakeSandbox
	release chan struct{}
}

func (s *heldSandbox) Destroy() error {
	<-s.release
	return s.fakeSandbox.Destroy()
}

// lockedBuffer is a bytes.Buffer safe for concurrent writes, for logs.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestPoolCloseDuringBackoff: while the pool's refills fail, runs start
// cold (and report the failure), and closing the engine does not hang on
// the filler waiting to retry.
func TestPoolCloseDuringBackoff(t *testing.T) {
	b := newFake(printCode)
	b.setStartErr(errors.New("runsc is broken"))
	var tries atomic.Int32
	e := newEngine(t, &countingBackend{b, &tries}, engine.Config{Pool: engine.PoolConfig{Size: map[string]int{"python": 1}}})
	eventually(t, "the filler tries to start a sandbox", func() bool { return tries.Load() > 0 })
	res, err := e.Run(context.Background(), sandbox.Job{Language: "python", Code: "x"})
	if err != nil || res.Status != sandbox.StatusSandboxError || !strings.Contains(res.Message, "runsc is broken") {
		t.Errorf("Run while the backend is broken: %v, %s: %s", err, res.Status, res.Message)
	}
	if got := e.PoolSizes(); got["python"] != 0 {
		t.Errorf("PoolSizes = %v", got)
	}
	closed := make(chan struct{})
	go func() { e.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second): // the backoff is 1 s; this bound only catches a hang
		t.Fatalf("Close did not return while the pool waited to retry")
	}
}

// countingBackend counts the starts of a fakeBackend.
type countingBackend struct {
	*fakeBackend
	starts *atomic.Int32
}

func (c *countingBackend) Start(spec engine.StartSpec) (engine.Sandbox, error) {
	c.starts.Add(1)
	return c.fakeBackend.Start(spec)
}
