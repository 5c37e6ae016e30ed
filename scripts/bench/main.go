// Command bench measures, side by side in one run on one machine, what a
// run costs on each layer of safe-run: the bare interpreter of the image
// (chroot), gVisor alone (`runsc run` of an equivalent bundle), `safe-run
// run` cold and warm, and a full MCP stdio round trip to run_code with the
// warm pool off and on; then the warm pool of every language with calls
// spaced out and back to back, throughput, the CPU time of one run and the
// memory of one warm sandbox by part. It prints markdown tables and a line
// per target of issue 17 (met or not met), writes them and the raw figures
// as JSON, and can put the tables into docs/benchmarks.md.
//
// Run it as root through `make bench` (full: about 14 minutes on 2 busy
// CPUs) or `make bench-quick` (2½–4 minutes; written to quick.{md,json},
// docs untouched), after `make build runsc rootfs`. -cold and -cpu measure
// only the cold CLI against raw runsc (with -compare OLD/safe-run for a
// before and after in the same turns) or only the CPU rows, in a minute
// (with -baseline DIR, the restore rows of the build in DIR beside this
// one's).
package main

import (
	"bufio"
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

	"golang.org/x/sys/unix"

	"github.com/safe-run/safe-run/rootfs"
)

// programs are the two workloads of the layer table: the smallest
// program, and one dominated by importing pandas.
var programs = []struct{ Name, Code string }{
	{"print(1)", "print(1)"},
	{"import pandas", "import pandas as pd; print(pd.__version__)"},
}

type options struct {
	bin, runsc, agent, out, doc string
	runs, throughputRuns        int
	burst, cpuRuns              int
	quick                       bool
	// warmLangs limits -warm to the rows of these languages ("": all).
	warmLangs string
	// warmRuns and monitorBaseline are -monitor's: calls of each warm
	// cell (0: runs), and a second safe-run binary whose warm row is
	// measured in the same turns.
	warmRuns        int
	monitorBaseline string
	// idle is how long a timed warm call waits, once every pool is
	// full, before it is made (see server.timed).
	idle time.Duration
}

// quickOptions are what -quick sets, unless given: a run of a few minutes
// whose figures are rougher.
var quickOptions = map[string]string{"runs": "5", "throughput-runs": "8", "burst": "20", "cpu-runs": "3", "doc": ""}

func main() {
	defer exitOnFailure()
	var o options
	flag.StringVar(&o.bin, "safe-run", "bin/safe-run", "safe-run binary")
	flag.StringVar(&o.runsc, "runsc", "bin/runsc", "runsc binary")
	flag.StringVar(&o.agent, "agent", "bin/safe-run-agent", "safe-run-agent binary")
	flag.IntVar(&o.runs, "runs", 30, "timed runs per row and program")
	flag.IntVar(&o.throughputRuns, "throughput-runs", 24, "runs per throughput measurement")
	flag.IntVar(&o.burst, "burst", 50, "calls of each back-to-back series")
	flag.IntVar(&o.cpuRuns, "cpu-runs", 10, "samples of each CPU-per-run row")
	flag.StringVar(&o.warmLangs, "warm-langs", "", "-warm: only the warm rows of these languages (comma-separated: python, node, bash)")
	flag.BoolVar(&o.quick, "quick", false, "a run of a few minutes: -runs 5 -throughput-runs 8 -burst 20 -cpu-runs 3, no network rows, written to quick.{md,json}, docs/benchmarks.md untouched")
	flag.StringVar(&o.out, "out", "scripts/bench/results", "directory for latest.md and latest.json")
	flag.StringVar(&o.doc, "doc", "docs/benchmarks.md", "the document whose benchmark tables (between <!-- NAME:begin --> and <!-- NAME:end -->) are replaced (empty: leave it)")
	check := flag.Bool("check", false, "measure only safe-run check -j 2 on 100 print(i) blocks against 100 safe-run run calls")
	checkReps := flag.Int("check-reps", 3, "repetitions of each path of -check (the median is reported)")
	netOnly := flag.Bool("net", false, "measure only the network rows: start with and without a network, request latency, a 64 MiB download")
	coldOnly := flag.Bool("cold", false, "measure only cold `safe-run run` print(1) against raw `runsc run`, until exit and until its stdout ends (-runs each)")
	var compare listFlag
	flag.Var(&compare, "compare", "with -cold: another safe-run binary measured in the same turns, e.g. a build of the commit before a change (repeatable)")
	cpuOnly := flag.Bool("cpu", false, "measure only the CPU rows: raw `runsc run`, cold `safe-run run`, a restore and its prime, a warm call all in (-cpu-runs each)")
	warmOnly := flag.Bool("warm", false, "measure only the warm rows (-runs spaced calls per language); with -baseline, also the safe-run binaries in that directory, call by call in turn")
	burstOnly := flag.Bool("burst-only", false, "measure only the burst series (-burst calls back to back, pool on and off, -rounds times); with -baseline, also the binaries in that directory, burst by burst in turn")
	rounds := flag.Int("rounds", 3, "-burst-only: bursts of each build and pool")
	burstThroughput := flag.Bool("burst-throughput", false, "-burst-only: also the throughput rows pool on and off at concurrency 1, 2 and 4 (-throughput-runs each, -rounds times)")
	baseline := flag.String("baseline", "", "with -warm, -cpu or -burst-only: a directory holding another build's safe-run, safe-run-agent, safe-run-shim and safe-run-net, measured in turn with this one")
	monitorOnly := flag.Bool("monitor", false, "measure only the behaviour monitor's overhead: print(1), import pandas and a file-heavy program cold, and a pooled MCP print(1), at --monitor off, default and full, interleaved (-runs each)")
	flag.DurationVar(&o.idle, "idle", time.Second, "how long each timed warm call waits, with every pool full, before it is made: a call after the machine rested, as calls a person or a model makes are")
	flag.IntVar(&o.warmRuns, "warm-runs", 0, "-monitor: warm calls per level (0: -runs)")
	flag.StringVar(&o.monitorBaseline, "monitor-baseline", "", "-monitor: another safe-run binary (with its agent and shim beside it; runsc is -runsc, as for this build), e.g. an earlier commit's, whose warm row is measured in the same turns")
	flag.Parse()
	if o.quick {
		set := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
		for name, v := range quickOptions {
			if !set[name] {
				must(flag.Set(name, v))
			}
		}
	}
	log.SetFlags(0)
	log.SetPrefix("bench: ")
	if os.Geteuid() != 0 {
		fatal("run as root (chroot, runsc and safe-run need it); use `sudo make bench`")
	}
	for _, p := range []*string{&o.bin, &o.runsc, &o.agent} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			fatal(err)
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
	if *coldOnly {
		coldMain(o, compare)
		return
	}
	if *cpuOnly {
		cpuMain(o, *baseline)
		return
	}
	if *monitorOnly {
		monitorMain(o)
		return
	}
	if *burstOnly {
		burstMain(o, *baseline, *rounds, *burstThroughput)
		return
	}
	if *warmOnly {
		warmMain(o, *baseline)
		return
	}
	start := time.Now()
	rep, err := run(o)
	if err != nil {
		fatal(err)
	}
	name := "latest"
	if o.quick {
		name = "quick"
	}
	writeReport(o, name, "bench", rep, rep.markdown())
	if !o.quick {
		netMain(o)
	}
	log.Printf("took %s", time.Since(start).Round(time.Second))
}

func must(err error) {
	if err != nil {
		fatal(err)
	}
}

// failure is what fatal and fatalf panic with.
type failure string

// fatal ends the benchmark with v as log.Fatal would, but by unwinding the
// main goroutine, so that the cleanups it deferred (servers, their pools,
// temporary directories) run first: log.Fatal exits at once and left them.
// exitOnFailure, deferred by main, then logs v and exits 1.
func fatal(v ...any) { panic(failure(fmt.Sprint(v...))) }

// fatalf is fatal with a format.
func fatalf(format string, v ...any) { panic(failure(fmt.Sprintf(format, v...))) }

// exitOnFailure logs the failure main's goroutine unwound with and exits 1;
// any other panic goes on.
func exitOnFailure() {
	r := recover()
	if r == nil {
		return
	}
	f, ok := r.(failure)
	if !ok {
		panic(r)
	}
	log.Print(string(f))
	os.Exit(1)
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

func run(o options) (*Report, error) {
	begin := time.Now()
	img, err := rootfs.Store{}.Lookup(rootfs.DefaultName)
	if err != nil {
		return nil, err
	}
	rep := &Report{Date: time.Now().UTC().Format("2006-01-02 15:04 UTC"), Machine: machine(), Quick: o.quick}
	if out, err := exec.Command(o.runsc, "--version").Output(); err == nil {
		rep.Runsc = strings.TrimPrefix(strings.SplitN(string(out), "\n", 2)[0], "runsc version ")
	}
	raw, err := newRawRunsc(o, img.Root)
	if err != nil {
		return nil, err
	}
	defer raw.close()

	cold, err := startServer(o, nil, 0, "--pool=")
	if err != nil {
		return nil, err
	}
	defer cold.close()
	warm, err := startServer(o, nil, warmPoolSize, "--pool", warmPool)
	if err != nil {
		return nil, err
	}
	defer warm.close()

	coldCLI := func(code string) error { return coldRun(o, nil, code) }
	rows := []struct {
		name string
		run  func(code string) error
	}{
		{"bare python3 in the image (chroot) — the floor", func(code string) error {
			return exec.Command("chroot", img.Root, "/usr/bin/env", "-i", "PATH=/usr/bin:/bin", "HOME=/tmp", "python3", "-c", code).Run()
		}},
		{"`runsc run` of an equivalent bundle — gVisor alone", raw.run},
		{"`safe-run run` — cold", coldCLI},
		{"`safe-run run --warm` — restored from a checkpoint", func(code string) error {
			return exec.Command(o.bin, "run", "--warm", "--lang", "python", "-c", code).Run()
		}},
		{"MCP stdio `run_code`, pool off", cold.call},
	}
	// Warm-up: build the checkpoint image and fill caches outside the timing.
	for _, r := range rows {
		for _, p := range programs {
			if err := r.run(p.Code); err != nil {
				return nil, fmt.Errorf("%s, %s: %w", r.name, p.Name, err)
			}
		}
	}
	// The rows take turns, run by run, so that the load of the machine
	// drifts alike for all of them and their ratios hold.
	ds := make([][][]time.Duration, len(rows))
	for i := range rows {
		ds[i] = make([][]time.Duration, len(programs))
	}
	for range o.runs {
		for i, r := range rows {
			for j, p := range programs {
				start := time.Now()
				if err := r.run(p.Code); err != nil {
					return nil, fmt.Errorf("%s, %s: %w", r.name, p.Name, err)
				}
				ds[i][j] = append(ds[i][j], time.Since(start))
			}
		}
	}
	for i, r := range rows {
		row := Row{Name: r.name, Stats: map[string]Stats{}}
		for j, p := range programs {
			row.Stats[p.Name] = summarise(ds[i][j])
			log.Printf("%-55s %-14s p50 %8.2f ms", r.name, p.Name, row.Stats[p.Name].P50)
		}
		rep.Rows = append(rep.Rows, row)
	}

	// The pool-on row of the layer table is the warm series' Python rows.
	rep.WarmIdle = o.idle.String()
	if rep.Warm, err = measureWarm(warm, o.runs); err != nil {
		return nil, err
	}
	rep.Rows = append(rep.Rows, Row{Name: "MCP stdio `run_code`, pool on", Stats: map[string]Stats{
		programs[0].Name: rep.Warm[0].Stats, programs[1].Name: rep.Warm[1].Stats}})

	on, err := burst(warm, fmt.Sprintf("pool on (python=%d)", burstPool), o.burst)
	if err != nil {
		return nil, fmt.Errorf("burst, pool on: %w", err)
	}
	off, err := burst(cold, "pool off", o.burst)
	if err != nil {
		return nil, fmt.Errorf("burst, pool off: %w", err)
	}
	on.classify(off)
	off.classify(off)
	rep.Bursts = []Burst{on, off}

	paths := []struct {
		name string
		run  func(string) error
	}{
		{"`runsc run` — gVisor alone", raw.run},
		{"`safe-run run` — cold", coldCLI},
		{"MCP `run_code`, pool off", cold.call},
		{fmt.Sprintf("MCP `run_code`, pool on (python=%d)", burstPool), warm.call},
	}
	rep.Throughput = make([]Throughput, len(paths))
	// At each concurrency the paths follow each other: pool on and off
	// are compared under the same load.
	for _, c := range []int{1, 2, 4} {
		for i, t := range paths {
			if err := warm.waitFull(); err != nil {
				return nil, err
			}
			perS, err := throughput(o.throughputRuns, c, func() error { return t.run("print(1)") })
			if err != nil {
				return nil, fmt.Errorf("throughput of %s: %w", t.name, err)
			}
			if rep.Throughput[i].PerS == nil {
				rep.Throughput[i] = Throughput{Name: t.name, PerS: map[string]float64{}}
			}
			rep.Throughput[i].PerS[strconv.Itoa(c)] = perS
			log.Printf("%-55s concurrency %d: %.1f runs/s", t.name, c, perS)
		}
	}
	// The rest measures one sandbox at a time: nothing else may wait.
	cold.close()
	warm.close()

	if rep.CPU, err = measureCPUPerRun(o, raw, o.cpuRuns); err != nil {
		return nil, err
	}
	if rep.WarmMemory, err = warmMemory(o, min(o.runs, 10)); err != nil {
		return nil, err
	}
	rep.Targets = targets(rep)
	rep.Took = time.Since(begin).Round(time.Second).String()
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

// replaceSection puts table between the benchmark markers of doc.
func replaceSection(doc, table string) error { return replaceMarked(doc, "bench", table) }

// replaceMarked puts table between doc's <!-- NAME:begin --> and
// <!-- NAME:end --> markers.
func replaceMarked(doc, name, table string) error {
	begin, end := "<!-- "+name+":begin -->\n", "<!-- "+name+":end -->"
	data, err := os.ReadFile(doc)
	if err != nil {
		return err
	}
	s := string(data)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		return fmt.Errorf("%s has no %q … %q section", doc, strings.TrimSpace(begin), end)
	}
	return os.WriteFile(doc, []byte(s[:i+len(begin)]+table+s[j:]), 0o644)
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
