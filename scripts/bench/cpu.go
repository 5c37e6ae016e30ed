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

	// A server with one pooled Python sandbox: each sandbox's own cgroup
	// (below the server's) counts its restore and prime; the server's
	// cgroup counts everything.
	var cg *cpuCgroup
	parent := ownCgroup("cpuacct")
	if safeRunFits() {
		var err error
		if cg, err = newCPUCgroup(); err != nil {
			return nil, err
		}
		defer cg.remove()
		parent = cg.dir
	} else {
		out.Note = "cgroup v2: safe-run as root cannot run in a cgroup the bench makes, so the cold run and the whole server are not measured"
	}
	s, err := startServer(o, cg, 1, "--pool", "python=1")
	if err != nil {
		return nil, err
	}
	defer s.close()
	var restores []time.Duration
	var before time.Duration
	for i := range n + 1 {
		if err := s.waitFull(); err != nil {
			return nil, err
		}
		ids := s.pooled()
		if len(ids) != 1 {
			return nil, fmt.Errorf("CPU of a restore: %d sandboxes in a pool of one", len(ids))
		}
		d, err := cpuUsage(filepath.Join(parent, ids[0]))
		if err != nil {
			return nil, fmt.Errorf("CPU of a restore: %w", err)
		}
		// The server's first sandbox may be a cold start that writes the
		// checkpoint; the ones after are restores.
		if i > 0 {
			restores = append(restores, d)
		} else if cg != nil {
			if before, err = cg.usage(); err != nil {
				return nil, err
			}
		}
		if i == n {
			break
		}
		if err := s.call("print(1)"); err != nil {
			return nil, err
		}
	}
	out.Restore = summarise(restores)
	if cg != nil {
		after, err := cg.usage()
		if err != nil {
			return nil, err
		}
		// One figure, the mean: per-call shares cannot be told apart.
		per := (after - before) / time.Duration(n)
		st := summarise([]time.Duration{per})
		st.Runs = n
		out.WarmCall = &st
	}
	log.Printf("CPU per run: runsc run %.0f ms, restore+prime %.0f ms", out.Raw.P50, out.Restore.P50)
	return out, nil
}

// cpuMain measures only the CPU rows and prints them with their ratios
// to raw `runsc run`.
func cpuMain(o options) {
	img, err := rootfs.Store{}.Lookup(rootfs.DefaultName)
	must(err)
	raw, err := newRawRunsc(o, img.Root)
	must(err)
	defer raw.close()
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
