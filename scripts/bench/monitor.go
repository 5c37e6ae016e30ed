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
	return rep, nil
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
	fmt.Fprintf(&b, "Measured %s on %s; p50 (min) of %d cold `safe-run run` calls per cell, the levels interleaved (`go run ./scripts/bench -monitor`).\n\n", r.Date, r.Machine, r.Runs)
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
	return b.String()
}

func monitorMain(o options) {
	rep, err := runMonitorBench(o)
	if err != nil {
		log.Fatal(err)
	}
	writeReport(o, "monitor", "bench-monitor", rep, rep.markdown())
}
