package main

import (
	"log"
	"math"
	"slices"
	"time"
)

// burstShown is how many of a burst's first calls the table lists.
const burstShown = 6

// Burst is a series of print(1) calls back to back, without pause, as a
// client calling as fast as it can makes them.
type Burst struct {
	Name  string    `json:"name"`
	Calls []float64 `json:"calls_ms"` // in order
	Stats Stats     `json:"stats"`
	// Warm counts the calls under warmBelow ms: served by a pooled sandbox.
	Warm      int     `json:"warm_calls"`
	WarmBelow float64 `json:"warm_below_ms"`
	// FirstWarm is how many calls from the first were all warm.
	FirstWarm int `json:"first_warm_in_a_row"`
	// Misses are the calls that were not warm.
	Misses *Stats `json:"misses,omitempty"`
}

// burst times n print(1) calls back to back, starting with a full pool.
func burst(s *server, name string, n int) (Burst, error) {
	b := Burst{Name: name}
	if err := s.waitFull(); err != nil {
		return b, err
	}
	var ds []time.Duration
	for range n {
		start := time.Now()
		if err := s.call("print(1)"); err != nil {
			return b, err
		}
		ds = append(ds, time.Since(start))
	}
	for _, d := range ds {
		b.Calls = append(b.Calls, math.Round(float64(d.Microseconds())/10)/100)
	}
	b.Stats = summarise(slices.Clone(ds))
	return b, nil
}

// classify marks the calls of b that were warm: those faster than half
// the quickest call of the same burst without a pool, which no start of a
// sandbox beats.
func (b *Burst) classify(off Burst) {
	b.WarmBelow = off.Stats.Min / 2
	var misses []time.Duration
	inARow := true
	for _, ms := range b.Calls {
		if ms < b.WarmBelow {
			b.Warm++
			if inARow {
				b.FirstWarm++
			}
			continue
		}
		inARow = false
		misses = append(misses, time.Duration(ms*float64(time.Millisecond)))
	}
	if len(misses) > 0 {
		s := summarise(misses)
		b.Misses = &s
	}
	log.Printf("burst %s: p50 %.1f ms, %d of %d warm (the first %d)", b.Name, b.Stats.P50, b.Warm, len(b.Calls), b.FirstWarm)
}
