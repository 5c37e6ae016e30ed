//go:build linux

package agent_test

import "syscall"

func syscallUmask(m int) int { return syscall.Umask(m) }
