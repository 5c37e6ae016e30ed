package runtime

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// memoryPoll is how often a memory watch reads the sandbox's memory use.
// A program can allocate beyond its limit for at most this long.
const memoryPoll = 50 * time.Millisecond

// gvisorMemoryFile is the name of the memory file gVisor's sentry backs all
// sandbox memory with — processes, tmpfs contents and file caches alike —
// as it appears among the sentry's open files.
const gvisorMemoryFile = "/memfd:runsc-memory"

// memoryWatch enforces a run's memory limit where there is no memory
// cgroup to do it (CgroupsNone): it reads how many bytes gVisor's memory
// file holds — the sandbox's whole memory by gVisor's own accounting, read
// from the host — and kills the sandbox when they exceed the limit, which
// the run then reports as out of memory.
type memoryWatch struct {
	limit   int64
	runsc   int // the sentry is a child of runsc: the shim's pid, after exec
	peak    atomic.Int64
	tripped atomic.Bool
	stop    chan struct{}
	done    chan struct{}

	mu     sync.Mutex
	sentry int    // the sandbox process, once found
	file   string // its memory file's /proc path, once found
}

// watchMemory starts a memoryWatch of p's sandbox with limit bytes.
func (p *sandboxProc) watchMemory(limit int64) *memoryWatch {
	w := &memoryWatch{limit: limit, runsc: p.cmd.Process.Pid, stop: make(chan struct{}), done: make(chan struct{})}
	go w.run(p)
	return w
}

// locate finds the sandbox's memory file, which the sentry opens while it
// boots, before any program runs. An error means the memory limit cannot
// be enforced, and the sandbox must not be used.
func (w *memoryWatch) locate() (sentry int, file string, err error) {
	if w == nil {
		return 0, "", nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.file == "" {
		w.sentry, w.file = findMemoryFile(w.runsc)
	}
	if w.file == "" {
		return 0, "", fmt.Errorf("gVisor's memory file (%s) is not among the sandbox's open files, so its memory limit cannot be enforced without a cgroup; run safe-run as root or in a delegated cgroup", gvisorMemoryFile)
	}
	return w.sentry, w.file, nil
}

func (w *memoryWatch) run(p *sandboxProc) {
	defer close(w.done)
	tick := time.NewTicker(memoryPoll)
	defer tick.Stop()
	// A sandbox whose memory file is not found by the time any sandbox
	// must have started is killed rather than left unbounded.
	giveUp := time.Now().Add(startTimeout)
	for {
		select {
		case <-w.stop:
			return
		case <-p.exited:
			return
		case <-tick.C:
		}
		sentry, file, err := w.locate()
		if err != nil {
			if time.Now().After(giveUp) {
				p.rt.log.Error("kill sandbox", "id", p.id, "err", err)
				p.kill()
				return
			}
			continue
		}
		var st syscall.Stat_t
		if err := syscall.Stat(file, &st); err != nil {
			return // the sandbox is gone
		}
		used := st.Blocks * 512
		if used > w.peak.Load() {
			w.peak.Store(used)
		}
		if used > w.limit {
			w.tripped.Store(true)
			_ = syscall.Kill(sentry, syscall.SIGKILL)
			p.kill()
			return
		}
	}
}

// close stops the watch and waits for it.
func (w *memoryWatch) close() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// usage reports whether the watch killed the sandbox, as a cgroup's OOM
// kill count would, and the peak it saw.
func (w *memoryWatch) usage() (oomKills uint64, peak int64) {
	if w.tripped.Load() {
		oomKills = 1
	}
	return oomKills, w.peak.Load()
}

// findMemoryFile looks among the descendants of pid for the process that
// holds gVisor's memory file open and returns it and the file's /proc path.
func findMemoryFile(pid int) (int, string) {
	for _, child := range childPids(pid) {
		fds, _ := os.ReadDir("/proc/" + strconv.Itoa(child) + "/fd")
		for _, fd := range fds {
			path := "/proc/" + strconv.Itoa(child) + "/fd/" + fd.Name()
			if target, err := os.Readlink(path); err == nil && strings.HasPrefix(target, gvisorMemoryFile) {
				return child, path
			}
		}
		if sentry, file := findMemoryFile(child); file != "" {
			return sentry, file
		}
	}
	return 0, ""
}

// childPids lists the children of pid's threads.
func childPids(pid int) []int {
	tasks, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/children")
	var out []int
	for _, t := range tasks {
		data, _ := os.ReadFile(t)
		for _, f := range strings.Fields(string(data)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

// memoryUsage reads the host memory the sandbox uses now: its cgroup's
// usage, or without a cgroup, its memory file plus the sentry's own
// anonymous memory (which the cgroup would also count).
func (p *sandboxProc) memoryUsage() (int64, error) {
	if p.mem == nil {
		return p.cg.memoryUsage()
	}
	sentry, file, err := p.mem.locate()
	if err != nil {
		return 0, err
	}
	var st syscall.Stat_t
	if err := syscall.Stat(file, &st); err != nil {
		return 0, fmt.Errorf("read memory usage: %w", err)
	}
	return st.Blocks*512 + rssAnon(sentry), nil
}

// rssAnon reads a process's resident anonymous memory, 0 if unknown.
func rssAnon(pid int) int64 {
	data, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "RssAnon:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}
