package main

import (
	"fmt"
	"log"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// warmPrograms are the warm rows of issue 17, each with its target p50
// (and p95 where the issue sets one), in ms; a row without a target (0)
// only measures. The last makes 30,000 small objects, as real code does,
// which sets off the interpreter's garbage collections during the run.
var warmPrograms = []warmProgram{
	{"python", "print(1)", "print(1)", 5, 10},
	{"python", "import pandas", "import pandas as pd; print(pd.__version__)", 6, 0},
	{"node", "console.log(1)", "console.log(1)", 5, 0},
	{"bash", "echo 1", "echo 1", 5, 0},
	{"python", "30,000 objects", `x = [{"a": [i]} for i in range(30000)]; print(len(x))`, 0, 0},
}

// warmProgram is one warm row: a program of a language and its targets.
type warmProgram struct {
	Lang, Name, Code string
	P50, P95         float64
}

// warmProgramsOf returns the warm rows of the comma-separated languages
// langs, or all of them for "".
func warmProgramsOf(langs string) []warmProgram {
	if langs == "" {
		return warmPrograms
	}
	var out []warmProgram
	for _, p := range warmPrograms {
		if slices.Contains(strings.Split(langs, ","), p.Lang) {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		fatalf("-warm-langs %q: no warm row of those languages; the rows are of python, node and bash", langs)
	}
	return out
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

// warmBuild is one build of safe-run that warmMain measures.
type warmBuild struct {
	name string
	o    options
}

// warmMain measures only the warm rows (of o.warmLangs, or all), of this
// build and, if baseline is a directory, of the build whose binaries it
// holds: both servers run at once, their calls take turns, so that the two
// builds see the same load, and each call waits until both pools are full.
func warmMain(o options, baseline string) {
	progs := warmProgramsOf(o.warmLangs)
	builds := []warmBuild{{"this build", o}}
	if baseline != "" {
		b := o
		b.bin, b.agent = filepath.Join(baseline, "safe-run"), filepath.Join(baseline, "safe-run-agent")
		builds = append(builds, warmBuild{"baseline " + baseline, b})
	}
	servers := make([]*server, len(builds))
	for i, b := range builds {
		s, err := startServer(b.o, nil, warmPoolSize, "--pool", warmPool, "--agent", b.o.agent)
		if err != nil {
			fatalf("%s: %v", b.name, err)
		}
		defer s.close()
		servers[i] = s
	}
	ds := make([][][]time.Duration, len(builds))
	for i := range ds {
		ds[i] = make([][]time.Duration, len(progs))
	}
	for r := range o.runs + 1 {
		for j, p := range progs {
			for i, s := range servers {
				// Every pool full, not only this one's: a refill of the
				// other build's must not run during this call.
				for _, other := range servers {
					if err := other.waitFull(); err != nil {
						fatalf("%s: %v", builds[i].name, err)
					}
				}
				d, err := s.timed(p.Lang, p.Code)
				if err != nil {
					fatalf("%s: warm %s %s: %v", builds[i].name, p.Lang, p.Name, err)
				}
				if r > 0 {
					ds[i][j] = append(ds[i][j], d)
				}
			}
		}
		if r > 0 && r < o.runs {
			// The table so far: a run stopped early still tells.
			log.Printf("after %d of %d rounds:", r, o.runs)
			printWarmTable(builds, progs, ds, r)
		}
	}
	printWarmTable(builds, progs, ds, o.runs)
}

// printWarmTable prints the warm rows progs of each build measured so far,
// runs calls each.
func printWarmTable(builds []warmBuild, progs []warmProgram, ds [][][]time.Duration, runs int) {
	head := []string{fmt.Sprintf("warm MCP `run_code`, %d spaced calls", runs)}
	for _, b := range builds {
		head = append(head, b.name+": p50 / p95 / min (ms)")
	}
	fmt.Printf("| %s |\n|%s\n", strings.Join(head, " | "), strings.Repeat("---|", len(head)))
	for j, p := range progs {
		cells := []string{p.Lang + " `" + p.Name + "`"}
		for i := range builds {
			st := summarise(slices.Clone(ds[i][j]))
			cells = append(cells, fmt.Sprintf("%.1f / %.1f / %.1f", st.P50, st.P95, st.Min))
		}
		fmt.Printf("| %s |\n", strings.Join(cells, " | "))
	}
}
