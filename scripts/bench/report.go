package main

import (
	"fmt"
	"strings"
)

// Report is everything one benchmark run measured.
type Report struct {
	Date       string       `json:"date"`
	Machine    string       `json:"machine"`
	Runsc      string       `json:"runsc"`
	Quick      bool         `json:"quick"`
	Took       string       `json:"took"` // the whole of it, network rows excepted
	Rows       []Row        `json:"rows"`
	Warm       []Warm       `json:"warm_spaced"`
	WarmIdle   string       `json:"warm_idle"` // each warm call's wait with every pool full (-idle)
	Bursts     []Burst      `json:"bursts"`
	Throughput []Throughput `json:"throughput"`
	CPU        *CPU         `json:"cpu_per_run"`
	WarmMemory []Memory     `json:"warm_sandbox_memory"`
	Targets    []Target     `json:"targets"`
}

// Target is one of the goals and whether this run met it.
type Target struct {
	Goal string `json:"goal"`
	Got  string `json:"got"`
	Met  bool   `json:"met"`
}

// targets checks this run's figures against the targets of issue 17.
func targets(rep *Report) []Target {
	find := func(prefix string) Row {
		for _, r := range rep.Rows {
			if strings.Contains(r.Name, prefix) {
				return r
			}
		}
		return Row{}
	}
	tput := func(prefix, c string) float64 {
		for _, t := range rep.Throughput {
			if strings.Contains(t.Name, prefix) {
				return t.PerS[c]
			}
		}
		return 0
	}
	var out []Target
	add := func(goal string, got string, met bool) { out = append(out, Target{goal, got, met}) }
	for i, p := range warmPrograms {
		s := rep.Warm[i].Stats
		if p.P50 == 0 {
			continue
		}
		add(fmt.Sprintf("warm MCP run_code %s `%s` p50 ≤ %.0f ms", p.Lang, p.Name, p.P50), fmt.Sprintf("%.1f ms", s.P50), s.P50 <= p.P50)
		if p.P95 > 0 {
			add(fmt.Sprintf("warm MCP run_code %s `%s` p95 ≤ %.0f ms", p.Lang, p.Name, p.P95), fmt.Sprintf("%.1f ms", s.P95), s.P95 <= p.P95)
		}
	}
	on, off := rep.Bursts[0], rep.Bursts[1]
	add(fmt.Sprintf("burst: the first %d calls (the pool's size) are warm", burstPool),
		fmt.Sprintf("the first %d warm, %d of %d in all", on.FirstWarm, on.Warm, len(on.Calls)), on.FirstWarm >= burstPool)
	if on.Misses != nil {
		add("burst: a call that finds the pool empty costs ≤ the same call with the pool off (p50)",
			fmt.Sprintf("%.0f ms vs %.0f ms", on.Misses.P50, off.Stats.P50), on.Misses.P50 <= off.Stats.P50)
	} else {
		add("burst: a call that finds the pool empty costs ≤ the same call with the pool off (p50)", "no call missed", true)
	}
	for _, c := range []string{"1", "2", "4"} {
		a, b := tput("pool on", c), tput("pool off", c)
		add("throughput, pool on ≥ pool off, concurrency "+c, fmt.Sprintf("%.1f vs %.1f runs/s", a, b), a >= b)
	}
	if rep.CPU != nil {
		r, w := rep.CPU.Raw.P50, rep.CPU.Restore.P50
		add("CPU of one restored, primed sandbox ≤ 1.2 × one raw `runsc run`", fmt.Sprintf("%.0f vs %.0f ms (%.2f ×)", w, r, w/r), w <= 1.2*r)
	}
	c1, r1 := find("`safe-run run` — cold").Stats["print(1)"].P50, find("runsc run").Stats["print(1)"].P50
	add("cold `safe-run run` p50 ≤ 1.2 × raw `runsc run` p50 (print(1))", fmt.Sprintf("%.2f ×", c1/r1), c1 <= 1.2*r1)
	add("goal: cold `safe-run run` p50 ≤ 1.1 × raw `runsc run` p50 (print(1))", fmt.Sprintf("%.2f ×", c1/r1), c1 <= 1.1*r1)
	return out
}

func (rep *Report) markdown() string {
	var b strings.Builder
	how := "`make bench`"
	if rep.Quick {
		how = "`make bench-quick`, rough"
	}
	fmt.Fprintf(&b, "Measured %s on %s, runsc %s; %d runs per cell, bursts of %d calls (%s, %s).\n\n",
		rep.Date, rep.Machine, rep.Runsc, rep.Rows[0].Stats[programs[0].Name].Runs, len(rep.Bursts[0].Calls), how, rep.Took)
	b.WriteString("Latency by layer, milliseconds (min / **p50** / p95):\n\n| path |")
	for _, p := range programs {
		fmt.Fprintf(&b, " `%s` |", p.Name)
	}
	b.WriteString("\n|---|")
	for range programs {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, r := range rep.Rows {
		fmt.Fprintf(&b, "| %s |", r.Name)
		for _, p := range programs {
			s := r.Stats[p.Name]
			fmt.Fprintf(&b, " %.1f / **%.1f** / %.1f |", s.Min, s.P50, s.P95)
		}
		b.WriteString("\n")
	}

	fmt.Fprintf(&b, "\nWarm MCP stdio `run_code` (pool %s, full and then %s at rest before each call), milliseconds:\n\n", warmPool, rep.WarmIdle)
	b.WriteString("| language | program | min | p50 | p95 |\n|---|---|---|---|---|\n")
	for _, w := range rep.Warm {
		fmt.Fprintf(&b, "| %s | `%s` | %.1f | **%.1f** | %.1f |\n", w.Lang, w.Name, w.Stats.Min, w.Stats.P50, w.Stats.P95)
	}

	fmt.Fprintf(&b, "\n%d `print(1)` calls back to back, milliseconds (warm: under half the quickest pool-off call):\n\n", len(rep.Bursts[0].Calls))
	fmt.Fprintf(&b, "| MCP `run_code` | p50 | p95 | warm calls | misses' p50 | first %d calls |\n|---|---|---|---|---|---|\n", burstShown)
	for _, s := range rep.Bursts {
		miss := "—"
		if s.Misses != nil {
			miss = fmt.Sprintf("%.0f", s.Misses.P50)
		}
		var first []string
		for _, ms := range s.Calls[:min(burstShown, len(s.Calls))] {
			first = append(first, fmt.Sprintf("%.0f", ms))
		}
		fmt.Fprintf(&b, "| %s | **%.0f** | %.0f | %d of %d | %s | %s |\n", s.Name, s.Stats.P50, s.Stats.P95, s.Warm, len(s.Calls), miss, strings.Join(first, ", "))
	}

	b.WriteString("\nThroughput of `print(1)`, runs per second:\n\n| path | 1 at a time | 2 | 4 |\n|---|---|---|---|\n")
	for _, t := range rep.Throughput {
		fmt.Fprintf(&b, "| %s | %.1f | %.1f | %.1f |\n", t.Name, t.PerS["1"], t.PerS["2"], t.PerS["4"])
	}

	if c := rep.CPU; c != nil {
		fmt.Fprintf(&b, "\nCPU time of one `print(1)`, every process of it in a cgroup (p50 of %d):\n\n| path | CPU | ÷ raw |\n|---|---|---|\n", c.Samples)
		row := func(name string, s *Stats) {
			if s == nil {
				fmt.Fprintf(&b, "| %s | not measured | |\n", name)
				return
			}
			fmt.Fprintf(&b, "| %s | %.0f ms | %.2f × |\n", name, s.P50, s.P50/c.Raw.P50)
		}
		row("`runsc run` of the bundle — gVisor alone", &c.Raw)
		row("a pooled Python sandbox: restore + prime (its own cgroup)", &c.Restore)
		row("a warm MCP call all in: call, teardown, refill (the server's cgroup, mean)", c.WarmCall)
		row("`safe-run run` — cold", c.Cold)
		if c.Note != "" {
			fmt.Fprintf(&b, "\n%s.\n", c.Note)
		}
	}

	b.WriteString("\nMemory of one warm sandbox waiting in the pool, MiB (the cgroup's usage; the memory file's allocated pages; anonymous memory of each process), and warm p50 of each Python pool, ms — what the preloads buy and cost:\n\n")
	b.WriteString("| pool | cgroup | gVisor memory file | sentry heap | gofer | waiting runsc | `print(1)` | `import pandas` |\n|---|---|---|---|---|---|---|---|\n")
	for _, m := range rep.WarmMemory {
		lat := func(ms float64) string {
			if ms == 0 {
				return "—"
			}
			return fmt.Sprintf("%.1f", ms)
		}
		runsc := fmt.Sprintf("%.1f", mib(m.RunscAnon))
		if m.RunscN == 0 {
			runsc = "none"
		}
		fmt.Fprintf(&b, "| %s | **%.1f** | %.1f | %.1f | %.1f | %s | %s | %s |\n", m.Pool, mib(m.Bytes), mib(m.MemoryFile),
			mib(m.SentryHeap), mib(m.GoferAnon), runsc, lat(m.PrintP50), lat(m.PandasP50))
	}

	b.WriteString("\n| target (issue 17) | this run | |\n|---|---|---|\n")
	for _, t := range rep.Targets {
		met := "not met"
		if t.Met {
			met = "met"
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", t.Goal, t.Got, met)
	}
	return b.String()
}
