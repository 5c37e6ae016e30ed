package main

import (
	"fmt"
	"syscall"
	"unsafe"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"golang.org/x/sys/unix"
)

// lockdown drops every capability (effective, permitted, inheritable,
// ambient and, where permitted, the bounding set) on every thread, makes
// it not dumpable, sets no_new_privs and installs the seccomp allowlist
// on every thread. After it the helper can run Go, read and write its descriptors, and open
// internet sockets to dial out; it cannot exec, open a file, or make
// any other socket.
func lockdown() error {
	all := func(trap, a1, a2, a3 uintptr) error {
		if _, _, e := syscall.AllThreadsSyscall(trap, a1, a2, a3); e != 0 {
			return e
		}
		return nil
	}
	if err := all(unix.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0); err != nil && err != unix.EINVAL {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	for c := 0; c <= unix.CAP_LAST_CAP; c++ {
		// Needs CAP_SETPCAP; without it the bounding set cannot matter:
		// no_new_privs below keeps exec (refused anyway) from gaining any.
		if err := all(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, uintptr(c), 0); err != nil && err != unix.EPERM && err != unix.EINVAL {
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := all(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); err != nil {
		return fmt.Errorf("drop capabilities: %w", err)
	}
	// Not dumpable: no other process of the helper's uid (65534 is shared
	// with other daemons and every other sandbox's helper) may ptrace it or
	// open its /proc files, which would hand it the link and the records.
	if err := all(unix.SYS_PRCTL, unix.PR_SET_DUMPABLE, 0, 0); err != nil {
		return fmt.Errorf("clear the dumpable flag: %w", err)
	}
	if err := all(unix.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0); err != nil {
		return fmt.Errorf("set no_new_privs: %w", err)
	}
	if err := seccomp.LoadFilter(filter()); err != nil {
		return fmt.Errorf("install the seccomp filter: %w", err)
	}
	return nil
}

// filter is the seccomp allowlist: what the Go runtime, the stack (fdbased
// reads and writes frames with readv/recvmmsg/writev/sendmmsg, waits with
// ppoll) and dialling need. Everything else fails with EPERM, execve and
// openat included.
func filter() seccomp.Filter {
	names := append([]string{
		// Go runtime
		"read", "write", "readv", "writev", "pread64", "close", "fstat", "newfstatat", "lseek",
		"mmap", "munmap", "mprotect", "madvise", "brk",
		"rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "sigaltstack",
		"futex", "gettid", "getpid", "tgkill", "exit", "exit_group", "restart_syscall",
		"sched_yield", "sched_getaffinity", "nanosleep", "clock_gettime", "clock_nanosleep", "gettimeofday",
		"epoll_create1", "epoll_ctl", "epoll_pwait", "eventfd2", "pipe2", "fcntl", "getrandom",
		// the link and the sockets dialled out
		"ppoll", "recvmmsg", "sendmmsg", "recvfrom", "recvmsg", "sendto", "sendmsg",
		"connect", "getsockname", "getpeername", "setsockopt", "getsockopt", "shutdown",
	}, archNames...)
	clone := []seccomp.NameWithConditions{
		// Threads only: a clone without CLONE_THREAD (a fork) is refused.
		{Name: "clone", Conditions: []seccomp.Condition{{Argument: 0, Operation: seccomp.BitsSet, Value: unix.CLONE_THREAD}}},
		// Internet sockets only (dialling out, the resolver's queries).
		{Name: "socket", Conditions: []seccomp.Condition{{Argument: 0, Operation: seccomp.Equal, Value: unix.AF_INET}}},
		{Name: "socket", Conditions: []seccomp.Condition{{Argument: 0, Operation: seccomp.Equal, Value: unix.AF_INET6}}},
	}
	return seccomp.Filter{
		NoNewPrivs: true,
		Flag:       seccomp.FilterFlagTSync,
		Policy: seccomp.Policy{
			DefaultAction: seccomp.ActionErrno,
			Syscalls: []seccomp.SyscallGroup{
				{Names: names, NamesWithCondtions: clone, Action: seccomp.ActionAllow},
			},
		},
	}
}
