package main

import (
	"fmt"
	"log"
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
}

// runMonitorBench measures every program at every level, o.runs times each.
func runMonitorBench(o options) (*MonitorReport, error) {
	rep := &MonitorReport{Date: time.Now().UTC().Format("2006-01-02"), Machine: machine(), Runs: o.runs, Rows: map[string]map[string]Stats{}}
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
	warm, err := monitorWarm(o)
	if err != nil {
		return nil, err
	}
	rep.Warm = warm
	return rep, nil
}

// monitorWarm times pooled print(1) calls through MCP at every level, the
// levels' servers taking turns, each call alone with its pool full.
func monitorWarm(o options) (map[string]Stats, error) {
	servers := map[string]*server{}
	defer func() {
		for _, s := range servers {
			s.close()
		}
	}()
	for _, level := range monitorLevels {
		s, err := startServer(o, nil, 1, "--pool", "python=1", "--monitor", level)
		if err != nil {
			return nil, fmt.Errorf("serve --monitor %s: %w", level, err)
		}
		servers[level] = s
	}
	times := map[string][]time.Duration{}
	for i := range o.runs + 1 {
		for _, level := range monitorLevels {
			d, err := servers[level].timed("python", "print(1)")
			if err != nil {
				return nil, fmt.Errorf("warm print(1) --monitor %s: %w", level, err)
			}
			if i > 0 { // the first call of each warms the server's own paths
				times[level] = append(times[level], d)
			}
		}
	}
	out := map[string]Stats{}
	for level, ds := range times {
		out[level] = summarise(ds)
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
	fmt.Fprintf(&b, "Measured %s on %s; p50 (min) of %d cold `safe-run run` calls per cell (the last row: as many warm MCP calls from a pool of one), the levels interleaved (`go run ./scripts/bench -monitor`).\n\n", r.Date, r.Machine, r.Runs)
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
	if len(r.Warm) > 0 {
		b.WriteString("| print(1), warm: MCP `run_code` from the pool |")
		for _, level := range monitorLevels {
			s := r.Warm[level]
			cell := fmt.Sprintf(" %.1f ms (%.1f)", s.P50, s.Min)
			if level != "off" {
				cell += fmt.Sprintf(", %+.1f ms", s.P50-r.Warm["off"].P50)
			}
			b.WriteString(cell + " |")
		}
		b.WriteString("\n")
	}
	return b.String()
}

func monitorMain(o options) {
	rep, err := runMonitorBench(o)
	if err != nil {
		log.Fatal(err)
	}
	writeReport(o, "monitor", "bench-monitor", rep, rep.markdown())
}
