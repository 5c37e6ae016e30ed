package monitor

import (
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	pb "gvisor.dev/gvisor/pkg/sentry/seccheck/points/points_go_proto"
)

// takeWithin calls m.Take and fails the test when it has not returned
// after d: a bound far beyond what settling takes, so that only a lost
// wake-up (settle waiting out Limits.Settle, set huge) trips it.
func takeWithin(t *testing.T, m *Monitor, d time.Duration) (events int) {
	t.Helper()
	done := make(chan int, 1)
	go func() { done <- m.Take().Events["open"] }()
	select {
	case n := <-done:
		return n
	case <-time.After(d):
		t.Fatalf("Take did not return within %s: settle missed the reader's idle notice", d)
		return 0
	}
}

// TestSettleWakesWhenDrained checks that Take returns once the reader has
// applied what the socket held, without waiting out its bound (an hour
// here), and that it then holds every point sent before it: the reader's
// idle notice wakes settle, and none is lost between its check and its
// wait.
func TestSettleWakesWhenDrained(t *testing.T) {
	m := startMonitor(t, Options{Limits: Limits{Settle: time.Hour}})
	s := dial(t, m)
	s.send(start("/safe-run-agent"))
	total := 0
	for round := range 200 {
		n := round % 7 // some rounds send nothing: the reader is idle already
		for range n {
			s.send(openat(2, "/workspace/f", unix.O_RDONLY, 0))
		}
		total += n
		if got := takeWithin(t, m, 30*time.Second); got != n {
			t.Fatalf("round %d: Take saw %d opens of the %d sent before it", round, got, n)
		}
	}
	if got := m.Total().Events["open"]; got != total {
		t.Errorf("total %d opens, sent %d", got, total)
	}
}

// TestSettleConcurrentTakers checks that many goroutines settling at once
// are all woken (one notice wakes every waiter) while the sink sends.
func TestSettleConcurrentTakers(t *testing.T) {
	m := startMonitor(t, Options{Limits: Limits{Settle: time.Hour}})
	s := dial(t, m)
	s.send(start("/safe-run-agent"))
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				m.settle()
				m.Total()
			}
		}()
	}
	for range 500 {
		s.send(openat(2, "/workspace/f", unix.O_RDONLY, 0))
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("settling goroutines still waiting after 30 s: a wake-up was lost")
	}
	if got := takeWithin(t, m, 30*time.Second); got != 500 {
		t.Errorf("Take saw %d opens of 500", got)
	}
}

// TestSettleBound checks that a reader that cannot drain the socket (a
// flood held back by the rate limit) makes Take wait no longer than its
// bound, and that the result then holds what was applied so far.
func TestSettleBound(t *testing.T) {
	// A bound long enough for a loaded machine to schedule the reader.
	m := startMonitor(t, Options{Limits: Limits{EventsPerSecond: 10, Settle: time.Second}})
	s := dial(t, m)
	if err := unix.SetNonblock(s.fd, true); err != nil {
		t.Fatal(err)
	}
	msg := frame(pb.MessageType_MESSAGE_SYSCALL_OPEN, 0, openat(2, "/workspace/f", unix.O_RDONLY, 0))
	sent := 0
	for range 200 {
		if _, err := unix.Write(s.fd, msg); err == nil {
			sent++
		}
	}
	// The burst (20) is applied at once; the rest trickles at 10/s.
	got := takeWithin(t, m, 10*time.Second)
	if got == 0 || got >= sent {
		t.Errorf("Take saw %d opens of %d held back by the rate limit: want some, not all", got, sent)
	}
	// Close settles (1 s), then gives the readers 2 s more at most.
	if err := closeWithin(m, 5*time.Second); err != nil {
		t.Error(err)
	}
}
