package runtime

import (
	"bytes"
	"context"
	"encoding/json"
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

	"github.com/safe-run/safe-run/agent"
	"github.com/safe-run/safe-run/bundle"
	"github.com/safe-run/safe-run/sandbox"
)

// sandboxProc is one gVisor sandbox whose first process is the agent: from
// `runsc run` to the removal of everything it left on the host. A one-shot
// run uses it for one request; a session for many.
type sandboxProc struct {
	rt   *Runtime
	id   string
	dir  string   // bundle/, runsc/ (runsc --root), runsc.log, lock
	lock *os.File // held while the sandbox lives; see reapStale
	cg   *runCgroup
	mem  *memoryWatch // the memory limit where there is no cgroup, else nil
	cmd  *exec.Cmd

	sendMu sync.Mutex
	stdin  *os.File
	events chan agent.Event // from the agent, in order; closed when its stream ends
	// eventsErr says why the stream ended early; read after events closes.
	eventsErr error
	budget    eventBudget

	restore string // the checkpoint image the sandbox starts from, if any
	ready   bool   // the agent has answered: Ready, or a request after a restore

	exited      chan struct{} // closed when runsc has exited
	runscStatus int           // its exit status, -1 if killed; read after exited closes

	start  time.Time
	phases []any // slog attributes: milliseconds from start to each phase

	destroyOnce sync.Once
	destroyErr  error
}

// mark records that the sandbox reached a phase, for debug logs.
func (p *sandboxProc) mark(phase string) {
	p.phases = append(p.phases, slog.Float64(phase, float64(time.Since(p.start).Microseconds())/1000))
}

func (p *sandboxProc) bundleDir() string { return filepath.Join(p.dir, "bundle") }
func (p *sandboxProc) runscRoot() string { return filepath.Join(p.dir, "runsc") }

// startSandbox writes the bundle for job, creates the cgroup and starts
// runsc inside it: a new sandbox, or, if restore names a checkpoint image,
// the sandbox saved there. The sandbox serves one request if oneShot, else
// many. On error nothing is left behind.
func (rt *Runtime) startSandbox(job sandbox.Job, oneShot bool, restore string) (*sandboxProc, error) {
	p := &sandboxProc{
		rt: rt, id: "safe-run-" + uuid.NewString(), start: time.Now(), restore: restore,
		events: make(chan agent.Event, 64), exited: make(chan struct{}),
	}
	p.dir = filepath.Join(rt.cfg.StateDir, p.id)
	rt.live.Add(1) // until destroy
	rt.liveN.Add(1)
	if err := p.setUp(job, oneShot); err != nil {
		p.destroy()
		if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
			err = fmt.Errorf("%w: the state directory %s is full; free space there or choose another with --state-dir or SAFE_RUN_STATE_DIR", err, rt.cfg.StateDir)
		}
		return nil, err
	}
	return p, nil
}

func (p *sandboxProc) setUp(job sandbox.Job, oneShot bool) error {
	rt := p.rt
	cfg, err := rt.bundleConfig(job, !oneShot)
	if err != nil {
		return err
	}
	spec, err := bundle.Build(job, cfg)
	if err != nil {
		return err
	}
	if err := os.Mkdir(p.dir, 0o700); err != nil {
		return fmt.Errorf("create state directory of %s: %w", p.id, err)
	}
	if p.lock, err = lockRunDir(p.dir); err != nil {
		return err
	}
	if err := bundle.Write(p.bundleDir(), spec); err != nil {
		return err
	}
	p.mark("bundle_written")
	if p.cg, err = newRunCgroup(rt.cgroups, p.id, spec.Linux.Resources); err != nil {
		return err
	}
	p.mark("cgroup_created")

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
	p.cmd = exec.Command(rt.cfg.Shim, p.shimArgs()...)
	p.cmd.Stdin, p.cmd.Stdout, p.cmd.Stderr = stdinR, stdoutW, logFile
	p.cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err = p.cmd.Start()
	closeFiles(stdinR, stdoutW, logFile)
	if err != nil {
		closeFiles(stdinW, stdoutR)
		p.cmd = nil
		close(p.exited)
		close(p.events)
		return fmt.Errorf("start runsc: %w", err)
	}
	p.mark("runsc_started")
	p.stdin = stdinW
	go func() {
		_ = p.cmd.Wait() // the status is in ProcessState; -1 if killed
		p.runscStatus = -1
		if p.cmd.ProcessState != nil {
			p.runscStatus = p.cmd.ProcessState.ExitCode()
		}
		close(p.exited)
	}()
	go p.readEvents(stdoutR)
	if rt.cgroups.Mode == CgroupsNone {
		p.mem = p.watchMemory(job.Limits.MemoryBytes)
	}
	return nil
}

// shimArgs are the shim's arguments: the cgroup files to join, then the
// runsc command line.
func (p *sandboxProc) shimArgs() []string {
	args := []string{ShimCommand}
	args = append(args, p.cg.procsFiles()...)
	args = append(args, "--", p.rt.cfg.Runsc,
		"--root", p.runscRoot(),
		"--platform", p.rt.cfg.Platform,
		"--network", "none", // the sandbox gets only a loopback interface
		"--oci-seccomp",      // apply the bundle's seccomp filter inside gVisor
		"--ignore-cgroups",   // safe-run owns the cgroup and starts runsc inside it
		"--overlay2", "none", // the root is read-only; nothing needs an overlay
	)
	if d := p.rt.cfg.DebugLogDir; d != "" {
		args = append(args, "--debug", "--debug-log", filepath.Join(d, p.id)+"/")
	}
	if p.restore != "" {
		return append(args, "restore", "--image-path", p.restore, "--bundle", p.bundleDir(), p.id)
	}
	return append(args, "run", "--bundle", p.bundleDir(), p.id)
}

// eventBudget bounds the bytes the agent may send for one request. The
// agent runs beside untrusted code, so its stream is treated as untrusted.
type eventBudget struct {
	left atomic.Int64
}

// reset gives the next request n bytes.
func (b *eventBudget) reset(n int64) { b.left.Store(n) }

type budgetReader struct {
	r io.Reader
	b *eventBudget
}

var errOverBudget = errors.New("the sandbox sent more event data than the request allows")

func (br budgetReader) Read(p []byte) (int, error) {
	n, err := br.r.Read(p)
	if br.b.left.Add(-int64(n)) < 0 {
		return n, errOverBudget
	}
	return n, err
}

// readEvents decodes the agent's events until its stream ends.
func (p *sandboxProc) readEvents(pipe *os.File) {
	defer close(p.events)
	defer pipe.Close()
	p.budget.reset(1 << 20) // the Ready event and its framing
	dec := json.NewDecoder(budgetReader{pipe, &p.budget})
	for {
		var ev agent.Event
		if err := dec.Decode(&ev); err != nil {
			switch {
			case errors.Is(err, errOverBudget):
				p.eventsErr = err
			case !errors.Is(err, io.EOF) && !errors.Is(err, os.ErrClosed):
				p.eventsErr = fmt.Errorf("malformed event from the sandbox: %w", err)
			}
			// Keep the writers from blocking until they die.
			_, _ = io.Copy(io.Discard, pipe)
			return
		}
		p.events <- ev
	}
}

// observeStart reports how long the sandbox took to be ready.
func (p *sandboxProc) observeStart() {
	if observe := p.rt.cfg.ObserveStart; observe != nil {
		observe(time.Since(p.start))
	}
}

// awaitReady waits for the agent's Ready event.
func (p *sandboxProc) awaitReady(ctx context.Context) error {
	timer := time.NewTimer(startTimeout)
	defer timer.Stop()
	for {
		select {
		case ev, ok := <-p.events:
			switch {
			case !ok:
				<-p.exited
				return fmt.Errorf("%w (runsc exit status %d%s)", errNotStarted, p.runscStatus, p.runscLogTail())
			case ev.Ready != nil:
				p.mark("agent_ready")
				if _, err := p.mem.locate(); err != nil {
					p.kill()
					return err
				}
				p.ready = true
				p.observeStart()
				return nil
			}
		case <-timer.C:
			p.kill()
			return fmt.Errorf("%w within %s%s", errNotStarted, startTimeout, p.runscLogTail())
		case <-ctx.Done():
			p.kill()
			return ctx.Err()
		}
	}
}

// ending says how a request ended when the agent did not answer it.
type ending struct {
	timedOut  bool // the host's deadline passed and the sandbox was killed
	cancelled bool // the caller's context ended and the sandbox was killed
	err       error
}

// request sends req to the agent and waits for its Exit, passing output
// to stdout and stderr, for at most deadline. If the deadline passes or
// ctx ends first, the sandbox is killed.
func (p *sandboxProc) request(ctx context.Context, req agent.Request, budget int64, deadline time.Duration, stdout, stderr *stream) (*agent.Exit, ending) {
	p.budget.reset(budget)
	go func() {
		// The pipe holds 64 KiB; larger requests wait for the agent to read.
		// If the agent is gone, the write fails and the end of its event
		// stream tells what happened.
		p.sendMu.Lock()
		defer p.sendMu.Unlock()
		_ = json.NewEncoder(p.stdin).Encode(req)
	}()
	timer := time.NewTimer(deadline)
	defer timer.Stop()
	for {
		select {
		case ev, ok := <-p.events:
			switch {
			case !ok:
				select {
				case <-p.exited:
				case <-time.After(5 * time.Second):
				}
				return nil, ending{err: p.eventsErr}
			case ev.Output != nil && ev.Output.Stream == agent.Stdout && stdout != nil:
				stdout.write(ev.Output.Data)
			case ev.Output != nil && ev.Output.Stream == agent.Stderr && stderr != nil:
				stderr.write(ev.Output.Data)
			case ev.Exit != nil:
				p.ready = true
				return ev.Exit, ending{}
			}
		case <-timer.C:
			p.kill()
			return nil, ending{timedOut: true}
		case <-ctx.Done():
			p.kill()
			return nil, ending{cancelled: true}
		}
	}
}

// kill destroys the sandbox at once and reaps runsc. It does not ask runsc,
// which may be half-way through creating the sandbox: it kills every
// process in the run's cgroup. destroy then removes runsc's state.
func (p *sandboxProc) kill() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	p.cg.killAll(5 * time.Second)
	select {
	case <-p.exited:
	case <-time.After(5 * time.Second):
		p.rt.log.Error("runsc did not exit after SIGKILL", "id", p.id)
		<-p.exited
	}
}

// usage reads the sandbox's OOM kills and peak memory from its cgroup.
func (p *sandboxProc) usage() (oomKills uint64, peak int64) {
	if p.mem != nil {
		return p.mem.usage()
	}
	oomKills, peak, err := p.cg.usage()
	if err != nil {
		p.rt.log.Warn("read cgroup usage", "id", p.id, "err", err)
	}
	return oomKills, peak
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

// destroy removes every trace of the sandbox: its processes, the null
// network namespace mount runsc leaves under its root, the state directory
// and the cgroup. It runs whatever happened before, and reports what it
// could not remove. Only the first call does the work (and counts the
// sandbox gone); later ones wait for it and report the same.
func (p *sandboxProc) destroy() error {
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
			p.kill()
		}
	}
	if p.mem != nil {
		p.mem.close()
	}
	var errs []error
	if err := cleanRunDir(p.rt, p.dir, p.id); err != nil {
		errs = append(errs, err)
	}
	p.rt.removeCgroup(p.id, p.cg)
	if p.rt.cgroups.Mode == CgroupsNone {
		p.awaitStragglers(5 * time.Second)
	}
	if p.lock != nil {
		p.lock.Close()
	}
	p.mark("cleaned_up")
	p.rt.liveN.Add(-1)
	p.rt.live.Done()
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
			p.rt.log.Error("sandbox processes did not exit after SIGKILL", "id", p.id, "pids", pids)
			return
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

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
func cleanRunDir(rt *Runtime, dir, id string) error {
	var errs []error
	root := filepath.Join(dir, "runsc")
	if entries, err := os.ReadDir(root); err == nil {
		// `runsc run` removes its container's state when it exits normally;
		// anything else under its root means a sandbox may still be there.
		if slices.ContainsFunc(entries, func(e os.DirEntry) bool { return e.Name() != nullNetNS }) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			// A plain delete right after exit can fail; --force always works.
			if out, err := rt.runsc(ctx, root, "delete", "--force", id); err != nil && !isNotExist(out) {
				errs = append(errs, err)
			}
			cancel()
		}
		for unix.Unmount(filepath.Join(root, nullNetNS), unix.MNT_DETACH) == nil {
			// runsc may stack several mounts on the same path.
		}
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
