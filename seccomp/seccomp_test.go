package seccomp_test

import (
	"reflect"
	"runtime"
	"slices"
	"testing"

	moby "github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/safe-run/safe-run/seccomp"
)

// profile returns Profile's result or stops the test.
func profile(t *testing.T) *specs.LinuxSeccomp {
	t.Helper()
	p, err := seccomp.Profile()
	if err != nil {
		t.Fatalf("Profile() error: %v", err)
	}
	return p
}

// permits reports whether a rule's action lets the call through.
func permits(action specs.LinuxSeccompAction) bool {
	return action == specs.ActAllow || action == specs.ActLog
}

// allowed returns the rules of p that let the system call name through,
// with or without conditions on its arguments.
func allowed(p *specs.LinuxSeccomp, name string) []specs.LinuxSyscall {
	var rules []specs.LinuxSyscall
	for _, r := range p.Syscalls {
		if permits(r.Action) && slices.Contains(r.Names, name) {
			rules = append(rules, r)
		}
	}
	return rules
}

// rulesFor returns every rule of p that names the system call, whatever
// its action.
func rulesFor(p *specs.LinuxSeccomp, name string) []specs.LinuxSyscall {
	var rules []specs.LinuxSyscall
	for _, r := range p.Syscalls {
		if slices.Contains(r.Names, name) {
			rules = append(rules, r)
		}
	}
	return rules
}

// allowedUnconditionally reports whether some rule allows name whatever
// its arguments.
func allowedUnconditionally(p *specs.LinuxSeccomp, name string) bool {
	return slices.ContainsFunc(allowed(p, name), func(r specs.LinuxSyscall) bool { return len(r.Args) == 0 })
}

func TestProfileDefaultAction(t *testing.T) {
	p := profile(t)
	if p.DefaultAction != specs.ActErrno {
		t.Errorf("DefaultAction = %q, want %q", p.DefaultAction, specs.ActErrno)
	}
}

func TestProfileArchitectures(t *testing.T) {
	native := map[string]specs.Arch{
		"amd64": specs.ArchX86_64,
		"arm64": specs.ArchAARCH64,
	}
	want, ok := native[runtime.GOARCH]
	if !ok {
		if _, err := seccomp.Profile(); err == nil {
			t.Errorf("Profile() on %s: no error, want one (gVisor does not run here)", runtime.GOARCH)
		}
		return
	}
	p := profile(t)
	if !slices.Contains(p.Architectures, want) {
		t.Errorf("Architectures = %v, want it to contain %q on %s", p.Architectures, want, runtime.GOARCH)
	}
	for arch, other := range native {
		if arch != runtime.GOARCH && slices.Contains(p.Architectures, other) {
			t.Errorf("Architectures = %v, contains %q, which is not of %s", p.Architectures, other, runtime.GOARCH)
		}
	}
}

func TestProfileDenied(t *testing.T) {
	p := profile(t)
	if len(seccomp.Denied) == 0 {
		t.Fatal("Denied is empty")
	}
	for _, name := range seccomp.Denied {
		t.Run(name, func(t *testing.T) {
			if rules := allowed(p, name); len(rules) > 0 {
				t.Errorf("%s is denied, but allowed by %+v", name, rules)
			}
		})
	}
}

// TestDeniedList pins the calls the package promises to deny, so that a
// name dropped from Denied is noticed here and not silently allowed.
func TestDeniedList(t *testing.T) {
	p := profile(t)
	for _, name := range []string{
		// debugging and reading other processes
		"ptrace", "process_vm_readv", "process_vm_writev",
		// kernel key rings, eBPF, perf, userfaultfd, io_uring
		"keyctl", "add_key", "request_key",
		"bpf", "perf_event_open", "userfaultfd",
		"io_uring_setup", "io_uring_enter", "io_uring_register",
		// mounting
		"mount", "umount", "umount2", "mount_setattr", "move_mount", "open_tree",
		"fsopen", "fsconfig", "fsmount", "fspick", "pivot_root", "chroot",
		// entering or creating namespaces
		"unshare", "setns",
		// the 32-bit multiplexer that would bypass the socket family rule
		"socketcall",
		// kexec and kernel modules
		"kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
	} {
		t.Run(name, func(t *testing.T) {
			if !slices.Contains(seccomp.Denied, name) {
				t.Errorf("Denied does not list %s", name)
			}
			if rules := allowed(p, name); len(rules) > 0 {
				t.Errorf("%s is allowed by %+v", name, rules)
			}
		})
	}
}

func TestProfileSocket(t *testing.T) {
	p := profile(t)
	rules := allowed(p, "socket")
	if len(rules) == 0 {
		t.Fatal("socket is not allowed at all; programs need AF_UNIX, AF_INET and AF_INET6")
	}
	want := map[uint64]bool{unix.AF_UNIX: true, unix.AF_INET: true, unix.AF_INET6: true}
	got := map[uint64]bool{}
	for _, r := range rules {
		if len(r.Args) != 1 {
			t.Errorf("socket rule %+v has %d argument conditions, want exactly 1 (the domain)", r, len(r.Args))
			continue
		}
		a := r.Args[0]
		if a.Index != 0 || a.Op != specs.OpEqualTo {
			t.Errorf("socket rule condition %+v, want Index 0 with Op %q", a, specs.OpEqualTo)
			continue
		}
		if !want[a.Value] {
			t.Errorf("socket allowed for domain %d, want only %d (AF_UNIX), %d (AF_INET) and %d (AF_INET6)",
				a.Value, unix.AF_UNIX, unix.AF_INET, unix.AF_INET6)
		}
		got[a.Value] = true
	}
	for domain := range want {
		if !got[domain] {
			t.Errorf("socket not allowed for domain %d", domain)
		}
	}
	if allowedUnconditionally(p, "socket") {
		t.Error("socket is allowed unconditionally, want only for AF_UNIX, AF_INET and AF_INET6")
	}
}

func TestProfileSocketDomains(t *testing.T) {
	want := []uint64{1, 2, 10} // AF_UNIX, AF_INET, AF_INET6
	got := slices.Sorted(slices.Values(seccomp.SocketDomains))
	if !slices.Equal(got, want) {
		t.Errorf("SocketDomains = %v, want %v", seccomp.SocketDomains, want)
	}
}

func TestProfileClone3(t *testing.T) {
	p := profile(t)
	if !allowedUnconditionally(p, "clone3") {
		t.Errorf("clone3 is not allowed unconditionally; rules: %+v", rulesFor(p, "clone3"))
	}
	// gVisor ignores errnoRet, so Docker's "clone3 → ENOSYS" would answer
	// EPERM and glibc would not fall back to clone: no thread could start.
	for _, r := range rulesFor(p, "clone3") {
		if r.Action == specs.ActErrno {
			t.Errorf("clone3 has an errno rule %+v; gVisor ignores errnoRet", r)
		}
	}
}

func TestProfileClone(t *testing.T) {
	p := profile(t)
	// clone is allowed only without namespace flags: creating a namespace
	// needs CAP_SYS_ADMIN, which the sandboxed process lacks.
	const nsFlags = unix.CLONE_NEWNS | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWUSER |
		unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWCGROUP
	masked := false
	for _, r := range allowed(p, "clone") {
		switch {
		case len(r.Args) == 0:
			t.Errorf("clone is allowed unconditionally by %+v; namespace flags must be masked", r)
		case len(r.Args) == 1 && r.Args[0] == specs.LinuxSeccompArg{Index: 0, Value: nsFlags, ValueTwo: 0, Op: specs.OpMaskedEqual}:
			masked = true
		}
	}
	if !masked {
		t.Errorf("no clone rule masks the namespace flags %#x; rules: %+v", nsFlags, rulesFor(p, "clone"))
	}
}

func TestProfileCommonCalls(t *testing.T) {
	p := profile(t)
	// What a Python or Node program needs from start-up to exit.
	for _, names := range [][]string{
		{"read"},
		{"write"},
		{"openat"},
		{"close"},
		{"mmap"},
		{"munmap"},
		{"brk"},
		{"futex"},
		{"execve"},
		{"exit_group"},
		{"epoll_wait", "epoll_pwait"},
		{"getrandom"},
		{"rt_sigaction"},
		{"wait4"},
	} {
		t.Run(names[0], func(t *testing.T) {
			if !slices.ContainsFunc(names, func(name string) bool { return allowedUnconditionally(p, name) }) {
				t.Errorf("none of %v is allowed unconditionally", names)
			}
		})
	}
}

func TestProfileCapabilityCalls(t *testing.T) {
	p := profile(t)
	// Calls Docker's profile allows only to a process holding a capability.
	for _, tt := range []struct {
		name, capability string
	}{
		{"mount", "CAP_SYS_ADMIN"},
		{"umount2", "CAP_SYS_ADMIN"},
		{"sethostname", "CAP_SYS_ADMIN"},
		{"setdomainname", "CAP_SYS_ADMIN"},
		{"unshare", "CAP_SYS_ADMIN"},
		{"setns", "CAP_SYS_ADMIN"},
		{"quotactl", "CAP_SYS_ADMIN"},
		{"fanotify_init", "CAP_SYS_ADMIN"},
		{"syslog", "CAP_SYSLOG"},
		{"reboot", "CAP_SYS_BOOT"},
		{"chroot", "CAP_SYS_CHROOT"},
		{"init_module", "CAP_SYS_MODULE"},
		{"acct", "CAP_SYS_PACCT"},
		{"kcmp", "CAP_SYS_PTRACE"},
		{"pidfd_getfd", "CAP_SYS_PTRACE"},
		{"settimeofday", "CAP_SYS_TIME"},
		{"clock_settime", "CAP_SYS_TIME"},
		{"vhangup", "CAP_SYS_TTY_CONFIG"},
		{"open_by_handle_at", "CAP_DAC_READ_SEARCH"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if rules := allowed(p, tt.name); len(rules) > 0 {
				t.Errorf("%s needs %s, which the sandbox lacks, but is allowed by %+v", tt.name, tt.capability, rules)
			}
		})
	}
}

// TestProfileNoCapabilityRules checks every rule of Docker's profile that
// requires a capability: a call such a rule is the only way to allow must
// stay denied, except clone3, which the package allows on purpose.
func TestProfileNoCapabilityRules(t *testing.T) {
	p := profile(t)
	def := moby.DefaultProfile()
	allowedWithoutCaps := map[string]bool{"clone3": true}
	for _, r := range def.Syscalls {
		if r.Includes == nil || len(r.Includes.Caps) == 0 {
			for _, name := range r.Names {
				allowedWithoutCaps[name] = true
			}
		}
	}
	checked := 0
	for _, r := range def.Syscalls {
		if r.Includes == nil || len(r.Includes.Caps) == 0 {
			continue
		}
		for _, name := range r.Names {
			if allowedWithoutCaps[name] {
				continue
			}
			checked++
			if rules := allowed(p, name); len(rules) > 0 {
				t.Errorf("%s needs %v in Docker's profile, but is allowed by %+v", name, r.Includes.Caps, rules)
			}
		}
	}
	if checked < 20 {
		t.Errorf("only %d capability-only calls found in Docker's profile; the test no longer checks much", checked)
	}
}

func TestProfileDeterministic(t *testing.T) {
	a, b := profile(t), profile(t)
	if !reflect.DeepEqual(a, b) {
		t.Error("two calls of Profile() differ")
	}
	// The results share nothing: changing one leaves the next intact.
	a.Syscalls[0].Names[0] = "changed"
	a.Syscalls = a.Syscalls[:1]
	if c := profile(t); !reflect.DeepEqual(b, c) {
		t.Error("changing one result of Profile() changed the next")
	}
}
