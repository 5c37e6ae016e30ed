package engine

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"time"

	"github.com/safe-run/safe-run/agent"
	"github.com/safe-run/safe-run/sandbox"
)

// Run runs job in a fresh sandbox and destroys the sandbox afterwards, in
// the background once the result is known (Wait waits for it; a failure
// to remove it is logged). It returns an error only for an invalid job
// (*sandbox.InputError); every other failure is a Result with status
// sandbox_error.
func (e *Engine) Run(ctx context.Context, job sandbox.Job) (sandbox.Result, error) {
	job, lang, err := e.cfg.Policy.Check(job)
	if err != nil {
		return sandbox.Result{}, err
	}
	start := time.Now()
	res := sandbox.Result{ExitCode: -1}
	b := e.pool.take(job)
	pooled := b != nil
	if pooled {
		// What the warm-up and its prime did is not this run's doing.
		takeActivity(b.sb, false)
	}
	// From here the run uses a CPU, and refills leave it to the run.
	booted, over := e.pool.runStarted(!pooled)
	if !pooled {
		b, err = e.startBox(e.spec(job, false), "")
	}
	if err != nil {
		over()
		res = e.sandboxError(res, err)
		res.DurationMS = time.Since(start).Milliseconds()
		return res, nil
	}
	res.SandboxID = b.id()
	res = e.runOnce(ctx, b, job, lang, res, booted)
	over()
	if !pooled {
		res = withNetwork(res, b.sb, true) // pooled sandboxes have no network
	}
	// Logged before the removal starts, which adds to b.phases.
	b.log.Debug("run finished", "language", job.Language, "status", res.Status, "exit_code", res.ExitCode,
		"pooled", pooled, slog.Group("ms_since_start", b.phases...))
	// The result is complete: the caller need not wait for the sandbox's
	// removal (5-10 ms), which Wait still accounts for, so that a server
	// or the CLI exits only once it is over. A removal that fails is
	// logged, not reported in the result, which has gone by then.
	go e.cleanUp(b, pooled)
	res.DurationMS = time.Since(start).Milliseconds()
	return res, nil
}

// cleanUp destroys the sandbox of a run whose result was reported and,
// for a pooled one, lets the pool refill.
func (e *Engine) cleanUp(b *box, pooled bool) {
	if err := b.destroy(); err != nil {
		b.log.Error("clean up sandbox after its run", "err", err)
	}
	if pooled {
		e.pool.released()
	}
}

// runOnce hands the job to a one-shot sandbox and reads the outcome.
// A cold sandbox's booted is called once its agent is ready, or failed
// to be.
func (e *Engine) runOnce(ctx context.Context, b *box, job sandbox.Job, lang sandbox.Language, res sandbox.Result, booted func()) (out sandbox.Result) {
	cold := b.current() == statusStarting
	if cold {
		observe := func(d time.Duration) {
			e.pool.observeCold(job.Language, d)
			if e.cfg.ObserveStart != nil {
				e.cfg.ObserveStart(d)
			}
		}
		err := b.awaitReady(ctx, observe)
		booted()
		if err != nil {
			if ctx.Err() != nil {
				return outcome(res, job, nil, ending{cancelled: true}, 0)
			}
			return e.sandboxError(res, err)
		}
		// The agent's own start (its Go runtime reads /sys/kernel/mm/...)
		// is not what the code did: the run's activity begins with its
		// request, as a pooled sandbox's does.
		takeActivity(b.sb, false)
	}
	req := e.request(job, lang)
	stdout, stderr := newStreams(job)
	b.mark("request")
	asked, cpuAsked := time.Now(), cpuUsed(b.sb, !cold)
	exit, end := b.request(ctx, req, e.eventBudget(job), job.Limits.Timeout+killGrace, stdout, stderr)
	b.mark("answered")
	if exit != nil && exit.Error == "" {
		var cpu time.Duration
		if used := cpuUsed(b.sb, e.pool != nil); used > cpuAsked {
			cpu = used - cpuAsked
		}
		e.pool.observeRun(job.Language, cold, time.Since(asked), cpu)
	}
	if exit == nil {
		// Whatever ended the sandbox, its usage has the last word only
		// once its processes are gone.
		<-b.sb.Exited()
		b.mark("exited")
	}
	usage := b.sb.Usage()
	b.mark("usage_read")
	res.MemoryPeakBytes = usage.PeakBytes
	res = finishStreams(res, exit, stdout, stderr)
	res.Files = e.outputFiles(job, exit)
	// The program has ended: what it did is the run's activity. A kill
	// rule that fired explains the sandbox's end before anything else.
	act := takeActivity(b.sb, true)
	if ruleHit(act, actionKill) != nil {
		return withActivity(res, act)
	}
	defer func() { out = withActivity(out, act) }()
	if exit == nil && !end.timedOut && !end.cancelled && usage.OOMKills == 0 {
		if end.err == nil {
			end.err = fmt.Errorf("the sandbox ended without a report (%s)", b.sb.ExitReport())
		}
		return e.sandboxError(res, end.err)
	}
	if exit != nil && exit.Error != "" && usage.OOMKills == 0 {
		return e.sandboxError(res, fmt.Errorf("could not run the %s program: %s", lang.Name, exit.Error))
	}
	return outcome(res, job, exit, end, usage.OOMKills)
}

// sandboxError makes res a sandbox_error explained by err.
func (e *Engine) sandboxError(res sandbox.Result, err error) sandbox.Result {
	res.Status = sandbox.StatusSandboxError
	res.ExitCode = -1
	res.Message = err.Error()
	if sandbox.Class(err) == nil {
		err = sandbox.WithClass(err, sandbox.ErrUnavailable)
	}
	res.Err = err
	e.log.Error("sandbox failed", "sandbox", res.SandboxID, "err", err)
	return res
}

// outcome classifies how a request ended: first by the cgroup's OOM kills
// (gVisor cannot report them), then by the host's own deadline or the
// caller, then by the agent's report.
func outcome(res sandbox.Result, job sandbox.Job, exit *agent.Exit, end ending, oomKills uint64) sandbox.Result {
	limits := job.Limits
	res.ExitCode = -1
	switch {
	case oomKills > 0:
		res.Status = sandbox.StatusOOM
		res.Message = fmt.Sprintf("the program exceeded its memory limit of %s and the sandbox was killed", sandbox.FormatBytes(limits.MemoryBytes))
	case exit != nil && exit.InstallFailed:
		return installFailed(res, exit, limits.Timeout)
	case end.timedOut || exit != nil && exit.TimedOut:
		res.Status = sandbox.StatusTimeout
		res.Message = fmt.Sprintf("the program did not finish within its %s timeout and was killed", limits.Timeout)
	case end.cancelled:
		res.Status = sandbox.StatusKilled
		res.Message = "the run was cancelled and its sandbox killed"
	case exit.Signal != "":
		res.Status = sandbox.StatusKilled
		res.Signal = exit.Signal
		res.Message = "the program was killed by " + exit.Signal
	case exit.Code == 0:
		res.Status = sandbox.StatusOK
		res.ExitCode = 0
	default:
		res.Status = sandbox.StatusError
		res.ExitCode = exit.Code
		res.Message = fmt.Sprintf("the program exited with code %d", exit.Code)
	}
	return res
}

// newStreams assembles the job's stdout and stderr, forwarding them live
// to its writers.
func newStreams(job sandbox.Job) (stdout, stderr *stream) {
	return &stream{capture: agent.Capture{Max: job.Limits.OutputBytes}, live: job.Stdout},
		&stream{capture: agent.Capture{Max: job.Limits.OutputBytes}, live: job.Stderr}
}

// finishStreams puts the assembled output in res.
func finishStreams(res sandbox.Result, exit *agent.Exit, stdout, stderr *stream) sandbox.Result {
	var outTotal, errTotal int64
	var outTail, errTail []byte
	if exit != nil {
		outTotal, errTotal, outTail, errTail = exit.StdoutBytes, exit.StderrBytes, exit.StdoutTail, exit.StderrTail
	}
	res.Stdout, res.StdoutTruncated, res.StdoutBytes = stdout.result(outTotal, outTail)
	res.Stderr, res.StderrTruncated, res.StderrBytes = stderr.result(errTotal, errTail)
	return res
}

// request is the agent request that runs job as a new process.
func (e *Engine) request(job sandbox.Job, lang sandbox.Language) agent.Request {
	files := []agent.File{{Path: lang.Filename, Data: []byte(job.Code)}}
	req := agent.Request{
		Files:       append(files, agentFiles(job.Files)...),
		Argv:        lang.Command,
		Stdin:       job.Stdin,
		Env:         job.Env,
		Timeout:     job.Limits.Timeout,
		OutputBytes: job.Limits.OutputBytes,
		Collect:     e.collect(job),
	}
	return e.withPackages(req, job, lang)
}

func agentFiles(files []sandbox.File) []agent.File {
	var out []agent.File
	for _, f := range files {
		mode := uint32(0o644)
		if f.Executable {
			mode = 0o755
		}
		out = append(out, agent.File{Path: f.Path, Data: f.Data, Mode: mode})
	}
	return out
}

// collect asks for the job's output directory, within the policy's caps.
func (e *Engine) collect(job sandbox.Job) *agent.Collect {
	if job.OutputDir == "" {
		return nil
	}
	l := e.cfg.Policy.OutputFileLimits()
	return &agent.Collect{Dir: job.OutputDir, MaxFiles: l.MaxFiles, MaxFileBytes: l.MaxFileBytes, MaxTotalBytes: l.MaxTotalBytes}
}

// eventBudget is how many bytes of events one request of job may bring:
// its output and files base64-encoded (4/3 larger), plus framing.
func (e *Engine) eventBudget(job sandbox.Job) int64 {
	budget := 4*job.Limits.OutputBytes + 1<<20
	if job.OutputDir != "" {
		budget += 2 * e.cfg.Policy.OutputFileLimits().MaxTotalBytes
	}
	return budget
}

// outputFiles checks the files the agent returned against the policy's
// caps, as it would have applied them, and keeps only what passes.
func (e *Engine) outputFiles(job sandbox.Job, exit *agent.Exit) []sandbox.OutputFile {
	if exit == nil || job.OutputDir == "" {
		return nil
	}
	l := e.cfg.Policy.OutputFileLimits()
	var (
		out   []sandbox.OutputFile
		total int64
	)
	for _, f := range exit.Files {
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

// cpuUsed reads the CPU sb used so far if want says so and its backend
// can tell (CPUMeter), and is 0 otherwise.
func cpuUsed(sb Sandbox, want bool) time.Duration {
	if m, ok := sb.(CPUMeter); ok && want {
		if d, err := m.CPUUsed(); err == nil {
			return d
		}
	}
	return 0
}
