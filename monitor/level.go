package monitor

import "fmt"

// Level chooses how much of gVisor's trace points a sandbox reports: each
// point costs the sandboxed program time on every matching call.
type Level string

const (
	// LevelOff runs without a trace session.
	LevelOff Level = "off"
	// LevelDefault reports process starts, exits, clones, socket, connect
	// and bind, and opens (filtered here to writes outside /workspace and
	// /tmp and the sensitive list).
	LevelDefault Level = "default"
	// LevelFull adds every other syscall point the schema has that is cheap
	// to summarise (listen, accept, socketpair, ptrace, chroot, setuid...,
	// signals sent), counted by kind.
	LevelFull Level = "full"
)

// ParseLevel reads a --monitor value.
func ParseLevel(s string) (Level, error) {
	switch l := Level(s); l {
	case LevelOff, LevelDefault, LevelFull:
		return l, nil
	case "":
		return LevelDefault, nil
	}
	return "", fmt.Errorf("monitor level %q: the levels are off, default and full", s)
}
