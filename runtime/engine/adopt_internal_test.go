package engine

import (
	"testing"
	"time"
)

// TestAdoptable: a run that finds the pool empty waits for the oldest
// refill under way that no other run waits for, only if that refill is
// expected to be ready before a cold start would be.
func TestAdoptable(t *testing.T) {
	now := time.Now()
	at := func(ago time.Duration) *refill { return &refill{start: now.Add(-ago)} }
	const refillTook, coldTook = 430 * time.Millisecond, 190 * time.Millisecond
	for _, tc := range []struct {
		name                 string
		refills              []*refill
		refillTook, coldTook time.Duration
		want                 int // index in refills, -1 for none
	}{
		{"no refill under way", nil, refillTook, coldTook, -1},
		{"just started: a cold start is sooner", []*refill{at(10 * time.Millisecond)}, refillTook, coldTook, -1},
		{"more than half done: it is sooner", []*refill{at(300 * time.Millisecond)}, refillTook, coldTook, 0},
		{"exactly as soon: start cold", []*refill{at(refillTook - coldTook)}, refillTook, coldTook, -1},
		{"overdue: it is sooner", []*refill{at(2 * time.Second)}, refillTook, coldTook, 0},
		{"the oldest unclaimed one", []*refill{{start: now.Add(-time.Second), claimed: true}, at(400 * time.Millisecond), at(350 * time.Millisecond)}, refillTook, coldTook, 1},
		{"a background refill: its progress is unknown", []*refill{{start: now.Add(-time.Second), background: true}}, refillTook, coldTook, -1},
		{"the oldest at a run's priority", []*refill{{start: now.Add(-time.Second), background: true}, at(400 * time.Millisecond)}, refillTook, coldTook, 1},
		{"every one claimed", []*refill{{start: now.Add(-time.Second), claimed: true}}, refillTook, coldTook, -1},
		{"refills faster than cold starts", []*refill{at(0)}, 100 * time.Millisecond, coldTook, 0},
		{"no refill measured yet", []*refill{at(2 * time.Second)}, 0, coldTook, -1},
		{"no cold start measured yet", []*refill{at(2 * time.Second)}, refillTook, 0, -1},
	} {
		pl := &poolLang{refills: tc.refills, refillTook: tc.refillTook, coldTook: tc.coldTook}
		got := pl.adoptable(now)
		var want *refill
		if tc.want >= 0 {
			want = tc.refills[tc.want]
		}
		if got != want {
			t.Errorf("%s: adoptable = %v, want %v", tc.name, got, want)
		}
	}
}
