package main

// End-to-end tests of doctor on hosts that get in the way, made live where
// this host can become one: a seccomp filter like a container's, a user
// namespace limit, cgroup v1. The kernel settings this shared host must
// not change are covered as data in runtime's TestUserNamespaceFix.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"syscall"
	"testing"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/opencontainers/cgroups"
	"golang.org/x/sys/unix"

	"github.com/safe-run/safe-run/rootfs"
)

// seccompHelperEnv names a filter of seccompFilters: this test binary,
// started with it, installs the filter and executes its arguments, which
// then run under it as a container's processes run under its profile.
const seccompHelperEnv = "SAFE_RUN_TEST_SECCOMP"

var seccompFilters = map[string]seccomp.Filter{
	// What Docker's default profile does to a process without
	// CAP_SYS_ADMIN: unshare and clone with CLONE_NEWUSER get EPERM, clone3
	// ENOSYS (its flags are out of the filter's reach, so libc falls back
	// to clone).
	"no-user-namespaces": {NoNewPrivs: true, Policy: seccomp.Policy{
		DefaultAction: seccomp.ActionAllow,
		Syscalls: []seccomp.SyscallGroup{
			{Action: seccomp.ActionErrno, Names: []string{"unshare"}, NamesWithCondtions: []seccomp.NameWithConditions{
				{Name: "clone", Conditions: seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.BitsSet, Value: unix.CLONE_NEWUSER}}},
			}},
			{Action: seccomp.Action(unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)), Names: []string{"clone3"}},
		},
	}},
	// A namespace is created, but its root may not mount: how Ubuntu's
	// AppArmor restriction leaves it.
	"no-mount": {NoNewPrivs: true, Policy: seccomp.Policy{
		DefaultAction: seccomp.ActionAllow,
		Syscalls:      []seccomp.SyscallGroup{{Action: seccomp.ActionErrno, Names: []string{"mount"}}},
	}},
}

func init() {
	name := os.Getenv(seccompHelperEnv)
	if name == "" {
		return
	}
	// The filter and no_new_privs are the calling thread's; exec keeps them.
	goruntime.LockOSThread()
	filter, ok := seccompFilters[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "%s: no filter %q\n", seccompHelperEnv, name)
		os.Exit(2)
	}
	if err := seccomp.LoadFilter(filter); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", seccompHelperEnv, err)
		os.Exit(2)
	}
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, seccompHelperEnv+"=") })
	path, err := exec.LookPath(os.Args[1])
	if err == nil {
		err = syscall.Exec(path, os.Args[1:], env)
	}
	fmt.Fprintf(os.Stderr, "%s: exec %s: %v\n", seccompHelperEnv, os.Args[1], err)
	os.Exit(2)
}

// doctorReport is doctor --json's output.
type doctorReport struct {
	OK     bool    `json:"ok"`
	Checks []check `json:"checks"`
}

func (r doctorReport) check(name string) check {
	for _, c := range r.Checks {
		if c.Name == name {
			return c
		}
	}
	return check{Name: name, Detail: "missing from the report"}
}

// ordinaryUser is safe-run installed where uid 65534 can run it, and a
// home for that user. Run from root, commands switch to uid 65534; run by
// an ordinary user (as CI reruns the suite), they stay that user.
type ordinaryUser struct {
	bin, home string
}

func newOrdinaryUser(t *testing.T) ordinaryUser {
	t.Helper()
	bin := binary(t)
	if os.Geteuid() != 0 {
		return ordinaryUser{bin: bin, home: t.TempDir()}
	}
	// t.TempDir's parent is private to root: the user needs a path it can reach.
	home, err := os.MkdirTemp("", "safe-run-user-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(home) })
	// The user's own, as a home is: a directory others may write to could
	// not hold a state directory (see runtime's checkStateParents).
	if err := os.Chown(home, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(home, 0o755); err != nil {
		t.Fatal(err)
	}
	// So is the checkout, possibly: the user gets the binaries side by
	// side, as `make install` would put them.
	installed := filepath.Join(home, "bin")
	if err := os.MkdirAll(installed, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, src := range map[string]string{"safe-run": bin, "runsc": os.Getenv("SAFE_RUN_RUNSC"), "safe-run-agent": os.Getenv("SAFE_RUN_AGENT")} {
		if src == "" {
			src = filepath.Join(filepath.Dir(bin), name)
		}
		dst := filepath.Join(installed, name)
		if os.Link(src, dst) == nil {
			continue // no copy of runsc's 100 MB on the same file system
		}
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return ordinaryUser{bin: filepath.Join(installed, "safe-run"), home: home}
}

// become is the command that makes what follows it run as the user: from
// root, setpriv to uid 65534; for the user, nothing.
func (u ordinaryUser) become() []string {
	if os.Geteuid() != 0 {
		return nil
	}
	return []string{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"}
}

// command runs safe-run with args below wrap, a command and its arguments
// that end by executing the rest as the user, with an environment of the
// user's own.
func (u ordinaryUser) command(wrap []string, args ...string) *exec.Cmd {
	argv := slices.Concat(wrap, []string{u.bin}, args)
	cmd := exec.Command(argv[0], argv[1:]...)
	// No TMPDIR: doctor must not need one.
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + u.home, "SAFE_RUN_CACHE=" + rootfs.DefaultDir(),
		"SAFE_RUN_STATE_DIR=" + filepath.Join(u.home, "state")}
	return cmd
}

// doctor runs safe-run doctor --json as the user below wrap, with env
// added to its environment.
func (u ordinaryUser) doctor(t *testing.T, wrap []string, env ...string) doctorReport {
	t.Helper()
	cmd := u.command(wrap, "doctor", "--json")
	cmd.Env = append(cmd.Env, env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var report doctorReport
	if jerr := json.Unmarshal(out, &report); jerr != nil || len(report.Checks) == 0 {
		t.Fatalf("%s: %v, %v\n%s%s", cmd, err, jerr, out, stderr.String())
	}
	if exit := cmd.ProcessState.ExitCode(); (exit == 0) != report.OK {
		t.Errorf("exit %d with ok %v", exit, report.OK)
	}
	return report
}

// TestDoctorAsOrdinaryUser runs doctor as uid 65534 on this host: the user
// namespace works, and the cgroups check warns with the fix that fits
// the host's cgroups.
func TestDoctorAsOrdinaryUser(t *testing.T) {
	u := newOrdinaryUser(t)
	report := u.doctor(t, u.become())
	if c := report.check("user"); !c.OK || !strings.Contains(c.Detail, "uid 65534") && os.Geteuid() == 0 {
		t.Errorf("user check = %+v, want a pass as uid 65534", c)
	}
	cg := report.check("cgroups")
	switch {
	case !cg.OK:
		t.Errorf("cgroups check = %+v: without a delegated cgroup safe-run still runs, so it only warns", cg)
	case !cgroups.IsCgroup2UnifiedMode():
		// Hybrid (as here) or legacy: nothing can be delegated before a
		// reboot into cgroup v2.
		if !strings.Contains(cg.Detail, "cgroup v1") || !strings.Contains(cg.Fix, "systemd.unified_cgroup_hierarchy=1") ||
			!strings.Contains(cg.Detail, "CPU use is not capped") {
			t.Errorf("cgroups check = %+v, want a warning that names cgroup v1, what holds without it, and the switch to v2", cg)
		}
	case cg.Fix != "" && !strings.Contains(cg.Fix, "systemd-run --user --scope -p Delegate=yes"):
		t.Errorf("cgroups check = %+v, want delegation as the fix", cg)
	}
	if c := report.check("sandbox"); !report.OK || !c.OK {
		t.Errorf("sandbox check = %+v, ok %v; want sandboxes started as the user", c, report.OK)
	}
}

// TestDoctorExplainsBlockedUserNamespaces runs doctor as an ordinary user
// who may not create user namespaces, or whose namespace's root is
// powerless, and checks that the user check fails with the cause and fix.
func TestDoctorExplainsBlockedUserNamespaces(t *testing.T) {
	u := newOrdinaryUser(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		wrap   []string
		env    []string
		detail string   // in the user check's detail
		fix    []string // each in its fix
	}{
		{
			// The limit of the namespace the user is in is used up by the
			// one the user is in.
			name:   "max_user_namespaces used up",
			wrap:   []string{"unshare", "--user", "--map-root-user", "sh", "-c", `echo 1 > /proc/sys/user/max_user_namespaces && exec unshare --user --map-user=65534 --map-group=65534 "$@"`, "sh"},
			detail: "no space left on device",
			fix:    []string{"at its limit", "sysctl -w user.max_user_namespaces=15000"},
		},
		{
			// Set in a namespace of the test's own: the shared host's
			// setting stays. The capabilities that set it are dropped
			// before doctor starts.
			name:   "max_user_namespaces=0",
			wrap:   []string{"unshare", "--user", "--map-user=65534", "--map-group=65534", "--keep-caps", "sh", "-c", `echo 0 > /proc/sys/user/max_user_namespaces && exec setpriv --inh-caps=-all --ambient-caps=-all "$@"`, "sh"},
			detail: "no space left on device",
			fix:    []string{"user namespaces are disabled (user.max_user_namespaces=0)", "sysctl -w user.max_user_namespaces=15000", "/etc/sysctl.d/"},
		},
		{
			name:   "a container's seccomp profile",
			wrap:   append([]string{self}, u.become()...),
			env:    []string{seccompHelperEnv + "=no-user-namespaces"},
			detail: "cannot create a user namespace: fork/exec /bin/true: operation not permitted",
			fix:    []string{"a seccomp filter on safe-run (Seccomp: 2 in /proc/self/status) refused it with EPERM", "--security-opt seccomp=unconfined", "CLONE_NEWUSER"},
		},
		{
			name:   "a namespace whose root may not mount",
			wrap:   append([]string{self}, u.become()...),
			env:    []string{seccompHelperEnv + "=no-mount"},
			detail: "a user namespace was created, but its root is powerless: make its mounts private: operation not permitted",
			fix:    []string{"a seccomp filter on safe-run (Seccomp: 2 in /proc/self/status) refused it with EPERM", "mount"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			report := u.doctor(t, tc.wrap, tc.env...)
			user := report.check("user")
			if report.OK || user.OK || !strings.Contains(user.Detail, tc.detail) {
				t.Errorf("ok %v, user check = %+v; want a failure with %q in its detail", report.OK, user, tc.detail)
			}
			for _, want := range tc.fix {
				if !strings.Contains(user.Fix, want) {
					t.Errorf("user check's fix %q does not contain %q", user.Fix, want)
				}
			}
			if c := report.check("sandbox"); c.OK || !strings.Contains(c.Detail, "not tried") {
				t.Errorf("sandbox check = %+v, want it not tried", c)
			}
		})
	}
}
