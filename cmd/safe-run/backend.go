package main

import (
	"context"
	"errors"

	"github.com/safe-run/safe-run/runtime/engine"
	"github.com/safe-run/safe-run/runtime/gvisor"
	"github.com/safe-run/safe-run/sandbox"
)

// This file is the one place where cmd/safe-run names the backend that
// starts sandboxes (package gvisor) and builds the engine over it: another
// backend is chosen here, and nowhere else in cmd/.

// backend is what the commands use of the sandbox runner: runs, sessions,
// the stats that metrics read, and an orderly end.
type backend interface {
	sandbox.Runner
	sandbox.Sessions
	// Policy is the policy jobs are checked against.
	Policy() sandbox.Policy
	// Close ends the sessions and the pool; runs in progress clean up
	// after themselves (Wait waits for them).
	Close()
	// Wait returns once every sandbox is gone, or ctx's error.
	Wait(ctx context.Context) error
	// LiveSandboxes counts sandboxes started and not yet destroyed.
	LiveSandboxes() int
	// PoolSizes gives the idle warm sandboxes per language.
	PoolSizes() map[string]int
}

// backendConfig configures the backend and the engine over it.
type backendConfig struct {
	Backend gvisor.Config
	Engine  engine.Config
}

// newBackend starts the backend that cfg describes and the engine over it.
func newBackend(cfg backendConfig) (backend, error) {
	be, err := gvisor.New(cfg.Backend)
	if err != nil {
		return nil, withHint(err)
	}
	cfg.Engine.Backend = be
	e, err := engine.New(cfg.Engine)
	if err != nil {
		return nil, err // not a typed nil inside the interface
	}
	return e, nil
}

// The configuration and defaults of the engine and the backend, named here
// so that the other files of cmd/ do not name their packages.
type (
	poolConfig    = engine.PoolConfig
	sessionConfig = engine.SessionConfig
	backendImage  = gvisor.Image
	imageResolver = gvisor.ImageResolver
	cgroupLayout  = gvisor.CgroupLayout
)

// defaultPoolMemory is the pool's memory budget unless --pool-memory says.
const defaultPoolMemory = engine.DefaultPoolMemory

// defaultPlatform is runsc's platform unless --platform says.
const defaultPlatform = gvisor.DefaultPlatform

// defaultSessions are the session bounds unless --max-sessions and the
// session timeouts say.
var defaultSessions = engine.DefaultSessions

// The host's side of the backend: the checks doctor and version report,
// and the re-executions main starts with.
var (
	preloadModules       = engine.DefaultPreload
	defaultStateDir      = gvisor.DefaultStateDir
	checkPrivileges      = gvisor.CheckPrivileges
	runscVersion         = gvisor.RunscVersion
	hostRoot             = gvisor.HostRoot
	hostUID              = gvisor.HostUID
	detectCgroups        = gvisor.DetectCgroups
	detectUserCgroups    = gvisor.DetectUserCgroups
	userNamespaceCheck   = gvisor.UserNamespaceCheck
	userNamespaceCapable = gvisor.UserNamespaceCapable
	userNamespaceFix     = gvisor.UserNamespaceFix
	userNamespaceMain    = gvisor.UserNamespaceMain
	shimMain             = gvisor.ShimMain
	networkCheck         = gvisor.NetworkCheck
)

// backendHints say how to provide a part the backend found missing or
// broken: the backend names the part and the fact, the CLI the fix.
var backendHints = []struct {
	part error
	hint string
}{
	{gvisor.ErrRunsc, "build it with `make runsc`, or name another with --runsc or " + envName("runsc")},
	{gvisor.ErrAgent, "build it with `make`, or name it with --agent or " + envName("agent")},
	{gvisor.ErrRootfs, "build the default image with `make rootfs`"},
	{gvisor.ErrPrivileges, "start safe-run as the command (it enters a user namespace of its own for ordinary users)"},
	{gvisor.ErrStateDirFull, "free space there or choose another with --state-dir or " + envName("state-dir")},
	{gvisor.ErrStateDir, "remove it or make it and its parents private to you, or choose another with --state-dir or " + envName("state-dir")},
	{gvisor.ErrMemoryUnwatched, "run safe-run as root or in a delegated cgroup (see docs/rootless.md)"},
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
