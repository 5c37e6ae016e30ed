package main

import (
	"fmt"
	"log"
	"time"
)

// warmPrograms are the warm rows of issue 17, each with its target p50
// (and p95 where the issue sets one), in ms.
var warmPrograms = []struct {
	Lang, Name, Code string
	P50, P95         float64
}{
	{"python", "print(1)", "print(1)", 5, 10},
	{"python", "import pandas", "import pandas as pd; print(pd.__version__)", 6, 0},
	{"node", "console.log(1)", "console.log(1)", 5, 0},
	{"bash", "echo 1", "echo 1", 5, 0},
}

// warmPool is the pool of the warm server: every language of warmPrograms,
// and two Python sandboxes for the burst.
const (
	warmPool     = "python=2,node=1,bash=1"
	warmPoolSize = 4
	burstPool    = 2 // the Python pool's size
)

// Warm is the spaced series of one warm program: the pool full before
// each call, the call alone timed.
type Warm struct {
	Lang  string `json:"language"`
	Name  string `json:"program"`
	Stats Stats  `json:"stats"`
}

// measureWarm times runs calls of each warm program, taking turns so that
// load drifts alike, after one untimed call each.
func measureWarm(s *server, runs int) ([]Warm, error) {
	ds := make([][]time.Duration, len(warmPrograms))
	for i := range runs + 1 {
		for j, p := range warmPrograms {
			d, err := s.timed(p.Lang, p.Code)
			if err != nil {
				return nil, fmt.Errorf("warm %s %s: %w", p.Lang, p.Name, err)
			}
			if i > 0 {
				ds[j] = append(ds[j], d)
			}
		}
	}
	var out []Warm
	for j, p := range warmPrograms {
		w := Warm{Lang: p.Lang, Name: p.Name, Stats: summarise(ds[j])}
		log.Printf("warm MCP run_code %-6s %-14s p50 %6.2f ms p95 %6.2f ms", p.Lang, p.Name, w.Stats.P50, w.Stats.P95)
		out = append(out, w)
	}
	return out, nil
}
