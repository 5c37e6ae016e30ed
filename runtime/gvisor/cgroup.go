package gvisor

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/fs"
	"github.com/opencontainers/cgroups/fs2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// cgroupControllers are the controllers a run's cgroup needs: memory (limit
// and OOM count), pids (backstop) and cpu (quota). cpuacct is joined where
// it is a hierarchy of its own so CPU use can be read.
var cgroupControllers = []string{"memory", "pids", "cpu", "cpuacct"}

// CgroupLayout says where runs' cgroups go on this host.
type CgroupLayout struct {
	// Mode is "v2" (unified), "hybrid" (v1 controllers beside an empty
	// cgroup2), "v1", or CgroupsNone.
	Mode string
	// Parents maps each controller to the directory new cgroups are created
	// in: safe-run's own cgroup. With v2 the only key is "".
	Parents map[string]string
	// Missing lists controllers that cannot be used, with the reason.
	Missing []string
}

// DetectCgroups finds safe-run's own cgroup(s) from /proc/self/cgroup and
// checks that a run's cgroup can be created below them with the needed
// controllers.
func DetectCgroups() (CgroupLayout, error) {
	if cgroups.IsCgroup2UnifiedMode() {
		return detectV2()
	}
	l := CgroupLayout{Mode: "v1", Parents: map[string]string{}}
	if cgroups.IsCgroup2HybridMode() {
		l.Mode = "hybrid"
	}
	for _, c := range cgroupControllers {
		dir, err := cgroups.GetOwnCgroupPath(c)
		if err != nil {
			if c != "cpuacct" {
				l.Missing = append(l.Missing, fmt.Sprintf("%s: %v", c, err))
			}
			continue
		}
		l.Parents[c] = dir
	}
	if len(l.Missing) > 0 {
		return l, fmt.Errorf("cgroup v1 controllers unavailable: %s", strings.Join(l.Missing, "; "))
	}
	return l, nil
}

func detectV2() (CgroupLayout, error) {
	parent, err := ownCgroupV2()
	if err != nil {
		return CgroupLayout{Mode: "v2"}, err
	}
	return detectV2At(parent)
}

// ownCgroupV2 returns the directory of this process's cgroup v2.
func ownCgroupV2() (string, error) {
	return ownCgroupV2At("/proc/self/cgroup", fs2.UnifiedMountpoint)
}

// ownCgroupV2At returns the directory, below cgroup v2's mount point, of
// the cgroup v2 that the cgroup file (a /proc/PID/cgroup) names.
func ownCgroupV2At(file, mount string) (string, error) {
	own, err := cgroups.ParseCgroupFile(file)
	if err != nil {
		return "", fmt.Errorf("read own cgroup: %w", err)
	}
	return filepath.Join(mount, own[""]), nil
}

// detectV2At enables the needed controllers for the children of parent.
func detectV2At(parent string) (CgroupLayout, error) {
	l := CgroupLayout{Mode: "v2"}
	l.Parents = map[string]string{"": parent}
	need := []string{"memory", "pids", "cpu"}
	enabled := func() []string {
		data, _ := os.ReadFile(filepath.Join(parent, "cgroup.subtree_control"))
		return strings.Fields(string(data))
	}
	for _, c := range need {
		if slices.Contains(enabled(), c) {
			continue
		}
		// Enabling a controller for our children touches only our own cgroup;
		// the kernel refuses it (EBUSY) while processes live in it.
		err := os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), []byte("+"+c), 0)
		if err != nil {
			l.Missing = append(l.Missing, fmt.Sprintf("%s: %v", c, err))
		}
	}
	if len(l.Missing) > 0 {
		return l, fmt.Errorf("cgroup v2 controllers not delegated to %s (%s); start safe-run in a cgroup of its own with them delegated, e.g. `systemd-run --scope -p Delegate=yes safe-run ...`",
			parent, strings.Join(l.Missing, "; "))
	}
	return l, nil
}

// runCgroup is the cgroup of one run, created below safe-run's own cgroup.
// safe-run owns it: runsc runs with --ignore-cgroups and is started inside
// it by the shim, so nothing else creates, changes or removes cgroups.
type runCgroup struct {
	mgr   cgroups.Manager
	paths map[string]string
	// heldCPU is a CPU limit created but not yet applied (limitCPU).
	heldCPU *specs.LinuxCPU
}

// newRunCgroup creates the cgroup named id below each parent and applies
// res but its CPU limit, which limitCPU applies once the sandbox is up.
// Without cgroups (CgroupsNone) it returns an empty runCgroup.
func newRunCgroup(layout CgroupLayout, id string, res *specs.LinuxResources) (*runCgroup, error) {
	if layout.Mode == CgroupsNone {
		return &runCgroup{}, nil
	}
	held := res.CPU
	if held != nil {
		unlimited := *res
		unlimited.CPU = nil
		res = &unlimited
	}
	paths := make(map[string]string, len(layout.Parents))
	for c, parent := range layout.Parents {
		paths[c] = filepath.Join(parent, id)
	}
	r := toCgroupResources(res, paths)
	cg := &cgroups.Cgroup{Name: id, Resources: r}
	var (
		mgr cgroups.Manager
		err error
	)
	if layout.Mode == "v2" {
		dir := paths[""]
		if err := os.Mkdir(dir, 0o755); err != nil {
			return nil, fmt.Errorf("create cgroup %s: %w", dir, err)
		}
		mgr, err = fs2.NewManager(cg, dir)
	} else {
		mgr, err = fs.NewManager(cg, paths)
		if err == nil {
			err = mgr.Apply(-1) // creates the directories, adds no process
		}
	}
	c := &runCgroup{mgr: mgr, paths: paths, heldCPU: held}
	if err != nil {
		c.destroy()
		return nil, fmt.Errorf("create cgroup %s: %w", id, err)
	}
	if err := mgr.Set(r); err != nil {
		c.destroy()
		return nil, fmt.Errorf("set limits of cgroup %s: %w", id, err)
	}
	return c, nil
}

func toCgroupResources(res *specs.LinuxResources, paths map[string]string) *cgroups.Resources {
	r := &cgroups.Resources{}
	if m := res.Memory; m != nil && m.Limit != nil {
		r.Memory = *m.Limit
		// Limit swap too where the kernel accounts it, so a run cannot swap
		// its way past the limit.
		if m.Swap != nil && hasSwapAccounting(paths) {
			r.MemorySwap = *m.Swap
		}
		r.MemorySwappiness = m.Swappiness
	}
	if p := res.Pids; p != nil && p.Limit != nil {
		r.PidsLimit = p.Limit
	}
	if c := res.CPU; c != nil {
		if c.Quota != nil {
			r.CpuQuota = *c.Quota
		}
		if c.Period != nil {
			r.CpuPeriod = *c.Period
		}
	}
	return r
}

func hasSwapAccounting(paths map[string]string) bool {
	if dir, ok := paths[""]; ok {
		_, err := os.Stat(filepath.Join(filepath.Dir(dir), "memory.swap.max"))
		return err == nil
	}
	_, err := os.Stat(filepath.Join(filepath.Dir(paths["memory"]), "memory.memsw.limit_in_bytes"))
	return err == nil
}

// cgroupKillWait bounds how long killing a cgroup's processes may take.
const cgroupKillWait = 5 * time.Second

// open attaches c to the cgroup directories of its paths that exist: those
// of a run whose owner died.
func (c *runCgroup) open(layout CgroupLayout) error {
	for k, p := range c.paths {
		if _, err := os.Stat(p); err != nil {
			delete(c.paths, k)
		}
	}
	if len(c.paths) == 0 {
		return os.ErrNotExist
	}
	cg := &cgroups.Cgroup{Resources: &cgroups.Resources{}}
	var err error
	if layout.Mode == "v2" {
		c.mgr, err = fs2.NewManager(cg, c.paths[""])
	} else {
		c.mgr, err = fs.NewManager(cg, c.paths)
	}
	return err
}

// limitCPU applies the CPU limit newRunCgroup held back, once; with none
// held it does nothing. It writes the quota files itself, as runc's cgroup
// manager would (v2 cpu.max "QUOTA PERIOD", v1 the period, then the quota),
// rather than have the manager write every limit again.
func (c *runCgroup) limitCPU() error {
	cpu := c.heldCPU
	if cpu == nil {
		return nil
	}
	var writes [][2]string // file, value
	quota, period := int64(0), uint64(0)
	if cpu.Quota != nil {
		quota = *cpu.Quota
	}
	if cpu.Period != nil {
		period = *cpu.Period
	}
	switch dir := c.paths[""]; {
	case quota == 0 && period == 0:
	case dir != "":
		value := "max"
		if quota > 0 {
			value = strconv.FormatInt(quota, 10)
		}
		if period != 0 {
			value += " " + strconv.FormatUint(period, 10)
		}
		writes = append(writes, [2]string{filepath.Join(dir, "cpu.max"), value})
	case c.paths["cpu"] != "":
		if period != 0 {
			writes = append(writes, [2]string{filepath.Join(c.paths["cpu"], "cpu.cfs_period_us"), strconv.FormatUint(period, 10)})
		}
		if quota != 0 {
			writes = append(writes, [2]string{filepath.Join(c.paths["cpu"], "cpu.cfs_quota_us"), strconv.FormatInt(quota, 10)})
		}
	}
	for _, w := range writes {
		if err := os.WriteFile(w[0], []byte(w[1]), 0); err != nil {
			return fmt.Errorf("apply the CPU limit: %w", err)
		}
	}
	c.heldCPU = nil
	return nil
}

// usage reads how many OOM kills the cgroup saw and its peak memory. It
// reads the two files that hold them and nothing else: the manager's
// GetStats reads a dozen files (0.6 ms at the end of every run).
func (c *runCgroup) usage() (oomKills uint64, peak int64, err error) {
	if len(c.paths) == 0 {
		return 0, 0, nil
	}
	if dir, ok := c.paths[""]; ok {
		return readUsage(dir, "memory.events", "memory.peak")
	}
	return readUsage(c.paths["memory"], "memory.oom_control", "memory.max_usage_in_bytes")
}

// readUsage reads the oom_kill count from dir's events file (v2
// memory.events, v1 memory.oom_control: both "key value" lines) and the
// peak from its peak file. The count decides whether a run is reported as
// out of memory, so failing to read it is an error; the peak is
// informative (v2 has memory.peak only since Linux 5.19), so a missing one
// reads as 0.
func readUsage(dir, eventsFile, peakFile string) (oomKills uint64, peak int64, err error) {
	data, err := os.ReadFile(filepath.Join(dir, eventsFile))
	if err != nil {
		return 0, 0, fmt.Errorf("read OOM kill count: %w", err)
	}
	oomKills, err = keyedValue(data, "oom_kill")
	if err != nil {
		return 0, 0, fmt.Errorf("read OOM kill count from %s: %w", eventsFile, err)
	}
	if data, err := os.ReadFile(filepath.Join(dir, peakFile)); err == nil {
		peak, _ = strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	}
	return oomKills, peak, nil
}

// keyedValue returns the value of key in data, lines of "key value".
func keyedValue(data []byte, key string) (uint64, error) {
	for line := range strings.Lines(string(data)) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), " ")
		if ok && k == key {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: %w", key, err)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("no %s line", key)
}

// memoryUsage reads the memory the cgroup's processes use now (v2
// memory.current, v1 memory.usage_in_bytes), for sizing the warm pool.
func (c *runCgroup) memoryUsage() (int64, error) {
	if len(c.paths) == 0 {
		return 0, errors.New("read memory usage: the run has no cgroup")
	}
	file := filepath.Join(c.paths["memory"], "memory.usage_in_bytes")
	if dir, ok := c.paths[""]; ok {
		file = filepath.Join(dir, "memory.current")
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return 0, fmt.Errorf("read memory usage: %w", err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("read memory usage from %s: %w", file, err)
	}
	return n, nil
}

// cpuUsed reads the CPU time the cgroup's processes used (v2 cpu.stat
// usage_usec, v1 cpuacct.usage in nanoseconds).
func (c *runCgroup) cpuUsed() (time.Duration, error) {
	if dir, ok := c.paths[""]; ok {
		data, err := os.ReadFile(filepath.Join(dir, "cpu.stat"))
		if err != nil {
			return 0, fmt.Errorf("read CPU usage: %w", err)
		}
		us, err := keyedValue(data, "usage_usec")
		if err != nil {
			return 0, fmt.Errorf("read CPU usage from cpu.stat: %w", err)
		}
		return time.Duration(us) * time.Microsecond, nil
	}
	dir, ok := c.paths["cpuacct"]
	if !ok {
		return 0, errors.New("read CPU usage: the run has no cpuacct cgroup")
	}
	data, err := os.ReadFile(filepath.Join(dir, "cpuacct.usage"))
	if err != nil {
		return 0, fmt.Errorf("read CPU usage: %w", err)
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("read CPU usage from cpuacct.usage: %w", err)
	}
	return time.Duration(ns), nil
}

// CPU weights of a run's cgroup: background for a warm pool refill, which
// takes only CPU that runs leave idle, and the kernel's default for any
// other. v1 cpu.shares range 2..262144 (default 1024), v2 cpu.weight
// 1..10000 (default 100).
const (
	cpuSharesBackground, cpuSharesDefault = "2", "1024"
	cpuWeightBackground, cpuWeightDefault = "1", "100"
)

// setBackground gives the cgroup the lowest CPU weight, or, with false,
// the default one. Without a cgroup it does nothing.
func (c *runCgroup) setBackground(background bool) error {
	var file, value string
	switch {
	case c.paths[""] != "":
		file, value = filepath.Join(c.paths[""], "cpu.weight"), cpuWeightDefault
		if background {
			value = cpuWeightBackground
		}
	case c.paths["cpu"] != "":
		file, value = filepath.Join(c.paths["cpu"], "cpu.shares"), cpuSharesDefault
		if background {
			value = cpuSharesBackground
		}
	default:
		return nil
	}
	if err := os.WriteFile(file, []byte(value), 0); err != nil {
		return fmt.Errorf("set CPU weight: %w", err)
	}
	return nil
}

// killAll kills every process in the cgroup — runsc, the gofer and the
// sandbox, all of this run — until none is left or d has passed. Only the
// run's own processes can be there: the shim put runsc in, and everything
// else descends from it.
//
// Descendants go first, so that their parent (runsc, alive until then)
// reaps them at once: orphans are reaped by the host's init, which may take
// seconds, and until then they keep the cgroup from being removed.
func (c *runCgroup) killAll(d time.Duration) {
	if c.mgr == nil {
		return
	}
	deadline := time.Now().Add(d)
	for _, topsToo := range []bool{false, true} {
		for ; ; time.Sleep(5 * time.Millisecond) {
			pids, err := c.mgr.GetAllPids()
			if err != nil || time.Now().After(deadline) {
				return
			}
			victims := pids
			if !topsToo {
				victims = descendants(pids)
			}
			if len(victims) == 0 {
				break
			}
			for _, pid := range victims {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
}

// descendants returns the pids whose parent is also in pids.
func descendants(pids []int) []int {
	in := make(map[int]bool, len(pids))
	for _, pid := range pids {
		in[pid] = true
	}
	var out []int
	for _, pid := range pids {
		if in[parentPid(pid)] {
			out = append(out, pid)
		}
	}
	return out
}

// parentPid reads a process's parent from /proc, 0 if it is gone.
func parentPid(pid int) int {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The command name may hold spaces and parentheses: fields follow the last ')'.
	fields := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
	if len(fields) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(fields[1])
	return ppid
}

// destroy kills whatever is left in the cgroup and removes it.
func (c *runCgroup) destroy() error {
	if c.mgr == nil {
		return nil
	}
	c.killAll(cgroupKillWait)
	if err := c.mgr.Destroy(); err != nil {
		return fmt.Errorf("remove cgroup: %w", err)
	}
	return nil
}
