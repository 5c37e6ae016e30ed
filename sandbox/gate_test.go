package sandbox

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

func TestGateAdmitsQueuesAndRefuses(t *testing.T) {
	g := NewGate(2, 2)
	ctx := context.Background()
	leave1, err1 := g.Enter(ctx, nil)
	leave2, err2 := g.Enter(ctx, nil)
	if err1 != nil || err2 != nil {
		t.Fatalf("first two callers refused: %v, %v", err1, err2)
	}

	var mu sync.Mutex
	var order []int
	positions := map[int][]int{}
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			leave, err := g.Enter(ctx, func(ahead int) {
				mu.Lock()
				positions[i] = append(positions[i], ahead)
				mu.Unlock()
			})
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			leave()
		}()
		waitFor(t, func() bool { _, w := g.Load(); return w == i+1 }) // keep arrival order
	}
	if _, err := g.Enter(ctx, nil); !errors.Is(err, ErrBusy) {
		t.Errorf("third waiter: err = %v, want ErrBusy", err)
	}
	if r, w := g.Load(); r != 2 || w != 2 {
		t.Errorf("Load = %d running, %d waiting; want 2, 2", r, w)
	}
	// Waiters admitted by leave1 keep their slot until they record
	// themselves, so the second one can only follow.
	leave1()
	waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(order) >= 1 })
	leave2()
	wg.Wait()
	if len(order) != 2 || order[0] != 0 || order[1] != 1 {
		t.Errorf("admission order %v, want [0 1]", order)
	}
	if p := positions[1]; len(p) == 0 || p[0] != 1 {
		t.Errorf("second waiter saw positions %v, want to start at 1", p)
	}
	if r, w := g.Load(); r != 0 || w != 0 {
		t.Errorf("after all left: %d running, %d waiting", r, w)
	}
}

func TestGateCancelWhileWaiting(t *testing.T) {
	g := NewGate(1, 4)
	leave, _ := g.Enter(context.Background(), nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		_, err := g.Enter(ctx, nil)
		done <- err
	}()
	waitFor(t, func() bool { _, w := g.Load(); return w == 1 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", err)
	}
	if _, w := g.Load(); w != 0 {
		t.Errorf("%d still waiting after cancel", w)
	}
	leave()
	if leave2, err := g.Enter(context.Background(), nil); err != nil {
		t.Errorf("slot not free after leave: %v", err)
	} else {
		leave2()
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not reached within 5s")
}
