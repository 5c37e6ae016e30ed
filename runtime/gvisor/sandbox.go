package gvisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"

	"github.com/safe-run/safe-run/bundle"
	"github.com/safe-run/safe-run/runtime/engine"
	"github.com/safe-run/safe-run/sandbox"
)

// sandboxProc is one gVisor sandbox whose first process is the agent: from
// `runsc run` to the removal of everything it left on the host. It is the
// engine.Sandbox this backend hands out.
type sandboxProc struct {
	g     *Backend
	id    string
	log   *slog.Logger
	dir   string   // bundle/, runsc/ (runsc --root), runsc.log, lock
	lock  *os.File // held while the sandbox lives; see reapStale
	cg    *runCgroup
	mem   *memoryWatch // the memory limit where there is no cgroup, else nil
	cmd   *exec.Cmd
	mark  func(phase string)
	netNS *sandboxNet    // a networked sandbox's namespace and link, else nil
	net   *netHelperProc // and its network helper

	stdin  *os.File // the agent's requests
	stdout *os.File // the agent's events

	restore string // the checkpoint image the sandbox starts from, if any

	mon *sandboxMonitor // its behaviour monitor, nil when not monitored

	background atomic.Bool // started at the background CPU weight and not yet raised

	exited      chan struct{} // closed when runsc has exited
	runscStatus int           // its exit status, -1 if killed; read after exited closes

	destroyOnce sync.Once
	destroyErr  error
}

var (
	_ engine.Sandbox     = (*sandboxProc)(nil)
	_ engine.PoolMarker  = (*sandboxProc)(nil)
	_ engine.Prioritizer = (*sandboxProc)(nil)
	_ engine.CPUMeter    = (*sandboxProc)(nil)
)

func (p *sandboxProc) ID() string                { return p.id }
func (p *sandboxProc) Requests() io.Writer       { return p.stdin }
func (p *sandboxProc) Events() io.ReadCloser     { return p.stdout }
func (p *sandboxProc) Exited() <-chan struct{}   { return p.exited }
func (p *sandboxProc) MemoryNow() (int64, error) { return p.memoryUsage() }

// CPUUsed reads the CPU time the sandbox's cgroup used so far.
func (p *sandboxProc) CPUUsed() (time.Duration, error) {
	if p.cg == nil {
		return 0, errors.New("read CPU usage: the sandbox has no cgroup")
	}
	return p.cg.cpuUsed()
}

// Ready applies the CPU limit the sandbox started without, before any
// request, and finds the sentry for the memory watch, if there is one: a
// sandbox whose limits cannot be enforced must not be used.
func (p *sandboxProc) Ready() error {
	if err := p.cg.limitCPU(); err != nil {
		p.Kill()
		return err
	}
	if _, err := p.mem.locate(); err != nil {
		p.Kill()
		return err
	}
	return nil
}

// ExitReport is runsc's exit status and the last line it logged.
func (p *sandboxProc) ExitReport() string {
	select {
	case <-p.exited:
		return fmt.Sprintf("runsc exit status %d%s", p.runscStatus, p.runscLogTail())
	default:
		return "runsc still running" + p.runscLogTail()
	}
}

func (p *sandboxProc) bundleDir() string { return filepath.Join(p.dir, "bundle") }
func (p *sandboxProc) runscRoot() string { return filepath.Join(p.dir, "runsc") }

// Start starts a sandbox for spec (see startSandbox).
func (g *Backend) Start(spec engine.StartSpec) (engine.Sandbox, error) {
	p, err := g.startSandbox(spec, "")
	if err != nil {
		return nil, err
	}
	return p, nil
}

// startSandbox writes the bundle for spec, creates the cgroup and starts
// runsc inside it: a new sandbox, or, if restore names a checkpoint image,
// the sandbox saved there. On error nothing is left behind.
func (g *Backend) startSandbox(spec engine.StartSpec, restore string) (*sandboxProc, error) {
	p := &sandboxProc{g: g, id: "safe-run-" + uuid.NewString(), restore: restore, mark: spec.Mark, exited: make(chan struct{})}
	if p.mark == nil {
		p.mark = func(string) {}
	}
	log := spec.Log
	if log == nil {
		log = g.log
	}
	p.log = log.With("sandbox", p.id)
	p.dir = filepath.Join(g.cfg.StateDir, p.id)
	g.live.Add(1) // until destroy
	g.liveN.Add(1)
	if err := p.setUp(spec); err != nil {
		_ = p.Destroy()
		if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
			err = &partErr{part: ErrStateDirFull, class: sandbox.ErrExhausted,
				msg: fmt.Sprintf("%v: the state directory %s is full", err, g.cfg.StateDir)}
		}
		return nil, fmt.Errorf("start sandbox %s: %w", p.id, err)
	}
	if spec.Background {
		// A refill: it takes only the CPU runs leave idle until a run
		// needs it (Foreground). runsc has just started; its first
		// milliseconds at the default weight do not matter.
		p.background.Store(true)
		if err := p.cg.setBackground(true); err != nil {
			p.log.Warn("start a refill in the background", "err", err)
		}
	}
	return p, nil
}

// Foreground gives a sandbox started in the background the CPU weight of
// any other run.
func (p *sandboxProc) Foreground() {
	if !p.background.CompareAndSwap(true, false) {
		return
	}
	if err := p.cg.setBackground(false); err != nil {
		p.log.Warn("raise a refill to the foreground", "err", err)
	}
}

func (p *sandboxProc) setUp(start engine.StartSpec) error {
	g := p.g
	job := start.Job
	cfg, err := g.bundleConfig(job, start.KeepAlive)
	if err != nil {
		return err
	}
	if p.lock, err = createRunDir(p.dir); err != nil {
		return err
	}
	if len(job.Network) > 0 {
		if cfg.Network, err = p.setUpNetwork(cfg.Rootfs, job.Network, start.NetworkLimits); err != nil {
			return err
		}
	}
	spec, err := bundle.Build(job, cfg)
	if err != nil {
		return err
	}
	if err := bundle.Write(p.bundleDir(), spec); err != nil {
		return err
	}
	p.mark("bundle_written")
	// The sandbox starts without its CPU limit, which Ready applies before
	// the first request: the limit is for the code requests bring, while
	// runsc's start (or restore, and the engine's prime) is safe-run's own
	// work, a fixed amount done in parallel threads, which took 1.7 times
	// as long under a quota of one CPU (Ready after 425 against 251 ms
	// here). A refill still takes only idle CPU: its weight is the lowest
	// (Background).
	if p.cg, err = newRunCgroup(g.cgroups, p.id, spec.Linux.Resources); err != nil {
		return err
	}
	p.mark("cgroup_created")
	if err := p.startMonitor(); err != nil {
		return err
	}

	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		return err
	}
	stdoutR, stdoutW, err := os.Pipe()
	if err != nil {
		closeFiles(stdinR, stdinW)
		return err
	}
	// runsc's own messages go to a file: a pipe would be inherited by the
	// sandbox and tie our reading to its lifetime.
	logFile, err := os.Create(filepath.Join(p.dir, "runsc.log"))
	if err != nil {
		closeFiles(stdinR, stdinW, stdoutR, stdoutW)
		return err
	}
	err = p.startRunsc(stdinR, stdoutW, logFile)
	closeFiles(stdinR, stdoutW, logFile)
	if err != nil {
		closeFiles(stdinW, stdoutR)
		p.cmd = nil
		close(p.exited)
		return fmt.Errorf("start runsc: %w", err)
	}
	p.mark("runsc_started")
	p.stdin, p.stdout = stdinW, stdoutR
	go func() {
		_ = p.cmd.Wait() // the status is in ProcessState; -1 if killed
		p.runscStatus = -1
		if p.cmd.ProcessState != nil {
			p.runscStatus = p.cmd.ProcessState.ExitCode()
		}
		close(p.exited)
	}()
	if g.cgroups.Mode == CgroupsNone {
		p.mem = p.watchMemory(job.Limits.MemoryBytes)
	}
	return nil
}

// startRunsc starts runsc inside the run's cgroup (see runscCommand) with
// the given standard files.
func (p *sandboxProc) startRunsc(stdin, stdout, stderr *os.File) error {
	for {
		clone := !p.g.noCloneIntoCgroup.Load()
		cmd, dir, err := p.runscCommand(p.runscArgs(), clone)
		if err != nil {
			return err
		}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
		cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
		err = cmd.Start()
		if dir != nil {
			dir.Close()
			if err != nil && clone && cloneIntoCgroupRefused(err) {
				p.log.Info("the kernel refuses to clone into a cgroup; runsc starts through the cgroup shim", "err", err)
				p.g.noCloneIntoCgroup.Store(true)
				continue
			}
		}
		if err == nil {
			p.cmd = cmd
		}
		return err
	}
}

// runscArgs are runsc's arguments for the sandbox: its global flags, then
// run (or restore) of the bundle.
func (p *sandboxProc) runscArgs() []string {
	args := []string{
		"--root", p.runscRoot(),
		"--platform", p.g.cfg.Platform,
	}
	args = append(args, p.runscMonitorArgs()...)
	switch {
	case p.netNS == nil:
		args = append(args, "--network", "none") // the sandbox gets only a loopback interface
	case p.netNS.kind == LinkVeth:
		// With GSO over AF_PACKET, connections stalled after the handshake.
		args = append(args, "--network", "sandbox", "--gso=false")
	default:
		args = append(args, "--network", "sandbox")
	}
	args = append(args,
		"--oci-seccomp",      // apply the bundle's seccomp filter inside gVisor
		"--ignore-cgroups",   // safe-run owns the cgroup and starts runsc inside it
		"--overlay2", "none", // the root is read-only; nothing needs an overlay
	)
	if d := p.g.cfg.DebugLogDir; d != "" {
		args = append(args, "--debug", "--debug-log", filepath.Join(d, p.id)+"/")
	}
	if p.restore != "" {
		return append(args, "restore", "--image-path", p.restore, "--bundle", p.bundleDir(), p.id)
	}
	return append(args, "run", "--bundle", p.bundleDir(), p.id)
}

// kill destroys the sandbox at once and reaps runsc. It does not ask runsc,
// which may be half-way through creating the sandbox: it kills every
// process in the run's cgroup. destroy then removes runsc's state.
func (p *sandboxProc) Kill() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	p.cg.killAll(5 * time.Second)
	select {
	case <-p.exited:
	case <-time.After(5 * time.Second):
		p.log.Error("runsc did not exit after SIGKILL")
		<-p.exited
	}
}

// Usage reads the sandbox's OOM kills and peak memory from its cgroup, or
// from its memory watch where there is none.
func (p *sandboxProc) Usage() engine.Usage {
	if p.mem != nil {
		oomKills, peak := p.mem.usage()
		return engine.Usage{OOMKills: oomKills, PeakBytes: peak}
	}
	oomKills, peak, err := p.cg.usage()
	if err != nil {
		p.log.Warn("read cgroup usage", "err", err)
	}
	return engine.Usage{OOMKills: oomKills, PeakBytes: peak}
}

// runscLogTail returns the last line runsc logged, as ": line", or "".
func (p *sandboxProc) runscLogTail() string {
	data, err := os.ReadFile(filepath.Join(p.dir, "runsc.log"))
	if err != nil {
		return ""
	}
	if line := lastLine(data); line != "" {
		return ": " + line
	}
	return ""
}

// Destroy removes every trace of the sandbox: its processes, the null
// network namespace mount runsc leaves under its root, the state directory
// and the cgroup. It runs whatever happened before, and reports what it
// could not remove. Only the first call does the work (and counts the
// sandbox gone); later ones wait for it and report the same.
func (p *sandboxProc) Destroy() error {
	p.destroyOnce.Do(func() { p.destroyErr = p.remove() })
	return p.destroyErr
}

func (p *sandboxProc) remove() error {
	if p.cmd != nil {
		if p.stdin != nil {
			p.stdin.Close() // a session's agent sees EOF and exits
		}
		select {
		case <-p.exited:
		case <-time.After(2 * time.Second):
			p.Kill()
		}
	}
	if p.mem != nil {
		p.mem.close()
	}
	p.closeMonitor()
	if p.net != nil {
		p.net.kill()
	}
	p.netNS.remove()
	var errs []error
	if err := removeRunDir(p.g, p.dir, p.id); err != nil {
		errs = append(errs, err)
	}
	p.g.removeCgroup(p.id, p.cg)
	if p.g.cgroups.Mode == CgroupsNone {
		p.awaitStragglers(5 * time.Second)
	}
	if p.lock != nil {
		p.lock.Close()
	}
	p.g.liveN.Add(-1)
	p.g.live.Done()
	return errors.Join(errs...)
}

// awaitStragglers waits, for at most d, until no process names the run's
// directory, killing those that do. Without a cgroup nothing else tells
// when the sandbox is gone: runsc's children die of their parent-death
// signal once runsc is killed, but a large one takes a moment to exit.
func (p *sandboxProc) awaitStragglers(d time.Duration) {
	mark := []byte(p.dir + "/")
	for deadline := time.Now().Add(d); ; time.Sleep(10 * time.Millisecond) {
		pids := processesNaming(mark)
		if len(pids) == 0 {
			return
		}
		if time.Now().After(deadline) {
			p.log.Error("sandbox processes did not exit after SIGKILL", "pids", pids)
			return
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// MarkPooled marks the sandbox's run directory with a file, pooledMarker,
// while it waits in the warm pool.
func (p *sandboxProc) MarkPooled(language string) {
	path := filepath.Join(p.dir, pooledMarker)
	if language != "" {
		_ = os.WriteFile(path, []byte(language+"\n"), 0o600)
	} else {
		_ = os.Remove(path)
	}
}

// pooledMarker is a file in the run directory of a sandbox that waits in
// the pool, holding its language, so that operators (and the benchmark)
// can tell it from one that is starting, running or being removed.
const pooledMarker = "pooled"

// processesNaming returns the processes whose command line holds mark.
func processesNaming(mark []byte) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && bytes.Contains(cmdline, mark) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// cleanRunDir force-deletes the container under a run directory if runsc
// left it, unmounts the null network namespace and removes the directory.
func cleanRunDir(g *Backend, dir, id string) error {
	var errs []error
	root := filepath.Join(dir, "runsc")
	if entries, err := os.ReadDir(root); err == nil {
		// `runsc run` removes its container's state when it exits normally;
		// anything else under its root means a sandbox may still be there.
		if slices.ContainsFunc(entries, func(e os.DirEntry) bool { return e.Name() != nullNetNS }) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			// A plain delete right after exit can fail; --force always works.
			if out, err := g.runsc(ctx, root, "delete", "--force", id); err != nil && !isNotExist(out) {
				errs = append(errs, err)
			}
			cancel()
		}
		for unix.Unmount(filepath.Join(root, nullNetNS), unix.MNT_DETACH) == nil {
			// runsc may stack several mounts on the same path.
		}
	}
	unmountNetNS(filepath.Join(dir, netnsFile))
	if err := removeMonitorSockDir(dir); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, fmt.Errorf("remove state directory: %w", err))
	}
	return errors.Join(errs...)
}

// nullNetNS is the network namespace runsc --network=none bind-mounts under
// its root and leaves there.
const nullNetNS = "null-netns"

func isNotExist(runscOutput []byte) bool {
	out := string(runscOutput)
	return out == "" || strings.Contains(out, "does not exist") || strings.Contains(out, "not found")
}

func closeFiles(files ...*os.File) {
	for _, f := range files {
		f.Close()
	}
}
