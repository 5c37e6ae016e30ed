package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"
)

// monitorLevels are the --monitor levels the overhead rows compare.
var monitorLevels = []string{"off", "default", "full"}

// monitorPrograms are the workloads of the monitor rows: the smallest
// program, one dominated by importing (thousands of opens), and one that
// creates, writes and reads many files (an open point each).
var monitorPrograms = []struct{ Name, Code string }{
	{"print(1)", "print(1)"},
	{"import pandas", "import pandas as pd; print(pd.__version__)"},
	{"2,000 files written and read", "import os\nos.makedirs('/workspace/d', exist_ok=True)\nfor i in range(2000):\n    p = f'/workspace/d/{i}.txt'\n    open(p, 'w').write(str(i))\n    open(p).read()\nprint('ok')"},
}

// MonitorReport is the overhead of behaviour monitoring: cold `safe-run
// run` of each program at each --monitor level, the levels interleaved
// run by run so that the host's load falls on all of them alike.
type MonitorReport struct {
	Date    string                      `json:"date"`
	Machine string                      `json:"machine"`
	Runs    int                         `json:"runs"`
	Rows    map[string]map[string]Stats `json:"rows"` // program → level → stats
	// Warm is a pooled MCP run_code print(1) at each level: one server per
	// level, each with a Python pool of one, called in turns.
	Warm map[string]Stats `json:"warm"`
	// WarmRuns is the number of calls of each Warm cell.
	WarmRuns int `json:"warm_runs"`
	// Baseline, Warm's calls to another safe-run binary (-monitor-baseline,
	// e.g. an earlier commit's), its servers taking turns with Warm's so
	// that the two are measured side by side; BaselineBin names it.
	Baseline    map[string]Stats `json:"baseline,omitempty"`
	BaselineBin string           `json:"baseline_bin,omitempty"`
	// Load is the host's load average (1, 5, 15 min) at the start and at
	// the end: the machine may be shared.
	Load []string `json:"load"`
}

// runMonitorBench measures every program at every level, o.runs times each.
func runMonitorBench(o options) (*MonitorReport, error) {
	rep := &MonitorReport{Date: time.Now().UTC().Format("2006-01-02"), Machine: machine(), Runs: o.runs, Rows: map[string]map[string]Stats{}, Load: []string{loadAverage()}}
	defer func() { rep.Load = append(rep.Load, loadAverage()) }()
	for _, p := range monitorPrograms {
		times := map[string][]time.Duration{}
		for _, level := range monitorLevels { // untimed: the page cache and the image
			if err := monitorRun(o, level, p.Code); err != nil {
				return nil, err
			}
		}
		for range o.runs {
			for _, level := range monitorLevels {
				start := time.Now()
				if err := monitorRun(o, level, p.Code); err != nil {
					return nil, err
				}
				times[level] = append(times[level], time.Since(start))
			}
		}
		rep.Rows[p.Name] = map[string]Stats{}
		for level, ds := range times {
			rep.Rows[p.Name][level] = summarise(ds)
		}
	}
	rep.WarmRuns = o.warmRuns
	if rep.WarmRuns <= 0 {
		rep.WarmRuns = o.runs
	}
	bins := []string{o.bin}
	if o.monitorBaseline != "" {
		bins = append(bins, o.monitorBaseline)
		rep.BaselineBin = o.monitorBaseline
	}
	warm, err := monitorWarm(o, bins, rep.WarmRuns)
	if err != nil {
		return nil, err
	}
	rep.Warm = warm[o.bin]
	if o.monitorBaseline != "" {
		rep.Baseline = warm[o.monitorBaseline]
	}
	return rep, nil
}

// loadAverage is /proc/loadavg's first three fields.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	if f := strings.Fields(string(b)); len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "unknown"
}

// monitorWarm times pooled print(1) calls through MCP at every level, for
// each binary of bins, runs calls each: one server per binary and level,
// taking turns, each call alone with its pool full.
func monitorWarm(o options, bins []string, runs int) (map[string]map[string]Stats, error) {
	type key struct{ bin, level string }
	servers := map[key]*server{}
	defer func() {
		for _, s := range servers {
			s.close()
		}
	}()
	for _, bin := range bins {
		ob := o
		ob.bin = bin
		for _, level := range monitorLevels {
			s, err := startServer(ob, nil, 1, "--pool", "python=1", "--monitor", level)
			if err != nil {
				return nil, fmt.Errorf("%s serve --monitor %s: %w", bin, level, err)
			}
			servers[key{bin, level}] = s
		}
	}
	times := map[key][]time.Duration{}
	for i := range runs + 1 {
		for _, bin := range bins {
			for _, level := range monitorLevels {
				k := key{bin, level}
				d, err := servers[k].timed("python", "print(1)")
				if err != nil {
					return nil, fmt.Errorf("%s warm print(1) --monitor %s: %w", bin, level, err)
				}
				if i > 0 { // the first call of each warms the server's own paths
					times[k] = append(times[k], d)
				}
			}
		}
	}
	out := map[string]map[string]Stats{}
	for k, ds := range times {
		if out[k.bin] == nil {
			out[k.bin] = map[string]Stats{}
		}
		out[k.bin][k.level] = summarise(ds)
	}
	return out, nil
}

// monitorRun runs code once, cold, at level.
func monitorRun(o options, level, code string) error {
	out, err := exec.Command(o.bin, "run", "--monitor", level, "--timeout", "2m", "--lang", "python", "-c", code).CombinedOutput()
	if err != nil {
		return fmt.Errorf("safe-run run --monitor %s: %v: %s", level, err, out)
	}
	return nil
}

func (r *MonitorReport) markdown() string {
	var b strings.Builder
	warmRuns := r.WarmRuns
	if warmRuns == 0 { // a report from before warm_runs
		warmRuns = r.Runs
	}
	fmt.Fprintf(&b, "Measured %s on %s; p50 (min) of %d cold `safe-run run` calls per cell (the warm rows: %d MCP calls a cell from a pool of one), the levels interleaved (`go run ./scripts/bench -monitor`).\n\n", r.Date, r.Machine, r.Runs, warmRuns)
	b.WriteString("| program | `--monitor=off` | `default` | `full` |\n|---|---|---|---|\n")
	for _, p := range monitorPrograms {
		row := r.Rows[p.Name]
		fmt.Fprintf(&b, "| %s |", p.Name)
		for _, level := range monitorLevels {
			s := row[level]
			cell := fmt.Sprintf(" %.0f ms (%.0f)", s.P50, s.Min)
			if level != "off" {
				cell += fmt.Sprintf(", %+.0f ms", s.P50-row["off"].P50)
			}
			b.WriteString(cell + " |")
		}
		b.WriteString("\n")
	}
	warmRow := func(name string, warm map[string]Stats) {
		fmt.Fprintf(&b, "| %s |", name)
		for _, level := range monitorLevels {
			s := warm[level]
			cell := fmt.Sprintf(" %.1f ms (%.1f)", s.P50, s.Min)
			if level != "off" {
				cell += fmt.Sprintf(", %+.1f ms", s.P50-warm["off"].P50)
			}
			b.WriteString(cell + " |")
		}
		b.WriteString("\n")
	}
	if len(r.Warm) > 0 {
		warmRow("print(1), warm: MCP `run_code` from the pool", r.Warm)
	}
	if len(r.Baseline) > 0 {
		warmRow(fmt.Sprintf("print(1), warm, baseline `%s`, in the same turns", r.BaselineBin), r.Baseline)
	}
	if len(r.Load) > 0 {
		fmt.Fprintf(&b, "\nLoad average (1, 5, 15 min) at the start and the end: %s.\n", strings.Join(r.Load, "; "))
	}
	return b.String()
}

func monitorMain(o options) {
	rep, err := runMonitorBench(o)
	if err != nil {
		fatal(err)
	}
	writeReport(o, "monitor", "bench-monitor", rep, rep.markdown())
}
