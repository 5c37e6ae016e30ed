package gvisor

// Integration tests of closing sessions while their sandboxes start, with
// the real runsc (see integration_test.go for how they are enabled). They
// use only the public API, so that they run against any version.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/safe-run/safe-run/runtime/engine"
	"github.com/safe-run/safe-run/sandbox"
)

// closeWhileBootingTries is how many rounds TestCloseWhileBooting makes,
// each with two sessions closed at a random point of their start.
const closeWhileBootingTries = 150

// liveOnHost counts what sandboxes left on the host below the runtime's
// state directory: run directories and processes naming them.
func liveOnHost(rt *testRuntime) (dirs int, procs []string) {
	entries, _ := os.ReadDir(rt.cfg.StateDir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "safe-run-") {
			dirs++
		}
	}
	for _, p := range listProcs() {
		if cmdline, err := os.ReadFile(p); err == nil && bytes.Contains(cmdline, []byte(rt.cfg.StateDir+"/")) {
			stat, _ := os.ReadFile(strings.TrimSuffix(p, "cmdline") + "stat")
			procs = append(procs, fmt.Sprintf("%s (%s)", bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}), stat))
		}
	}
	return dirs, procs
}

func listProcs() []string {
	entries, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range entries {
		if c := e.Name()[0]; c >= '0' && c <= '9' {
			out = append(out, "/proc/"+e.Name()+"/cmdline")
		}
	}
	return out
}

// TestCloseWhileBooting closes sessions at random points while their
// sandboxes start — as another client that saw them in ListSessions would —
// and checks after each round that no sandbox outlives its session: the
// runtime counts none, and no run directory or runsc process is left.
// Closes that land after the start are checked too.
func TestCloseWhileBooting(t *testing.T) {
	rt := newTestRuntimeWith(t, func(cfg *testConfig) { cfg.Engine.Sessions = engine.SessionConfig{MaxSessions: 2} })
	ctx := context.Background()
	spec := sandbox.SessionSpec{Language: "bash"}

	// How long a start takes here: the closes are spread over it.
	start := time.Now()
	info, err := rt.CreateSession(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	boot := time.Since(start)
	if err := rt.CloseSession(ctx, info.ID); err != nil {
		t.Fatal(err)
	}

	var duringBoot, afterBoot int
	for try := range closeWhileBootingTries {
		results := make(chan error, 2)
		for range 2 {
			go func() { _, err := rt.CreateSession(ctx, spec); results <- err }()
		}
		// Find them as another client would, then close them.
		var ids []string
		for deadline := time.Now().Add(10 * time.Second); len(ids) < 2 && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			ids = ids[:0]
			for _, s := range rt.ListSessions() {
				ids = append(ids, s.ID)
			}
		}
		time.Sleep(time.Duration(rand.Int64N(int64(boot * 3 / 2))))
		var wg sync.WaitGroup
		for _, id := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := rt.CloseSession(ctx, id); err != nil && !errors.Is(err, sandbox.ErrNoSession) {
					t.Errorf("try %d: close %s: %v", try, id, err)
				}
			}()
		}
		wg.Wait()
		for range 2 {
			switch err := <-results; {
			case err == nil:
				afterBoot++
			case errors.Is(err, sandbox.ErrNoSession):
				duringBoot++
			default:
				t.Errorf("try %d: create: %v", try, err)
			}
		}
		if n := len(rt.ListSessions()); n != 0 {
			t.Fatalf("try %d: %d sessions listed after all were closed", try, n)
		}
		// Both calls have returned: every sandbox must be gone.
		live := rt.LiveSandboxes()
		dirs, procs := liveOnHost(rt)
		if live != 0 || dirs != 0 || len(procs) != 0 {
			t.Fatalf("try %d (closed up to %s into a %s start): %d sandboxes outlive their sessions: the runtime counts %d live, %d run directories and %d sandbox processes are left:\n%s",
				try, boot*3/2, boot.Round(time.Millisecond), max(live, dirs), live, dirs, len(procs), strings.Join(procs, "\n"))
		}
	}
	t.Logf("%d sessions closed while they started, %d after (start takes %s)", duringBoot, afterBoot, boot.Round(time.Millisecond))
	if duringBoot < closeWhileBootingTries/5 {
		t.Errorf("only %d of %d closes landed during the start: the test did not test it", duringBoot, 2*closeWhileBootingTries)
	}
}

// TestShutdownDuringBoots closes the runtime while sessions start: every
// start is cancelled or its sandbox destroyed, and Wait returns instead of
// waiting for sandboxes nobody owns.
func TestShutdownDuringBoots(t *testing.T) {
	rt := newTestRuntimeWith(t, func(cfg *testConfig) { cfg.Engine.Sessions = engine.SessionConfig{MaxSessions: 4} })
	ctx := context.Background()
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() { defer wg.Done(); _, _ = rt.CreateSession(ctx, sandbox.SessionSpec{Language: "bash"}) }()
	}
	for deadline := time.Now().Add(10 * time.Second); len(rt.ListSessions()) < 4 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // into the starts
	rt.Close()
	wg.Wait()
	wait, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := rt.Wait(wait); err != nil {
		t.Fatalf("Wait after Close: %v, with %d sandboxes live", err, rt.LiveSandboxes())
	}
}

// TestCloseStopsSessionExpiry: the goroutine that expires idle sessions
// ends with the runtime.
func TestCloseStopsSessionExpiry(t *testing.T) {
	rt := newTestRuntime(t, sandbox.Policy{})
	id := newSession(t, rt, "bash")
	if !janitorRunning() {
		t.Fatal("no goroutine expires sessions while one is live: the check below would prove nothing")
	}
	if err := rt.CloseSession(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	rt.Close()
	for deadline := time.Now().Add(5 * time.Second); janitorRunning() && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if janitorRunning() {
		t.Error("the goroutine that expires sessions outlives Close")
	}
}

// janitorRunning says whether a goroutine is in expireSessions.
func janitorRunning() bool {
	var b bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&b, 2)
	return strings.Contains(b.String(), "engine.(*Engine).expireSessions")
}
