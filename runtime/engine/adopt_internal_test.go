package engine

import (
	"errors"
	"testing"
	"time"
)

// TestAdoptable: a run that finds the pool empty waits for the refill
// under way, at a run's priority, that no other run waits for and will be
// ready soonest, only if that is before a cold start would be; without a
// CPU meter a refill's progress is its age.
func TestAdoptable(t *testing.T) {
	now := time.Now()
	at := func(ago time.Duration) *refill { return &refill{start: now.Add(-ago), started: true} }
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
		{"the soonest unclaimed one", []*refill{{start: now.Add(-time.Second), started: true, claimed: true}, at(400 * time.Millisecond), at(350 * time.Millisecond)}, refillTook, coldTook, 1},
		{"a background refill: its progress is unknown", []*refill{{start: now.Add(-time.Second), started: true, background: true}}, refillTook, coldTook, -1},
		{"the oldest at a run's priority", []*refill{{start: now.Add(-time.Second), started: true, background: true}, at(400 * time.Millisecond)}, refillTook, coldTook, 1},
		{"every one claimed", []*refill{{start: now.Add(-time.Second), started: true, claimed: true}}, refillTook, coldTook, -1},
		{"refills faster than cold starts", []*refill{at(0)}, 100 * time.Millisecond, coldTook, 0},
		{"no refill measured yet", []*refill{at(2 * time.Second)}, 0, coldTook, -1},
		{"no cold start measured yet", []*refill{at(2 * time.Second)}, refillTook, 0, -1},
		{"overdue, but its sandbox not started: all its work ahead", []*refill{{start: now.Add(-2 * time.Second)}}, refillTook, coldTook, -1},
	} {
		pl := &poolLang{refills: tc.refills, refillTook: tc.refillTook, coldTook: tc.coldTook}
		checkAdoptable(t, tc.name, pl, now, tc.want)
	}
}

// checkAdoptable checks that pl.adoptable(now) is pl.refills[want], or nil
// for -1.
func checkAdoptable(t *testing.T, name string, pl *poolLang, now time.Time, want int) {
	t.Helper()
	var r *refill
	if want >= 0 {
		r = pl.refills[want]
	}
	if got, _, _ := pl.adoptable(now, true); got != r {
		t.Errorf("%s: adoptable = %v, want %v", name, got, r)
	}
}

// TestAdoptableByCPU: where the backend meters a refill's CPU, its
// progress is the CPU it used against what a refill uses, whatever its
// priority or age, and it is adopted if what it has left is less than the
// CPU a cold sandbox uses until it answered minus what a pooled run uses.
func TestAdoptableByCPU(t *testing.T) {
	now := time.Now()
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	// used makes a background refill started ago that has used cpu.
	used := func(ago, cpu time.Duration) *refill {
		return &refill{start: now.Add(-ago), started: true, background: true, used: func() (time.Duration, error) { return cpu, nil }}
	}
	unreadable := &refill{start: now.Add(-time.Second), started: true, background: true,
		used: func() (time.Duration, error) { return 0, errors.New("no cgroup") }}
	claimed := used(ms(50), ms(290))
	claimed.claimed = true
	type cpus struct{ refill, cold, warmRun time.Duration }
	// Measured here: a restore and its prime use 230-300 ms of CPU, a cold
	// sandbox about 165 ms until it answered print(1), a pooled run 5 ms.
	here := cpus{ms(300), ms(165), ms(5)}
	for _, tc := range []struct {
		name    string
		refills []*refill
		c       cpus
		want    int // index in refills, -1 for none
	}{
		{"just started: a cold start is sooner", []*refill{used(ms(20), ms(10))}, here, -1},
		{"old but starved of CPU: a cold start is sooner", []*refill{used(ms(900), ms(50))}, here, -1},
		{"young but far along: it is sooner", []*refill{used(ms(150), ms(200))}, here, 0},
		{"less left than a cold start costs more", []*refill{used(ms(100), ms(300-159))}, here, 0},
		{"exactly as much: start cold", []*refill{used(ms(100), ms(300-160))}, here, -1},
		{"used more than a refill uses: it is sooner", []*refill{used(ms(100), ms(400))}, here, 0},
		{"the one with least left", []*refill{used(ms(500), ms(150)), used(ms(100), ms(250)), used(ms(300), ms(200))}, here, 1},
		{"a claimed one is another run's", []*refill{claimed, used(ms(100), ms(200))}, here, 1},
		{"every one claimed", []*refill{claimed}, here, -1},
		{"an unreadable meter: its progress is unknown", []*refill{unreadable}, here, -1},
		{"no refill's CPU measured yet: not by age in the background", []*refill{used(ms(900), ms(290))}, cpus{0, ms(165), ms(5)}, -1},
		{"no cold sandbox's CPU measured yet", []*refill{used(ms(100), ms(290))}, cpus{ms(300), 0, ms(5)}, -1},
		{"no pooled run measured yet: the cold start's CPU", []*refill{used(ms(100), ms(140))}, cpus{ms(300), ms(165), 0}, 0},
		{"pooled runs cost as much: no cold cost to beat", []*refill{used(ms(100), ms(299))}, cpus{ms(300), ms(165), ms(165)}, -1},
	} {
		// The durations would adopt any refill at a run's priority:
		// with a meter they do not count.
		pl := &poolLang{refills: tc.refills, refillTook: ms(430), coldTook: ms(2000), refillCPU: tc.c.refill,
			coldCPUMin: tc.c.cold, warmRunCPUMin: tc.c.warmRun}
		checkAdoptable(t, tc.name, pl, now, tc.want)
		// Where runs take every CPU, a background refill is not judged
		// by its CPU: a run starts cold.
		if got, _, _ := pl.adoptable(now, false); got != nil {
			t.Errorf("%s, no CPU free: adoptable = %v, want none", tc.name, got)
		}
	}
}

// TestAdoptableSavesInterpreterStart: without a meter, a cold start's cost
// is its duration plus the interpreter start a pooled sandbox saves (the
// shortest cold run minus the shortest pooled one).
func TestAdoptableSavesInterpreterStart(t *testing.T) {
	now := time.Now()
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	for _, tc := range []struct {
		name                   string
		age                    time.Duration
		coldRunMin, warmRunMin time.Duration
		adopt                  bool
	}{
		{"nothing saved: a cold start is sooner", ms(200), 0, 0, false},
		{"the interpreter's start makes it sooner", ms(200), ms(90), ms(10), true},
		{"pooled runs no faster: no saving", ms(200), ms(10), ms(20), false},
	} {
		r := &refill{start: now.Add(-tc.age), started: true}
		pl := &poolLang{refills: []*refill{r}, refillTook: ms(430), coldTook: ms(190), coldRunMin: tc.coldRunMin, warmRunMin: tc.warmRunMin}
		if got, _, _ := pl.adoptable(now, true); (got == r) != tc.adopt {
			t.Errorf("%s: adopted %v, want %v", tc.name, got == r, tc.adopt)
		}
	}
}

// TestPoolLearnsColdCostOnceFilled: a cold run's duration and CPU teach
// the pool what a cold start costs only once the pool has been full: the
// first runs of a server (its probe) come beside the pool's first fill.
func TestPoolLearnsColdCostOnceFilled(t *testing.T) {
	pl := &poolLang{size: 2}
	p := &pool{langs: map[string]*poolLang{"python": pl}}
	p.observeCold("python", time.Second)
	p.observeRun("python", true, time.Second, 2*time.Second)
	p.observeRun("python", false, 20*time.Millisecond, 10*time.Millisecond)
	if pl.coldTook != 0 || pl.coldRunMin != 0 || pl.coldCPUMin != 0 {
		t.Errorf("before the first fill: coldTook %v, coldRunMin %v, coldCPUMin %v; want none", pl.coldTook, pl.coldRunMin, pl.coldCPUMin)
	}
	if pl.warmRunMin != 20*time.Millisecond || pl.warmRunCPUMin != 10*time.Millisecond {
		t.Errorf("a pooled run before the first fill: warmRunMin %v, warmRunCPUMin %v; want 20ms, 10ms", pl.warmRunMin, pl.warmRunCPUMin)
	}
	pl.filled = true
	p.observeCold("python", 400*time.Millisecond)
	p.observeRun("python", true, 500*time.Millisecond, 600*time.Millisecond)
	if pl.coldTook != 400*time.Millisecond || pl.coldRunMin != 500*time.Millisecond || pl.coldCPUMin != 600*time.Millisecond {
		t.Errorf("once filled: coldTook %v, coldRunMin %v, coldCPUMin %v; want 400ms, 500ms, 600ms", pl.coldTook, pl.coldRunMin, pl.coldCPUMin)
	}
}
