package gvisor

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/opencontainers/cgroups"
)

// TestRunscCommandStartsInsideTheCgroup starts a stand-in for runsc (sleep)
// the way each kind of host starts runsc: through the shim joining cgroup v1
// hierarchies by their tasks files, cloned into a cgroup v2, and through the
// shim joining a cgroup v2 by cgroup.procs (for kernels that cannot clone
// into one). In each, the process that runs the command is in the run's
// cgroup in every hierarchy. It needs root; a hierarchy the host lacks is
// skipped.
func TestRunscCommandStartsInsideTheCgroup(t *testing.T) {
	if !HostRoot() {
		t.Skip("creating cgroups needs root")
	}
	sleep, err := filepath.EvalSymlinks("/bin/sleep")
	if err != nil {
		t.Skipf("no sleep to stand in for runsc: %v", err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		mode  string
		clone bool
	}{
		{"v1 through the shim, by tasks", "v1", false},
		{"v2 cloned into the cgroup", "v2", true},
		{"v2 through the shim, by cgroup.procs", "v2", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parents := testCgroupParents(t, tc.mode)
			id := "safe-run-test-" + strconv.Itoa(os.Getpid()) + "-" + strconv.Itoa(int(time.Now().UnixNano()%1e6))
			cg := &runCgroup{paths: map[string]string{}}
			for c, parent := range parents {
				dir := filepath.Join(parent, id)
				if err := os.Mkdir(dir, 0o755); err != nil {
					t.Skipf("cannot create a cgroup here: %v", err)
				}
				t.Cleanup(func() { removeTestCgroup(t, dir) })
				cg.paths[c] = dir
			}
			g := &Backend{cfg: Config{Runsc: sleep, Shim: self}, cgroups: CgroupLayout{Mode: tc.mode, Parents: parents}}
			p := &sandboxProc{g: g, cg: cg}
			cmd, dir, err := p.runscCommand([]string{"30"}, tc.clone)
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatalf("start: %v", err)
			}
			if dir != nil {
				dir.Close()
			}
			defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
			pid := cmd.Process.Pid
			// Through the shim, the pid runs the shim until it executes sleep.
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
				if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); exe == sleep {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("process %d did not execute %s", pid, sleep)
				}
			}
			for c, dir := range cg.paths {
				data, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Contains(strings.Fields(string(data)), strconv.Itoa(pid)) {
					t.Errorf("%s: process %d is not in %s (cgroup.procs: %q)", c, pid, dir, data)
				}
			}
		})
	}
}

// testCgroupParents returns this process's own cgroups in the hierarchies
// of mode: each needed v1 controller's, or the cgroup v2 one (on a hybrid
// host, in its controller-less cgroup2). It skips the test if there are
// none.
func testCgroupParents(t testing.TB, mode string) map[string]string {
	t.Helper()
	switch mode {
	case "v1":
		if cgroups.IsCgroup2UnifiedMode() {
			t.Skip("no cgroup v1 hierarchy on this host")
		}
		l, err := DetectCgroups()
		if err != nil {
			t.Skipf("cgroup v1: %v", err)
		}
		return l.Parents
	default:
		mount := "/sys/fs/cgroup"
		if !cgroups.IsCgroup2UnifiedMode() {
			mount = "/sys/fs/cgroup/unified"
			var st syscall.Statfs_t
			if err := syscall.Statfs(mount, &st); err != nil || st.Type != 0x63677270 { // CGROUP2_SUPER_MAGIC
				t.Skip("no cgroup v2 hierarchy on this host")
			}
		}
		own, err := ownCgroupV2At("/proc/self/cgroup", mount)
		if err != nil {
			t.Skip(err)
		}
		return map[string]string{"": own}
	}
}

// removeTestCgroup removes a cgroup whose process was killed: its removal
// waits until the process is reaped.
func removeTestCgroup(t *testing.T, dir string) {
	var err error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if err = os.Remove(dir); err == nil || errors.Is(err, fs.ErrNotExist) {
			return
		}
	}
	t.Errorf("remove test cgroup: %v", err)
}

func TestCloneIntoCgroupRefused(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&os.PathError{Op: "fork/exec", Path: "/usr/bin/runsc", Err: syscall.ENOSYS}, true},
		{&os.PathError{Op: "fork/exec", Path: "/usr/bin/runsc", Err: syscall.EINVAL}, true},
		{&os.PathError{Op: "fork/exec", Path: "/usr/bin/runsc", Err: syscall.E2BIG}, true},
		{&os.PathError{Op: "fork/exec", Path: "/usr/bin/runsc", Err: syscall.ENOENT}, false},
		{&os.PathError{Op: "fork/exec", Path: "/usr/bin/runsc", Err: syscall.EACCES}, false},
		{errors.New("other"), false},
	} {
		if got := cloneIntoCgroupRefused(tc.err); got != tc.want {
			t.Errorf("cloneIntoCgroupRefused(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func TestShimFor(t *testing.T) {
	for _, tc := range []struct {
		name string
		shim fs.FileMode // the mode of safe-run-shim beside the executable; 0: none
		want string      // "shim" or "self"
	}{
		{"installed beside", 0o755, "shim"},
		{"missing", 0, "self"},
		{"not executable", 0o644, "self"},
		{"a directory", fs.ModeDir | 0o755, "self"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bin := t.TempDir()
			exe := filepath.Join(bin, "safe-run")
			if err := os.WriteFile(exe, nil, 0o755); err != nil {
				t.Fatal(err)
			}
			shim := filepath.Join(bin, ShimName)
			var err error
			switch {
			case tc.shim.IsDir():
				err = os.Mkdir(shim, 0o755)
			case tc.shim != 0:
				err = os.WriteFile(shim, nil, tc.shim)
			}
			if err != nil {
				t.Fatal(err)
			}
			// Found through a link, as from a PATH directory.
			link := filepath.Join(t.TempDir(), "safe-run")
			if err := os.Symlink(exe, link); err != nil {
				t.Fatal(err)
			}
			want := map[string]string{"shim": shim, "self": exe}[tc.want]
			if got := shimFor(link); got != want {
				t.Errorf("shimFor(%s) = %s, want %s", link, got, want)
			}
		})
	}
}

// BenchmarkRunscCommand times starting a stand-in for runsc (true) inside a
// new cgroup until it exits, each way runscCommand can (with safe-run-shim,
// built here), and the way the shim joined cgroup v1 before it used tasks
// files (cgroup.procs, whose first
// write waits for an RCU grace period). Runs are spaced out as cold runs
// are, so that each pays that wait afresh. It needs root.
func BenchmarkRunscCommand(b *testing.B) {
	if !HostRoot() {
		b.Skip("creating cgroups needs root")
	}
	// The shim as it is installed: a program of its own.
	shim := filepath.Join(b.TempDir(), ShimName)
	if out, err := exec.Command("go", "build", "-o", shim, "../../cmd/safe-run-shim").CombinedOutput(); err != nil {
		b.Skipf("build %s: %v: %s", ShimName, err, out)
	}
	for _, bc := range []struct {
		name  string
		mode  string
		clone bool
		procs bool // join v1 by cgroup.procs, as before
	}{
		{"v1 shim by tasks", "v1", false, false},
		{"v1 shim by cgroup.procs", "v1", false, true},
		{"v2 clone into cgroup", "v2", true, false},
		{"v2 shim by cgroup.procs", "v2", false, false},
	} {
		b.Run(bc.name, func(b *testing.B) {
			parents := testCgroupParents(b, bc.mode)
			cg := &runCgroup{paths: map[string]string{}}
			for c, parent := range parents {
				dir := filepath.Join(parent, "safe-run-bench-"+strconv.Itoa(os.Getpid()))
				if err := os.Mkdir(dir, 0o755); err != nil {
					b.Skipf("cannot create a cgroup here: %v", err)
				}
				defer os.Remove(dir)
				cg.paths[c] = dir
			}
			g := &Backend{cfg: Config{Runsc: "/bin/true", Shim: shim}, cgroups: CgroupLayout{Mode: bc.mode, Parents: parents}}
			p := &sandboxProc{g: g, cg: cg}
			for b.Loop() {
				b.StopTimer()
				time.Sleep(50 * time.Millisecond)
				b.StartTimer()
				cmd, dir, err := p.runscCommand(nil, bc.clone)
				if err != nil {
					b.Fatal(err)
				}
				if bc.procs {
					for i, a := range cmd.Args {
						cmd.Args[i] = strings.Replace(a, "/tasks", "/cgroup.procs", 1)
					}
				}
				err = cmd.Run()
				if dir != nil {
					dir.Close()
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
