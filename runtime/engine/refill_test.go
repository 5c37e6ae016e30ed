package engine_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/safe-run/safe-run/agent"
	"github.com/safe-run/safe-run/runtime/engine"
	"github.com/safe-run/safe-run/sandbox"
)

// heldWarms answers like printCode, but each warm-up waits until release
// is closed, counting how many wait at once.
type heldWarms struct {
	release chan struct{}
	now     atomic.Int64
	most    atomic.Int64
	once    sync.Once
}

func (h *heldWarms) handler() handler {
	return func(a *fakeAgent, req agent.Request) []agent.Event {
		if req.Op == agent.OpWarm {
			n := h.now.Add(1)
			for m := h.most.Load(); n > m && !h.most.CompareAndSwap(m, n); m = h.most.Load() {
			}
			<-h.release
			h.now.Add(-1)
		}
		return printCode(a, req)
	}
}

func (h *heldWarms) free() { h.once.Do(func() { close(h.release) }) }

// TestPoolRefillsInParallel: a pool with Refills N starts up to N
// sandboxes at once, and never more than CPUs; Refills 0 starts as many as
// there are CPUs.
func TestPoolRefillsInParallel(t *testing.T) {
	for _, tc := range []struct {
		refills, cpus, want int
	}{{0, 3, 3}, {0, 1, 1}, {1, 3, 1}, {3, 3, 3}, {3, 2, 2}} {
		h := &heldWarms{release: make(chan struct{})}
		b := newFake(h.handler())
		e := newEngine(t, b, engine.Config{Pool: engine.PoolConfig{Size: map[string]int{"python": 3}, Refills: tc.refills, CPUs: tc.cpus}})
		eventually(t, "the refills start", func() bool { return h.now.Load() == int64(tc.want) })
		time.Sleep(50 * time.Millisecond) // would a further one start? (not a timing assertion: it may only add)
		if got := h.most.Load(); got != int64(tc.want) {
			t.Errorf("Refills %d, CPUs %d: %d refills at once, want %d", tc.refills, tc.cpus, got, tc.want)
		}
		h.free()
		eventually(t, "the pool fills", func() bool { return e.PoolSizes()["python"] == 3 })
		e.Close()
	}
}

// TestPoolAwaitRefill: with AwaitRefill, a run that finds the pool empty
// while a refill is under way waits for it and runs in it, instead of
// starting a sandbox of its own; without it, the run starts cold.
func TestPoolAwaitRefill(t *testing.T) {
	for _, await := range []time.Duration{0, time.Minute} {
		h := &heldWarms{release: make(chan struct{})}
		b := newFake(h.handler())
		e := newEngine(t, b, engine.Config{Pool: engine.PoolConfig{Size: map[string]int{"python": 1}, AwaitRefill: await}})
		eventually(t, "a refill is under way", func() bool { return h.now.Load() == 1 })
		done := make(chan sandbox.Result)
		go func() {
			res, _ := e.Run(context.Background(), sandbox.Job{Language: "python", Code: "print(1)"})
			done <- res
		}()
		var res sandbox.Result
		if await == 0 {
			res = <-done // cold, beside the held refill
		} else {
			select {
			case res = <-done:
				t.Fatalf("AwaitRefill: the run did not wait for the refill: %+v", res)
			case <-time.After(100 * time.Millisecond):
			}
			h.free()
			res = <-done
		}
		h.free()
		if res.Status != sandbox.StatusOK {
			t.Fatalf("AwaitRefill %s: %s: %s", await, res.Status, res.Message)
		}
		ran := b.sandbox(res.SandboxID)
		if warmed := ran.spec.KeepAlive || len(ran.pooledMarks()) > 0; warmed != (await > 0) {
			t.Errorf("AwaitRefill %s: the run's sandbox was pooled: %v, want %v", await, warmed, await > 0)
		}
		e.Close()
	}
}

// TestPoolAwaitRefillBackToBack: where runs wait for refills (a check),
// each run's replacement starts while the run goes on, and every run of a
// series back to back is served by a refill; elsewhere refills wait for a
// lull (TestPoolRefillsWaitForALull).
func TestPoolAwaitRefillBackToBack(t *testing.T) {
	var b *fakeBackend
	var mu sync.Mutex
	var alone []string // runs no refill started beside within a second
	b = newFake(func(a *fakeAgent, req agent.Request) []agent.Event {
		if req.Op == agent.OpRun {
			beside := func() bool {
				boxes := b.sandboxes()
				return slices.IndexFunc(boxes, func(sb *fakeSandbox) bool { return sb == a.sb }) < len(boxes)-1
			}
			for deadline := time.Now().Add(time.Second); !beside() && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
			if !beside() {
				mu.Lock()
				alone = append(alone, a.sb.id)
				mu.Unlock()
			}
		}
		return printCode(a, req)
	})
	e := newEngine(t, b, engine.Config{Pool: engine.PoolConfig{Size: map[string]int{"python": 1}, CPUs: 2, AwaitRefill: time.Minute}})
	eventually(t, "the pool fills", func() bool { return e.PoolSizes()["python"] == 1 })
	for i := range 10 {
		res, _ := e.Run(context.Background(), sandbox.Job{Language: "python", Code: "x"})
		if res.Status != sandbox.StatusOK {
			t.Fatalf("run %d: %s: %s", i, res.Status, res.Message)
		}
		if ran := b.sandbox(res.SandboxID); !ran.spec.Background {
			t.Errorf("run %d ran in %s, a sandbox of its own, want a refill's", i, res.SandboxID)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(alone) > 0 {
		t.Errorf("no refill started beside the runs in %v", alone)
	}
}
