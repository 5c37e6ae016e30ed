// Package shim is the cgroup shim: the program that joins a run's cgroup
// and then executes runsc in its place, so that runsc and every process it
// starts are born inside that cgroup and runsc never creates or removes a
// cgroup itself.
//
// It runs once per sandbox, on the cold path, so it imports only the
// lowest layers of the standard library: built alone (cmd/safe-run-shim)
// it starts in about a millisecond, where safe-run itself spends ten on
// package initialisation before main.
package shim

import (
	"errors"
	"os"
	"runtime"
	"slices"
	"strings"
	"syscall"
)

// Command is the first argument that makes a program act as the shim
// (see Main).
const Command = "__sandbox-exec"

// Main runs the shim and does not return if os.Args asks for it (Command
// first); otherwise it returns at once. Programs that contain the shim
// call it first thing in main.
//
//	PROGRAM __sandbox-exec CGROUP_FILE... -- COMMAND ARGS...
//
// Each CGROUP_FILE is a cgroup.procs file, which moves the whole process
// into that cgroup, or a cgroup v1 tasks file, which moves only the calling
// thread. Moving a thread skips the kernel's global lock over every thread
// group (cgroup_threadgroup_rwsem), whose first writer waits for an RCU
// grace period: about 10 ms here, against 0.1 ms for the thread. Main
// writes and executes from one locked thread, and execve ends every other
// thread, so what runs COMMAND is inside every cgroup given either way.
func Main() {
	if len(os.Args) < 2 || os.Args[1] != Command {
		return
	}
	err := run(os.Args[2:])
	os.Stderr.WriteString("safe-run shim: " + err.Error() + "\n")
	os.Exit(125)
}

// run joins the cgroups args name and executes the command they end with.
// It returns only on failure.
func run(args []string) error {
	files, argv, err := Parse(args)
	if err != nil {
		return err
	}
	// The thread that joins is the thread that executes: a goroutine may
	// otherwise move to another thread in between.
	runtime.LockOSThread()
	for _, f := range files {
		if err := os.WriteFile(f, []byte("0"), 0); err != nil {
			return errors.New("join cgroup: " + err.Error())
		}
	}
	if err := syscall.Exec(argv[0], argv, os.Environ()); err != nil {
		return errors.New("exec " + argv[0] + ": " + err.Error())
	}
	return nil // not reached
}

// Parse splits the shim's arguments (after Command) into the cgroup files
// to join and the command line to execute, and checks both.
func Parse(args []string) (files, argv []string, err error) {
	sep := slices.Index(args, "--")
	if sep < 0 || sep == len(args)-1 {
		return nil, nil, errors.New("usage: " + Command + " CGROUP_FILE... -- COMMAND ARGS")
	}
	for _, f := range args[:sep] {
		if !strings.HasSuffix(f, "/cgroup.procs") && !strings.HasSuffix(f, "/tasks") {
			return nil, nil, errors.New(f + " is neither a cgroup.procs nor a tasks file")
		}
	}
	return args[:sep], args[sep+1:], nil
}
