// Package gvisor is the engine's backend for this host: it starts each
// sandbox with runsc, gVisor's runtime, and owns everything of gVisor and
// of the host — the OCI bundle on disk (written by package bundle), the
// run's cgroup and, without one, the memory watch, the cgroup shim, the
// user namespace for ordinary users, the reaping of sandboxes a dead
// process left, and checkpoint images with their seals. It implements
// engine.Backend and engine.Checkpointer.
//
// One sandbox is one `runsc run`: a bundle is written, a cgroup is created
// below safe-run's own, runsc is started inside that cgroup with the agent
// as the sandbox's first process, and on Destroy everything — runsc
// processes, the cgroup, the null network namespace mount, the bundle and
// state directories — is removed, whatever happened.
package gvisor

import (
	"bufio"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/safe-run/safe-run/bundle"
	"github.com/safe-run/safe-run/monitor"
	"github.com/safe-run/safe-run/runtime/engine"
	"github.com/safe-run/safe-run/sandbox"
)

// Config configures a Backend. Runsc, Agent and Rootfs are required.
type Config struct {
	// Runsc is the path of the runsc binary.
	Runsc string
	// Agent is the host path of the safe-run-agent binary.
	Agent string
	// Rootfs is the host path of the root directory of the image jobs run
	// in unless they or their language name another.
	Rootfs string
	// Images finds the image a job names (Job.Image, else its language's
	// Image) by reference; nil means jobs can only run in Rootfs.
	Images ImageResolver
	// StateDir holds one directory per live run; empty means
	// DefaultStateDir(). It must be on a local file system.
	StateDir string
	// Platform is runsc's platform; empty means DefaultPlatform.
	Platform string
	// Shim is the executable that runs ShimMain, used to start runsc inside
	// the run's cgroup where runsc cannot be cloned into it; empty means
	// safe-run-shim next to this executable if it is there, else this
	// executable.
	Shim string
	// CheckpointDir, if set, is where checkpoint images of warm sandboxes
	// are kept, one per image, language, preload list, agent and runsc, for
	// the engine's warm pool to restore refills from. Empty keeps none.
	CheckpointDir string
	// DebugLogDir, if set, makes runsc write debug logs to a directory per
	// run below it. The logs are kept.
	DebugLogDir string
	// Logger receives diagnostics; nil means slog.Default().
	Logger *slog.Logger
	// NetHelper is the path of the network helper (safe-run-net) started
	// for each networked sandbox; empty means safe-run-net beside Agent.
	NetHelper string
	// NetLink is the link of networked sandboxes: LinkTap, LinkVeth, or ""
	// for a TAP if /dev/net/tun opens and a veth otherwise.
	NetLink string
	// NetworkCA is a PEM file of CAs networked sandboxes trust besides the
	// image's: both are bound over the image's CA bundle.
	NetworkCA string
	// Monitor, unless its Level is empty or off, starts every sandbox with
	// a trace session served by package monitor (see monitor.go); its Log
	// and OnKill are the backend's own.
	Monitor monitor.Options
}

// DefaultPlatform is the runsc platform sandboxes run on unless configured:
// systrap works everywhere, KVM only where /dev/kvm does.
const DefaultPlatform = "systrap"

// Image is what a sandbox needs of an image.
type Image struct {
	// Rootfs is the host path of the image's root directory.
	Rootfs string
	// Env is the image's environment, e.g. its PATH.
	Env []string
	// WorkingDir is the image's WORKDIR, or empty.
	WorkingDir string
}

// ImageResolver finds an image by reference, e.g. "python:3.12-slim".
type ImageResolver func(ref string) (Image, error)

// image returns the image a sandbox of job runs in: the one it names (the
// engine fills in its language's), else the default one (Config.Rootfs).
func (g *Backend) image(job sandbox.Job) (Image, error) {
	ref := job.Image
	if ref == "" || g.cfg.Images == nil {
		return Image{Rootfs: g.cfg.Rootfs}, nil
	}
	img, err := g.cfg.Images(ref)
	if err != nil {
		return Image{}, fmt.Errorf("image %s: %w", ref, err)
	}
	return img, nil
}

// bundleConfig is the bundle configuration of a sandbox for job: its
// image's root, environment and WORKDIR, and the agent.
func (g *Backend) bundleConfig(job sandbox.Job, keepAlive bool) (bundle.Config, error) {
	img, err := g.image(job)
	if err != nil {
		return bundle.Config{}, err
	}
	return bundle.Config{Rootfs: img.Rootfs, ImageEnv: img.Env, WorkingDir: img.WorkingDir,
		Agent: g.cfg.Agent, KeepAlive: keepAlive}, nil
}

// DefaultStateDir is /run/safe-run for root and $XDG_RUNTIME_DIR/safe-run
// (or a directory in /tmp) for other users.
func DefaultStateDir() string {
	if HostRoot() {
		return "/run/safe-run"
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "safe-run")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("safe-run-%d", HostUID()))
}

// Backend starts gVisor sandboxes on this host. It is safe for concurrent
// use.
type Backend struct {
	cfg     Config
	cgroups CgroupLayout
	log     *slog.Logger
	live    sync.WaitGroup // sandboxes not yet destroyed
	liveN   atomic.Int64   // how many
	lagging sync.WaitGroup // cgroups whose removal is being retried
	// noCloneIntoCgroup is set once the kernel refused CLONE_INTO_CGROUP:
	// runsc then starts through the shim on cgroup v2 too.
	noCloneIntoCgroup atomic.Bool
}

var (
	_ engine.Backend      = (*Backend)(nil)
	_ engine.Checkpointer = (*Backend)(nil)
)

// New checks cfg against the host and returns a Backend. Its errors are of
// class sandbox.ErrUnavailable and name the part that is missing or broken
// (errors.Is with ErrRunsc, ErrAgent, ErrRootfs).
func New(cfg Config) (*Backend, error) {
	if cfg.Platform == "" {
		cfg.Platform = DefaultPlatform
	}
	if cfg.StateDir == "" {
		cfg.StateDir = DefaultStateDir()
	}
	if cfg.Shim == "" {
		shim, err := defaultShim()
		if err != nil {
			return nil, err
		}
		cfg.Shim = shim
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := CheckPrivileges(); err != nil {
		return nil, err
	}
	if err := checkExecutable(cfg.Runsc, ErrRunsc); err != nil {
		return nil, err
	}
	if err := checkProgram(cfg.Runsc, ErrRunsc); err != nil {
		return nil, err
	}
	if err := checkExecutable(cfg.Agent, ErrAgent); err != nil {
		return nil, err
	}
	if fi, err := os.Stat(cfg.Rootfs); err != nil || !fi.IsDir() {
		return nil, partError(ErrRootfs, "rootfs %q is not a directory", cfg.Rootfs)
	}
	for _, p := range []*string{&cfg.Runsc, &cfg.Agent, &cfg.Rootfs, &cfg.StateDir} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			return nil, err
		}
		*p = abs
	}
	if err := ensurePrivateDir(cfg.StateDir); err != nil {
		return nil, err
	}
	var (
		layout CgroupLayout
		err    error
	)
	if HostRoot() {
		if layout, err = DetectCgroups(); err != nil {
			return nil, err
		}
	} else if layout, err = userCgroups(); err != nil {
		// Without root, runs use a delegated cgroup if safe-run has one, and
		// no cgroup otherwise.
		cfg.Logger.Info("runs get no cgroup: memory is watched from the host, CPU is not capped", "reason", err)
	}
	g := &Backend{cfg: cfg, cgroups: layout, log: cfg.Logger}
	reaped, err := g.reapStale()
	if len(reaped) > 0 {
		g.log.Warn("removed sandboxes left by a safe-run process that died", "sandboxes", reaped)
	}
	if err != nil {
		g.log.Error("remove stale sandboxes", "err", err)
	}
	return g, nil
}

// cgroupRetry bounds how long the removal of a cgroup is retried.
const cgroupRetry = 2 * time.Minute

// removeCgroup removes a run's cgroup. Killed sandbox processes are reaped
// by the host's init, which can take seconds, and keep the cgroup busy
// until then; so when the first attempt fails, it is retried in the
// background, and Wait waits for it.
func (g *Backend) removeCgroup(id string, c *runCgroup) {
	if c == nil || c.destroy() == nil {
		return
	}
	g.lagging.Add(1)
	go func() {
		defer g.lagging.Done()
		var err error
		for deadline := time.Now().Add(cgroupRetry); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
			if err = c.destroy(); err == nil {
				return
			}
		}
		g.log.Error("remove cgroup", "sandbox", id, "err", err)
	}()
}

// The parts New checks. Its errors match one of them (errors.Is), so that
// the caller can say how to provide that part, and are all of class
// sandbox.ErrUnavailable.
var (
	ErrRunsc      = errors.New("runsc")
	ErrAgent      = errors.New("safe-run-agent")
	ErrRootfs     = errors.New("the default image")
	ErrPrivileges = errors.New("privileges")
	ErrStateDir   = errors.New("the state directory")
	// ErrMemoryUnwatched marks a sandbox refused because, without a
	// cgroup, its memory limit cannot be enforced.
	ErrMemoryUnwatched = errors.New("the memory watch")
)

// ErrStateDirFull marks a sandbox that could not start because the state
// directory is out of space (class sandbox.ErrExhausted).
var ErrStateDirFull = errors.New("the state directory is full")

// partError is an error naming the part at fault and its class.
type partErr struct {
	part, class error
	msg         string
}

func (e *partErr) Error() string   { return e.msg }
func (e *partErr) Unwrap() []error { return []error{e.part, e.class} }

// partError is an error of New: part is broken, the service unavailable.
func partError(part error, format string, args ...any) error {
	return &partErr{part: part, class: sandbox.ErrUnavailable, msg: fmt.Sprintf(format, args...)}
}

// CheckPrivileges reports whether this process can run sandboxes: as root,
// or as root of its own user namespace (see UserNamespaceMain).
func CheckPrivileges() error {
	if os.Geteuid() != 0 {
		return partError(ErrPrivileges, "sandboxes need root or a user namespace of their own, and this process has neither")
	}
	return nil
}

// Wait blocks until every sandbox has been destroyed, and the removal of
// each cgroup retried in the background is over, or ctx ends.
func (g *Backend) Wait(ctx context.Context) error {
	done := make(chan struct{})
	go func() { g.live.Wait(); g.lagging.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Live counts the sandboxes started and not yet destroyed.
func (g *Backend) Live() int { return int(g.liveN.Load()) }

func checkExecutable(path string, part error) error {
	if path == "" {
		return partError(part, "%s not found", part)
	}
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		return partError(part, "%s not found at %s", part, path)
	case !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0:
		return partError(part, "%s at %s is not an executable file", part, path)
	}
	return nil
}

// checkProgram reports whether path holds something the kernel can execute
// — an ELF binary or a script — so that a broken file is named here rather
// than by a sandbox that fails to start.
func checkProgram(path string, part error) error {
	f, err := elf.Open(path)
	if err == nil {
		f.Close()
		return nil
	}
	head := make([]byte, 2)
	if g, oerr := os.Open(path); oerr == nil {
		_, _ = io.ReadFull(g, head)
		g.Close()
	}
	if string(head) == "#!" {
		return nil
	}
	return partError(part, "%s at %s is not a program (%v)", part, path, err)
}

// RunscVersion returns the version line of the runsc binary at path.
func RunscVersion(ctx context.Context, path string) (string, error) {
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("run %s --version: %w", path, err)
	}
	line, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimSpace(strings.TrimPrefix(line, "runsc version ")), nil
}

// runsc runs a runsc subcommand against the run's state root and returns
// its combined output.
func (g *Backend) runsc(ctx context.Context, root string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, g.cfg.Runsc, append([]string{"--root", root}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("runsc %s: %w: %s", args[0], err, lastLine(out))
	}
	return out, nil
}

// lastLine returns the last non-empty line of out, for error messages.
func lastLine(out []byte) string {
	var last string
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if t := strings.TrimSpace(sc.Text()); t != "" {
			last = t
		}
	}
	return last
}

// startTimeout bounds how long a sandbox may take to come up, however
// loaded the host (the engine waits as long for its agent): beyond it the
// sandbox is broken, not slow.
const startTimeout = 60 * time.Second
