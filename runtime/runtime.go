// Package runtime runs jobs in gVisor sandboxes: it owns the runsc process
// lifecycle, the per-run state and cgroup, and turns what happened into a
// sandbox.Result. It implements sandbox.Runner.
//
// One run is one sandbox: a bundle is written (package bundle), a cgroup is
// created below safe-run's own, `runsc run` is started inside that cgroup
// with the agent as the sandbox's first process, the job is handed to the
// agent over a pipe, and afterwards everything — runsc processes, the
// cgroup, the null network namespace mount, the bundle and state
// directories — is removed, whatever happened.
package runtime

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
	"github.com/safe-run/safe-run/sandbox"
)

// Config configures a Runtime. Runsc, Agent and Rootfs are required.
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
	// Platform is runsc's platform; empty means "systrap".
	Platform string
	// Policy validates jobs and supplies default limits.
	Policy sandbox.Policy
	// Shim is the executable that runs ShimMain, used to start runsc inside
	// the run's cgroup; empty means this executable.
	Shim string
	// DebugLogDir, if set, makes runsc write debug logs to a directory per
	// run below it. The logs are kept.
	DebugLogDir string
	// Sessions bounds sessions (see CreateSession).
	Sessions SessionConfig
	// Pool keeps sandboxes warm for one-shot runs; the zero value has none.
	Pool PoolConfig
	// Logger receives diagnostics; nil means slog.Default().
	Logger *slog.Logger
	// ObserveStart, if set, hears how long each sandbox took from start to
	// its agent being ready (for metrics).
	ObserveStart func(time.Duration)
}

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

// image returns the image job runs in: the one it names, else its
// language's, else the default one (Config.Rootfs).
func (rt *Runtime) image(job sandbox.Job) (Image, error) {
	ref := job.Image
	if ref == "" {
		lang, _ := rt.cfg.Policy.Language(job.Language)
		ref = lang.Image
	}
	if ref == "" || rt.cfg.Images == nil {
		return Image{Rootfs: rt.cfg.Rootfs}, nil
	}
	img, err := rt.cfg.Images(ref)
	if err != nil {
		return Image{}, fmt.Errorf("image %s: %w", ref, err)
	}
	return img, nil
}

// bundleConfig is the bundle configuration of a sandbox for job: its
// image's root, environment and WORKDIR, and the agent.
func (rt *Runtime) bundleConfig(job sandbox.Job, keepAlive bool) (bundle.Config, error) {
	img, err := rt.image(job)
	if err != nil {
		return bundle.Config{}, err
	}
	return bundle.Config{Rootfs: img.Rootfs, ImageEnv: img.Env, WorkingDir: img.WorkingDir,
		Agent: rt.cfg.Agent, KeepAlive: keepAlive}, nil
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

// Runtime runs jobs in gVisor sandboxes. It is safe for concurrent use.
type Runtime struct {
	cfg     Config
	cgroups CgroupLayout
	log     *slog.Logger
	live    sync.WaitGroup // sandboxes not yet destroyed
	liveN   atomic.Int64   // how many
	lagging sync.WaitGroup // cgroups whose removal is being retried

	sessionsOnce sync.Once
	sessions     *sessionTable

	pool *pool // nil without one
}

var _ sandbox.Runner = (*Runtime)(nil)

// New checks cfg against the host and returns a Runtime. Its errors say
// what is missing and how to get it.
func New(cfg Config) (*Runtime, error) {
	if cfg.Platform == "" {
		cfg.Platform = "systrap"
	}
	if cfg.StateDir == "" {
		cfg.StateDir = DefaultStateDir()
	}
	if cfg.Shim == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("find own executable for the cgroup shim: %w", err)
		}
		cfg.Shim = exe
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := CheckPrivileges(); err != nil {
		return nil, err
	}
	if err := checkExecutable(cfg.Runsc, "runsc", "build it with `make runsc`, or name another with --runsc or SAFE_RUN_RUNSC"); err != nil {
		return nil, err
	}
	if err := checkProgram(cfg.Runsc, "runsc", "build it with `make runsc`, or name another with --runsc or SAFE_RUN_RUNSC"); err != nil {
		return nil, err
	}
	if err := checkExecutable(cfg.Agent, "safe-run-agent", "build it with `make`, or name it with --agent or SAFE_RUN_AGENT"); err != nil {
		return nil, err
	}
	if fi, err := os.Stat(cfg.Rootfs); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("rootfs %q is not a directory; build the default image with `make rootfs`", cfg.Rootfs)
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
	rt := &Runtime{cfg: cfg, cgroups: layout, log: cfg.Logger}
	reaped, err := rt.reapStale()
	if len(reaped) > 0 {
		rt.log.Warn("removed sandboxes left by a safe-run process that died", "sandboxes", reaped)
	}
	if err != nil {
		rt.log.Error("remove stale sandboxes", "err", err)
	}
	if len(cfg.Pool.Size) > 0 {
		if rt.pool, err = newPool(rt, cfg.Pool); err != nil {
			return nil, err
		}
	}
	return rt, nil
}

// Close destroys the warm pool's sandboxes and closes every session. Runs
// in progress go on; Wait waits for them.
func (rt *Runtime) Close() {
	rt.pool.close()
	rt.CloseSessions()
}

// PoolSizes returns how many warm sandboxes are ready, per pooled language.
func (rt *Runtime) PoolSizes() map[string]int { return rt.pool.sizes() }

// cgroupRetry bounds how long the removal of a cgroup is retried.
const cgroupRetry = 2 * time.Minute

// removeCgroup removes a run's cgroup. Killed sandbox processes are reaped
// by the host's init, which can take seconds, and keep the cgroup busy
// until then; so when the first attempt fails, it is retried in the
// background, and Wait waits for it.
func (rt *Runtime) removeCgroup(id string, c *runCgroup) {
	if c == nil || c.destroy() == nil {
		return
	}
	rt.lagging.Add(1)
	go func() {
		defer rt.lagging.Done()
		var err error
		for deadline := time.Now().Add(cgroupRetry); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
			if err = c.destroy(); err == nil {
				return
			}
		}
		rt.log.Error("remove cgroup", "id", id, "err", err)
	}()
}

// CheckPrivileges reports whether this process can run sandboxes: as root,
// or as root of its own user namespace (see UserNamespaceMain).
func CheckPrivileges() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("sandboxes need root or a user namespace of their own; start safe-run as the command (it enters one for ordinary users), or call runtime.UserNamespaceMain first")
	}
	return nil
}

// Wait blocks until every sandbox has been destroyed — runs ended and
// cleaned up, sessions closed — or ctx ends. A server calls it after
// cancelling its runs and closing its sessions, before exit.
func (rt *Runtime) Wait(ctx context.Context) error {
	done := make(chan struct{})
	go func() { rt.live.Wait(); rt.lagging.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// LiveSandboxes counts the sandboxes started and not yet destroyed.
func (rt *Runtime) LiveSandboxes() int { return int(rt.liveN.Load()) }

// Policy returns the policy jobs are checked against.
func (rt *Runtime) Policy() sandbox.Policy { return rt.cfg.Policy }

func checkExecutable(path, what, fix string) error {
	if path == "" {
		return fmt.Errorf("%s not found; %s", what, fix)
	}
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		return fmt.Errorf("%s not found at %s; %s", what, path, fix)
	case !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0:
		return fmt.Errorf("%s at %s is not an executable file; %s", what, path, fix)
	}
	return nil
}

// checkProgram reports whether path holds something the kernel can execute
// — an ELF binary or a script — so that a broken file is named here rather
// than by a sandbox that fails to start.
func checkProgram(path, what, fix string) error {
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
	return fmt.Errorf("%s at %s is not a program (%v); %s", what, path, err, fix)
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
func (rt *Runtime) runsc(ctx context.Context, root string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, rt.cfg.Runsc, append([]string{"--root", root}, args...)...)
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

var errNotStarted = errors.New("sandbox did not start")

// startTimeout bounds how long a sandbox may take to come up, however
// loaded the host: beyond it the sandbox is broken, not slow.
const startTimeout = 60 * time.Second

// killGrace is how long after the program's timeout the host waits for the
// agent's own report before it kills the whole sandbox.
const killGrace = 500 * time.Millisecond
