package engine

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/safe-run/safe-run/agent"
)

// stubSandbox is a Sandbox that does nothing but count its removals.
type stubSandbox struct {
	destroys atomic.Int32
	exited   chan struct{}
}

func (s *stubSandbox) ID() string                { return "stub" }
func (s *stubSandbox) Requests() io.Writer       { return io.Discard }
func (s *stubSandbox) Events() io.ReadCloser     { return io.NopCloser(strings.NewReader("")) }
func (s *stubSandbox) Ready() error              { return nil }
func (s *stubSandbox) Exited() <-chan struct{}   { return s.exited }
func (s *stubSandbox) ExitReport() string        { return "stub" }
func (s *stubSandbox) Usage() Usage              { return Usage{} }
func (s *stubSandbox) MemoryNow() (int64, error) { return 0, nil }
func (s *stubSandbox) Kill()                     {}
func (s *stubSandbox) Destroy() error {
	s.destroys.Add(1)
	return errors.New("stub removal failed")
}

// stubBox returns a box in status st over a stub sandbox.
func stubBox(st status) (*box, *stubSandbox) {
	sb := &stubSandbox{exited: make(chan struct{})}
	close(sb.exited)
	return &box{sb: sb, log: slog.New(slog.NewTextHandler(io.Discard, nil)), status: st, events: make(chan agent.Event)}, sb
}

var allStatuses = []status{statusStarting, statusReady, statusRunning, statusExited, statusDestroyed}

// TestStatusMoves checks every (from, to) pair of the sandbox lifecycle:
// the allowed moves happen; the others are refused with an error naming
// both states, and leave the status as it was.
func TestStatusMoves(t *testing.T) {
	allowed := map[[2]status]bool{
		{statusStarting, statusReady}: true, {statusStarting, statusExited}: true, {statusStarting, statusDestroyed}: true,
		{statusReady, statusRunning}: true, {statusReady, statusExited}: true, {statusReady, statusDestroyed}: true,
		{statusRunning, statusReady}: true, {statusRunning, statusExited}: true, {statusRunning, statusDestroyed}: true,
		{statusExited, statusDestroyed}: true,
	}
	for _, from := range allStatuses {
		for _, to := range allStatuses {
			t.Run(from.String()+"→"+to.String(), func(t *testing.T) {
				b, _ := stubBox(from)
				err := b.changeStatus(to)
				switch {
				case allowed[[2]status{from, to}]:
					if err != nil || b.current() != to {
						t.Errorf("changeStatus: %v, status %s; want %s", err, b.current(), to)
					}
				case err == nil:
					t.Errorf("move from %s to %s allowed", from, to)
				case b.current() != from:
					t.Errorf("a refused move changed the status to %s", b.current())
				case !strings.Contains(err.Error(), "from "+from.String()+" to "+to.String()):
					t.Errorf("error %q does not name both states", err)
				}
			})
		}
	}
}

// TestRequireStatus: requireStatus accepts the listed statuses only, and
// its error names the status the box is in.
func TestRequireStatus(t *testing.T) {
	for _, st := range allStatuses {
		b, _ := stubBox(st)
		if err := b.requireStatus(st, statusDestroyed); err != nil {
			t.Errorf("requireStatus(%s) in %s: %v", st, st, err)
		}
		other := statusReady
		if st == statusReady {
			other = statusRunning
		}
		if err := b.requireStatus(other); err == nil || !strings.Contains(err.Error(), "is "+st.String()) {
			t.Errorf("requireStatus(%s) in %s: %v", other, st, err)
		}
	}
	if s := status(9).String(); s != "status 9" {
		t.Errorf("an unknown status prints as %q", s)
	}
}

// TestDestroyRunsOnce: destroy removes the sandbox once, however many
// times and from however many goroutines it is called, and every call
// reports the same result.
func TestDestroyRunsOnce(t *testing.T) {
	for _, from := range allStatuses[:4] {
		t.Run(from.String(), func(t *testing.T) {
			b, sb := stubBox(from)
			var wg sync.WaitGroup
			errs := make([]error, 8)
			for i := range errs {
				wg.Go(func() { errs[i] = b.destroy() })
			}
			wg.Wait()
			if err := b.destroy(); err == nil || err.Error() != "stub removal failed" {
				t.Errorf("a later destroy reports %v", err)
			}
			if n := sb.destroys.Load(); n != 1 {
				t.Errorf("Destroy ran %d times, want once", n)
			}
			for _, err := range errs {
				if err == nil || err.Error() != "stub removal failed" {
					t.Errorf("a concurrent destroy reports %v", err)
				}
			}
			if st := b.current(); st != statusDestroyed {
				t.Errorf("after destroy the box is %s", st)
			}
			b.kill() // killing a destroyed box leaves it destroyed
			if st := b.current(); st != statusDestroyed {
				t.Errorf("kill moved a destroyed box to %s", st)
			}
		})
	}
}

// TestRequestRefusedWhenNotReady: a request to a box that is not ready
// (starting, busy, dead or destroyed) is refused before anything is sent.
func TestRequestRefusedWhenNotReady(t *testing.T) {
	for _, st := range []status{statusStarting, statusRunning, statusExited, statusDestroyed} {
		t.Run(st.String(), func(t *testing.T) {
			b, _ := stubBox(st)
			exit, end := b.request(context.Background(), agent.Request{}, 1<<20, startTimeout, nil, nil)
			if exit != nil || end.err == nil || !strings.Contains(end.err.Error(), "from "+st.String()+" to running") {
				t.Errorf("request in %s: exit %v, error %v", st, exit, end.err)
			}
			if err := b.call(context.Background(), agent.Request{Op: agent.OpWarm}); err == nil {
				t.Errorf("call in %s succeeded", st)
			}
			if got := b.current(); got != st {
				t.Errorf("a refused request moved the box to %s", got)
			}
		})
	}
}

// TestKillMovesToExited: kill takes a live box to exited.
func TestKillMovesToExited(t *testing.T) {
	for _, st := range allStatuses[:3] {
		b, _ := stubBox(st)
		b.kill()
		if got := b.current(); got != statusExited {
			t.Errorf("kill in %s: the box is %s, want exited", st, got)
		}
	}
}
