// Command safe-run-agent is the first process of every safe-run sandbox. The
// host mounts it read-only into the sandbox and talks to it over its stdin
// and stdout; see package agent for the protocol.
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"syscall"

	"github.com/safe-run/safe-run/agent"
)

func init() {
	// The main goroutine keeps the process's first thread, so that the
	// agent's file operations, which switch their thread to the program's
	// user and let it end with them, never run on it (see agent.Config.User).
	runtime.LockOSThread()
}

func main() {
	workdir := flag.String("workdir", "/workspace", "where files are written and programs run")
	oneShot := flag.Bool("one-shot", false, "serve one request, then kill every other process and exit")
	uid := flag.Int("uid", -1, "run programs as this user (and own their files); -1: as the agent's own")
	gid := flag.Int("gid", -1, "run programs with this group; -1: the agent's own")
	flag.Parse()
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
