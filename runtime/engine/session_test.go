package engine_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/safe-run/safe-run/agent"
	"github.com/safe-run/safe-run/runtime/engine"
	"github.com/safe-run/safe-run/sandbox"
)

// interpreter is a session agent with a tiny language: "n+=1" counts in
// the interpreter's state and prints the count; "die", "oom" and "hang" do
// what they say; "timeout" is a cell the agent interrupted at its timeout
// (killing the interpreter); "fail" exits with code 1. Files live in a
// workspace map; reading "crash" kills the agent.
var interpreter handler = func(a *fakeAgent, req agent.Request) []agent.Event {
	if a.state == nil {
		a.state, a.files = map[string]int{}, map[string][]byte{}
	}
	switch req.Op {
	case agent.OpEval:
		switch req.Code {
		case "n+=1":
			a.state["n"]++
			out := fmt.Sprint(a.state["n"])
			return append([]agent.Event{stdout(out)}, exit(agent.Exit{StdoutBytes: int64(len(out))})...)
		case "die":
			return nil
		case "oom":
			a.oom()
			return nil
		case "hang":
			a.hang()
			return nil
		case "timeout":
			clear(a.state)
			return exit(agent.Exit{Code: -1, Signal: "SIGKILL", TimedOut: true, StateLost: true})
		case "fail":
			return exit(agent.Exit{Code: 1})
		case "flood":
			for a.send(stdout(strings.Repeat("x", 64<<10))) {
			}
			return nil
		}
		return exit(agent.Exit{Error: "unknown cell " + req.Code})
	case agent.OpWrite:
		for _, f := range req.Files {
			if f.Path == "full" {
				return exit(agent.Exit{Error: "no space left on the workspace"})
			}
		}
		for _, f := range req.Files {
			a.files[f.Path] = f.Data
		}
		return exit(agent.Exit{})
	case agent.OpRead:
		switch req.Path {
		case "crash":
			return nil
		case "other":
			return exit(agent.Exit{Files: []agent.OutputFile{{Path: "secret", Data: []byte("x")}}})
		case "huge":
			return exit(agent.Exit{Files: []agent.OutputFile{{Path: "huge", Data: make([]byte, req.MaxBytes+1)}}})
		}
		data, ok := a.files[req.Path]
		if !ok {
			return exit(agent.Exit{Error: "no such file: " + req.Path})
		}
		return exit(agent.Exit{Files: []agent.OutputFile{{Path: req.Path, Size: int64(len(data)), Data: data, Type: "file"}}})
	case agent.OpList:
		var files []agent.OutputFile
		for _, name := range slices.Sorted(maps.Keys(a.files)) {
			files = append(files, agent.OutputFile{Path: name, Size: int64(len(a.files[name])), Type: "file"})
		}
		files = append(files, agent.OutputFile{Path: "../outside", Type: "file"}) // dropped by the engine
		return exit(agent.Exit{Files: files})
	}
	return exit(agent.Exit{Error: "unknown op " + req.Op})
}

// hangSignalled is interpreter, closing got when a cell hangs.
func hangSignalled(got chan struct{}) handler {
	return func(a *fakeAgent, req agent.Request) []agent.Event {
		if req.Code == "hang" {
			close(got)
		}
		return interpreter(a, req)
	}
}

// cell runs code in session id and fails the test on an error.
func cell(t *testing.T, e *engine.Engine, ctx context.Context, id, code string) sandbox.Result {
	t.Helper()
	res, err := e.RunInSession(ctx, id, sandbox.Job{Code: code})
	if err != nil {
		t.Fatalf("RunInSession(%q): %v", code, err)
	}
	return res
}

// TestSession drives one session through its life: calls that keep the
// interpreter's state, calls that lose it (the sandbox dying, killed for
// memory, a cell interrupted at its timeout), files, and close.
func TestSession(t *testing.T) {
	b := newFake(interpreter)
	var ended []string
	var endMu sync.Mutex
	e := newEngine(t, b, engine.Config{Sessions: engine.SessionConfig{OnEnd: func(info sandbox.SessionInfo, why string) {
		endMu.Lock()
		defer endMu.Unlock()
		ended = append(ended, info.ID+": "+why)
	}}})
	ctx := context.Background()
	info, err := e.CreateSession(ctx, sandbox.SessionSpec{Language: "python"})
	if err != nil {
		t.Fatalf("CreateSession: %v", err)
	}
	first := b.sandboxes()[0]
	if !first.spec.KeepAlive {
		t.Errorf("the session's sandbox was started one-shot")
	}
	if got := e.ListSessions(); len(got) != 1 || got[0].ID != info.ID || got[0].Language != "python" {
		t.Errorf("ListSessions = %+v", got)
	}

	steps := []struct {
		code      string
		status    sandbox.Status
		stdout    string
		stateLost bool
		fresh     bool   // the call ran in a new sandbox
		message   string // a part of the message
	}{
		{code: "n+=1", status: sandbox.StatusOK, stdout: "1"},
		{code: "n+=1", status: sandbox.StatusOK, stdout: "2"},
		{code: "fail", status: sandbox.StatusError, message: "the session keeps its state"},
		{code: "n+=1", status: sandbox.StatusOK, stdout: "3"},
		{code: "timeout", status: sandbox.StatusTimeout, stateLost: true, message: "variables and imports from earlier calls are gone"},
		{code: "n+=1", status: sandbox.StatusOK, stdout: "1"}, // same sandbox, new interpreter
		{code: "die", status: sandbox.StatusSandboxError, stateLost: true, message: "its next call starts a fresh sandbox"},
		{code: "n+=1", status: sandbox.StatusOK, stdout: "1", fresh: true},
		{code: "n+=1", status: sandbox.StatusOK, stdout: "2"},
		{code: "oom", status: sandbox.StatusOOM, stateLost: true, message: "memory limit"},
		{code: "n+=1", status: sandbox.StatusOK, stdout: "1", fresh: true},
		{code: "flood", status: sandbox.StatusSandboxError, stateLost: true, message: "more event data than the request allows"},
		{code: "n+=1", status: sandbox.StatusOK, stdout: "1", fresh: true},
	}
	sandboxID := first.id
	for i, st := range steps {
		res := cell(t, e, ctx, info.ID, st.code)
		if res.Status != st.status || res.StateLost != st.stateLost || st.stdout != "" && res.Stdout != st.stdout ||
			!strings.Contains(res.Message, st.message) {
			t.Errorf("step %d (%s): status %s, stdout %q, state lost %v, message %q; want %s, %q, %v, %q",
				i, st.code, res.Status, res.Stdout, res.StateLost, res.Message, st.status, st.stdout, st.stateLost, st.message)
		}
		if fresh := res.SandboxID != sandboxID; fresh != st.fresh {
			t.Errorf("step %d (%s): ran in sandbox %s after %s; want a fresh one: %v", i, st.code, res.SandboxID, sandboxID, st.fresh)
		}
		if st.status == sandbox.StatusSandboxError && sandbox.Class(res.Err) != sandbox.ErrUnavailable {
			t.Errorf("step %d (%s): error %v is of class %v", i, st.code, res.Err, sandbox.Class(res.Err))
		}
		sandboxID = res.SandboxID
	}
	if got := e.ListSessions(); len(got) != 1 || got[0].Calls != len(steps) {
		t.Errorf("ListSessions = %+v, want one session of %d calls", got, len(steps))
	}
	for _, sb := range b.sandboxes()[:len(b.sandboxes())-1] {
		if !sb.isDestroyed() {
			t.Errorf("sandbox %s, which the session left, was not destroyed", sb.id)
		}
	}

	// Files, then a file operation that kills the sandbox: the next cell
	// says the state was lost.
	if err := e.WriteFiles(ctx, info.ID, []sandbox.File{{Path: "data/a.txt", Data: []byte("alpha")}, {Path: "b.txt", Data: []byte("b")}}); err != nil {
		t.Fatalf("WriteFiles: %v", err)
	}
	f, err := e.ReadFile(ctx, info.ID, "data/a.txt")
	if err != nil || string(f.Data) != "alpha" || f.Size != 5 || f.Path != "data/a.txt" {
		t.Errorf("ReadFile = %+v, %v", f, err)
	}
	if _, err := e.ReadFile(ctx, info.ID, "missing"); sandbox.Class(err) != sandbox.ErrInvalid || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("ReadFile of a missing file: %v, want an input error", err)
	}
	if _, err := e.ReadFile(ctx, info.ID, "../etc/passwd"); sandbox.Class(err) != sandbox.ErrInvalid {
		t.Errorf("ReadFile outside the workspace: %v, want an input error", err)
	}
	list, err := e.ListFiles(ctx, info.ID, "")
	if err != nil || len(list) != 2 || list[0].Path != "b.txt" || list[1].Path != "data/a.txt" || list[1].Size != 5 {
		t.Errorf("ListFiles = %+v, %v", list, err)
	}
	if _, err := e.ReadFile(ctx, info.ID, "crash"); err == nil || !strings.Contains(err.Error(), "state was lost") {
		t.Errorf("ReadFile whose sandbox died: %v", err)
	}
	res := cell(t, e, ctx, info.ID, "n+=1")
	if res.Status != sandbox.StatusOK || res.Stdout != "1" || !res.StateLost || res.SandboxID == sandboxID {
		t.Errorf("the call after a failed file operation: %+v; want ok in a fresh sandbox, state lost", res)
	}
	if _, err := e.ReadFile(ctx, info.ID, "data/a.txt"); err == nil {
		t.Errorf("a fresh sandbox still has the old one's files")
	}
	if res := cell(t, e, ctx, info.ID, "n+=1"); res.StateLost {
		t.Errorf("state lost reported twice")
	}

	if err := e.CloseSession(ctx, info.ID); err != nil {
		t.Fatalf("CloseSession: %v", err)
	}
	if n := e.LiveSandboxes(); n != 0 {
		t.Errorf("%d sandboxes live after the only session closed", n)
	}
	if got := e.ListSessions(); len(got) != 0 {
		t.Errorf("ListSessions after close = %+v", got)
	}
	if _, err := e.RunInSession(ctx, info.ID, sandbox.Job{Code: "n+=1"}); !errors.Is(err, sandbox.ErrNoSession) || sandbox.Class(err) != sandbox.ErrNotFound {
		t.Errorf("a call to a closed session: %v", err)
	}
	if err := e.CloseSession(ctx, info.ID); !errors.Is(err, sandbox.ErrNoSession) {
		t.Errorf("closing twice: %v", err)
	}
	endMu.Lock()
	if len(ended) != 1 || ended[0] != info.ID+": closed" {
		t.Errorf("OnEnd heard %q", ended)
	}
	endMu.Unlock()
}

// TestSessionHostDeadline: a cell the agent does not stop in time is
// stopped by the host, which kills the sandbox; the next call starts a new
// one.
func TestSessionHostDeadline(t *testing.T) {
	b := newFake(interpreter)
	e := newEngine(t, b, engine.Config{})
	ctx := context.Background()
	info, err := e.CreateSession(ctx, sandbox.SessionSpec{Language: "python", Limits: sandbox.Limits{Timeout: 10 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	cell(t, e, ctx, info.ID, "n+=1")
	res := cell(t, e, ctx, info.ID, "hang")
	if res.Status != sandbox.StatusTimeout || !res.StateLost || !strings.Contains(res.Message, "state was lost") {
		t.Errorf("a hung cell: %s, state lost %v, %q", res.Status, res.StateLost, res.Message)
	}
	if sb := b.sandbox(res.SandboxID); sb == nil || !sb.isDestroyed() {
		t.Errorf("the hung cell's sandbox was not destroyed")
	}
	if res2 := cell(t, e, ctx, info.ID, "n+=1"); res2.Stdout != "1" || res2.SandboxID == res.SandboxID || res2.StateLost {
		t.Errorf("the call after: %+v", res2)
	}
}

// TestSessionCancel: a cancelled call kills the sandbox; the session goes on
// with a new one.
func TestSessionCancel(t *testing.T) {
	got := make(chan struct{})
	b := newFake(hangSignalled(got))
	e := newEngine(t, b, engine.Config{})
	info, err := e.CreateSession(context.Background(), sandbox.SessionSpec{Language: "node"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-got; cancel() }()
	res := cell(t, e, ctx, info.ID, "hang")
	if res.Status != sandbox.StatusKilled || !res.StateLost || !strings.Contains(res.Message, "cancelled") {
		t.Errorf("a cancelled cell: %s, state lost %v, %q", res.Status, res.StateLost, res.Message)
	}
	if res2 := cell(t, e, context.Background(), info.ID, "n+=1"); res2.Status != sandbox.StatusOK || res2.SandboxID == res.SandboxID {
		t.Errorf("the call after: %+v", res2)
	}
}

// TestSessionExpiry: sessions end when idle too long or alive too long,
// and OnEnd says which.
func TestSessionExpiry(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  engine.SessionConfig
		why  string
	}{
		{"idle", engine.SessionConfig{IdleTimeout: 30 * time.Millisecond}, "idle timeout"},
		// Lifetime is checked first: a session past both ends for its age.
		{"lifetime", engine.SessionConfig{IdleTimeout: 30 * time.Millisecond, MaxLifetime: 30 * time.Millisecond}, "reached its maximum lifetime"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newFake(interpreter)
			whys := make(chan string, 1)
			tc.cfg.OnEnd = func(info sandbox.SessionInfo, why string) { whys <- why }
			e := newEngine(t, b, engine.Config{Sessions: tc.cfg})
			info, err := e.CreateSession(context.Background(), sandbox.SessionSpec{Language: "bash"})
			if err != nil {
				t.Fatal(err)
			}
			if !info.ExpiresAt.After(info.Created) || info.ExpiresAt.After(info.Created.Add(time.Second)) {
				t.Errorf("created %s, expires %s", info.Created, info.ExpiresAt)
			}
			eventually(t, "the session expires", func() bool { return len(e.ListSessions()) == 0 && e.LiveSandboxes() == 0 })
			if why := <-whys; why != tc.why {
				t.Errorf("OnEnd said %q, want %q", why, tc.why)
			}
			if _, err := e.RunInSession(context.Background(), info.ID, sandbox.Job{Code: "n+=1"}); !errors.Is(err, sandbox.ErrNoSession) {
				t.Errorf("a call to an expired session: %v", err)
			}
		})
	}
}

// TestSessionOwners: a session is found only by calls acting for its
// owner; to anyone else it does not exist.
func TestSessionOwners(t *testing.T) {
	b := newFake(interpreter)
	e := newEngine(t, b, engine.Config{})
	alice := sandbox.WithOwner(context.Background(), "alice")
	bob := sandbox.WithOwner(context.Background(), "bob")
	info, err := e.CreateSession(alice, sandbox.SessionSpec{Language: "python", Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	for _, ctx := range []context.Context{bob, context.Background()} {
		if _, err := e.RunInSession(ctx, info.ID, sandbox.Job{Code: "n+=1"}); !errors.Is(err, sandbox.ErrNoSession) {
			t.Errorf("RunInSession for %q: %v", sandbox.OwnerFrom(ctx), err)
		}
		if err := e.WriteFiles(ctx, info.ID, []sandbox.File{{Path: "x", Data: []byte("x")}}); !errors.Is(err, sandbox.ErrNoSession) {
			t.Errorf("WriteFiles for %q: %v", sandbox.OwnerFrom(ctx), err)
		}
		if _, err := e.ReadFile(ctx, info.ID, "x"); !errors.Is(err, sandbox.ErrNoSession) {
			t.Errorf("ReadFile for %q: %v", sandbox.OwnerFrom(ctx), err)
		}
		if _, err := e.ListFiles(ctx, info.ID, "."); !errors.Is(err, sandbox.ErrNoSession) {
			t.Errorf("ListFiles for %q: %v", sandbox.OwnerFrom(ctx), err)
		}
		if err := e.CloseSession(ctx, info.ID); !errors.Is(err, sandbox.ErrNoSession) || sandbox.Class(err) != sandbox.ErrNotFound {
			t.Errorf("CloseSession for %q: %v", sandbox.OwnerFrom(ctx), err)
		}
	}
	if res := cell(t, e, alice, info.ID, "n+=1"); res.Stdout != "1" {
		t.Errorf("the owner's call: %+v", res)
	}
	if got := e.ListSessions(); len(got) != 1 || got[0].Owner != "alice" {
		t.Errorf("ListSessions = %+v", got)
	}
	if err := e.CloseSession(alice, info.ID); err != nil {
		t.Errorf("the owner's close: %v", err)
	}
}

// TestSessionErrors checks the class of each way a session cannot be had.
func TestSessionErrors(t *testing.T) {
	ctx := context.Background()
	t.Run("limit", func(t *testing.T) {
		e := newEngine(t, newFake(interpreter), engine.Config{Sessions: engine.SessionConfig{MaxSessions: 2}})
		for range 2 {
			if _, err := e.CreateSession(ctx, sandbox.SessionSpec{Language: "python"}); err != nil {
				t.Fatal(err)
			}
		}
		_, err := e.CreateSession(ctx, sandbox.SessionSpec{Language: "python"})
		if !errors.Is(err, sandbox.ErrTooManySessions) || sandbox.Class(err) != sandbox.ErrExhausted || !strings.Contains(err.Error(), "limit is 2") {
			t.Errorf("a session over the limit: %v (class %v)", err, sandbox.Class(err))
		}
		first := e.ListSessions()[0]
		if err := e.CloseSession(ctx, first.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := e.CreateSession(ctx, sandbox.SessionSpec{Language: "python"}); err != nil {
			t.Errorf("a session after one closed: %v", err)
		}
	})
	t.Run("after close", func(t *testing.T) {
		b := newFake(interpreter)
		e := newEngine(t, b, engine.Config{})
		info, err := e.CreateSession(ctx, sandbox.SessionSpec{Language: "python"})
		if err != nil {
			t.Fatal(err)
		}
		e.Close()
		if n := e.LiveSandboxes(); n != 0 || len(e.ListSessions()) != 0 {
			t.Errorf("after Close: %d sandboxes live, sessions %+v", n, e.ListSessions())
		}
		if _, err := e.RunInSession(ctx, info.ID, sandbox.Job{Code: "n+=1"}); !errors.Is(err, sandbox.ErrNoSession) {
			t.Errorf("a call after Close: %v", err)
		}
		_, err = e.CreateSession(ctx, sandbox.SessionSpec{Language: "python"})
		if sandbox.Class(err) != sandbox.ErrUnavailable {
			t.Errorf("a session after Close: %v (class %v)", err, sandbox.Class(err))
		}
	})
	t.Run("start failure", func(t *testing.T) {
		b := newFake(interpreter)
		b.setStartErr(errors.New("runsc is broken"))
		e := newEngine(t, b, engine.Config{})
		_, err := e.CreateSession(ctx, sandbox.SessionSpec{Language: "python"})
		if sandbox.Class(err) != sandbox.ErrUnavailable || !strings.Contains(err.Error(), "runsc is broken") {
			t.Errorf("a session whose sandbox cannot start: %v (class %v)", err, sandbox.Class(err))
		}
		if got := e.ListSessions(); len(got) != 0 {
			t.Errorf("a failed session is listed: %+v", got)
		}
	})
	t.Run("agent never ready", func(t *testing.T) {
		b := &fakeBackend{agent: func(a *fakeAgent) {}}
		e := newEngine(t, b, engine.Config{})
		_, err := e.CreateSession(ctx, sandbox.SessionSpec{Language: "python"})
		if sandbox.Class(err) != sandbox.ErrUnavailable || !strings.Contains(err.Error(), "did not start") {
			t.Errorf("a session whose agent never answers: %v (class %v)", err, sandbox.Class(err))
		}
	})
	t.Run("restart failure", func(t *testing.T) {
		b := newFake(interpreter)
		e := newEngine(t, b, engine.Config{})
		info, err := e.CreateSession(ctx, sandbox.SessionSpec{Language: "python"})
		if err != nil {
			t.Fatal(err)
		}
		cell(t, e, ctx, info.ID, "die")
		b.setStartErr(errors.New("runsc is broken"))
		_, err = e.RunInSession(ctx, info.ID, sandbox.Job{Code: "n+=1"})
		if sandbox.Class(err) != sandbox.ErrUnavailable {
			t.Errorf("a call whose new sandbox cannot start: %v (class %v)", err, sandbox.Class(err))
		}
		b.setStartErr(nil)
		if res := cell(t, e, ctx, info.ID, "n+=1"); res.Status != sandbox.StatusOK {
			t.Errorf("the session did not recover: %+v", res)
		}
	})
	t.Run("invalid", func(t *testing.T) {
		e := newEngine(t, newFake(interpreter), engine.Config{
			Policy: sandbox.Policy{Languages: append(slices.Clone(sandbox.DefaultLanguages),
				sandbox.Language{Name: "ruby", Filename: "main.rb", Command: []string{"ruby", "main.rb"}})}})
		for _, lang := range []string{"ruby", "cobol"} {
			if _, err := e.CreateSession(ctx, sandbox.SessionSpec{Language: lang}); sandbox.Class(err) != sandbox.ErrInvalid {
				t.Errorf("a %s session: %v (class %v)", lang, err, sandbox.Class(err))
			}
		}
		info, err := e.CreateSession(ctx, sandbox.SessionSpec{Language: "python"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.RunInSession(ctx, info.ID, sandbox.Job{Language: "node", Code: "x"}); sandbox.Class(err) != sandbox.ErrInvalid {
			t.Errorf("a node call to a python session: %v", err)
		}
		if _, err := e.RunInSession(ctx, "session-nope", sandbox.Job{Code: "x"}); sandbox.Class(err) != sandbox.ErrNotFound {
			t.Errorf("a call to an unknown session: %v", err)
		}
	})
}

// TestCloseSessionDuringCall: closing a session in the middle of a call
// ends the call and the sandbox at once.
func TestCloseSessionDuringCall(t *testing.T) {
	got := make(chan struct{})
	b := newFake(hangSignalled(got))
	e := newEngine(t, b, engine.Config{})
	ctx := context.Background()
	info, err := e.CreateSession(ctx, sandbox.SessionSpec{Language: "python"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan sandbox.Result)
	go func() {
		res, _ := e.RunInSession(ctx, info.ID, sandbox.Job{Code: "hang"})
		done <- res
	}()
	<-got
	if err := e.CloseSession(ctx, info.ID); err != nil {
		t.Fatalf("CloseSession: %v", err)
	}
	if n := e.LiveSandboxes(); n != 0 {
		t.Errorf("%d sandboxes live once CloseSession returned", n)
	}
	if res := <-done; res.Status != sandbox.StatusKilled {
		t.Errorf("the call in progress ended %s: %s", res.Status, res.Message)
	}
}

// TestSessionDeathIsExplained: when a session's sandbox dies, the message
// says how it ended (the backend's exit report), never "<nil>".
func TestSessionDeathIsExplained(t *testing.T) {
	e := newEngine(t, newFake(interpreter), engine.Config{})
	ctx := context.Background()
	info, err := e.CreateSession(ctx, sandbox.SessionSpec{Language: "python"})
	if err != nil {
		t.Fatal(err)
	}
	res := cell(t, e, ctx, info.ID, "die")
	if strings.Contains(res.Message, "<nil>") || !strings.Contains(res.Message, "fake agent exited") {
		t.Errorf("a cell whose sandbox died: %q", res.Message)
	}
	_, err = e.ReadFile(ctx, info.ID, "crash")
	if err == nil || strings.Contains(err.Error(), "<nil>") || !strings.Contains(err.Error(), "fake agent exited") {
		t.Errorf("a file operation whose sandbox died: %v", err)
	}
}

// TestSessionCallsInTurn: concurrent calls to one session run one at a
// time, each seeing the state the one before left.
func TestSessionCallsInTurn(t *testing.T) {
	e := newEngine(t, newFake(interpreter), engine.Config{})
	ctx := context.Background()
	info, err := e.CreateSession(ctx, sandbox.SessionSpec{Language: "python"})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[string]bool{}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 5 {
				res, err := e.RunInSession(ctx, info.ID, sandbox.Job{Code: "n+=1"})
				mu.Lock()
				if err != nil || seen[res.Stdout] {
					t.Errorf("call: %v, output %q (seen before: %v)", err, res.Stdout, seen[res.Stdout])
				}
				seen[res.Stdout] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for i := 1; i <= 20; i++ {
		if !seen[fmt.Sprint(i)] {
			t.Errorf("no call printed %d: %v", i, seen)
		}
	}
}

// TestSessionCreateCancelled: a session whose start is cancelled, by its
// caller or by closing it, leaves nothing behind.
func TestSessionCreateCancelled(t *testing.T) {
	for _, how := range []string{"context", "close"} {
		t.Run(how, func(t *testing.T) {
			started := make(chan struct{})
			b := &fakeBackend{agent: func(a *fakeAgent) { close(started); a.hang() }} // never ready
			e := newEngine(t, b, engine.Config{})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() {
				<-started
				if how == "context" {
					cancel()
					return
				}
				list := e.ListSessions()
				if len(list) != 1 {
					t.Errorf("a booting session is not listed: %+v", list)
					cancel()
					return
				}
				if err := e.CloseSession(ctx, list[0].ID); err != nil {
					t.Errorf("CloseSession of a booting session: %v", err)
				}
			}()
			_, err := e.CreateSession(ctx, sandbox.SessionSpec{Language: "python"})
			want := map[string]error{"context": context.Canceled, "close": sandbox.ErrNotFound}[how]
			if sandbox.Class(err) != want {
				t.Errorf("CreateSession: %v (class %v), want class %v", err, sandbox.Class(err), want)
			}
			if n := e.LiveSandboxes(); n != 0 || len(e.ListSessions()) != 0 {
				t.Errorf("after a cancelled start: %d sandboxes live, sessions %+v", n, e.ListSessions())
			}
		})
	}
}

// TestSessionFileAnswersChecked: the engine does not take the agent's word
// for a file read it did not ask for, and passes on a refused write as the
// caller's problem.
func TestSessionFileAnswersChecked(t *testing.T) {
	e := newEngine(t, newFake(interpreter), engine.Config{Policy: sandbox.Policy{OutputFiles: sandbox.OutputFileLimits{MaxFileBytes: 100}}})
	ctx := context.Background()
	info, err := e.CreateSession(ctx, sandbox.SessionSpec{Language: "python"})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"other", "huge"} {
		if f, err := e.ReadFile(ctx, info.ID, name); err == nil || !strings.Contains(err.Error(), "something else") {
			t.Errorf("ReadFile(%q) = %+v, %v", name, f, err)
		}
	}
	err = e.WriteFiles(ctx, info.ID, []sandbox.File{{Path: "full", Data: []byte("x")}})
	if sandbox.Class(err) != sandbox.ErrInvalid || !strings.Contains(err.Error(), "no space left") {
		t.Errorf("a refused write: %v (class %v)", err, sandbox.Class(err))
	}
	if err := e.WriteFiles(ctx, info.ID, []sandbox.File{{Path: "/abs", Data: []byte("x")}}); sandbox.Class(err) != sandbox.ErrInvalid {
		t.Errorf("a write outside the workspace: %v", err)
	}
}

// TestSessionSandboxDiedWhileIdle: a session's state follows its sandbox's.
// A sandbox that died between calls (killed from outside, say) makes the
// session lost: the next call runs in a fresh sandbox and says the state is
// gone, instead of failing against the dead one.
func TestSessionSandboxDiedWhileIdle(t *testing.T) {
	b := newFake(interpreter)
	e := newEngine(t, b, engine.Config{})
	ctx := context.Background()
	info, err := e.CreateSession(ctx, sandbox.SessionSpec{Language: "python"})
	if err != nil {
		t.Fatal(err)
	}
	if res := cell(t, e, ctx, info.ID, "n+=1"); res.Status != sandbox.StatusOK || res.Stdout != "1" {
		t.Fatalf("first cell: %+v", res)
	}
	first := b.sandboxes()[0]
	first.Kill() // from outside, while the session is idle
	res := cell(t, e, ctx, info.ID, "n+=1")
	if res.Status != sandbox.StatusOK || res.Stdout != "1" || !res.StateLost || res.SandboxID == first.ID() {
		t.Errorf("the call after the sandbox died idle: status %s, stdout %q, state lost %v, sandbox %s (the dead one %s); want ok in a fresh sandbox, from scratch, saying the state was lost",
			res.Status, res.Stdout, res.StateLost, res.SandboxID, first.ID())
	}
	if !first.isDestroyed() {
		t.Error("the dead sandbox was not destroyed")
	}
	if res := cell(t, e, ctx, info.ID, "n+=1"); res.Stdout != "2" || res.StateLost {
		t.Errorf("the call after that: stdout %q, state lost %v; want 2, kept", res.Stdout, res.StateLost)
	}
}
