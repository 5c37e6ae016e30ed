// Command safe-run-agent is the first process of every safe-run sandbox. The
// host mounts it read-only into the sandbox and talks to it over its stdin
// and stdout; see package agent for the protocol.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"syscall"

	"github.com/safe-run/safe-run/agent"
)

func init() {
	// The main goroutine keeps the process's first thread, so that the
	// agent's file operations, which switch their thread to the program's
	// user and let it end with them, never run on it (see agent.Config.User).
	runtime.LockOSThread()
	// One P. The agent only supervises, and inside gVisor each wake-up of
	// a thread costs 0.1-0.3 ms here and each system call 45-170 µs in a
	// sandbox that waited idle (a few µs once busy), paid beside the run on
	// a host of few CPUs. With a P per CPU, Go's runtime woke threads of the
	// agent during every run: when the agent's one goroutine blocked in its poll
	// for the run's end, sysmon kept polling (nanosleep) and handed the
	// P to another thread, and it reread the CPU affinity to update
	// GOMAXPROCS, which setting it stops. Counted with runsc --strace over
	// one warm Python print(1), from the request's read to the Exit's
	// write: 23 nanosleeps and 18 futex calls with two Ps, 12 and 6 with one.
	// Side by side with two Ps (scripts/bench -warm -baseline, two runs),
	// warm print(1) p50 13.5 and 14.6 ms against 15.3 and 15.7, and a
	// restore with its prime no more CPU (727 against 766 ms).
	runtime.GOMAXPROCS(1)
}

func main() {
	workdir := flag.String("workdir", "/workspace", "where files are written and programs run")
	oneShot := flag.Bool("one-shot", false, "serve one request, then kill every other process and exit")
	uid := flag.Int("uid", -1, "run programs as this user (and own their files); -1: as the agent's own")
	gid := flag.Int("gid", -1, "run programs with this group; -1: the agent's own")
	wait := flag.Bool("wait", false, "serve nothing: wait for SIGTERM, reaping orphans (a Kubernetes sandbox Pod's process)")
	flag.Parse()
	if *wait {
		waitForTerm()
		return
	}
	cfg := agent.Config{Workdir: *workdir, OneShot: *oneShot}
	if *uid >= 0 || *gid >= 0 {
		if *uid < 0 || *gid < 0 {
			fmt.Fprintln(os.Stderr, "safe-run-agent: --uid and --gid go together")
			os.Exit(2)
		}
		// No supplementary groups: the program belongs to its group only.
		cfg.User = &syscall.Credential{Uid: uint32(*uid), Gid: uint32(*gid), Groups: []uint32{}}
	}
	if err := agent.Serve(os.Stdin, os.Stdout, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "safe-run-agent:", err)
		os.Exit(1)
	}
}

// waitForTerm is the --wait mode, the process of a Kubernetes sandbox Pod:
// there the agent that serves requests is exec'd into the Pod per run, and
// the container's own process must only keep the Pod alive. It is the
// agent rather than `sleep` because the agent is the one program every
// safe-run image is known to have. As the Pod's pid 1 it must handle
// SIGTERM itself (the kernel gives pid 1 no default action, so the Pod
// would wait out its grace period) and reap the orphans of exec'd agents,
// as init does; it starts and signals nothing.
func waitForTerm() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			return
		}
		for {
			var ws syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
