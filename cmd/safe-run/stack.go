package main

import (
	"context"
	"errors"

	"github.com/safe-run/safe-run/runtime/engine"
	"github.com/safe-run/safe-run/runtime/gvisor"
	"github.com/safe-run/safe-run/sandbox"
)

// stackConfig configures what runs the sandboxes: the backend, and the
// engine over it. The backend is chosen here and nowhere else in cmd/.
type stackConfig struct {
	Backend gvisor.Config
	Engine  engine.Config
}

// service is what the commands hold of the sandbox machinery, whatever the
// backend: runs, sessions, and the life of the whole.
type service interface {
	sandbox.Runner
	sandbox.Sessions
	// Policy is the policy jobs are checked against.
	Policy() sandbox.Policy
	// Close destroys the warm pool and closes every session.
	Close()
	// Wait blocks until every sandbox is gone, or ctx ends.
	Wait(ctx context.Context) error
	// LiveSandboxes counts the sandboxes not yet destroyed.
	LiveSandboxes() int
	// PoolSizes counts the warm sandboxes ready, per language.
	PoolSizes() map[string]int
}

// newStack starts the backend and the engine over it.
func newStack(cfg stackConfig) (service, error) {
	be, err := gvisor.New(cfg.Backend)
	if err != nil {
		return nil, withHint(err)
	}
	cfg.Engine.Backend = be
	return engine.New(cfg.Engine)
}

// backendHints say how to provide a part the backend found missing or
// broken; the backend names the part and the fact, the CLI the fix.
var backendHints = []struct {
	part error
	hint string
}{
	{gvisor.ErrRunsc, "build it with `make runsc`, or name another with --runsc or SAFE_RUN_RUNSC"},
	{gvisor.ErrAgent, "build it with `make`, or name it with --agent or SAFE_RUN_AGENT"},
	{gvisor.ErrRootfs, "build the default image with `make rootfs`"},
	{gvisor.ErrPrivileges, "start safe-run as the command (it enters a user namespace of its own for ordinary users)"},
	{gvisor.ErrStateDirFull, "free space there or choose another with --state-dir or SAFE_RUN_STATE_DIR"},
}

// hint returns the fix for err, or "".
func hint(err error) string {
	for _, h := range backendHints {
		if errors.Is(err, h.part) {
			return h.hint
		}
	}
	return ""
}

// hintedError is an error with the CLI's fix appended to its text.
type hintedError struct {
	err  error
	hint string
}

func (e *hintedError) Error() string { return e.err.Error() + "; " + e.hint }
func (e *hintedError) Unwrap() error { return e.err }

// withHint appends the fix for err, if there is one.
func withHint(err error) error {
	if h := hint(err); h != "" && err != nil {
		return &hintedError{err: err, hint: h}
	}
	return err
}
