package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// cgroupV2 says whether the host has a pure cgroup v2 hierarchy; otherwise
// it has v1 controllers (hybrid hosts have an empty cgroup2 beside them).
func cgroupV2() bool {
	_, err := os.Stat("/sys/fs/cgroup/cgroup.controllers")
	return err == nil
}

// ownCgroup is the directory of this process's cgroup for a v1 controller
// (memory, cpuacct), or its cgroup v2 on a pure v2 host. safe-run creates
// its runs' cgroups below its own, so a sandbox's cgroup is ownCgroup/ID
// for a safe-run started by the bench.
func ownCgroup(controller string) string {
	data, _ := os.ReadFile("/proc/self/cgroup")
	v2 := cgroupV2()
	for _, line := range strings.Split(string(data), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if v2 && parts[0] == "0" && parts[1] == "" {
			return filepath.Join("/sys/fs/cgroup", parts[2])
		}
		if !v2 && slices.Contains(strings.Split(parts[1], ","), controller) {
			// The hierarchy is mounted under the names of its controllers
			// (cpu,cpuacct), often with a link per controller (cpuacct).
			for _, mount := range []string{parts[1], controller} {
				if dir := filepath.Join("/sys/fs/cgroup", mount); exists(dir) {
					return filepath.Join(dir, parts[2])
				}
			}
		}
	}
	return ""
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// cpuUsage reads the CPU time the cgroup dir and its descendants (the
// removed ones too) used: cpuacct.usage on v1, cpu.stat's usage_usec on v2.
func cpuUsage(dir string) (time.Duration, error) {
	if data, err := os.ReadFile(filepath.Join(dir, "cpuacct.usage")); err == nil {
		ns, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
		return time.Duration(ns), err
	}
	data, err := os.ReadFile(filepath.Join(dir, "cpu.stat"))
	if err != nil {
		return 0, fmt.Errorf("read CPU usage of %s: %w", dir, err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
			us, err := strconv.ParseInt(v, 10, 64)
			return time.Duration(us) * time.Microsecond, err
		}
	}
	return 0, fmt.Errorf("read CPU usage of %s: no usage_usec in cpu.stat", dir)
}

// cpuCgroup is a cgroup the bench creates to count the CPU time of one
// command and everything it starts: the sentry, the gofer, every runsc
// process, and the cgroups safe-run creates below it. A nil *cpuCgroup
// runs commands where the bench runs.
type cpuCgroup struct{ dir string }

// newCPUCgroup creates an empty cgroup below the bench's own that counts
// CPU time: in the cpuacct hierarchy on v1, in the unified one on v2.
func newCPUCgroup() (*cpuCgroup, error) {
	parent := ownCgroup("cpuacct")
	if parent == "" {
		return nil, errors.New("create a cgroup: no cpuacct (v1) or cgroup v2 hierarchy")
	}
	cg := &cpuCgroup{dir: filepath.Join(parent, "safe-run-bench-"+uuid.NewString()[:8])}
	if err := os.Mkdir(cg.dir, 0o755); err != nil {
		return nil, fmt.Errorf("create cgroup: %w", err)
	}
	return cg, nil
}

// safeRunFits says whether safe-run, as root, can run inside a cgroup
// the bench made. On v2 it cannot: it enables controllers for its runs'
// cgroups in its own cgroup, which the kernel refuses while a process
// lives there (the root cgroup excepted).
func safeRunFits() bool { return !cgroupV2() }

// wrap returns the command line that runs name with args inside cg: a
// shell moves itself into the cgroup, then becomes the command, so that
// nothing of it runs outside. The shell's own cost (≈ 2 ms) is counted.
func (cg *cpuCgroup) wrap(name string, args ...string) (string, []string) {
	if cg == nil {
		return name, args
	}
	return "/bin/sh", append([]string{"-c", `echo $$ >"$0" && exec "$@"`, filepath.Join(cg.dir, "cgroup.procs"), name}, args...)
}

// usage is the CPU time the cgroup's processes used so far.
func (cg *cpuCgroup) usage() (time.Duration, error) { return cpuUsage(cg.dir) }

// remove removes the cgroup once its processes and the cgroups safe-run
// made below it are gone (their removal can lag the command's exit).
func (cg *cpuCgroup) remove() error {
	if cg == nil {
		return nil
	}
	var err error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if err = os.Remove(cg.dir); err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
	}
	return fmt.Errorf("remove cgroup %s: %w", cg.dir, err)
}

// measureCPU runs f in a new cgroup and returns the CPU time it used.
func measureCPU(f func(cg *cpuCgroup) error) (time.Duration, error) {
	cg, err := newCPUCgroup()
	if err != nil {
		return 0, err
	}
	defer cg.remove()
	if err := f(cg); err != nil {
		return 0, err
	}
	return cg.usage()
}
