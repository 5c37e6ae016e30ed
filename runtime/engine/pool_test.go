package engine_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/safe-run/safe-run/agent"
	"github.com/safe-run/safe-run/runtime/engine"
	"github.com/safe-run/safe-run/sandbox"
)

// warmLog records the warm-up requests the agents were sent.
type warmLog struct {
	mu    sync.Mutex
	warms []agent.Request
}

// handler answers like printCode and records warm-ups.
func (w *warmLog) handler() handler {
	return func(a *fakeAgent, req agent.Request) []agent.Event {
		if req.Op == agent.OpWarm {
			w.mu.Lock()
			w.warms = append(w.warms, req)
			w.mu.Unlock()
		}
		return printCode(a, req)
	}
}

// pooled returns the sandbox that waits in the pool: marked for language
// and not yet taken.
func pooled(t *testing.T, b *fakeBackend, language string) *fakeSandbox {
	t.Helper()
	var found *fakeSandbox
	eventually(t, "a "+language+" sandbox waits in the pool", func() bool {
		for _, sb := range b.sandboxes() {
			if marks := sb.pooledMarks(); slices.Equal(marks, []string{language}) && !sb.isDestroyed() {
				found = sb
				return true
			}
		}
		return false
	})
	return found
}

// run runs a python job and fails the test unless it is ok.
func run(t *testing.T, e *engine.Engine, job sandbox.Job) sandbox.Result {
	t.Helper()
	if job.Language == "" {
		job.Language = "python"
	}
	if job.Code == "" {
		job.Code = "print(1)"
	}
	res, err := e.Run(context.Background(), job)
	if err != nil || res.Status != sandbox.StatusOK {
		t.Fatalf("Run: %v, %s: %s", err, res.Status, res.Message)
	}
	return res
}

// TestPoolServesOneRunPerSandbox: a pooled sandbox, warmed with its
// language's preloads, serves exactly one run, is destroyed after it, and
// is replaced by a new one.
func TestPoolServesOneRunPerSandbox(t *testing.T) {
	var warms warmLog
	b := newFake(warms.handler())
	e := newEngine(t, b, engine.Config{Pool: engine.PoolConfig{Size: map[string]int{"python": 1, "bash": 0},
		Preload: map[string][]string{"python": {"numpy"}}}})
	seen := map[string]bool{}
	for i := range 3 {
		sb := pooled(t, b, "python")
		if got := e.PoolSizes(); got["python"] != 1 || len(got) != 1 {
			t.Errorf("PoolSizes = %v", got)
		}
		res := run(t, e, sandbox.Job{Code: "print(2)"})
		if res.SandboxID != sb.id || res.Stdout != "print(2)" {
			t.Errorf("run %d: ran in %s (%q), want the pooled %s", i, res.SandboxID, res.Stdout, sb.id)
		}
		if seen[res.SandboxID] {
			t.Errorf("run %d: sandbox %s was used twice", i, res.SandboxID)
		}
		seen[res.SandboxID] = true
		eventually(t, "the used sandbox is destroyed", sb.isDestroyed)
		if marks := sb.pooledMarks(); !slices.Equal(marks, []string{"python", ""}) {
			t.Errorf("pool marks of %s: %q, want marked then unmarked", sb.id, marks)
		}
	}
	warms.mu.Lock()
	defer warms.mu.Unlock()
	for _, w := range warms.warms {
		if w.Interpreter != "python" || !slices.Equal(w.Preload, []string{"numpy"}) {
			t.Errorf("warm request %+v, want python with numpy preloaded", w)
		}
	}
	if len(warms.warms) < 3 {
		t.Errorf("%d warm requests for 3 pooled sandboxes", len(warms.warms))
	}
}

// TestPoolTakesOnlyMatchingJobs: a job whose sandbox would differ from the
// pooled one (limits built into it, another image, another language)
// starts cold and leaves the pooled sandbox waiting; a job that differs in
// what travels with the request (timeout, output cap) takes it.
func TestPoolTakesOnlyMatchingJobs(t *testing.T) {
	b := newFake(printCode)
	e := newEngine(t, b, engine.Config{Policy: sandbox.Policy{Images: []string{"custom:1"}},
		Pool: engine.PoolConfig{Size: map[string]int{"python": 1}}})
	sb := pooled(t, b, "python")
	for _, job := range []sandbox.Job{
		{Limits: sandbox.Limits{MemoryBytes: 256 * sandbox.MiB}},
		{Limits: sandbox.Limits{Processes: 16}},
		{Image: "custom:1"},
		{Language: "bash", Code: "echo"},
	} {
		res := run(t, e, job)
		if res.SandboxID == sb.id {
			t.Errorf("job %+v took the pooled sandbox", job)
		}
		cold := b.sandbox(res.SandboxID)
		if cold.spec.Job.Image != job.Image || len(cold.pooledMarks()) != 0 {
			t.Errorf("job %+v ran in a sandbox of image %q, marked %q", job, cold.spec.Job.Image, cold.pooledMarks())
		}
	}
	if sb.isDestroyed() {
		t.Fatalf("the pooled sandbox was used")
	}
	res := run(t, e, sandbox.Job{Limits: sandbox.Limits{Timeout: 5e9, OutputBytes: 4 * sandbox.KiB}})
	if res.SandboxID != sb.id {
		t.Errorf("a job with its own timeout and output cap ran in %s, not the pooled %s", res.SandboxID, sb.id)
	}
}

// TestPoolSkipsDeadSandboxes: a pooled sandbox that died while it waited is
// destroyed and never handed out.
func TestPoolSkipsDeadSandboxes(t *testing.T) {
	b := newFake(printCode)
	e := newEngine(t, b, engine.Config{Pool: engine.PoolConfig{Size: map[string]int{"python": 1}}})
	dead := pooled(t, b, "python")
	dead.Kill() // from outside, as the host's OOM killer would
	res := run(t, e, sandbox.Job{})
	if res.SandboxID == dead.id {
		t.Fatalf("the run was handed the dead sandbox")
	}
	eventually(t, "the dead sandbox is destroyed", dead.isDestroyed)
}

// TestPoolCheckpoints: with a backend that can checkpoint, the pool builds
// one image of a warm sandbox and restores every refill from it.
func TestPoolCheckpoints(t *testing.T) {
	b := newFakeCheckpointer(printCode)
	e := newEngine(t, b, engine.Config{Pool: engine.PoolConfig{Size: map[string]int{"python": 1, "node": 1}}})
	for i := range 3 {
		sb := pooled(t, b.fakeBackend, "python")
		if sb.restoredFrom != "image-1" {
			t.Errorf("refill %d was restored from %q, want image-1", i, sb.restoredFrom)
		}
		if res := run(t, e, sandbox.Job{}); res.SandboxID != sb.id {
			t.Errorf("run %d ran in %s, want the restored %s", i, res.SandboxID, sb.id)
		}
	}
	if node := pooled(t, b.fakeBackend, "node"); node.restoredFrom != "" {
		t.Errorf("a node sandbox was restored from %q: its random state would be shared", node.restoredFrom)
	}
	pooled(t, b.fakeBackend, "python")
	if checkpoints, restores, forgotten := b.counts(); checkpoints != 1 || restores != 4 || len(forgotten) != 0 {
		t.Errorf("%d checkpoints, %d restores, forgotten %q; want 1, 4, none", checkpoints, restores, forgotten)
	}
}

// TestPoolRestoreFailures: an image a restore failed from is forgotten and
// built again; after a second failure the language refills cold.
func TestPoolRestoreFailures(t *testing.T) {
	for _, tc := range []struct {
		name        string
		fails       func(n int) bool // whether the nth restore fails
		restored    []string         // what the pooled sandboxes of three refills were restored from
		checkpoints int
		forgotten   []string
	}{
		{"once", func(n int) bool { return n == 1 }, []string{"", "image-2", "image-2"}, 2, []string{"image-1"}},
		{"always", func(int) bool { return true }, []string{"", "", ""}, 2, []string{"image-1", "image-2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newFakeCheckpointer(printCode)
			b.restoreErr = func(n int) error {
				if tc.fails(n) {
					return errors.New("restore: image corrupt")
				}
				return nil
			}
			e := newEngine(t, b, engine.Config{Pool: engine.PoolConfig{Size: map[string]int{"python": 1}}})
			for i, want := range tc.restored {
				sb := pooled(t, b.fakeBackend, "python")
				if sb.restoredFrom != want {
					t.Errorf("refill %d was restored from %q, want %q", i, sb.restoredFrom, want)
				}
				if res := run(t, e, sandbox.Job{}); res.SandboxID != sb.id {
					t.Errorf("run %d ran in %s, want %s", i, res.SandboxID, sb.id)
				}
			}
			pooled(t, b.fakeBackend, "python")
			if checkpoints, _, forgotten := b.counts(); checkpoints != tc.checkpoints || !slices.Equal(forgotten, tc.forgotten) {
				t.Errorf("%d checkpoints, forgotten %q; want %d, %q", checkpoints, forgotten, tc.checkpoints, tc.forgotten)
			}
		})
	}
}

// TestPoolOnDemand: nothing waits; each run restores its sandbox from the
// checkpoint, built at the first run. Without checkpoints, runs start cold.
func TestPoolOnDemand(t *testing.T) {
	cfg := engine.Config{Pool: engine.PoolConfig{Size: map[string]int{"python": 1}, OnDemand: true}}
	t.Run("checkpoints", func(t *testing.T) {
		b := newFakeCheckpointer(printCode)
		e := newEngine(t, b, cfg)
		if n := len(b.sandboxes()); n != 0 {
			t.Errorf("%d sandboxes started before any run", n)
		}
		for i := range 2 {
			res := run(t, e, sandbox.Job{})
			if sb := b.sandbox(res.SandboxID); sb.restoredFrom != "image-1" {
				t.Errorf("run %d ran in a sandbox restored from %q, want image-1", i, sb.restoredFrom)
			}
			if got := e.PoolSizes(); got["python"] != 0 {
				t.Errorf("PoolSizes = %v: an on-demand pool keeps nothing", got)
			}
		}
		if checkpoints, restores, _ := b.counts(); checkpoints != 1 || restores != 2 {
			t.Errorf("%d checkpoints, %d restores; want 1, 2", checkpoints, restores)
		}
	})
	t.Run("no checkpoints", func(t *testing.T) {
		b := newFake(printCode)
		e := newEngine(t, b, cfg)
		res := run(t, e, sandbox.Job{})
		if sb := b.sandbox(res.SandboxID); sb.restoredFrom != "" || len(b.sandboxes()) != 1 {
			t.Errorf("ran in %+v of %d sandboxes, want one cold start", sb, len(b.sandboxes()))
		}
	})
}

// TestPoolRefusesBadSizes: a negative size is refused.
func TestPoolRefusesBadSizes(t *testing.T) {
	_, err := engine.New(engine.Config{Backend: newFake(printCode), Logger: discard,
		Pool: engine.PoolConfig{Size: map[string]int{"python": -1}}})
	if err == nil {
		t.Errorf("a pool of size -1 was accepted")
	}
	if _, err := engine.New(engine.Config{Logger: discard}); err == nil {
		t.Errorf("an engine without a backend was accepted")
	}
}
