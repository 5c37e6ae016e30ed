package main

import (
	"encoding/json"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// checkBlocks is how many `print(i)` blocks the check benchmark's document
// holds: a suite of short blocks, where start-up cost is all there is.
const checkBlocks = 100

// CheckReport is the check benchmark: one document of checkBlocks blocks
// through `safe-run check -j 2`, against the same blocks through as many
// `safe-run run` calls.
type CheckReport struct {
	Date    string  `json:"date"`
	Machine string  `json:"machine"`
	Runsc   string  `json:"runsc"`
	Blocks  int     `json:"blocks"`
	Reps    int     `json:"repetitions"`
	Check   float64 `json:"check_j2_s"`        // median wall time of `check -j 2`
	Run1    float64 `json:"run_sequential_s"`  // median wall time of the runs one at a time
	Run2    float64 `json:"run_2_at_a_time_s"` // median wall time of the runs two at a time
}

// checkDocument writes the benchmark's document: block i prints i, and its
// expected-output block says so, so every block is compared, not only run.
func checkDocument(dir string) (string, error) {
	var b strings.Builder
	b.WriteString("# bench\n")
	for i := range checkBlocks {
		fmt.Fprintf(&b, "\n```python\nprint(%d)\n```\n\n```output\n%d\n```\n", i, i)
	}
	path := filepath.Join(dir, "bench.md")
	return path, os.WriteFile(path, []byte(b.String()), 0o644)
}

// wall runs f(0) … f(n-1), c at a time, and returns the wall time of all.
func wall(n, c int, f func(i int) error) (time.Duration, error) {
	next := make(chan int, n)
	for i := range n {
		next <- i
	}
	close(next)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	start := time.Now()
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(i); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return time.Since(start), <-errs
}

// median of the durations, in seconds.
func median(ds []time.Duration) float64 {
	slices.Sort(ds)
	return ds[len(ds)/2].Seconds()
}

// runCheckBench measures the check benchmark, reps times each, after one
// untimed warm-up of each path (the check's pool builds its checkpoint there).
func runCheckBench(o options, reps int) (*CheckReport, error) {
	dir, err := os.MkdirTemp("", "safe-run-bench-check-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	doc, err := checkDocument(dir)
	if err != nil {
		return nil, err
	}
	check := func(int) error {
		out, err := exec.Command(o.bin, "check", "-j", "2", doc).CombinedOutput()
		if err != nil {
			return fmt.Errorf("safe-run check -j 2: %w\n%s", err, out)
		}
		return nil
	}
	run := func(i int) error {
		out, err := exec.Command(o.bin, "run", "--lang", "python", "-c", fmt.Sprintf("print(%d)", i)).Output()
		if err != nil {
			return fmt.Errorf("safe-run run print(%d): %w", i, err)
		}
		if got := strings.TrimSpace(string(out)); got != strconv.Itoa(i) {
			return fmt.Errorf("safe-run run print(%d) printed %q", i, got)
		}
		return nil
	}
	if err := check(0); err != nil {
		return nil, err
	}
	if err := run(0); err != nil {
		return nil, err
	}
	rep := &CheckReport{Date: time.Now().UTC().Format("2006-01-02 15:04 UTC"), Machine: machine(), Blocks: checkBlocks, Reps: reps}
	if out, err := exec.Command(o.runsc, "--version").Output(); err == nil {
		rep.Runsc = strings.TrimPrefix(strings.SplitN(string(out), "\n", 2)[0], "runsc version ")
	}
	var checks, seq, two []time.Duration
	for r := range reps {
		d, err := wall(1, 1, check)
		if err != nil {
			return nil, err
		}
		checks = append(checks, d)
		log.Printf("repetition %d: safe-run check -j 2, %d blocks: %.1f s", r+1, checkBlocks, d.Seconds())
		if d, err = wall(checkBlocks, 1, run); err != nil {
			return nil, err
		}
		seq = append(seq, d)
		log.Printf("repetition %d: %d safe-run run, one at a time: %.1f s", r+1, checkBlocks, d.Seconds())
		if d, err = wall(checkBlocks, 2, run); err != nil {
			return nil, err
		}
		two = append(two, d)
		log.Printf("repetition %d: %d safe-run run, two at a time: %.1f s", r+1, checkBlocks, d.Seconds())
	}
	rep.Check, rep.Run1, rep.Run2 = median(checks), median(seq), median(two)
	return rep, nil
}

// markdown renders the check benchmark for docs/benchmarks.md and docs/check.md.
func (rep *CheckReport) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Measured %s on %s, runsc %s; %d `print(i)` blocks, each with its expected output; median of %d repetitions.\n\n",
		rep.Date, rep.Machine, rep.Runsc, rep.Blocks, rep.Reps)
	b.WriteString("| path | wall time | per block | wall time ÷ `check -j 2`'s |\n|---|---|---|---|\n")
	row := func(name string, s float64) {
		fmt.Fprintf(&b, "| %s | %.1f s | %.0f ms | %.2f × |\n", name, s, s*1000/float64(rep.Blocks), s/rep.Check)
	}
	row("`safe-run check -j 2 bench.md` (its own warm pool)", rep.Check)
	row(fmt.Sprintf("%d × `safe-run run`, one at a time", rep.Blocks), rep.Run1)
	row(fmt.Sprintf("%d × `safe-run run`, two at a time", rep.Blocks), rep.Run2)
	return b.String()
}

// checkMain is `bench -check`: the check benchmark alone, written to
// check.{md,json} and to docs/benchmarks.md's bench-check section.
func checkMain(o options, reps int) {
	rep, err := runCheckBench(o, reps)
	if err != nil {
		fatal(err)
	}
	writeReport(o, "check", "bench-check", rep, rep.markdown())
}

// writeReport prints table and writes it and rep to NAME.{md,json} in the
// output directory and to docs/benchmarks.md's MARKER section.
func writeReport(o options, name, marker string, rep any, table string) {
	fmt.Print(table)
	must(os.MkdirAll(o.out, 0o755))
	js, _ := json.MarshalIndent(rep, "", "  ")
	must(os.WriteFile(filepath.Join(o.out, name+".json"), append(js, '\n'), 0o644))
	must(os.WriteFile(filepath.Join(o.out, name+".md"), []byte(table), 0o644))
	if o.doc != "" {
		must(replaceMarked(o.doc, marker, table))
	}
}
