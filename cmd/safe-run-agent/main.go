// Command safe-run-agent is the first process of every safe-run sandbox. The
// host mounts it read-only into the sandbox and talks to it over its stdin
// and stdout; see package agent for the protocol.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/safe-run/safe-run/agent"
)

func main() {
	workdir := flag.String("workdir", "/workspace", "where files are written and programs run")
	oneShot := flag.Bool("one-shot", false, "serve one request, then kill every other process and exit")
	flag.Parse()
	if err := agent.Serve(os.Stdin, os.Stdout, agent.Config{Workdir: *workdir, OneShot: *oneShot}); err != nil {
		fmt.Fprintln(os.Stderr, "safe-run-agent:", err)
		os.Exit(1)
	}
}
