// Package seccomp builds the system call filter of every sandbox: Docker's
// default profile (github.com/moby/profiles/seccomp), evaluated for a process
// without capabilities, then tightened.
//
// The filter is applied by gVisor to the sandboxed program's calls into the
// gVisor kernel (runsc --oci-seccomp). It is a second wall behind gVisor's
// own: it removes whole kernel features the program never needs, so a bug in
// gVisor's implementation of them cannot be reached.
package seccomp

import (
	"fmt"
	"runtime"
	"slices"

	moby "github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// Denied lists the calls the tightened profile never allows, even where
// Docker's default would: debugging and reading other processes, kernel key
// rings, eBPF, perf, userfaultfd, io_uring, and every way to mount or to
// enter or create namespaces, plus module and kexec loading.
var Denied = []string{
	"ptrace", "process_vm_readv", "process_vm_writev",
	"keyctl", "add_key", "request_key",
	"bpf", "perf_event_open", "userfaultfd",
	"io_uring_setup", "io_uring_enter", "io_uring_register",
	"mount", "umount", "umount2", "mount_setattr", "move_mount", "open_tree",
	"fsopen", "fsconfig", "fsmount", "fspick", "pivot_root", "chroot",
	"unshare", "setns",
	// socketcall would bypass the socket family rule below on 32-bit ABIs.
	"socketcall",
	"kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
}

// SocketDomains are the only address families socket(2) may create:
// AF_UNIX, AF_INET and AF_INET6. With no network the internet families
// reach only loopback, but programs (and Python's own start-up) use them.
var SocketDomains = []uint64{unix.AF_UNIX, unix.AF_INET, unix.AF_INET6}

// Profile returns the filter for the sandbox's process, which has no
// capabilities. The result is the same on every host: kernel-version
// conditions of Docker's profile are taken as met, since the calls are
// served by gVisor, not by the host kernel.
func Profile() (*specs.LinuxSeccomp, error) {
	def := moby.DefaultProfile()
	out := &specs.LinuxSeccomp{
		DefaultAction:   def.DefaultAction,
		DefaultErrnoRet: def.DefaultErrnoRet,
	}
	arch, ok := map[string]specs.Arch{"amd64": specs.ArchX86_64, "arm64": specs.ArchAARCH64}[runtime.GOARCH]
	if !ok {
		return nil, fmt.Errorf("seccomp: gVisor does not run on %s", runtime.GOARCH)
	}
	for _, a := range def.ArchMap {
		if a.Arch == arch {
			out.Architectures = append(out.Architectures, a.Arch)
			out.Architectures = append(out.Architectures, a.SubArches...)
		}
	}
	for _, rule := range def.Syscalls {
		if !appliesWithoutCapabilities(rule) {
			continue
		}
		r := rule.LinuxSyscall
		r.Names = slices.DeleteFunc(slices.Clone(r.Names), func(name string) bool {
			// gVisor ignores errnoRet: the profile's "clone3 → ENOSYS" rule
			// would answer EPERM, glibc would not fall back to clone, and no
			// thread could start. clone3 is allowed below instead.
			return slices.Contains(Denied, name) || name == "socket" || name == "clone3"
		})
		if len(r.Names) == 0 {
			continue
		}
		out.Syscalls = append(out.Syscalls, r)
	}
	out.Syscalls = append(out.Syscalls, specs.LinuxSyscall{Names: []string{"clone3"}, Action: specs.ActAllow})
	for _, domain := range SocketDomains {
		out.Syscalls = append(out.Syscalls, specs.LinuxSyscall{
			Names:  []string{"socket"},
			Action: specs.ActAllow,
			Args:   []specs.LinuxSeccompArg{{Index: 0, Value: domain, Op: specs.OpEqualTo}},
		})
	}
	allowed := 0
	for _, r := range out.Syscalls {
		allowed += len(r.Names)
	}
	if out.DefaultAction != specs.ActErrno || allowed < 250 {
		return nil, fmt.Errorf("seccomp: Docker's default profile changed shape (default action %q, %d calls allowed); review this package", out.DefaultAction, allowed)
	}
	return out, nil
}

// appliesWithoutCapabilities evaluates a rule's conditions for a process
// with no capabilities on this architecture.
func appliesWithoutCapabilities(rule *moby.Syscall) bool {
	if rule.Includes != nil {
		if len(rule.Includes.Caps) > 0 {
			return false
		}
		if len(rule.Includes.Arches) > 0 && !slices.ContainsFunc(rule.Includes.Arches, isOurArch) {
			return false
		}
	}
	if rule.Excludes != nil {
		if len(rule.Excludes.Arches) > 0 && slices.ContainsFunc(rule.Excludes.Arches, isOurArch) {
			return false
		}
		// Excluded capabilities are ones we lack, so the rule holds; an
		// excluded minimum kernel is taken as met, so the rule is dropped.
		if rule.Excludes.MinKernel != nil {
			return false
		}
	}
	return true
}

// isOurArch compares with Docker's architecture names, which match GOARCH
// for the two architectures gVisor supports.
func isOurArch(arch string) bool { return arch == runtime.GOARCH }
