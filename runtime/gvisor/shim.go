package gvisor

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
)

// ShimCommand is the first argument that makes a safe-run executable act as
// the cgroup shim (see ShimMain).
const ShimCommand = "__sandbox-exec"

// ShimMain runs the cgroup shim and does not return if os.Args asks for it;
// otherwise it returns at once. Binaries that create Runtimes call it first
// thing in main (tests: in TestMain).
//
// The shim joins the run's cgroup by writing its own pid to each
// cgroup.procs file it is given, then executes runsc. Every process runsc
// and gVisor start is therefore born inside the run's cgroup, on cgroup v1
// and v2 alike, and runsc itself never creates or removes a cgroup.
//
//	safe-run __sandbox-exec /sys/fs/cgroup/.../cgroup.procs ... -- runsc args...
func ShimMain() {
	if len(os.Args) < 2 || os.Args[1] != ShimCommand {
		return
	}
	args := os.Args[2:]
	sep := slices.Index(args, "--")
	if sep < 0 || sep == len(args)-1 {
		shimFail(fmt.Errorf("usage: %s CGROUP_PROCS_FILE... -- COMMAND ARGS", ShimCommand))
	}
	for _, procs := range args[:sep] {
		if !strings.HasSuffix(procs, "/cgroup.procs") {
			shimFail(fmt.Errorf("%s is not a cgroup.procs file", procs))
		}
		if err := os.WriteFile(procs, []byte("0"), 0); err != nil {
			shimFail(fmt.Errorf("join cgroup: %w", err))
		}
	}
	argv := args[sep+1:]
	if err := syscall.Exec(argv[0], argv, os.Environ()); err != nil {
		shimFail(fmt.Errorf("exec %s: %w", argv[0], err))
	}
}

func shimFail(err error) {
	fmt.Fprintln(os.Stderr, "safe-run shim:", err)
	os.Exit(125)
}
