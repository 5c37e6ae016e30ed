package gvisor

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/safe-run/safe-run/bundle"
)

// memoryPoll is how often a memory watch reads the sandbox's memory use.
// A program can allocate beyond its limit for at most this long.
const memoryPoll = 50 * time.Millisecond

// gvisorMemoryFile is the name of the memory file gVisor's sentry backs all
// sandbox memory with — processes, tmpfs contents and file caches alike —
// as it appears among the sentry's open files.
const gvisorMemoryFile = "/memfd:runsc-memory"

// memoryWatch enforces a run's memory limit where there is no memory
// cgroup to do it (CgroupsNone), and kills the sandbox, which the run then
// reports as out of memory, when either of two measures read from the host
// is over its bound:
//
//   - the bytes gVisor's memory file holds (the program's processes, tmpfs
//     contents, file caches: the sandbox's memory by gVisor's accounting)
//     over the job's limit. Fast allocations land here; the headroom
//     absorbs what they add before the next poll.
//   - those plus the sentry's own anonymous memory (its heap: the kernel
//     objects of a million files, say, which are not in the memory file)
//     plus the page tables of the sandbox's host processes (a program that
//     touches one byte per GiB of a huge sparse mapping makes the systrap
//     stubs, whose address spaces mirror the program's, hold two pages of
//     page tables for every page it uses) over the limit plus
//     bundle.MemoryHeadroom, the bound a memory cgroup puts on the same
//     processes, which charges it their page tables too.
//
// The peak it reports is the second measure, as a cgroup's would be.
type memoryWatch struct {
	limit   int64
	runsc   int // the sentry is a child of runsc: the shim's pid, after exec
	peak    atomic.Int64
	tripped atomic.Bool
	stop    chan struct{}
	done    chan struct{}

	mu     sync.Mutex
	sentry int // the sandbox process, once found
}

// watchMemory starts a memoryWatch of p's sandbox with limit bytes.
func (p *sandboxProc) watchMemory(limit int64) *memoryWatch {
	w := &memoryWatch{limit: limit, runsc: p.cmd.Process.Pid, stop: make(chan struct{}), done: make(chan struct{})}
	go w.run(p)
	return w
}

// locate finds the sentry: the sandbox process that holds gVisor's memory
// file, which it opens while it boots, before any program runs. An error
// means the memory limit cannot be enforced, and the sandbox must not be
// used.
func (w *memoryWatch) locate() (sentry int, err error) {
	if w == nil {
		return 0, nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.sentry == 0 {
		w.sentry = findSentry(w.runsc)
	}
	if w.sentry == 0 {
		return 0, partError(ErrMemoryUnwatched, "gVisor's memory file (%s) is not among the sandbox's open files, so its memory limit cannot be enforced without a cgroup", gvisorMemoryFile)
	}
	return w.sentry, nil
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
		sentry, err := w.locate()
		if err != nil {
			if time.Now().After(giveUp) {
				p.log.Error("kill sandbox: its memory cannot be watched", "err", err)
				p.Kill()
				return
			}
			continue
		}
		file, whole, alive := hostMemory(sentry)
		if !alive {
			return // the sandbox is gone
		}
		if whole > w.peak.Load() {
			w.peak.Store(whole)
		}
		if file > w.limit || whole > w.limit+bundle.MemoryHeadroom {
			w.tripped.Store(true)
			_ = syscall.Kill(sentry, syscall.SIGKILL)
			p.Kill()
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

// findSentry looks among the descendants of pid for the sentry: the
// process runsc names runsc-sandbox, once it holds gVisor's memory file
// open; 0 until then. The systrap stubs below it map the same file and may
// hold it too, so the search never goes below the sentry: taking a stub
// for it would leave its heap and the stubs' page tables uncounted.
func findSentry(pid int) int {
	for _, child := range childPids(pid) {
		if isSentry(child) {
			if hasMemoryFile(child) {
				return child
			}
			return 0
		}
		if sentry := findSentry(child); sentry != 0 {
			return sentry
		}
	}
	return 0
}

// sentryName is the argv[0] runsc gives the sandbox process, gVisor's
// kernel.
const sentryName = "runsc-sandbox"

func isSentry(pid int) bool {
	cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	argv0, _, _ := strings.Cut(string(cmdline), "\x00")
	return filepath.Base(argv0) == sentryName
}

func hasMemoryFile(pid int) bool {
	found := false
	eachMemoryFile(pid, func(string) { found = true })
	return found
}

// memoryFileBytes returns the bytes allocated to the memory files the
// sentry holds open, and whether it is still there. It looks the files up
// every time: a restore replaces the memory file the sentry booted with.
func memoryFileBytes(sentry int) (used int64, alive bool) {
	alive = eachMemoryFile(sentry, func(path string) {
		var st syscall.Stat_t
		if syscall.Stat(path, &st) == nil {
			used += st.Blocks * 512
		}
	})
	return used, alive
}

// eachMemoryFile calls f with the /proc path of each of gVisor's memory
// files that pid holds open, and reports whether pid's files could be read.
func eachMemoryFile(pid int, f func(path string)) bool {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd/"
	fds, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, fd := range fds {
		if target, err := os.Readlink(dir + fd.Name()); err == nil && strings.HasPrefix(target, gvisorMemoryFile) {
			f(dir + fd.Name())
		}
	}
	return true
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
	sentry, err := p.mem.locate()
	if err != nil {
		return 0, err
	}
	_, whole, alive := hostMemory(sentry)
	if !alive {
		return 0, errors.New("read memory usage: the sandbox is gone")
	}
	return whole, nil
}

// hostMemory reads what the sandbox of sentry holds on the host: the bytes
// of gVisor's memory file, and those plus the sentry's anonymous memory
// and the page tables of the sentry and the processes below it (what a
// memory cgroup would count). alive is false once the sentry is gone.
func hostMemory(sentry int) (file, whole int64, alive bool) {
	file, alive = memoryFileBytes(sentry)
	if !alive {
		return 0, 0, false
	}
	return file, file + statusBytes(sentry, "RssAnon:") + pageTableBytes(sentry), true
}

// pageTableBytes adds up the page tables of pid and its descendants once
// per address space: systrap's stub processes share theirs in groups, and
// each group's page tables exist once (kcmp tells them apart; where it
// cannot, a process counts on its own, which can only count more).
func pageTableBytes(pid int) int64 {
	var spaces []int // one process of each address space counted
	var total int64
	var walk func(pid int)
	walk = func(pid int) {
		if !slices.ContainsFunc(spaces, func(other int) bool { return sameAddressSpace(pid, other) }) {
			spaces = append(spaces, pid)
			total += statusBytes(pid, "VmPTE:")
		}
		for _, child := range childPids(pid) {
			walk(child)
		}
	}
	walk(pid)
	return total
}

// sameAddressSpace reports whether processes a and b share their memory
// map.
func sameAddressSpace(a, b int) bool {
	r, _, errno := unix.Syscall6(unix.SYS_KCMP, uintptr(a), uintptr(b), kcmpVM, 0, 0, 0)
	return errno == 0 && r == 0
}

// kcmpVM is KCMP_VM of linux/kcmp.h.
const kcmpVM = 1

// statusBytes reads a field counted in kB from a process's status, 0 if
// unknown.
func statusBytes(pid int, field string) int64 {
	data, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, field); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}
