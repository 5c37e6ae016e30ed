package main

import (
	"bufio"
	"bytes"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Memory is what one warm sandbox uses, by part, in bytes, read while it
// waits in the pool.
type Memory struct {
	Pool string `json:"pool"`
	// Bytes is its cgroup's usage (memory.usage_in_bytes, memory.current):
	// everything charged to it, page cache included.
	Bytes int64 `json:"bytes"`
	// Stat holds the cgroup's anonymous, shared-memory and file bytes
	// (memory.stat's total_rss, total_shmem, total_cache on v1; anon,
	// shmem, file on v2).
	Stat map[string]int64 `json:"stat,omitempty"`
	// MemoryFile is what gVisor's memory file (the sentry's runsc-memory
	// memfd, which holds the sandbox's application memory and page cache)
	// has allocated.
	MemoryFile int64 `json:"memory_file_bytes"`
	// SentryHeap is the sentry's anonymous memory: the Go heap and stacks
	// of gVisor's kernel.
	SentryHeap int64 `json:"sentry_anon_bytes"`
	// GoferAnon and RunscAnon are the anonymous memory of the gofer and of
	// the other runsc processes of the sandbox (the `runsc run` or `runsc
	// restore` that waits for it); their resident sets add the pages of
	// the runsc binary, which they share.
	GoferAnon int64 `json:"gofer_anon_bytes"`
	RunscAnon int64 `json:"runsc_anon_bytes"`
	RunscN    int   `json:"runsc_processes"`
	// SentryRSS, GoferRSS and RunscRSS are their resident sets, shared
	// pages (the binary, mapped parts of the memory file) included.
	SentryRSS int64 `json:"sentry_rss_bytes"`
	GoferRSS  int64 `json:"gofer_rss_bytes"`
	RunscRSS  int64 `json:"runsc_rss_bytes"`
	// PrintP50 and PandasP50 are warm run_code latencies of this pool
	// (Python only), p50 in ms: what the preloads buy, and cost.
	PrintP50  float64 `json:"print_p50_ms,omitempty"`
	PandasP50 float64 `json:"import_pandas_p50_ms,omitempty"`
}

// warmMemory fills a pool of one sandbox per language, and one of Python
// without preloads, and reads their memory; for each Python pool it also
// times a few warm calls, to put numbers on the preload trade-off.
func warmMemory(o options, calls int) ([]Memory, error) {
	var out []Memory
	for _, cfg := range []struct {
		args   []string
		n      int
		suffix string
	}{
		{[]string{"--pool", "python=1,node=1,bash=1"}, 3, " (numpy, pandas, matplotlib preloaded)"},
		{[]string{"--pool", "python=1", "--preload", "python="}, 1, " (nothing preloaded)"},
	} {
		s, err := startServer(o, nil, cfg.n, cfg.args...)
		if err != nil {
			return nil, err
		}
		got, err := poolMemory(s, calls, cfg.suffix)
		s.close()
		if err != nil {
			return nil, err
		}
		out = append(out, got...)
	}
	return out, nil
}

func poolMemory(s *server, calls int, suffix string) ([]Memory, error) {
	if err := s.waitFull(); err != nil {
		return nil, err
	}
	time.Sleep(2 * time.Second) // let gVisor settle after a restore
	var out []Memory
	for _, id := range s.pooled() {
		m, err := sandboxMemory(id)
		if err != nil {
			return nil, err
		}
		m.Pool = s.language(id)
		if m.Pool == "python" {
			m.Pool += suffix
		}
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b Memory) int { return strings.Compare(a.Pool, b.Pool) })
	for i := range out {
		if !strings.HasPrefix(out[i].Pool, "python") {
			continue
		}
		for _, p := range []struct {
			code string
			p50  *float64
		}{{"print(1)", &out[i].PrintP50}, {"import pandas as pd; print(pd.__version__)", &out[i].PandasP50}} {
			var ds []time.Duration
			for range calls {
				d, err := s.timed("python", p.code)
				if err != nil {
					return nil, err
				}
				ds = append(ds, d)
			}
			*p.p50 = summarise(ds).P50
		}
		log.Printf("warm %s: %.1f MiB, print(1) p50 %.1f ms, import pandas p50 %.1f ms",
			out[i].Pool, mib(out[i].Bytes), out[i].PrintP50, out[i].PandasP50)
	}
	return out, nil
}

// sandboxMemory reads the parts of the memory of the pooled sandbox id
// from its memory cgroup and its processes.
func sandboxMemory(id string) (Memory, error) {
	var m Memory
	dir := filepath.Join(ownCgroup("memory"), id)
	for _, f := range []string{"memory.usage_in_bytes", "memory.current"} {
		if n, err := readInt(filepath.Join(dir, f)); err == nil {
			m.Bytes = n
			break
		}
	}
	if m.Bytes == 0 {
		return m, fmt.Errorf("read the memory of sandbox %s: no usage in %s", id, dir)
	}
	m.Stat = memoryStat(filepath.Join(dir, "memory.stat"))
	procs, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return m, fmt.Errorf("read the processes of sandbox %s: %w", id, err)
	}
	seen := map[uint64]bool{} // memory files, by inode
	for _, f := range strings.Fields(string(procs)) {
		pid, _ := strconv.Atoi(f)
		rss, anon := smapsRollup(pid)
		switch argv0(pid) {
		case "runsc-sandbox":
			m.SentryRSS += rss
			m.SentryHeap += anon
			m.MemoryFile += memoryFiles(pid, seen)
		case "runsc-gofer":
			m.GoferRSS += rss
			m.GoferAnon += anon
		case "":
			// The systrap stubs, the address spaces of the sandbox's
			// processes (argv cleared): what they map is the memory file.
		default:
			m.RunscRSS += rss
			m.RunscAnon += anon
			m.RunscN++
		}
	}
	return m, nil
}

// memoryStat picks the anonymous, shared-memory and file figures from a
// cgroup's memory.stat, under one set of names for v1 and v2.
func memoryStat(path string) map[string]int64 {
	all := map[string]int64{}
	data, _ := os.ReadFile(path)
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok {
			all[k], _ = strconv.ParseInt(v, 10, 64)
		}
	}
	names := map[string]string{"anon": "anon", "shmem": "shmem", "file": "file"} // v2
	if _, v1 := all["total_rss"]; v1 {
		// v1's totals count the cgroup's descendants as well.
		names = map[string]string{"anon": "total_rss", "shmem": "total_shmem", "file": "total_cache"}
	}
	out := map[string]int64{}
	for name, key := range names {
		if v, ok := all[key]; ok {
			out[name] = v
		}
	}
	return out
}

// smapsRollup returns a process's resident and anonymous bytes.
func smapsRollup(pid int) (rss, anon int64) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 3 || fields[2] != "kB" {
			continue
		}
		kb, _ := strconv.ParseInt(fields[1], 10, 64)
		switch fields[0] {
		case "Rss:":
			rss = kb << 10
		case "Anonymous:":
			anon = kb << 10
		}
	}
	return rss, anon
}

// argv0 is the base name of a process's argv[0]: runsc names its sentry
// runsc-sandbox and its gofer runsc-gofer there.
func argv0(pid int) string {
	data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	first, _, _ := bytes.Cut(data, []byte{0})
	if len(first) == 0 {
		return ""
	}
	return filepath.Base(string(first))
}

// memoryFiles sums the allocated bytes of the gVisor memory files (memfds
// named runsc-memory) a process holds open, each file once.
func memoryFiles(pid int, seen map[uint64]bool) int64 {
	fds := fmt.Sprintf("/proc/%d/fd", pid)
	entries, _ := os.ReadDir(fds)
	var n int64
	for _, e := range entries {
		path := filepath.Join(fds, e.Name())
		if link, err := os.Readlink(path); err != nil || !strings.HasPrefix(link, "/memfd:runsc-memory") {
			continue
		}
		var st unix.Stat_t
		if unix.Stat(path, &st) != nil || seen[st.Ino] {
			continue
		}
		seen[st.Ino] = true
		n += st.Blocks * 512
	}
	return n
}

func readInt(path string) (int64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }
