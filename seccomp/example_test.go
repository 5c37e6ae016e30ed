package seccomp_test

import (
	"fmt"
	"slices"

	"github.com/safe-run/safe-run/seccomp"
)

func ExampleProfile() {
	p, err := seccomp.Profile()
	if err != nil {
		panic(err)
	}
	fmt.Println("default:", p.DefaultAction)
	for _, r := range p.Syscalls {
		if slices.Contains(r.Names, "socket") {
			fmt.Println("socket:", r.Action, "if domain", r.Args[0].Op, r.Args[0].Value)
		}
	}
	// Output:
	// default: SCMP_ACT_ERRNO
	// socket: SCMP_ACT_ALLOW if domain SCMP_CMP_EQ 1
	// socket: SCMP_ACT_ALLOW if domain SCMP_CMP_EQ 2
	// socket: SCMP_ACT_ALLOW if domain SCMP_CMP_EQ 10
}
