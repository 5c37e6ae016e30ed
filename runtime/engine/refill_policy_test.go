package engine_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/safe-run/safe-run/agent"
	"github.com/safe-run/safe-run/runtime/engine"
	"github.com/safe-run/safe-run/sandbox"
)

// holdRuns answers like printCode, except that a run of the code "hold"
// answers only once release is closed.
func holdRuns(release <-chan struct{}) handler {
	return func(a *fakeAgent, req agent.Request) []agent.Event {
		if req.Op == agent.OpRun && len(req.Files) > 0 && string(req.Files[0].Data) == "hold" {
			<-release
		}
		return printCode(a, req)
	}
}

// runAsync runs job and sends its result on the returned channel.
func runAsync(e *engine.Engine, job sandbox.Job) <-chan sandbox.Result {
	done := make(chan sandbox.Result, 1)
	go func() {
		res, _ := e.Run(context.Background(), job)
		done <- res
	}()
	return done
}

// TestPoolRefillUsesIdleCPU: the replacement of a pooled sandbox starts
// while the run it served is still under way, when a CPU is free for it —
// not only once that run is over — and it starts at a background
// priority, raised once a run takes it.
func TestPoolRefillUsesIdleCPU(t *testing.T) {
	release := make(chan struct{})
	b := newFake(holdRuns(release))
	e := newEngine(t, b, engine.Config{Pool: engine.PoolConfig{Size: map[string]int{"python": 1}, CPUs: 2}})
	eventually(t, "the pool fills", func() bool { return e.PoolSizes()["python"] == 1 })
	first := b.sandboxes()[0]
	if !first.spec.Background || first.foreground.Load() {
		t.Errorf("a waiting refill: Background %v, raised %v; want a background one not raised", first.spec.Background, first.foreground.Load())
	}
	done := runAsync(e, sandbox.Job{Language: "python", Code: "hold"})
	eventually(t, "the refill starts beside the held run", func() bool { return len(b.sandboxes()) == 2 })
	eventually(t, "the pool refills", func() bool { return e.PoolSizes()["python"] == 1 })
	close(release)
	res := <-done
	if res.Status != sandbox.StatusOK || res.SandboxID != first.id {
		t.Fatalf("the held run: %s in %s: %s; want ok in the pooled %s", res.Status, res.SandboxID, res.Message, first.id)
	}
	if !first.foreground.Load() {
		t.Error("the pooled sandbox a run took was not raised to the foreground")
	}
	cold := <-runAsync(e, sandbox.Job{Language: "bash", Code: "x"})
	if sb := b.sandbox(cold.SandboxID); sb.spec.Background {
		t.Error("a cold run's sandbox started in the background")
	}
}

// TestPoolRefillsYieldToRuns: while one-shot runs take every CPU, no refill
// starts; once a run ends and frees a CPU, it does.
func TestPoolRefillsYieldToRuns(t *testing.T) {
	release := make(chan struct{})
	b := newFake(holdRuns(release))
	e := newEngine(t, b, engine.Config{Pool: engine.PoolConfig{Size: map[string]int{"python": 1}, CPUs: 1}})
	eventually(t, "the pool fills", func() bool { return e.PoolSizes()["python"] == 1 })
	held := runAsync(e, sandbox.Job{Language: "bash", Code: "hold"}) // a cold run that takes the one CPU
	eventually(t, "the held run starts", func() bool { return len(b.sandboxes()) == 2 })
	// A pooled run drains the pool while the held one goes on.
	if res := <-runAsync(e, sandbox.Job{Language: "python", Code: "x"}); res.Status != sandbox.StatusOK {
		t.Fatalf("pooled run: %s: %s", res.Status, res.Message)
	}
	eventually(t, "the pooled run's sandbox is removed", func() bool { return b.sandboxes()[0].isDestroyed() })
	time.Sleep(50 * time.Millisecond) // would a refill start? (not a timing assertion: it may only add)
	if n := len(b.sandboxes()); n != 2 {
		t.Errorf("%d sandboxes started while a run took the only CPU, want 2 (no refill)", n)
	}
	close(release)
	if res := <-held; res.Status != sandbox.StatusOK {
		t.Fatalf("held run: %s: %s", res.Status, res.Message)
	}
	eventually(t, "the pool refills once the CPU is free", func() bool { return e.PoolSizes()["python"] == 1 })
}

// TestPoolRefillWaitsForColdBoot: while a cold run's sandbox boots (it has
// no CPU quota until its agent is ready, and runsc's start takes every CPU
// it gets), no refill starts, however many CPUs are free; once it is
// ready, the refill does.
func TestPoolRefillWaitsForColdBoot(t *testing.T) {
	b := newFake(printCode)
	e := newEngine(t, b, engine.Config{Pool: engine.PoolConfig{Size: map[string]int{"python": 1}, CPUs: 4}})
	eventually(t, "the pool fills", func() bool { return e.PoolSizes()["python"] == 1 })
	boot := make(chan struct{})
	b.setAgent(func(a *fakeAgent) { <-boot; serve(printCode)(a) })   // Ready waits for boot
	booting := runAsync(e, sandbox.Job{Language: "bash", Code: "x"}) // not pooled: cold
	eventually(t, "the cold run's sandbox starts", func() bool { return len(b.sandboxes()) == 2 })
	b.setAgent(serve(printCode))
	// A pooled run drains the pool while the cold one boots.
	if res := <-runAsync(e, sandbox.Job{Language: "python", Code: "x"}); res.Status != sandbox.StatusOK || res.SandboxID != b.sandboxes()[0].id {
		t.Fatalf("pooled run: %s in %s: %s", res.Status, res.SandboxID, res.Message)
	}
	// Would a refill start? Past the quiet that the runs' arrival asks for
	// (2 s for a run in flight), only the boot holds it back. Not a timing
	// assertion: waiting longer may only add a refill.
	time.Sleep(2500 * time.Millisecond)
	if n := len(b.sandboxes()); n != 2 {
		t.Errorf("%d sandboxes started while a cold run booted, want 2 (no refill)", n)
	}
	close(boot)
	if res := <-booting; res.Status != sandbox.StatusOK {
		t.Fatalf("cold run: %s: %s", res.Status, res.Message)
	}
	eventually(t, "the pool refills once the cold run has booted", func() bool { return e.PoolSizes()["python"] == 1 })
}

// TestPoolRefillsWaitForALull: while runs come back to back, no refill
// starts, however many CPUs are free (each would slow the runs and be
// drained at once); once they pause, the pool refills.
func TestPoolRefillsWaitForALull(t *testing.T) {
	b := newFake(printCode)
	e := newEngine(t, b, engine.Config{Pool: engine.PoolConfig{Size: map[string]int{"python": 1}, CPUs: 4}})
	eventually(t, "the pool fills", func() bool { return e.PoolSizes()["python"] == 1 })
	pooled := b.sandboxes()[0]
	var runs []string
	for start := time.Now(); time.Since(start) < time.Second; {
		res := <-runAsync(e, sandbox.Job{Language: "python", Code: "x"})
		if res.Status != sandbox.StatusOK {
			t.Fatalf("run %d: %s: %s", len(runs), res.Status, res.Message)
		}
		runs = append(runs, res.SandboxID)
	}
	if runs[0] != pooled.id {
		t.Errorf("the first run ran in %s, want the pooled %s", runs[0], pooled.id)
	}
	for _, sb := range b.sandboxes()[1:] {
		if sb.spec.Background {
			t.Errorf("refill %s started while %d runs came back to back", sb.id, len(runs))
		}
	}
	eventually(t, "the pool refills once the runs pause", func() bool { return e.PoolSizes()["python"] == 1 })
}

// TestPoolMissStartsColdUnmeasured: a run that finds the pool empty while
// a refill is under way starts cold as long as the pool has not measured
// both a refill and a cold start (it cannot tell which is sooner), and the
// refill goes on.
func TestPoolMissStartsColdUnmeasured(t *testing.T) {
	h := &heldWarms{release: make(chan struct{})}
	b := newFake(h.handler())
	e := newEngine(t, b, engine.Config{Pool: engine.PoolConfig{Size: map[string]int{"python": 1}, CPUs: 2}})
	eventually(t, "a refill is under way", func() bool { return h.now.Load() == 1 })
	res := <-runAsync(e, sandbox.Job{Language: "python", Code: "x"})
	if res.Status != sandbox.StatusOK {
		t.Fatalf("Run: %s: %s", res.Status, res.Message)
	}
	if sb := b.sandbox(res.SandboxID); sb.spec.Background {
		t.Errorf("the miss ran in the refill's sandbox %s, want a cold one", res.SandboxID)
	}
	h.free()
	eventually(t, "the refill lands", func() bool { return e.PoolSizes()["python"] == 1 })
}

// holdWarm answers like printCode, except that a warm-up answers only
// once the gate that hold returns at that moment is closed (nil: at once).
func holdWarm(hold func() <-chan struct{}) handler {
	return func(a *fakeAgent, req agent.Request) []agent.Event {
		if req.Op == agent.OpWarm {
			if gate := hold(); gate != nil {
				<-gate
			}
		}
		return printCode(a, req)
	}
}

// TestPoolAdoptsRefillByCPU: a run that finds the pool empty while a
// background refill is under way waits for that refill, raised to a run's
// priority, when the CPU the refill used says it is nearly done and a CPU
// is free beside the run; when it has used little, or the run takes the
// last CPU, the run starts cold and the refill stays in the background.
func TestPoolAdoptsRefillByCPU(t *testing.T) {
	for _, tc := range []struct {
		name  string
		used  time.Duration // by the refill under way when the run comes
		cpus  int
		adopt bool
	}{
		{"nearly done", 300 * time.Millisecond, 2, true},
		{"just begun", 0, 2, false},
		{"nearly done, but the run takes the only CPU", 300 * time.Millisecond, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var gate chan struct{}
			b := newFake(holdWarm(func() <-chan struct{} { mu.Lock(); defer mu.Unlock(); return gate }))
			b.cpu.Store(int64(300 * time.Millisecond)) // what a refill uses until ready
			e := newEngine(t, b, engine.Config{Pool: engine.PoolConfig{Size: map[string]int{"python": 1}, CPUs: tc.cpus}})
			eventually(t, "the pool fills", func() bool { return e.PoolSizes()["python"] == 1 })
			// A cold Python run (another environment: the pool cannot
			// serve it) and a pooled one measure both kinds of runs.
			if res := <-runAsync(e, sandbox.Job{Language: "python", Code: "x", Env: []string{"A=1"}}); res.Status != sandbox.StatusOK {
				t.Fatalf("cold run: %s: %s", res.Status, res.Message)
			}
			b.cpu.Store(0)
			mu.Lock()
			gate = make(chan struct{})
			mu.Unlock()
			open := func() {
				mu.Lock()
				defer mu.Unlock()
				if gate != nil {
					close(gate)
					gate = nil
				}
			}
			t.Cleanup(open) // before the engine's close, which waits for the refill
			if res := <-runAsync(e, sandbox.Job{Language: "python", Code: "x"}); res.Status != sandbox.StatusOK || res.SandboxID != b.sandboxes()[0].id {
				t.Fatalf("pooled run: %s in %s: %s", res.Status, res.SandboxID, res.Message)
			}
			eventually(t, "the refill starts", func() bool { return len(b.sandboxes()) == 3 })
			refill := b.sandboxes()[2]
			refill.cpu.Store(int64(tc.used))
			done := runAsync(e, sandbox.Job{Language: "python", Code: "x"})
			if tc.adopt {
				eventually(t, "the run raises the refill it waits for", refill.foreground.Load)
			} else {
				eventually(t, "the run starts cold", func() bool { return len(b.sandboxes()) == 4 })
			}
			open()
			res := <-done
			if res.Status != sandbox.StatusOK {
				t.Fatalf("the run: %s: %s", res.Status, res.Message)
			}
			if adopted := res.SandboxID == refill.id; adopted != tc.adopt {
				t.Errorf("the run ran in %s (the refill is %s): adopted %v, want %v", res.SandboxID, refill.id, adopted, tc.adopt)
			}
			if !tc.adopt && refill.foreground.Load() {
				t.Error("a refill no run took was raised to the foreground")
			}
		})
	}
}
