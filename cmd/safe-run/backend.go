package main

import (
	"context"

	"github.com/safe-run/safe-run/runtime"
	"github.com/safe-run/safe-run/sandbox"
)

// This file is the one place where cmd/safe-run names the package that runs
// sandboxes: another backend is chosen here, and nowhere else in cmd/.

// backend is what the commands use of the sandbox runner: runs, sessions,
// the stats that metrics read, and an orderly end.
type backend interface {
	sandbox.Runner
	sandbox.Sessions
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

// newBackend starts the backend that cfg describes.
func newBackend(cfg backendConfig) (backend, error) {
	rt, err := runtime.New(cfg)
	if err != nil {
		return nil, err // not a typed nil inside the interface
	}
	return rt, nil
}

// The backend's configuration and its defaults, named here so that the
// other files of cmd/ do not name the backend's package.
type (
	backendConfig = runtime.Config
	poolConfig    = runtime.PoolConfig
	sessionConfig = runtime.SessionConfig
	backendImage  = runtime.Image
	imageResolver = runtime.ImageResolver
	cgroupLayout  = runtime.CgroupLayout
)

// defaultPoolMemory is the pool's memory budget unless --pool-memory says.
const defaultPoolMemory = runtime.DefaultPoolMemory

// The host's side of the backend: the checks doctor and version report,
// and the re-executions main starts with.
var (
	preloadModules       = runtime.DefaultPreload
	defaultStateDir      = runtime.DefaultStateDir
	checkPrivileges      = runtime.CheckPrivileges
	runscVersion         = runtime.RunscVersion
	hostRoot             = runtime.HostRoot
	hostUID              = runtime.HostUID
	detectCgroups        = runtime.DetectCgroups
	detectUserCgroups    = runtime.DetectUserCgroups
	userNamespaceCheck   = runtime.UserNamespaceCheck
	userNamespaceCapable = runtime.UserNamespaceCapable
	userNamespaceFix     = runtime.UserNamespaceFix
	userNamespaceMain    = runtime.UserNamespaceMain
	shimMain             = runtime.ShimMain
)
