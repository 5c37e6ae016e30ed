package gvisor

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/safe-run/safe-run/runtime/gvisor/shim"
)

// ShimCommand is the first argument that makes a safe-run executable act as
// the cgroup shim (see ShimMain).
const ShimCommand = shim.Command

// ShimName is the cgroup shim's own program (cmd/safe-run-shim), which New
// uses when it is installed next to the running executable.
const ShimName = "safe-run-shim"

// ShimMain runs the cgroup shim (package shim) and does not return if
// os.Args asks for it; otherwise it returns at once. Binaries that create
// Runtimes call it first thing in main (tests: in TestMain), so that they
// can be their own shim where safe-run-shim is not installed.
//
//	safe-run __sandbox-exec /sys/fs/cgroup/.../tasks ... -- runsc args...
func ShimMain() { shim.Main() }

// defaultShim is the shim New uses unless configured: safe-run-shim next to
// this executable, which starts in a millisecond, else this executable,
// which runs ShimMain after its whole package initialisation (about 10 ms).
func defaultShim() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find own executable for the cgroup shim: %w", err)
	}
	return shimFor(exe), nil
}

// shimFor is the shim of the executable exe: ShimName in its directory (that
// of the file a symbolic link exe names) if there is an executable file of
// that name, else exe itself.
func shimFor(exe string) string {
	if resolved, err := filepath.EvalSymlinks(exe); err == nil {
		exe = resolved
	}
	own := filepath.Join(filepath.Dir(exe), ShimName)
	if fi, err := os.Stat(own); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
		return own
	}
	return exe
}

// joinFiles are the files the shim writes "0" to in order to join the
// run's cgroup in every hierarchy: on cgroup v1 each hierarchy's tasks file,
// which moves only the shim's thread and so skips the kernel's global
// thread-group lock (see package shim); on v2, which has no tasks file for
// a domain cgroup, cgroup.procs.
func joinFiles(mode string, c *runCgroup) []string {
	name := "tasks"
	if mode == "v2" {
		name = "cgroup.procs"
	}
	var out []string
	for _, dir := range c.paths {
		if p := filepath.Join(dir, name); !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// runscCommand is the command that starts runsc with args inside the run's
// cgroup, and a file the caller closes once the command has started (or
// nil):
//   - without a cgroup, runsc itself;
//   - on cgroup v2, runsc itself, cloned straight into the cgroup
//     (CLONE_INTO_CGROUP, with the cgroup's directory returned to close);
//   - otherwise, and on a kernel that refuses that clone, the shim, which
//     joins the cgroup and then executes runsc.
//
// Every process runsc and gVisor start is therefore born inside the run's
// cgroup, and runsc never runs outside it with more than the shim's thread.
func (p *sandboxProc) runscCommand(args []string, cloneIntoCgroup bool) (*exec.Cmd, *os.File, error) {
	mode := p.g.cgroups.Mode
	attr := &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	switch {
	case mode == CgroupsNone:
		cmd := exec.Command(p.g.cfg.Runsc, args...)
		cmd.SysProcAttr = attr
		return cmd, nil, nil
	case mode == "v2" && cloneIntoCgroup:
		dir, err := os.OpenFile(p.cg.paths[""], os.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			return nil, nil, fmt.Errorf("open cgroup: %w", err)
		}
		attr.UseCgroupFD, attr.CgroupFD = true, int(dir.Fd())
		cmd := exec.Command(p.g.cfg.Runsc, args...)
		cmd.SysProcAttr = attr
		return cmd, dir, nil
	}
	shimArgs := append([]string{ShimCommand}, joinFiles(mode, p.cg)...)
	shimArgs = append(append(shimArgs, "--", p.g.cfg.Runsc), args...)
	cmd := exec.Command(p.g.cfg.Shim, shimArgs...)
	cmd.SysProcAttr = attr
	return cmd, nil, nil
}

// cloneIntoCgroupRefused reports whether err, from starting a command with
// CLONE_INTO_CGROUP, says that the kernel lacks it (clone3 is Linux 5.3,
// CLONE_INTO_CGROUP 5.7) rather than that the command could not start.
func cloneIntoCgroupRefused(err error) bool {
	return errors.Is(err, syscall.ENOSYS) || errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.E2BIG)
}
