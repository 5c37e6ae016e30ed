// Command safe-run-shim is the cgroup shim safe-run starts each sandbox's
// runsc through (package shim): a program of its own so that it starts in
// about a millisecond. safe-run looks for it next to itself and, where it
// is missing, runs its own copy of the shim (`safe-run __sandbox-exec`).
package main

import (
	"os"

	"github.com/safe-run/safe-run/runtime/gvisor/shim"
)

func main() {
	shim.Main()
	os.Stderr.WriteString("safe-run-shim: started by safe-run only, as: safe-run-shim " + shim.Command +
		" CGROUP_FILE... -- COMMAND ARGS\n")
	os.Exit(2)
}
