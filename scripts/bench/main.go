// Command bench measures, side by side in one run on one machine, what a
// Python run costs on each layer of safe-run: the bare interpreter of the
// image (chroot), gVisor alone (`runsc run` of an equivalent bundle),
// `safe-run run` cold and warm, and a full MCP stdio round trip to run_code
// with the warm pool off and on. It prints a markdown table, writes it and
// the raw figures as JSON, and can put the table into the README.
//
// Run it as root through `make bench`, after `make build runsc rootfs`.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/mark3labs/mcp-go/client"
	mcpgo "github.com/mark3labs/mcp-go/mcp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/safe-run/safe-run/bundle"
	"github.com/safe-run/safe-run/rootfs"
	"github.com/safe-run/safe-run/sandbox"
)

// programs are the two workloads of the issue: the smallest program, and
// one dominated by importing pandas.
var programs = []struct{ Name, Code string }{
	{"print(1)", "print(1)"},
	{"import pandas", "import pandas as pd; print(pd.__version__)"},
}

type options struct {
	bin, runsc, agent, out, readme string
	runs, throughputRuns           int
}

func main() {
	var o options
	flag.StringVar(&o.bin, "safe-run", "bin/safe-run", "safe-run binary")
	flag.StringVar(&o.runsc, "runsc", "bin/runsc", "runsc binary")
	flag.StringVar(&o.agent, "agent", "bin/safe-run-agent", "safe-run-agent binary")
	flag.IntVar(&o.runs, "runs", 30, "timed runs per row and program")
	flag.IntVar(&o.throughputRuns, "throughput-runs", 24, "runs per throughput measurement")
	flag.StringVar(&o.out, "out", "scripts/bench/results", "directory for latest.md and latest.json")
	flag.StringVar(&o.readme, "readme", "README.md", "README whose benchmark section is replaced (empty: leave it)")
	check := flag.Bool("check", false, "measure only safe-run check -j 2 on 100 print(i) blocks against 100 safe-run run calls")
	checkReps := flag.Int("check-reps", 3, "repetitions of each path of -check (the median is reported)")
	netOnly := flag.Bool("net", false, "measure only the network rows: start with and without a network, request latency, a 64 MiB download")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("bench: ")
	if os.Geteuid() != 0 {
		log.Fatal("run as root (chroot, runsc and safe-run need it); use `sudo make bench`")
	}
	for _, p := range []*string{&o.bin, &o.runsc, &o.agent} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			log.Fatal(err)
		}
		*p = abs
	}
	if *check {
		checkMain(o, *checkReps)
		return
	}
	if *netOnly {
		netMain(o)
		return
	}
	rep, err := run(o)
	if err != nil {
		log.Fatal(err)
	}
	table := rep.markdown()
	fmt.Print(table)
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		log.Fatal(err)
	}
	js, _ := json.MarshalIndent(rep, "", "  ")
	must(os.WriteFile(filepath.Join(o.out, "latest.json"), append(js, '\n'), 0o644))
	must(os.WriteFile(filepath.Join(o.out, "latest.md"), []byte(table), 0o644))
	if o.readme != "" {
		must(replaceSection(o.readme, table))
	}
	netMain(o)
}

func must(err error) {
	if err != nil {
		log.Fatal(err)
	}
}

// Stats summarise the durations of one row, in milliseconds.
type Stats struct {
	Runs int     `json:"runs"`
	Min  float64 `json:"min_ms"`
	P50  float64 `json:"p50_ms"`
	P95  float64 `json:"p95_ms"`
}

func summarise(ds []time.Duration) Stats {
	slices.Sort(ds)
	ms := func(d time.Duration) float64 { return math.Round(float64(d.Microseconds())/10) / 100 }
	at := func(q float64) time.Duration { return ds[min(len(ds)-1, int(math.Ceil(q*float64(len(ds))))-1)] }
	return Stats{Runs: len(ds), Min: ms(ds[0]), P50: ms(at(0.5)), P95: ms(at(0.95))}
}

// Row is one way of running the programs.
type Row struct {
	Name  string           `json:"name"`
	Stats map[string]Stats `json:"stats"` // by program name
}

// Throughput is runs per second of print(1) at each concurrency.
type Throughput struct {
	Name  string             `json:"name"`
	PerS  map[string]float64 `json:"runs_per_second"` // by concurrency
	Notes string             `json:"notes,omitempty"`
}

// Report is everything one benchmark run measured.
type Report struct {
	Date       string       `json:"date"`
	Machine    string       `json:"machine"`
	Runsc      string       `json:"runsc"`
	Rows       []Row        `json:"rows"`
	Throughput []Throughput `json:"throughput"`
	WarmMemory []Memory     `json:"warm_sandbox_memory"`
	Targets    []Target     `json:"targets"`
}

// Memory is what one warm sandbox uses, as its cgroup counts it.
type Memory struct {
	Pool  string `json:"pool"`
	Bytes int64  `json:"bytes"`
}

// warmMemory fills a pool of one sandbox per language, and one of Python
// without preloads, and reads their memory.
func warmMemory(o options) ([]Memory, error) {
	var out []Memory
	for _, cfg := range []struct {
		args   []string
		n      int
		suffix string
	}{
		{[]string{"--pool", "python=1,node=1,bash=1"}, 3, ""},
		{[]string{"--pool", "python=1", "--preload", "python="}, 1, " (nothing preloaded)"},
	} {
		s, err := startServer(o, cfg.args...)
		if err != nil {
			return nil, err
		}
		if err := s.waitFull(cfg.n); err == nil {
			time.Sleep(2 * time.Second) // let gVisor settle after a restore
			for _, m := range s.poolMemory() {
				m.Pool += cfg.suffix
				out = append(out, m)
			}
		}
		s.close()
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Target is one of the goals and whether this run met it.
type Target struct {
	Goal string `json:"goal"`
	Got  string `json:"got"`
	Met  bool   `json:"met"`
}

func run(o options) (*Report, error) {
	img, err := rootfs.Store{}.Lookup(rootfs.DefaultName)
	if err != nil {
		return nil, err
	}
	rep := &Report{Date: time.Now().UTC().Format("2006-01-02 15:04 UTC"), Machine: machine()}
	if out, err := exec.Command(o.runsc, "--version").Output(); err == nil {
		rep.Runsc = strings.TrimPrefix(strings.SplitN(string(out), "\n", 2)[0], "runsc version ")
	}
	raw, err := newRawRunsc(o, img.Root)
	if err != nil {
		return nil, err
	}
	defer raw.close()

	cold, err := startServer(o, "--pool=")
	if err != nil {
		return nil, err
	}
	defer cold.close()
	warm, err := startServer(o, "--pool", "python=2")
	if err != nil {
		return nil, err
	}
	defer warm.close()

	rows := []struct {
		name string
		run  func(code string) error
	}{
		{"bare python3 in the image (chroot) — the floor", func(code string) error {
			return exec.Command("chroot", img.Root, "/usr/bin/env", "-i", "PATH=/usr/bin:/bin", "HOME=/tmp", "python3", "-c", code).Run()
		}},
		{"`runsc run` of an equivalent bundle — gVisor alone", raw.run},
		{"`safe-run run` — cold", func(code string) error {
			return exec.Command(o.bin, "run", "--lang", "python", "-c", code).Run()
		}},
		{"`safe-run run --warm` — restored from a checkpoint", func(code string) error {
			return exec.Command(o.bin, "run", "--warm", "--lang", "python", "-c", code).Run()
		}},
		{"MCP stdio `run_code`, pool off", cold.call},
		{"MCP stdio `run_code`, pool on", func(code string) error {
			// A client's calls come seconds apart; the pool refills between.
			if err := warm.waitFull(2); err != nil {
				return err
			}
			return warm.call(code)
		}},
	}
	// Warm-up: build the checkpoint image and fill caches outside the timing.
	for _, r := range rows {
		for _, p := range programs {
			if err := r.run(p.Code); err != nil {
				return nil, fmt.Errorf("%s, %s: %w", r.name, p.Name, err)
			}
		}
	}
	for _, r := range rows {
		row := Row{Name: r.name, Stats: map[string]Stats{}}
		for _, p := range programs {
			var ds []time.Duration
			for range o.runs {
				var start time.Time
				var err error
				if strings.Contains(r.name, "pool on") {
					// Time the call alone, not the wait for the refill.
					if err = warm.waitFull(2); err == nil {
						start = time.Now()
						err = warm.call(p.Code)
					}
				} else {
					start = time.Now()
					err = r.run(p.Code)
				}
				if err != nil {
					return nil, fmt.Errorf("%s, %s: %w", r.name, p.Name, err)
				}
				ds = append(ds, time.Since(start))
			}
			row.Stats[p.Name] = summarise(ds)
			log.Printf("%-55s %-14s p50 %8.2f ms", r.name, p.Name, row.Stats[p.Name].P50)
		}
		rep.Rows = append(rep.Rows, row)
	}

	if rep.WarmMemory, err = warmMemory(o); err != nil {
		return nil, err
	}

	for _, t := range []struct {
		name string
		run  func(string) error
	}{
		{"`runsc run` — gVisor alone", raw.run},
		{"`safe-run run` — cold", rows[2].run},
		{"MCP `run_code`, pool off", cold.call},
		{"MCP `run_code`, pool on (size 2)", warm.call},
	} {
		tp := Throughput{Name: t.name, PerS: map[string]float64{}}
		for _, c := range []int{1, 2, 4} {
			perS, err := throughput(o.throughputRuns, c, func() error { return t.run("print(1)") })
			if err != nil {
				return nil, fmt.Errorf("throughput of %s: %w", t.name, err)
			}
			tp.PerS[strconv.Itoa(c)] = perS
			log.Printf("%-55s concurrency %d: %.1f runs/s", t.name, c, perS)
			if t.run != nil && strings.Contains(t.name, "pool on") {
				_ = warm.waitFull(2)
			}
		}
		rep.Throughput = append(rep.Throughput, tp)
	}
	rep.Targets = targets(rep)
	return rep, nil
}

// throughput runs n calls of f with c at a time and returns calls per second.
func throughput(n, c int, f func() error) (float64, error) {
	d, err := wall(n, c, func(int) error { return f() })
	if err != nil {
		return 0, err
	}
	return math.Round(float64(n)/d.Seconds()*10) / 10, nil
}

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
	warm, cold, raw := find("pool on"), find("`safe-run run` — cold"), find("runsc run")
	var out []Target
	add := func(goal string, got string, met bool) { out = append(out, Target{goal, got, met}) }
	w1, wp := warm.Stats["print(1)"].P50, warm.Stats["import pandas"].P50
	add("warm MCP run_code print(1) p50 ≤ 10 ms", fmt.Sprintf("%.1f ms", w1), w1 <= 10)
	add("warm MCP run_code import pandas p50 ≤ 15 ms", fmt.Sprintf("%.1f ms", wp), wp <= 15)
	c1, r1 := cold.Stats["print(1)"].P50, raw.Stats["print(1)"].P50
	add("cold `safe-run run` p50 ≤ 1.10 × raw `runsc run` p50 (print(1))", fmt.Sprintf("%.2f ×", c1/r1), c1 <= 1.10*r1)
	for _, path := range []string{"`safe-run run` — cold", "pool on"} {
		s, r := tput(path, "2"), tput("runsc run", "2")
		add(fmt.Sprintf("throughput at concurrency 2, %s ≥ 0.9 × raw runsc", strings.Trim(strings.SplitN(path, " —", 2)[0], "`")),
			fmt.Sprintf("%.2f ×", s/r), s >= 0.9*r)
	}
	for _, m := range rep.WarmMemory {
		add("≤ 25 MiB per warm sandbox: "+m.Pool, fmt.Sprintf("%.1f MiB", float64(m.Bytes)/(1<<20)), m.Bytes <= 25<<20)
	}
	return out
}

func (rep *Report) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Measured %s on %s, runsc %s; %d runs per cell (milliseconds: min / p50 / p95).\n\n",
		rep.Date, rep.Machine, rep.Runsc, rep.Rows[0].Stats[programs[0].Name].Runs)
	b.WriteString("| path |")
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
	b.WriteString("\nThroughput of `print(1)`, runs per second:\n\n| path | 1 at a time | 2 | 4 |\n|---|---|---|---|\n")
	for _, t := range rep.Throughput {
		fmt.Fprintf(&b, "| %s | %.1f | %.1f | %.1f |\n", t.Name, t.PerS["1"], t.PerS["2"], t.PerS["4"])
	}
	var mem []string
	for _, m := range rep.WarmMemory {
		mem = append(mem, fmt.Sprintf("%s %.1f MiB", m.Pool, float64(m.Bytes)/(1<<20)))
	}
	fmt.Fprintf(&b, "\nMemory of one warm sandbox (its cgroup's usage, gVisor included; Python preloads numpy, pandas and matplotlib): %s.\n\n", strings.Join(mem, ", "))
	b.WriteString("| target | this run | met |\n|---|---|---|\n")
	for _, t := range rep.Targets {
		met := "no"
		if t.Met {
			met = "yes"
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", t.Goal, t.Got, met)
	}
	return b.String()
}

// replaceSection puts table between the benchmark markers of the README.
func replaceSection(readme, table string) error { return replaceMarked(readme, "bench", table) }

// replaceMarked puts table between the README's <!-- NAME:begin --> and
// <!-- NAME:end --> markers.
func replaceMarked(readme, name, table string) error {
	begin, end := "<!-- "+name+":begin -->\n", "<!-- "+name+":end -->"
	data, err := os.ReadFile(readme)
	if err != nil {
		return err
	}
	s := string(data)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		return fmt.Errorf("%s has no %q … %q section", readme, strings.TrimSpace(begin), end)
	}
	return os.WriteFile(readme, []byte(s[:i+len(begin)]+table+s[j:]), 0o644)
}

func machine() string {
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	model := "unknown CPU"
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	var si unix.Sysinfo_t
	_ = unix.Sysinfo(&si)
	return fmt.Sprintf("%s, %d CPUs, %d GiB, Linux %s", model, runtime.NumCPU(),
		(uint64(si.Totalram)*uint64(si.Unit)+(1<<29))>>30, unix.ByteSliceToString(uts.Release[:]))
}

// rawRunsc runs python3 directly as the sandbox's process, in a bundle
// built by the same code as safe-run's, with the same runsc flags: gVisor
// alone, without the agent, the cgroup or the shim.
type rawRunsc struct {
	o           options
	dir, bundle string
}

func newRawRunsc(o options, root string) (*rawRunsc, error) {
	dir, err := os.MkdirTemp("", "safe-run-bench-")
	if err != nil {
		return nil, err
	}
	r := &rawRunsc{o: o, dir: dir, bundle: filepath.Join(dir, "bundle")}
	job, _, err := sandbox.Policy{}.Check(sandbox.Job{Language: "python", Code: "x"})
	if err != nil {
		return nil, err
	}
	spec, err := bundle.Build(job, bundle.Config{Rootfs: root, Agent: o.agent})
	if err != nil {
		return nil, err
	}
	spec.Process.User = specs.User{UID: bundle.UID, GID: bundle.GID}
	spec.Process.Capabilities = &specs.LinuxCapabilities{}
	spec.Process.Args = []string{"python3", "-c", "import sys; exec(sys.argv[1])", ""}
	return r, bundle.Write(r.bundle, spec)
}

func (r *rawRunsc) run(code string) error {
	// Each run gets its own bundle copy (the code is in its argv) and root.
	id := "bench-" + uuid.NewString()[:8]
	dir := filepath.Join(r.dir, id)
	spec, err := readSpec(filepath.Join(r.bundle, "config.json"))
	if err != nil {
		return err
	}
	spec.Process.Args[len(spec.Process.Args)-1] = code
	if err := bundle.Write(filepath.Join(dir, "bundle"), spec); err != nil {
		return err
	}
	defer func() {
		_ = unix.Unmount(filepath.Join(dir, "root", "null-netns"), unix.MNT_DETACH)
		_ = os.RemoveAll(dir)
	}()
	cmd := exec.Command(r.o.runsc, "--root", filepath.Join(dir, "root"), "--platform", "systrap", "--network", "none",
		"--oci-seccomp", "--ignore-cgroups", "--overlay2", "none", "run", "--bundle", filepath.Join(dir, "bundle"), id)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("runsc run: %w: %s", err, out)
	}
	return nil
}

func (r *rawRunsc) close() { _ = os.RemoveAll(r.dir) }

func readSpec(path string) (*specs.Spec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var s specs.Spec
	return &s, json.Unmarshal(data, &s)
}

// server is a `safe-run serve` over stdio with a client.
type server struct {
	c        *client.Client
	stateDir string
}

func startServer(o options, args ...string) (*server, error) {
	dir, err := os.MkdirTemp("", "safe-run-bench-state-")
	if err != nil {
		return nil, err
	}
	s := &server{stateDir: dir}
	all := append([]string{"serve", "--state-dir", dir, "--log-level", "error", "--max-concurrent", "4"}, args...)
	if s.c, err = client.NewStdioMCPClient(o.bin, nil, all...); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var init mcpgo.InitializeRequest
	init.Params.ClientInfo = mcpgo.Implementation{Name: "safe-run-bench", Version: "1"}
	if _, err := s.c.Initialize(ctx, init); err != nil {
		return nil, fmt.Errorf("initialize: %w", err)
	}
	return s, nil
}

func (s *server) call(code string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var req mcpgo.CallToolRequest
	req.Params.Name = "run_code"
	req.Params.Arguments = map[string]any{"language": "python", "code": code}
	res, err := s.c.CallTool(ctx, req)
	if err != nil {
		return err
	}
	if res.IsError {
		return fmt.Errorf("run_code failed: %v", res.Content)
	}
	return nil
}

// waitFull waits until n sandboxes wait in the pool, ready, and no other
// is starting or being torn down.
func (s *server) waitFull(n int) error {
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		entries, _ := os.ReadDir(s.stateDir)
		if len(entries) == n && len(s.pooled()) == n {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("the pool did not fill within 3 minutes")
}

// pooled lists the sandboxes waiting in the pool: their run directories
// hold the runtime's "pooled" marker.
func (s *server) pooled() []string {
	found, _ := filepath.Glob(filepath.Join(s.stateDir, "*", "pooled"))
	var ids []string
	for _, f := range found {
		ids = append(ids, filepath.Base(filepath.Dir(f)))
	}
	return ids
}

// poolMemory reads the memory each pooled sandbox's cgroup uses.
func (s *server) poolMemory() []Memory {
	parent := ownMemoryCgroup()
	var out []Memory
	for _, id := range s.pooled() {
		lang, _ := os.ReadFile(filepath.Join(s.stateDir, id, "pooled"))
		for _, f := range []string{"memory.usage_in_bytes", "memory.current"} {
			data, err := os.ReadFile(filepath.Join(parent, id, f))
			if err != nil {
				continue
			}
			if n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64); err == nil {
				out = append(out, Memory{Pool: strings.TrimSpace(string(lang)), Bytes: n})
			}
			break
		}
	}
	slices.SortFunc(out, func(a, b Memory) int { return strings.Compare(a.Pool, b.Pool) })
	return out
}

// ownMemoryCgroup is the directory of this process's memory cgroup, below
// which safe-run creates its runs' cgroups.
func ownMemoryCgroup() string {
	data, _ := os.ReadFile("/proc/self/cgroup")
	for _, line := range strings.Split(string(data), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if slices.Contains(strings.Split(parts[1], ","), "memory") {
			return filepath.Join("/sys/fs/cgroup/memory", parts[2])
		}
		if parts[0] == "0" && parts[1] == "" {
			if _, err := os.Stat("/sys/fs/cgroup/memory"); err != nil {
				return filepath.Join("/sys/fs/cgroup", parts[2])
			}
		}
	}
	return ""
}

func (s *server) close() {
	s.c.Close()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if entries, _ := os.ReadDir(s.stateDir); len(entries) == 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = os.RemoveAll(s.stateDir)
}
