package gvisor

// Running without root. gVisor needs privileges a desktop user does not
// have (mount and network namespaces, chroot, pivot_root), and runsc's own
// --rootless mode re-creates them for each runsc command separately, which
// is why it cannot create, start or restore a sandbox. Instead, a safe-run
// process started by an ordinary user runs itself again once, as root of a
// user namespace (with a mount namespace of its own) that maps only that
// user: every runsc command of its lifetime then runs in the same
// namespaces, with runsc's full lifecycle, and the rest of the runtime works
// exactly as it does for root. No helper, setuid binary or /etc/subuid range
// is needed, because a namespace may map its creator's own uid and gid.
//
// Such a "root" holds capabilities only over its own namespaces: on the
// host it is still the user, and files the user cannot open stay closed.

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/fs2"
	"golang.org/x/sys/unix"
)

// UserNamespaceMain makes a process started by an ordinary user continue as
// root of a user namespace of its own: it runs this executable again with
// the same arguments in a new user and mount namespace, passes on the
// signals it gets, and exits with the new process's exit status. env is
// added to the new process's environment. For root, and inside the
// namespace, it returns at once. Binaries that create Runtimes call it
// before they do (after ShimMain).
func UserNamespaceMain(env ...string) {
	if os.Geteuid() == 0 {
		if inOwnUserNamespace() {
			// Mounts runsc makes (the null network namespace) stay in this
			// process's mount namespace, as `unshare --mount` would have it.
			_ = unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, "")
		}
		return
	}
	exe, err := os.Executable()
	if err != nil {
		userNamespaceFail(fmt.Errorf("find own executable: %w", err))
	}
	cmd := exec.Command(exe, os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(append(os.Environ(), env...), stateParentCheckEnv())
	cmd.SysProcAttr = userNamespaceAttr()
	sigs := make(chan os.Signal, 4)
	// Ctrl-C reaches both processes through the terminal; one started by an
	// MCP client gets SIGTERM only here. The child treats a repeat like the
	// first.
	signal.Notify(sigs, unix.SIGINT, unix.SIGTERM, unix.SIGHUP)
	if err := cmd.Start(); err != nil {
		userNamespaceFail(fmt.Errorf("create a user namespace: %w; %s", err, UserNamespaceFix(err)))
	}
	go func() {
		for s := range sigs {
			_ = cmd.Process.Signal(s)
		}
	}()
	err = cmd.Wait()
	var exit *exec.ExitError
	switch {
	case err == nil:
		os.Exit(0)
	case errors.As(err, &exit):
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			os.Exit(128 + int(ws.Signal()))
		}
		os.Exit(exit.ExitCode())
	}
	userNamespaceFail(err)
}

// userNamespaceAttr maps the caller's uid and gid to root in a new user
// namespace with a mount namespace of its own. If this process dies, the
// new one gets SIGTERM, so it can still destroy its sandboxes.
func userNamespaceAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER | unix.CLONE_NEWNS,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
		// Writing a gid map without privileges requires setgroups to be
		// denied.
		GidMappingsEnableSetgroups: false,
		Credential:                 &syscall.Credential{Uid: 0, Gid: 0},
		Pdeathsig:                  unix.SIGTERM,
	}
}

func userNamespaceFail(err error) {
	fmt.Fprintln(os.Stderr, "safe-run:", err)
	os.Exit(125)
}

// HostRoot reports whether this process is root on the host, rather than
// an ordinary user or root of a user namespace.
func HostRoot() bool {
	return os.Geteuid() == 0 && !inOwnUserNamespace()
}

// inOwnUserNamespace reports whether this process's user namespace maps
// less than the whole uid range: a namespace below the host's.
func inOwnUserNamespace() bool {
	data, err := os.ReadFile("/proc/self/uid_map")
	if err != nil {
		return false
	}
	whole, _ := parseUIDMap(string(data))
	return !whole
}

// parseUIDMap reads a uid_map: whether it is the host's identity map of
// every uid, and the host uid that uid 0 maps to (-1 if none).
func parseUIDMap(data string) (whole bool, rootHostUID int) {
	rootHostUID = -1
	for _, line := range strings.Split(strings.TrimSpace(data), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		if f[0] == "0" && f[1] == "0" && f[2] == "4294967295" {
			whole = true
		}
		if f[0] == "0" {
			rootHostUID, _ = strconv.Atoi(f[1])
		}
	}
	return whole, rootHostUID
}

// UserNamespaceCheck creates a user namespace the way UserNamespaceMain
// does, with a throw-away process, and says why it cannot when it cannot.
func UserNamespaceCheck() error {
	if HostRoot() {
		return nil
	}
	cmd := exec.Command("/bin/true")
	cmd.SysProcAttr = userNamespaceAttr()
	cmd.SysProcAttr.Pdeathsig = unix.SIGKILL
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("cannot create a user namespace: %w", err)
	}
	return nil
}

// UserNamespaceCapable checks, inside a user namespace, that its root has
// the capabilities a sandbox needs there, by mounting a tmpfs in a mount
// namespace of its own, as runsc does: a security module (AppArmor on
// Ubuntu) or a seccomp filter may let the namespace be created but refuse
// what its root does in it. It needs no writable directory.
func UserNamespaceCapable() error {
	errc := make(chan error, 1)
	go func() {
		// The thread takes its mount namespace with it: it stays locked, so
		// Go ends it when this goroutine returns, and no other goroutine
		// ever sees the tmpfs.
		goruntime.LockOSThread()
		errc <- mountInOwnNamespace()
	}()
	return <-errc
}

func mountInOwnNamespace() error {
	if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_FS); err != nil {
		return fmt.Errorf("create a mount namespace: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make its mounts private: %w", err)
	}
	if err := unix.Mount("tmpfs", "/", "tmpfs", 0, "size=4k"); err != nil {
		return fmt.Errorf("mount a tmpfs in its own mount namespace: %w", err)
	}
	return nil
}

// UserNamespaceFix says what keeps ordinary users from creating user
// namespaces on this host, or their root from using one, and the exact
// fix, as far as it can tell from the host and from err, the error creating
// or using one.
func UserNamespaceFix(err error) string {
	return userNamespaceFix(hostSigns{root: "/", getenv: os.Getenv}, err)
}

// hostSigns is what userNamespaceFix reads to find the cause: files below
// root ("/", or in tests a directory laid out like it) and the environment.
type hostSigns struct {
	root   string
	getenv func(string) string
}

func (h hostSigns) read(path string) string {
	data, _ := os.ReadFile(filepath.Join(h.root, path))
	return string(bytes.TrimSpace(data))
}

// seccompFiltered reports whether this process runs under a seccomp
// filter ("Seccomp: 2" in its status): the filter, not the kernel's
// settings, may be what refuses namespaces.
func (h hostSigns) seccompFiltered() bool {
	for _, line := range strings.Split(h.read("proc/self/status"), "\n") {
		if name, value, ok := strings.Cut(line, ":"); ok && name == "Seccomp" {
			return strings.TrimSpace(value) == "2"
		}
	}
	return false
}

// containerSign names a sign that this process runs in a container, or
// is "". None is proof: a virtual machine made from a container image may
// keep /.dockerenv, so a sign only chooses the wording of a fix.
func (h hostSigns) containerSign() string {
	for _, f := range []string{".dockerenv", "run/.containerenv", "run/systemd/container"} {
		if _, err := os.Stat(filepath.Join(h.root, f)); err == nil {
			return "/" + f
		}
	}
	if v := h.getenv("container"); v != "" {
		return "container=" + v
	}
	for _, word := range []string{"docker", "kubepods", "lxc"} {
		if strings.Contains(h.read("proc/1/cgroup"), word) {
			return word + " in /proc/1/cgroup"
		}
	}
	return ""
}

// userNamespaceFix is UserNamespaceFix on the host h. The kernel's settings
// come first, because they say for sure; a seccomp filter or a container
// is named only when the kernel refused with the errno one gives.
func userNamespaceFix(h hostSigns, err error) string {
	var errno unix.Errno
	refused := errors.As(err, &errno) && (errno == unix.EPERM || errno == unix.EACCES || errno == unix.ENOSYS)
	sign := h.containerSign()
	switch {
	case h.read("proc/sys/kernel/unprivileged_userns_clone") == "0":
		return "unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone=0); enable them as root: " +
			"sysctl -w kernel.unprivileged_userns_clone=1, and keep it: echo kernel.unprivileged_userns_clone=1 > /etc/sysctl.d/60-safe-run.conf"
	case h.read("proc/sys/user/max_user_namespaces") == "0":
		return "user namespaces are disabled (user.max_user_namespaces=0); enable them as root: " +
			"sysctl -w user.max_user_namespaces=15000, and keep it: echo user.max_user_namespaces=15000 > /etc/sysctl.d/60-safe-run.conf"
	case errors.Is(err, unix.ENOSPC):
		return "the number of user namespaces is at its limit (user.max_user_namespaces, here or in an enclosing container); " +
			"raise it as root where it is set: sysctl -w user.max_user_namespaces=15000"
	case h.read("proc/sys/kernel/apparmor_restrict_unprivileged_userns") == "1":
		exe, _ := os.Executable()
		if resolved, err := filepath.EvalSymlinks(exe); err == nil {
			exe = resolved
		}
		return "AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns=1, Ubuntu 23.10 and later): " +
			"it lets one be created but takes its root's capabilities; allow them for this safe-run binary alone, once, as root: " +
			"printf 'abi <abi/4.0>,\\ninclude <tunables/global>\\nprofile safe-run " + exe + " flags=(unconfined) {\\n  userns,\\n}\\n' > /etc/apparmor.d/safe-run && apparmor_parser -r /etc/apparmor.d/safe-run"
	case refused && h.seccompFiltered():
		cause := "a seccomp filter on safe-run (Seccomp: 2 in /proc/self/status) refused it with " + unix.ErrnoName(errno) + ": "
		allow := "a profile that allows unshare, clone and clone3 with CLONE_NEWUSER, and mount"
		if h.getenv("INVOCATION_ID") != "" {
			// systemd sets INVOCATION_ID in every service it starts: its
			// unit's filter comes before any container sign.
			return cause + "safe-run runs as a systemd service, whose unit sets RestrictNamespaces= or a SystemCallFilter= that denies them; " +
				"set RestrictNamespaces=no and drop that SystemCallFilter= in the unit (deploy/systemd/safe-run.service has the settings that work)"
		}
		if sign != "" {
			return cause + "safe-run appears to run in a container (" + sign + "), whose seccomp profile does this; run safe-run on the host, or start the container with " + allow +
				" (docker run or podman run --security-opt seccomp=unconfined, and --security-opt apparmor=unconfined where AppArmor confines containers)"
		}
		return cause + "a container's seccomp profile, or the filter of the service that started safe-run (systemd's RestrictNamespaces= or SystemCallFilter=); " +
			"run safe-run outside it, or give the container " + allow + " (docker run or podman run --security-opt seccomp=unconfined), " +
			"or set RestrictNamespaces=no and drop the SystemCallFilter= that denies them in the service's unit"
	case refused && sign != "":
		return "safe-run appears to run in a container (" + sign + ") that refuses it (" + unix.ErrnoName(errno) + ") without a seccomp filter: by its security module (AppArmor, SELinux) or its own user namespace settings; " +
			"run safe-run on the host, or start the container with --security-opt apparmor=unconfined (or label=disable for SELinux)"
	}
	return "check that the kernel has CONFIG_USER_NS and that no security module forbids unprivileged user namespaces, or run safe-run as root"
}

// HostUID returns the uid this process has on the host: its own outside a
// user namespace, the one its namespace maps root to inside.
func HostUID() int {
	if !inOwnUserNamespace() {
		return os.Geteuid()
	}
	data, _ := os.ReadFile("/proc/self/uid_map")
	_, uid := parseUIDMap(string(data))
	return uid
}

// CgroupsNone is the CgroupLayout mode of a safe-run without root and
// without a delegated cgroup: runs get no cgroup, and their limits are
// enforced without one (see watchMemory).
const CgroupsNone = "none"

// supervisorCgroup is the leaf a safe-run without root moves itself into,
// so that the cgroup it was delegated holds no process and may hand the
// memory, pids and cpu controllers down to its runs' cgroups.
const supervisorCgroup = "supervisor"

// DetectUserCgroups says which cgroups a safe-run without root can use: a
// delegated cgroup v2 subtree (Mode "v2", Parents[""] the delegated
// cgroup), or none (Mode CgroupsNone, with the error saying why and how to
// get one). It changes nothing.
func DetectUserCgroups() (CgroupLayout, error) {
	return detectUserCgroups(cgroupSigns{
		unified:  cgroups.IsCgroup2UnifiedMode(),
		mount:    fs2.UnifiedMountpoint,
		self:     "/proc/self/cgroup",
		ours:     []int{os.Getpid(), os.Getppid()},
		writable: func(path string) error { return unix.Access(path, unix.W_OK) },
	})
}

// cgroupSigns is what detectUserCgroups looks at: the host's cgroups, or
// in tests a directory laid out like them.
type cgroupSigns struct {
	unified  bool                    // cgroup v2 alone, no v1 controllers
	mount    string                  // where cgroup v2 is mounted
	self     string                  // this process's /proc/self/cgroup
	ours     []int                   // this process and the one that started it
	writable func(path string) error // whether this user may write path
}

// detectUserCgroups is DetectUserCgroups on the host c. Each error is the
// cause, "; ", then the fix.
func detectUserCgroups(c cgroupSigns) (CgroupLayout, error) {
	none := CgroupLayout{Mode: CgroupsNone}
	if !c.unified {
		return none, errors.New("this host's cgroup controllers are on cgroup v1, legacy or hybrid, which cannot be delegated to a user; " +
			"switch to cgroup v2 alone: add systemd.unified_cgroup_hierarchy=1 to the kernel command line (GRUB_CMDLINE_LINUX in /etc/default/grub, then update-grub) and reboot, " +
			"then start safe-run with systemd-run --user --scope -p Delegate=yes safe-run ...; or run safe-run as root")
	}
	own, err := ownCgroupV2At(c.self, c.mount)
	if err != nil {
		return none, err
	}
	// Already moved into our leaf by this process or the one it re-ran.
	if filepath.Base(own) == supervisorCgroup {
		own = filepath.Dir(own)
	}
	howto := "start safe-run in a cgroup delegated to you: systemd-run --user --scope -p Delegate=yes safe-run ..."
	for _, f := range []string{"cgroup.procs", "cgroup.subtree_control"} {
		if err := c.writable(filepath.Join(own, f)); err != nil {
			return none, fmt.Errorf("safe-run's cgroup %s is not delegated to this user (%s: %v); %s", own, f, err, howto)
		}
	}
	data, _ := os.ReadFile(filepath.Join(own, "cgroup.controllers"))
	var missing []string
	for _, ctl := range []string{"memory", "pids", "cpu"} {
		if !slices.Contains(strings.Fields(string(data)), ctl) {
			missing = append(missing, ctl)
		}
	}
	if len(missing) > 0 {
		// Writable, so delegated: the controllers stopped above it.
		return none, fmt.Errorf("safe-run's cgroup %s lacks controllers: %s; "+
			"delegate them to every user's systemd once, as root: mkdir -p /etc/systemd/system/user@.service.d && "+
			"printf '[Service]\\nDelegate=memory pids cpu\\n' > /etc/systemd/system/user@.service.d/delegate.conf && systemctl daemon-reload, "+
			"log in again, and start safe-run with systemd-run --user --scope -p Delegate=yes safe-run ... "+
			"(without systemd: enable them in cgroup.subtree_control of every cgroup above %s)",
			own, strings.Join(missing, ", "), own)
	}
	if others := strangers(own, c.ours); len(others) > 0 {
		return none, fmt.Errorf("safe-run's cgroup %s also holds other processes (%v), so it cannot hand controllers down; %s", own, others, howto)
	}
	return CgroupLayout{Mode: "v2", Parents: map[string]string{"": own}}, nil
}

// strangers lists the processes in cgroup dir other than ours and the
// supervisor leaf's.
func strangers(dir string, ours []int) []int {
	data, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	var out []int
	for _, f := range strings.Fields(string(data)) {
		pid, _ := strconv.Atoi(f)
		if !slices.Contains(ours, pid) {
			out = append(out, pid)
		}
	}
	return out
}

// cgroupHolds reports whether pid is in cgroup dir itself.
func cgroupHolds(dir string, pid int) bool {
	data, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	return slices.Contains(strings.Fields(string(data)), strconv.Itoa(pid))
}

// userCgroups returns the cgroups a Runtime without host root uses. With a
// delegated cgroup v2 it moves this process, and the one that re-ran it in
// the user namespace, into a leaf below it and enables the controllers
// there; otherwise it returns CgroupsNone and why.
func userCgroups() (CgroupLayout, error) {
	l, reason := DetectUserCgroups()
	if reason != nil {
		return l, reason
	}
	own := l.Parents[""]
	leaf := filepath.Join(own, supervisorCgroup)
	if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return CgroupLayout{Mode: CgroupsNone}, fmt.Errorf("create %s: %w", leaf, err)
	}
	procs := filepath.Join(leaf, "cgroup.procs")
	for _, pid := range []int{os.Getpid(), os.Getppid()} {
		if pid == os.Getppid() && !cgroupHolds(own, pid) {
			continue // the parent is moved only out of the delegated cgroup
		}
		if err := os.WriteFile(procs, []byte(strconv.Itoa(pid)), 0); err != nil {
			return CgroupLayout{Mode: CgroupsNone}, fmt.Errorf("move process %d into %s: %w", pid, leaf, err)
		}
	}
	l, err := detectV2At(own)
	if err != nil {
		return CgroupLayout{Mode: CgroupsNone}, err
	}
	return l, nil
}
