package main

import (
	"fmt"
	"log"
	"path/filepath"
	"time"

	"github.com/safe-run/safe-run/rootfs"
)

// CPU is the CPU time one run of print(1) costs on each path, counted by
// cgroup CPU accounting over every process of it (runsc, the sentry, the
// gofer, and safe-run where it takes part), p50 over the samples.
type CPU struct {
	Samples int `json:"samples"`
	// Raw is one `runsc run` of the print(1) bundle.
	Raw Stats `json:"raw_runsc_run"`
	// Restore is one pooled sandbox from the start of its restore until it
	// waits primed in the pool, read from the cgroup safe-run made for it.
	Restore Stats `json:"restore_and_prime"`
	// WarmCall is the whole server's CPU per spaced warm call: the call,
	// the used sandbox's teardown and the refill that replaces it, and
	// whatever the server and the waiting sandbox used meanwhile.
	WarmCall *Stats `json:"warm_call_all_in,omitempty"`
	// Cold is one `safe-run run`, the CLI process included.
	Cold *Stats `json:"cold_safe_run_run,omitempty"`
	// Note says what could not be measured on this host.
	Note string `json:"note,omitempty"`
}

// measureCPUPerRun measures the CPU rows, n samples each.
func measureCPUPerRun(o options, raw *rawRunsc, n int) (*CPU, error) {
	out := &CPU{Samples: n}
	var rawDs, coldDs []time.Duration
	for range n {
		d, err := measureCPU(func(cg *cpuCgroup) error { return raw.runIn(cg, "print(1)") })
		if err != nil {
			return nil, fmt.Errorf("CPU of runsc run: %w", err)
		}
		rawDs = append(rawDs, d)
		if !safeRunFits() {
			continue
		}
		if d, err = measureCPU(func(cg *cpuCgroup) error { return coldRun(o, cg, "print(1)") }); err != nil {
			return nil, fmt.Errorf("CPU of safe-run run: %w", err)
		}
		coldDs = append(coldDs, d)
	}
	out.Raw = summarise(rawDs)
	if len(coldDs) > 0 {
		s := summarise(coldDs)
		out.Cold = &s
	}

	builds, err := measureRestoreCPU([]warmBuild{{"this build", o}}, n)
	if err != nil {
		return nil, err
	}
	out.Restore, out.WarmCall, out.Note = builds[0].Restore, builds[0].WarmCall, builds[0].Note
	log.Printf("CPU per run: runsc run %.0f ms, restore+prime %.0f ms", out.Raw.P50, out.Restore.P50)
	return out, nil
}

// restoreCPU is the CPU of one build's pooled sandboxes (see CPU).
type restoreCPU struct {
	Restore  Stats
	WarmCall *Stats
	Note     string
}

// measureRestoreCPU measures the restore and warm-call rows of each build,
// n samples each: one server per build with one pooled Python sandbox,
// all running at once, their calls taking turns (every pool full before
// each call) so that the builds see the same load. Each sandbox's own
// cgroup (below its server's) counts its restore and prime; the server's
// cgroup counts everything.
func measureRestoreCPU(builds []warmBuild, n int) ([]restoreCPU, error) {
	out := make([]restoreCPU, len(builds))
	type measured struct {
		s        *server
		cg       *cpuCgroup
		parent   string
		restores []time.Duration
		before   time.Duration
	}
	ms := make([]*measured, len(builds))
	for i, b := range builds {
		m := &measured{parent: ownCgroup("cpuacct")}
		if safeRunFits() {
			cg, err := newCPUCgroup()
			if err != nil {
				return nil, err
			}
			defer cg.remove()
			m.cg, m.parent = cg, cg.dir
		} else {
			out[i].Note = "cgroup v2: safe-run as root cannot run in a cgroup the bench makes, so the cold run and the whole server are not measured"
		}
		s, err := startServer(b.o, m.cg, 1, "--pool", "python=1", "--agent", b.o.agent)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", b.name, err)
		}
		defer s.close()
		m.s = s
		ms[i] = m
	}
	for r := range n + 1 {
		for i, m := range ms {
			for _, other := range ms {
				if err := other.s.waitFull(); err != nil {
					return nil, fmt.Errorf("%s: %w", builds[i].name, err)
				}
			}
			ids := m.s.pooled()
			if len(ids) != 1 {
				return nil, fmt.Errorf("%s: CPU of a restore: %d sandboxes in a pool of one", builds[i].name, len(ids))
			}
			d, err := cpuUsage(filepath.Join(m.parent, ids[0]))
			if err != nil {
				return nil, fmt.Errorf("%s: CPU of a restore: %w", builds[i].name, err)
			}
			// The server's first sandbox may be a cold start that writes
			// the checkpoint; the ones after are restores.
			if r > 0 {
				m.restores = append(m.restores, d)
			} else if m.cg != nil {
				if m.before, err = m.cg.usage(); err != nil {
					return nil, err
				}
			}
			if r == n {
				continue
			}
			if err := m.s.call("print(1)"); err != nil {
				return nil, fmt.Errorf("%s: %w", builds[i].name, err)
			}
		}
	}
	for i, m := range ms {
		out[i].Restore = summarise(m.restores)
		if m.cg == nil {
			continue
		}
		after, err := m.cg.usage()
		if err != nil {
			return nil, err
		}
		// One figure, the mean: per-call shares cannot be told apart.
		per := (after - m.before) / time.Duration(n)
		st := summarise([]time.Duration{per})
		st.Runs = n
		out[i].WarmCall = &st
	}
	return out, nil
}

// cpuMain measures only the CPU rows and prints them with their ratios
// to raw `runsc run`; with a baseline directory (as -warm's), also the
// restore and warm-call rows of the build it holds, in the same turns.
func cpuMain(o options, baseline string) {
	img, err := rootfs.Store{}.Lookup(rootfs.DefaultName)
	must(err)
	raw, err := newRawRunsc(o, img.Root)
	must(err)
	defer raw.close()
	if baseline != "" {
		cpuCompare(o, raw, baseline)
		return
	}
	c, err := measureCPUPerRun(o, raw, o.cpuRuns)
	must(err)
	fmt.Printf("| CPU of one print(1), %d samples, p50 | ms | ÷ raw |\n|---|---|---|\n", c.Samples)
	fmt.Printf("| `runsc run` | %.0f | 1.00 × |\n", c.Raw.P50)
	fmt.Printf("| restore + prime | %.0f | %.2f × |\n", c.Restore.P50, c.Restore.P50/c.Raw.P50)
	if c.Cold != nil {
		fmt.Printf("| cold `safe-run run` | %.0f | %.2f × |\n", c.Cold.P50, c.Cold.P50/c.Raw.P50)
	}
	if c.WarmCall != nil {
		fmt.Printf("| a warm call all in | %.0f | %.2f × |\n", c.WarmCall.P50, c.WarmCall.P50/c.Raw.P50)
	}
	if c.Note != "" {
		fmt.Println(c.Note)
	}
}

// cpuCompare prints raw `runsc run` and, side by side, the restore and
// warm-call rows of this build and of the one in baseline, p50 / p95 / min.
func cpuCompare(o options, raw *rawRunsc, baseline string) {
	b := o
	b.bin, b.agent = filepath.Join(baseline, "safe-run"), filepath.Join(baseline, "safe-run-agent")
	builds := []warmBuild{{"this build", o}, {"baseline " + baseline, b}}
	var rawDs []time.Duration
	for range o.cpuRuns {
		d, err := measureCPU(func(cg *cpuCgroup) error { return raw.runIn(cg, "print(1)") })
		must(err)
		rawDs = append(rawDs, d)
	}
	rawSt := summarise(rawDs)
	rs, err := measureRestoreCPU(builds, o.cpuRuns)
	must(err)
	fmt.Printf("| CPU of one print(1), %d samples | build | p50 / p95 / min (ms) | p50 ÷ raw |\n|---|---|---|---|\n", o.cpuRuns)
	fmt.Printf("| `runsc run` | | %.0f / %.0f / %.0f | 1.00 × |\n", rawSt.P50, rawSt.P95, rawSt.Min)
	for i, r := range rs {
		fmt.Printf("| restore + prime | %s | %.0f / %.0f / %.0f | %.2f × |\n", builds[i].name, r.Restore.P50, r.Restore.P95, r.Restore.Min, r.Restore.P50/rawSt.P50)
	}
	for i, r := range rs {
		if r.WarmCall != nil {
			fmt.Printf("| a warm call all in (mean) | %s | %.0f | %.2f × |\n", builds[i].name, r.WarmCall.P50, r.WarmCall.P50/rawSt.P50)
		}
	}
	if rs[0].Note != "" {
		fmt.Println(rs[0].Note)
	}
}
