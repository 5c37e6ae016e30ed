package main

import (
	"fmt"
	"log"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// burstBuild is one build of safe-run that burstMain measures: a server
// with the bench's warm pool and one without a pool.
type burstBuild struct {
	name    string
	on, off *server
	calls   map[string][]time.Duration // by series: pool on, its misses, pool off
	warm    []int                      // warm calls of each pool-on burst
	perS    map[int][2][]float64       // by concurrency: pool on, pool off
}

// burstMain measures only the burst series (and, with throughput, the
// pool on/off throughput rows) of this build and, if baseline is a
// directory, of the build whose binaries it holds. The builds take
// turns, burst by burst, each starting with every pool of both builds
// full, so that they see the same load.
func burstMain(o options, baseline string, rounds int, throughputToo bool) {
	opts := []options{o}
	names := []string{"this build"}
	if baseline != "" {
		b := o
		b.bin, b.agent = filepath.Join(baseline, "safe-run"), filepath.Join(baseline, "safe-run-agent")
		opts = append(opts, b)
		names = append(names, "baseline "+baseline)
	}
	var builds []*burstBuild
	var all []*server
	for i, bo := range opts {
		on, err := startServer(bo, nil, warmPoolSize, "--pool", warmPool, "--agent", bo.agent)
		if err != nil {
			fatalf("%s: %v", names[i], err)
		}
		defer on.close()
		off, err := startServer(bo, nil, 0, "--pool=", "--agent", bo.agent)
		if err != nil {
			fatalf("%s: %v", names[i], err)
		}
		defer off.close()
		// One untimed call each: caches filled outside the timing.
		for _, s := range []*server{on, off} {
			if err := s.call("print(1)"); err != nil {
				fatalf("%s: %v", names[i], err)
			}
		}
		builds = append(builds, &burstBuild{name: names[i], on: on, off: off,
			calls: map[string][]time.Duration{}, perS: map[int][2][]float64{}})
		all = append(all, on, off)
	}
	full := func() {
		for _, s := range all {
			if err := s.waitFull(); err != nil {
				fatal(err)
			}
		}
	}
	for r := range rounds {
		for _, b := range builds {
			full()
			on, err := burst(b.on, "pool on", o.burst)
			if err != nil {
				fatalf("%s: burst, pool on: %v", b.name, err)
			}
			full()
			off, err := burst(b.off, "pool off", o.burst)
			if err != nil {
				fatalf("%s: burst, pool off: %v", b.name, err)
			}
			on.classify(off)
			b.warm = append(b.warm, on.Warm)
			for _, ms := range on.Calls {
				d := time.Duration(ms * float64(time.Millisecond))
				b.calls["on"] = append(b.calls["on"], d)
				if ms >= on.WarmBelow {
					b.calls["misses"] = append(b.calls["misses"], d)
				}
			}
			for _, ms := range off.Calls {
				b.calls["off"] = append(b.calls["off"], time.Duration(ms*float64(time.Millisecond)))
			}
		}
		log.Printf("after %d of %d rounds:", r+1, rounds)
		printBurstTable(builds, o.burst)
	}
	if !throughputToo {
		return
	}
	for range rounds {
		for _, c := range []int{1, 2, 4} {
			for _, b := range builds {
				for k, s := range []*server{b.on, b.off} {
					full()
					perS, err := throughput(o.throughputRuns, c, func() error { return s.call("print(1)") })
					if err != nil {
						fatalf("%s: throughput: %v", b.name, err)
					}
					v := b.perS[c]
					v[k] = append(v[k], perS)
					b.perS[c] = v
				}
			}
		}
	}
	printThroughputTable(builds, o.throughputRuns)
}

// printBurstTable prints each build's burst series measured so far.
func printBurstTable(builds []*burstBuild, n int) {
	head := []string{fmt.Sprintf("%d calls back to back, pool python=%d", n, burstPool)}
	for _, b := range builds {
		head = append(head, b.name+": p50 / p95 / min / mean (ms), runs")
	}
	fmt.Printf("| %s |\n|%s\n", strings.Join(head, " | "), strings.Repeat("---|", len(head)))
	for _, row := range []struct{ key, name string }{{"on", "pool on, all calls"}, {"misses", "pool on, misses"}, {"off", "pool off"}} {
		cells := []string{row.name}
		for _, b := range builds {
			if len(b.calls[row.key]) == 0 {
				cells = append(cells, "-")
				continue
			}
			st := summarise(slices.Clone(b.calls[row.key]))
			var sum time.Duration
			for _, d := range b.calls[row.key] {
				sum += d
			}
			mean := float64(sum.Microseconds()) / 1000 / float64(len(b.calls[row.key]))
			cells = append(cells, fmt.Sprintf("%.1f / %.1f / %.1f / %.1f, %d", st.P50, st.P95, st.Min, mean, st.Runs))
		}
		fmt.Printf("| %s |\n", strings.Join(cells, " | "))
	}
	cells := []string{"warm calls per burst"}
	for _, b := range builds {
		var s []string
		for _, w := range b.warm {
			s = append(s, strconv.Itoa(w))
		}
		cells = append(cells, strings.Join(s, ", "))
	}
	fmt.Printf("| %s |\n", strings.Join(cells, " | "))
}

// printThroughputTable prints each build's throughput, pool on and off,
// as the median of the rounds.
func printThroughputTable(builds []*burstBuild, n int) {
	head := []string{fmt.Sprintf("print(1) runs/s, %d runs each, median of rounds", n)}
	for _, b := range builds {
		head = append(head, b.name+": on / off (ratio)")
	}
	fmt.Printf("| %s |\n|%s\n", strings.Join(head, " | "), strings.Repeat("---|", len(head)))
	median := func(v []float64) float64 {
		v = slices.Clone(v)
		slices.Sort(v)
		return v[len(v)/2]
	}
	for _, c := range []int{1, 2, 4} {
		cells := []string{"concurrency " + strconv.Itoa(c)}
		for _, b := range builds {
			on, off := median(b.perS[c][0]), median(b.perS[c][1])
			cells = append(cells, fmt.Sprintf("%.1f / %.1f (%.2f x; on %v, off %v)", on, off, on/off, b.perS[c][0], b.perS[c][1]))
		}
		fmt.Printf("| %s |\n", strings.Join(cells, " | "))
	}
}
