package runtime

import (
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
	"syscall"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"

	"github.com/safe-run/safe-run/agent"
	"github.com/safe-run/safe-run/bundle"
	"github.com/safe-run/safe-run/sandbox"
)

// Run runs job in a fresh sandbox and destroys the sandbox afterwards. It
// returns an error only for an invalid job (*sandbox.InputError); every
// other failure is a Result with status sandbox_error.
func (rt *Runtime) Run(ctx context.Context, job sandbox.Job) (sandbox.Result, error) {
	job, lang, err := rt.cfg.Policy.Check(job)
	if err != nil {
		return sandbox.Result{}, err
	}
	rt.live.Add(1)
	defer rt.live.Done()
	start := time.Now()
	r := &run{
		rt:    rt,
		id:    "safe-run-" + uuid.NewString(),
		job:   job,
		lang:  lang,
		start: start,
	}
	r.dir = filepath.Join(rt.cfg.StateDir, r.id)
	res := r.execute(ctx)
	if err := r.cleanup(); err != nil {
		rt.log.Error("clean up sandbox", "id", r.id, "err", err)
		if res.Status == sandbox.StatusOK || res.Status == sandbox.StatusError {
			res.Message = "the run finished, but cleaning up its sandbox failed: " + err.Error()
		}
	}
	r.mark("cleaned_up")
	res.DurationMS = time.Since(start).Milliseconds()
	rt.log.Debug("run finished", "id", r.id, "language", job.Language, "status", res.Status,
		"exit_code", res.ExitCode, "duration_ms", res.DurationMS, slog.Group("ms_since_start", r.phases...))
	return res, nil
}

// run is one sandbox's life.
type run struct {
	rt   *Runtime
	id   string
	dir  string // state directory of the run: bundle/, runsc/ (runsc --root), runsc.log
	job  sandbox.Job
	lang sandbox.Language
	cg   *runCgroup

	start  time.Time
	phases []any // slog attributes: milliseconds from start to each phase

	stdout, stderr stream
	ready          chan struct{} // closed when the agent says it is up
	exit           *agent.Exit   // the agent's report, if it came
	protoErr       error         // a malformed or oversized event stream
}

// mark records that a phase of the run was reached, for debug logs.
func (r *run) mark(phase string) {
	r.phases = append(r.phases, slog.Float64(phase, float64(time.Since(r.start).Microseconds())/1000))
}

func (r *run) bundleDir() string { return filepath.Join(r.dir, "bundle") }
func (r *run) runscRoot() string { return filepath.Join(r.dir, "runsc") }

// execute runs the sandbox to its end and classifies the outcome.
func (r *run) execute(ctx context.Context) sandbox.Result {
	res := sandbox.Result{SandboxID: r.id, ExitCode: -1}
	fail := func(err error) sandbox.Result {
		res.Status = sandbox.StatusSandboxError
		res.Message = err.Error()
		r.rt.log.Error("sandbox failed", "id", r.id, "err", err)
		return res
	}
	spec, err := bundle.Build(r.job, bundle.Config{Rootfs: r.rt.cfg.Rootfs, Agent: r.rt.cfg.Agent})
	if err != nil {
		return fail(err)
	}
	if err := os.Mkdir(r.dir, 0o700); err != nil {
		return fail(fmt.Errorf("create state directory of %s: %w", r.id, err))
	}
	if err := bundle.Write(r.bundleDir(), spec); err != nil {
		return fail(err)
	}
	r.mark("bundle_written")
	if r.cg, err = newRunCgroup(r.rt.cgroups, r.id, spec.Linux.Resources); err != nil {
		return fail(err)
	}
	r.mark("cgroup_created")

	r.stdout = stream{capture: agent.Capture{Max: r.job.Limits.OutputBytes}, live: r.job.Stdout}
	r.stderr = stream{capture: agent.Capture{Max: r.job.Limits.OutputBytes}, live: r.job.Stderr}
	ended, err := r.launch(ctx)
	if err != nil {
		return fail(err)
	}
	r.mark("runsc_exited")

	oomKills, peak, usageErr := r.cg.usage()
	if usageErr != nil {
		r.rt.log.Warn("read cgroup usage", "id", r.id, "err", usageErr)
	}
	res.MemoryPeakBytes = peak
	res.Stdout, res.StdoutTruncated, res.StdoutBytes = r.stdout.result(r.exitTotal(agent.Stdout), r.exitTail(agent.Stdout))
	res.Stderr, res.StderrTruncated, res.StderrBytes = r.stderr.result(r.exitTotal(agent.Stderr), r.exitTail(agent.Stderr))
	res.Files = r.outputFiles()

	limits := r.job.Limits
	switch {
	case oomKills > 0:
		res.Status = sandbox.StatusOOM
		res.Message = fmt.Sprintf("the program exceeded its memory limit of %s and the sandbox was killed", sandbox.FormatBytes(limits.MemoryBytes))
	case ended.timedOut || r.exit != nil && r.exit.TimedOut:
		res.Status = sandbox.StatusTimeout
		res.Message = fmt.Sprintf("the program did not finish within its %s timeout and was killed", limits.Timeout)
	case ended.cancelled:
		res.Status = sandbox.StatusKilled
		res.Message = "the run was cancelled and its sandbox killed"
	case ended.err != nil:
		return fail(ended.err)
	case r.exit == nil:
		return fail(fmt.Errorf("the sandbox ended without a report (runsc exit status %d%s)", ended.runscStatus, r.runscLogTail()))
	case r.exit.Error != "":
		return fail(fmt.Errorf("could not run the %s program: %s", r.lang.Name, r.exit.Error))
	case r.exit.Signal != "":
		res.Status = sandbox.StatusKilled
		res.Signal = r.exit.Signal
		res.Message = "the program was killed by " + r.exit.Signal
	case r.exit.Code == 0:
		res.Status = sandbox.StatusOK
		res.ExitCode = 0
	default:
		res.Status = sandbox.StatusError
		res.ExitCode = r.exit.Code
		res.Message = fmt.Sprintf("the program exited with code %d", r.exit.Code)
	}
	if r.protoErr != nil && res.Status != sandbox.StatusOOM && res.Status != sandbox.StatusTimeout {
		return fail(r.protoErr)
	}
	return res
}

// ending says how the runsc process came to end.
type ending struct {
	runscStatus int  // exit status of runsc run, -1 if killed
	timedOut    bool // the host's hard deadline passed
	cancelled   bool // the caller's context ended
	err         error
}

// launch runs `runsc run` inside the run's cgroup, hands the agent its
// request and waits for the end, enforcing the host's own deadline.
func (r *run) launch(ctx context.Context) (ending, error) {
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		return ending{}, err
	}
	stdoutR, stdoutW, err := os.Pipe()
	if err != nil {
		stdinR.Close()
		stdinW.Close()
		return ending{}, err
	}
	// runsc's own messages go to a file: a pipe would be inherited by the
	// sandbox and tie our reading to its lifetime.
	logFile, err := os.Create(filepath.Join(r.dir, "runsc.log"))
	if err != nil {
		closeFiles(stdinR, stdinW, stdoutR, stdoutW)
		return ending{}, err
	}
	cmd := exec.Command(r.rt.cfg.Shim, r.shimArgs()...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdinR, stdoutW, logFile
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err = cmd.Start()
	closeFiles(stdinR, stdoutW, logFile)
	if err != nil {
		closeFiles(stdinW, stdoutR)
		return ending{}, fmt.Errorf("start runsc: %w", err)
	}
	r.mark("runsc_started")

	r.ready = make(chan struct{})
	events := make(chan struct{})
	go func() { defer close(events); r.readEvents(stdoutR) }()
	go func() {
		// The pipe holds 64 KiB; larger requests wait for the agent to read.
		_ = json.NewEncoder(stdinW).Encode(r.request())
		stdinW.Close()
	}()
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()

	var end ending
	deadline := time.NewTimer(startTimeout)
	defer deadline.Stop()
	ready := r.ready
	for done := false; !done; {
		select {
		case <-waited:
			end.runscStatus = exitStatus(cmd.ProcessState)
			done = true
		case <-ready:
			ready = nil
			deadline.Reset(r.job.Limits.Timeout + killGrace)
		case <-deadline.C:
			if ready != nil {
				end.err = fmt.Errorf("%w within %s%s", errNotStarted, startTimeout, r.runscLogTail())
			} else {
				end.timedOut = true
			}
			r.kill(cmd, waited)
			done = true
		case <-ctx.Done():
			end.cancelled = true
			r.kill(cmd, waited)
			done = true
		}
	}
	// Once runsc is gone, so is every writer of the event pipe; allow a
	// moment for the last events, then stop reading regardless.
	select {
	case <-events:
	case <-time.After(2 * time.Second):
		stdoutR.Close()
		<-events
	}
	stdoutR.Close()
	return end, nil
}

// kill destroys the sandbox at once and reaps runsc. It does not ask runsc,
// which may be half-way through creating the sandbox: it kills every
// process in the run's cgroup. cleanup then removes runsc's state.
func (r *run) kill(cmd *exec.Cmd, waited <-chan error) {
	_ = cmd.Process.Kill()
	r.cg.killAll(5 * time.Second)
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		r.rt.log.Error("runsc did not exit after SIGKILL", "id", r.id)
		<-waited
	}
}

// shimArgs are the shim's arguments: the cgroup files to join, then the
// runsc command line.
func (r *run) shimArgs() []string {
	args := []string{ShimCommand}
	args = append(args, r.cg.procsFiles()...)
	args = append(args, "--", r.rt.cfg.Runsc,
		"--root", r.runscRoot(),
		"--platform", r.rt.cfg.Platform,
		"--network", "none", // the sandbox gets only a loopback interface
		"--oci-seccomp",      // apply the bundle's seccomp filter inside gVisor
		"--ignore-cgroups",   // safe-run owns the cgroup and starts runsc inside it
		"--overlay2", "none", // the root is read-only; nothing needs an overlay
	)
	if d := r.rt.cfg.DebugLogDir; d != "" {
		args = append(args, "--debug", "--debug-log", filepath.Join(d, r.id)+"/")
	}
	return append(args, "run", "--bundle", r.bundleDir(), r.id)
}

func (r *run) request() agent.Request {
	files := []agent.File{{Path: r.lang.Filename, Data: []byte(r.job.Code)}}
	for _, f := range r.job.Files {
		mode := uint32(0o644)
		if f.Executable {
			mode = 0o755
		}
		files = append(files, agent.File{Path: f.Path, Data: f.Data, Mode: mode})
	}
	req := agent.Request{
		Files:       files,
		Argv:        r.lang.Command,
		Stdin:       r.job.Stdin,
		Timeout:     r.job.Limits.Timeout,
		OutputBytes: r.job.Limits.OutputBytes,
	}
	if r.job.OutputDir != "" {
		l := r.rt.cfg.Policy.OutputFileLimits()
		req.Collect = &agent.Collect{Dir: r.job.OutputDir, MaxFiles: l.MaxFiles, MaxFileBytes: l.MaxFileBytes, MaxTotalBytes: l.MaxTotalBytes}
	}
	return req
}

// outputFiles checks the files the agent returned against the policy's
// caps, as it would have applied them, and keeps only what passes.
func (r *run) outputFiles() []sandbox.OutputFile {
	if r.exit == nil || r.job.OutputDir == "" {
		return nil
	}
	l := r.rt.cfg.Policy.OutputFileLimits()
	var (
		out   []sandbox.OutputFile
		total int64
	)
	for _, f := range r.exit.Files {
		if len(out) == l.MaxFiles {
			break
		}
		if sandbox.CheckPath(f.Path) != nil {
			continue // not a name the agent could have found; drop it
		}
		o := sandbox.OutputFile{Path: f.Path, Size: max(f.Size, int64(len(f.Data))), Skipped: f.Skipped}
		switch {
		case f.Skipped != "":
		case int64(len(f.Data)) > l.MaxFileBytes:
			o.Skipped = "larger than the per-file limit"
		case total+int64(len(f.Data)) > l.MaxTotalBytes:
			o.Skipped = "over the total limit of output files"
		default:
			o.Data = f.Data
			total += int64(len(f.Data))
		}
		out = append(out, o)
	}
	return out
}

// readEvents reads the agent's events until the pipe ends. The agent runs
// beside untrusted code, so its stream is bounded and checked.
func (r *run) readEvents(pipe io.Reader) {
	// Base64 makes data 4/3 larger; the rest is framing.
	limit := 4*r.job.Limits.OutputBytes + 1<<20
	if r.job.OutputDir != "" {
		limit += 2 * r.rt.cfg.Policy.OutputFileLimits().MaxTotalBytes
	}
	lr := &io.LimitedReader{R: pipe, N: limit}
	dec := json.NewDecoder(lr)
	readyOnce := false
	for {
		var ev agent.Event
		if err := dec.Decode(&ev); err != nil {
			if lr.N <= 0 {
				r.protoErr = fmt.Errorf("the sandbox sent more than %d bytes of events", limit)
			} else if !errors.Is(err, io.EOF) && r.exit == nil {
				r.protoErr = fmt.Errorf("malformed event from the sandbox: %w", err)
			}
			io.Copy(io.Discard, pipe) // keep the writers from blocking until they die
			return
		}
		switch {
		case ev.Ready != nil && !readyOnce:
			readyOnce = true
			r.mark("agent_ready")
			close(r.ready)
		case ev.Output != nil && ev.Output.Stream == agent.Stdout:
			r.stdout.write(ev.Output.Data)
		case ev.Output != nil && ev.Output.Stream == agent.Stderr:
			r.stderr.write(ev.Output.Data)
		case ev.Exit != nil && r.exit == nil:
			r.mark("program_exited")
			r.exit = ev.Exit
		}
	}
}

func (r *run) exitTotal(s agent.Stream) int64 {
	switch {
	case r.exit == nil:
		return 0
	case s == agent.Stdout:
		return r.exit.StdoutBytes
	default:
		return r.exit.StderrBytes
	}
}

func (r *run) exitTail(s agent.Stream) []byte {
	switch {
	case r.exit == nil:
		return nil
	case s == agent.Stdout:
		return r.exit.StdoutTail
	default:
		return r.exit.StderrTail
	}
}

// runscLogTail returns the last line runsc logged, as ": line", or "".
func (r *run) runscLogTail() string {
	data, err := os.ReadFile(filepath.Join(r.dir, "runsc.log"))
	if err != nil {
		return ""
	}
	if line := lastLine(data); line != "" {
		return ": " + line
	}
	return ""
}

// cleanup removes every trace of the run: the sandbox, the null network
// namespace mount runsc leaves under its root, the state directory and the
// cgroup. It runs whatever happened before, and reports what it could not
// remove.
func (r *run) cleanup() error {
	var errs []error
	if entries, err := os.ReadDir(r.runscRoot()); err == nil {
		// `runsc run` removes its container's state when it exits normally;
		// anything else under its root means a sandbox may still be there.
		if slices.ContainsFunc(entries, func(e os.DirEntry) bool { return e.Name() != nullNetNS }) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			// A plain delete right after exit can fail; --force always works.
			if out, err := r.rt.runsc(ctx, r.runscRoot(), "delete", "--force", r.id); err != nil && !isNotExist(out) {
				errs = append(errs, err)
			}
			cancel()
		}
		for unix.Unmount(filepath.Join(r.runscRoot(), nullNetNS), unix.MNT_DETACH) == nil {
			// runsc may stack several mounts on the same path.
		}
	}
	if err := os.RemoveAll(r.dir); err != nil {
		errs = append(errs, fmt.Errorf("remove state directory: %w", err))
	}
	if r.cg != nil {
		if err := r.cg.destroy(); err != nil {
			errs = append(errs, err)
		}
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

// exitStatus is runsc's exit code, or -1 if it was killed or never ran.
func exitStatus(ps *os.ProcessState) int {
	if ps == nil {
		return -1
	}
	return ps.ExitCode()
}

func closeFiles(files ...*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// stream assembles one output stream from the agent's events.
type stream struct {
	capture agent.Capture
	live    io.Writer // the job's live writer, or nil
}

func (s *stream) write(p []byte) {
	before := len(s.capture.Head())
	s.capture.Write(p)
	if s.live != nil {
		// Forward only what the capture kept in its head, so the live copy
		// is bounded exactly as the result is.
		if grown := s.capture.Head()[before:]; len(grown) > 0 {
			_, _ = s.live.Write(grown)
		}
	}
}

// result renders the stream: its head, a marker where bytes were omitted,
// and its tail. claimed is the total the agent reported producing; the
// count can only add to what arrived, never hide it.
func (s *stream) result(claimed int64, tail []byte) (text string, truncated bool, total int64) {
	headLen := len(s.capture.Head())
	s.capture.Write(tail)
	head := s.capture.Head()
	kept := s.capture.Tail()
	total = max(claimed, s.capture.Total())
	omitted := total - int64(len(head)) - int64(len(kept))
	out := make([]byte, 0, len(head)+len(kept)+64)
	out = append(out, head...)
	if omitted > 0 {
		out = append(out, OmittedMarker(omitted)...)
	}
	out = append(out, kept...)
	if s.live != nil {
		_, _ = s.live.Write(out[headLen:])
	}
	return string(out), omitted > 0, total
}

// OmittedMarker is the line put between the head and the tail of an output
// stream from which bytes were dropped.
func OmittedMarker(n int64) string {
	return "\n[... safe-run omitted " + strconv.FormatInt(n, 10) + " bytes of output ...]\n"
}
