package sandbox

import (
	"context"
	"errors"
	"slices"
	"sync"
)

// ErrBusy is returned by Gate.Enter when the waiting line is full.
var ErrBusy = WithClass(errors.New("the server is busy: every sandbox slot is taken and the waiting line is full; try again shortly"), ErrExhausted)

// Gate admits at most a fixed number of runs at once and lets a bounded
// number of further callers wait, first come first served. The zero Gate
// admits nothing; use NewGate.
type Gate struct {
	mu         sync.Mutex
	running    int
	maxRunning int
	maxWaiting int
	line       []*waiter
}

type waiter struct {
	admitted chan struct{} // closed when the caller may run
	ahead    chan int      // latest count of callers ahead; buffered, newest wins
}

// NewGate returns a gate for maxRunning concurrent runs and maxWaiting
// waiting callers.
func NewGate(maxRunning, maxWaiting int) *Gate {
	return &Gate{maxRunning: max(1, maxRunning), maxWaiting: max(0, maxWaiting)}
}

// Enter returns once the caller may run, with the function that gives the
// slot back. While the caller waits, ahead is called (from the caller's
// goroutine) with the number of callers before it, each time that changes.
// It fails with ErrBusy when the line is full, or with ctx's error.
func (g *Gate) Enter(ctx context.Context, ahead func(int)) (leave func(), err error) {
	g.mu.Lock()
	if g.running < g.maxRunning && len(g.line) == 0 {
		g.running++
		g.mu.Unlock()
		return g.leave, nil
	}
	if len(g.line) >= g.maxWaiting {
		g.mu.Unlock()
		return nil, ErrBusy
	}
	w := &waiter{admitted: make(chan struct{}), ahead: make(chan int, 1)}
	g.line = append(g.line, w)
	w.ahead <- len(g.line) - 1
	g.mu.Unlock()

	for {
		select {
		case <-w.admitted:
			return g.leave, nil
		case n := <-w.ahead:
			if ahead != nil {
				ahead(n)
			}
		case <-ctx.Done():
			g.mu.Lock()
			if i := slices.Index(g.line, w); i >= 0 {
				g.line = slices.Delete(g.line, i, i+1)
				g.tellPositionsLocked(i)
				g.mu.Unlock()
				return nil, ctx.Err()
			}
			g.mu.Unlock()
			// Admitted at the same moment: hand the slot back.
			<-w.admitted
			g.leave()
			return nil, ctx.Err()
		}
	}
}

// leave frees a slot and admits the first waiting caller.
func (g *Gate) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.line) > 0 {
		w := g.line[0]
		g.line = g.line[1:]
		close(w.admitted) // the slot passes straight to it
		g.tellPositionsLocked(0)
		return
	}
	g.running--
}

// tellPositionsLocked updates the waiters from index i on.
func (g *Gate) tellPositionsLocked(from int) {
	for i := from; i < len(g.line); i++ {
		w := g.line[i]
		select {
		case <-w.ahead: // drop the stale count
		default:
		}
		w.ahead <- i
	}
}

// Load reports how many runs hold a slot and how many callers wait.
func (g *Gate) Load() (running, waiting int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.running, len(g.line)
}
