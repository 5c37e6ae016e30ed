package engine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"path"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/safe-run/safe-run/agent"
	"github.com/safe-run/safe-run/egress"
	"github.com/safe-run/safe-run/sandbox"
)

// SessionConfig bounds sessions. Zero fields take the defaults.
type SessionConfig struct {
	// MaxSessions is the most live sessions (default 8).
	MaxSessions int
	// IdleTimeout ends a session unused this long (default 10 min).
	IdleTimeout time.Duration
	// MaxLifetime ends a session this long after it began (default 1 h).
	MaxLifetime time.Duration
	// SweepStore makes the engine also end, once idle or too old, the
	// sessions of the backend's SessionStore it does not hold: those of
	// servers that died or let go. A server sets it; a one-shot CLI run,
	// whose session bounds need not be the servers', does not.
	SweepStore bool
	// OnEnd, if set, is told of every session that ends and why: closed,
	// idle timeout, maximum lifetime, or the server shutting down. It is
	// called once the session's sandbox is gone, and must not block.
	OnEnd func(info sandbox.SessionInfo, reason string)
}

// DefaultSessions holds the bounds a zero SessionConfig field takes; the
// CLI's flags default to them too.
var DefaultSessions = SessionConfig{MaxSessions: 8, IdleTimeout: 10 * time.Minute, MaxLifetime: time.Hour}

func (c SessionConfig) withDefaults() SessionConfig {
	if c.MaxSessions == 0 {
		c.MaxSessions = DefaultSessions.MaxSessions
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultSessions.IdleTimeout
	}
	if c.MaxLifetime == 0 {
		c.MaxLifetime = DefaultSessions.MaxLifetime
	}
	return c
}

// fileOpTimeout bounds a session's file operations.
const fileOpTimeout = 30 * time.Second

// sessionState is where a session is in its life. It changes only through
// session.move, which refuses a move its table does not allow, so that every
// path agrees on who owns the session's sandbox: the boot while booting,
// the call while busy, and whoever closes it otherwise.
type sessionState int

const (
	sessionBooting sessionState = iota // its first sandbox is starting
	sessionReady                       // idle, with a live sandbox
	sessionBusy                        // a call holds it, and may start a sandbox
	sessionLost                        // idle, its sandbox died; the next call starts another
	sessionClosed                      // refuses calls; leaves the table once its sandbox is gone
)

var sessionStateNames = [...]string{"booting", "ready", "busy", "lost", "closed"}

func (st sessionState) String() string {
	if int(st) < len(sessionStateNames) {
		return sessionStateNames[st]
	}
	return fmt.Sprintf("state %d", int(st))
}

// sessionMoves are the allowed transitions.
var sessionMoves = map[sessionState][]sessionState{
	sessionBooting: {sessionReady, sessionClosed},
	sessionReady:   {sessionBusy, sessionClosed},
	sessionBusy:    {sessionReady, sessionLost, sessionClosed},
	sessionLost:    {sessionBusy, sessionClosed},
	sessionClosed:  nil,
}

// session is one long-lived sandbox with a persistent interpreter.
type session struct {
	id      string
	owner   string // sandbox.SessionSpec.Owner: only calls acting for it find the session
	lang    sandbox.Language
	limits  sandbox.Limits // of the session's sandbox, and defaults of its calls
	network []string       // what its sandbox may reach (Job.Network), kept by every sandbox it gets

	pkgs sessionPackages // what its sandboxes install before their first cell

	mu sync.Mutex // held by the boot and by each call: one at a time

	// stMu guards state and why, and proc whenever the state changes; in
	// between, the owner the state names uses proc alone.
	stMu  sync.Mutex
	state sessionState
	proc  *box   // the live sandbox, if any
	why   string // why it was closed, for OnEnd; "" if it never began

	// reportLost says the sandbox died outside a cell (in a file
	// operation): the next cell says its state was lost. Guarded by mu.
	reportLost bool
	// attached says this server attached a new agent to the session's
	// sandbox (a SessionStore's): the next cell says why its state is
	// lost. Guarded by mu.
	attached bool
	// detach, set with the state closed, makes the session's end leave
	// its sandbox and record to other servers rather than remove them:
	// this server only lets go of it. Guarded by stMu.
	detach bool

	// denied, once a deny-future-calls monitoring rule fired, says which:
	// the session refuses every further call. Guarded by mu.
	denied *sandbox.RuleHit
	// past is the activity of the session's earlier sandboxes (it gets a
	// new one when one dies), for its whole tree at the end. Guarded by
	// mu, and read by the session's end once no call holds it.
	past []*sandbox.Activity
	// final is the session's whole activity, set by its end (nil if it
	// was not monitored); read after gone is closed.
	final *sandbox.Activity

	ctx    context.Context // ends when the session is closed, cancelling its boot or call
	cancel context.CancelFunc
	gone   chan struct{} // closed once its sandbox is destroyed and it left the table

	created  time.Time
	lastUsed atomic.Int64 // unix nanoseconds
	calls    atomic.Int64
}

// move changes the session's state, or says why it cannot. stMu is held.
func (s *session) move(to sessionState) error {
	if !slices.Contains(sessionMoves[s.state], to) {
		return fmt.Errorf("session %s: cannot go from %s to %s", s.id, s.state, to)
	}
	s.state = to
	return nil
}

// current returns the session's state.
func (s *session) current() sessionState {
	s.stMu.Lock()
	defer s.stMu.Unlock()
	return s.state
}

// bind returns a context that ends with ctx or when the session closes.
func (s *session) bind(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.ctx, cancel)
	return ctx, func() { stop(); cancel() }
}

type sessionTable struct {
	cfg     SessionConfig
	mu      sync.Mutex
	m       map[string]*session // every session whose sandbox is not yet gone
	closed  bool                // the runtime is shutting down: no new sessions
	janitor sync.Once
	stop    chan struct{} // closed by CloseSessions: the janitor returns
	stopped chan struct{} // closed when the janitor has returned (or never started)
	stopMu  sync.Once
}

func newSessionTable(cfg SessionConfig) *sessionTable {
	return &sessionTable{cfg: cfg.withDefaults(), m: map[string]*session{},
		stop: make(chan struct{}), stopped: make(chan struct{})}
}

func (e *Engine) table() *sessionTable { return e.sessions }

// newSessionID returns an unguessable session ID: 128 random bits.
func newSessionID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return "session-" + hex.EncodeToString(b[:])
}

// CreateSession starts a session: its sandbox, with the agent waiting for
// cells. The interpreter itself starts with the first call. Closing the
// session while it starts cancels the start.
func (e *Engine) CreateSession(ctx context.Context, spec sandbox.SessionSpec) (sandbox.SessionInfo, error) {
	job, lang, err := e.cfg.Policy.Check(sandbox.Job{Language: spec.Language, Code: "session", Limits: spec.Limits,
		Network: spec.Network, Packages: spec.Packages})
	if err != nil {
		return sandbox.SessionInfo{}, err
	}
	if lang.Interpreter == "" {
		return sandbox.SessionInfo{}, &sandbox.InputError{Field: "language", Msg: fmt.Sprintf("%q %v", lang.Name, sandbox.ErrSessionsUnsupported)}
	}
	t := e.table()
	s := &session{id: newSessionID(), owner: spec.Owner, lang: lang, limits: job.Limits, network: job.Network, created: time.Now(), gone: make(chan struct{})}
	s.pkgs.packages = job.Packages
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.lastUsed.Store(s.created.UnixNano())
	s.mu.Lock() // calls wait for the boot
	defer s.mu.Unlock()
	t.mu.Lock()
	switch {
	case t.closed:
		t.mu.Unlock()
		return sandbox.SessionInfo{}, sandbox.WithClass(errors.New("the server is shutting down; no new sessions"), sandbox.ErrUnavailable)
	case len(t.m) >= t.cfg.MaxSessions:
		t.mu.Unlock()
		return sandbox.SessionInfo{}, fmt.Errorf("%w (the limit is %d)", sandbox.ErrTooManySessions, t.cfg.MaxSessions)
	}
	t.m[s.id] = s // the place counts from now until the sandbox is gone
	t.mu.Unlock()
	t.janitor.Do(func() { go e.expireSessions() })

	bootCtx, done := s.bind(ctx)
	rec := s.record()
	p, err := e.startSessionSandbox(bootCtx, job, &rec)
	done()
	s.stMu.Lock()
	switch {
	case s.state == sessionClosed:
		err = fmt.Errorf("session %q was closed while its sandbox started: %w", s.id, sandbox.ErrNoSession)
	case err == nil:
		if err = s.move(sessionReady); err == nil {
			s.proc = p
			s.stMu.Unlock()
			e.log.Info("session created", "session", s.id, "language", lang.Name, "sandbox", p.id())
			return e.info(s), nil
		}
	default:
		_ = s.move(sessionClosed) // the boot failed: the session never began
		s.cancel()
	}
	s.stMu.Unlock()
	e.endSession(s, p) // p is nil unless the session was closed after its boot
	return sandbox.SessionInfo{}, err
}

// startSessionSandbox starts a session's sandbox for job (its language
// and limits) and waits for its agent; rec is the session's record, for a
// SessionStore. On error nothing is left; the error is of class
// unavailable unless the start was cancelled.
func (e *Engine) startSessionSandbox(ctx context.Context, job sandbox.Job, rec *SessionRecord) (*box, error) {
	spec := e.spec(sandbox.Job{Language: job.Language, Limits: job.Limits, Network: job.Network}, true)
	spec.Session = rec
	b, err := e.newBox(spec, e.cfg.Backend.Start, false)
	return e.sessionBoxReady(ctx, b, err)
}

// sessionBoxReady waits for the agent of b, a session's sandbox that
// started with err, and says why it cannot be used.
func (e *Engine) sessionBoxReady(ctx context.Context, b *box, err error) (*box, error) {
	if err == nil {
		if err = b.awaitReady(ctx, e.cfg.ObserveStart); err != nil {
			_ = b.destroy()
		} else {
			takeActivity(b.sb, false) // the agent's own start, not a call's doing
		}
	}
	switch {
	case err == nil:
		return b, nil
	case ctx.Err() != nil:
		return nil, fmt.Errorf("start the session's sandbox: %w", ctx.Err())
	case sandbox.Class(err) == nil:
		err = sandbox.WithClass(err, sandbox.ErrUnavailable)
	}
	return nil, fmt.Errorf("start the session's sandbox: %w", err)
}

// lookup finds a live session of the owner ctx acts for; another owner's
// session is reported exactly as an unknown one. A session this engine
// does not hold is looked for in the backend's SessionStore, if it has
// one, and attached to.
func (e *Engine) lookup(ctx context.Context, id string) (*session, error) {
	t := e.table()
	t.mu.Lock()
	s, ok := t.m[id]
	t.mu.Unlock()
	if store := e.store(); !ok && store != nil {
		return e.attach(ctx, store, id)
	}
	if !ok || s.current() == sessionClosed || s.owner != sandbox.OwnerFrom(ctx) {
		return nil, fmt.Errorf("session %q: %w", id, sandbox.ErrNoSession)
	}
	return s, nil
}

// call runs f with the session's sandbox, one call at a time, starting a
// new sandbox if the last one died. f's context ends with ctx or when the
// session is closed; f may destroy the sandbox and set s.proc to nil.
func (e *Engine) call(ctx context.Context, id string, f func(ctx context.Context, s *session) error) error {
	s, err := e.lookup(ctx, id)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stMu.Lock()
	err = s.move(sessionBusy)
	s.stMu.Unlock()
	if err != nil {
		return fmt.Errorf("session %q: %w", id, sandbox.ErrNoSession) // closed while the call waited
	}
	ctx, done := s.bind(ctx)
	defer done()
	defer e.release(s)
	if hit := s.denied; hit != nil {
		return sandbox.WithClass(fmt.Errorf("session %q refuses further calls: monitoring rule %q fired (%s); close it and create a new session", id, hit.Rule, hit.Event), sandbox.ErrInvalid)
	}
	if store := e.store(); store != nil && s.proc != nil {
		if err := e.checkStored(ctx, store, s); err != nil {
			return err
		}
	}
	if p := s.proc; p != nil && p.exited() {
		// Its sandbox died while the session was idle (killed from outside,
		// or the host ran out of memory): the session is lost, whatever its
		// state said, and this call starts afresh and says so.
		p.log.Warn("a session's sandbox died while idle", "session", s.id)
		s.drop(p, false)
		s.reportLost = true
	}
	if s.proc == nil {
		rec := s.record()
		p, err := e.startSessionSandbox(ctx, sandbox.Job{Language: s.lang.Name, Limits: s.limits, Network: s.network}, &rec)
		if err != nil {
			return err
		}
		s.stMu.Lock()
		s.proc = p // destroyed by release if the session was closed meanwhile
		s.stMu.Unlock()
	}
	if d, ok := s.proc.sb.(StoredSandbox); ok {
		defer e.keepTouched(d)()
	}
	return f(ctx, s)
}

// release ends a call: the session is idle again, or, if it was closed
// during the call, it ends here.
func (e *Engine) release(s *session) {
	s.lastUsed.Store(time.Now().UnixNano())
	s.stMu.Lock()
	if s.state == sessionClosed {
		p := s.proc
		s.proc = nil
		s.stMu.Unlock()
		e.endSession(s, p)
		return
	}
	to := sessionReady
	if s.proc == nil {
		to = sessionLost
	}
	err := s.move(to)
	s.stMu.Unlock()
	if err != nil {
		e.log.Error("end a session call", "err", err)
	}
}

// RunInSession runs job's code in the session's interpreter.
func (e *Engine) RunInSession(ctx context.Context, id string, job sandbox.Job) (sandbox.Result, error) {
	s, err := e.lookup(ctx, id)
	if err != nil {
		return sandbox.Result{}, err
	}
	if job.Language == "" {
		job.Language = s.lang.Name
	}
	if job.Language != s.lang.Name {
		return sandbox.Result{}, &sandbox.InputError{Field: "language", Msg: fmt.Sprintf("the session runs %s, not %s; create a %s session", s.lang.Name, job.Language, job.Language)}
	}
	// The sandbox's limits are the session's; a call may choose only its
	// own timeout and output cap.
	callLimits := s.limits
	if job.Limits.Timeout != 0 {
		callLimits.Timeout = job.Limits.Timeout
	}
	if job.Limits.OutputBytes != 0 {
		callLimits.OutputBytes = job.Limits.OutputBytes
	}
	job.Limits = callLimits
	if job, _, err = e.cfg.Policy.Check(job); err != nil {
		return sandbox.Result{}, err
	}

	start := time.Now()
	var res sandbox.Result
	err = e.call(ctx, id, func(ctx context.Context, s *session) error {
		s.calls.Add(1)
		var rep *egress.Report
		var act *sandbox.Activity
		res, rep, act = e.evalCell(ctx, s, job)
		res = addNetwork(res, rep)
		res = withActivity(res, act)
		if res.Status == sandbox.StatusPolicyViolation && res.StateLost {
			res.Message += "; the session's state was lost, and its next call starts a fresh sandbox"
		}
		if hit := ruleHit(act, actionDenyFutureCalls); hit != nil && s.denied == nil {
			s.denied = hit
			if res.Message != "" {
				res.Message += "; "
			}
			res.Message += fmt.Sprintf("monitoring rule %q fired: the session refuses further calls", hit.Rule)
		}
		return nil
	})
	res.DurationMS = time.Since(start).Milliseconds()
	return res, err
}

// evalCell runs one cell; if the sandbox dies or is killed on the way, the
// session loses its state and gets a new sandbox at its next call.
func (e *Engine) evalCell(ctx context.Context, s *session, job sandbox.Job) (sandbox.Result, *egress.Report, *sandbox.Activity) {
	p := s.proc
	res := sandbox.Result{SandboxID: p.id(), ExitCode: -1}
	req := agent.Request{
		Op: agent.OpEval, Interpreter: s.lang.Interpreter, Code: job.Code, Stdin: job.Stdin, Env: job.Env,
		Files: agentFiles(job.Files), Timeout: job.Limits.Timeout, OutputBytes: job.Limits.OutputBytes,
		Collect: e.collect(job),
	}
	req = e.withPackages(req, s.pkgs.job(job, s.network, p), s.lang)
	stdout, stderr := newStreams(job)
	// The agent interrupts the cell at its timeout and kills the
	// interpreter agent.InterruptGrace later; the host waits a little longer.
	exit, end := p.request(ctx, req, e.eventBudget(job), job.Limits.Timeout+agent.InterruptGrace+killGrace+time.Second, stdout, stderr)
	s.pkgs.done(p, exit)
	res = finishStreams(res, exit, stdout, stderr)
	res.Files = e.outputFiles(job, exit)
	lost := s.reportLost
	s.reportLost = false
	if exit == nil {
		// The sandbox is gone: it was killed at the deadline or on cancel, or
		// it died, for example out of memory.
		usage := p.sb.Usage()
		oomKills := usage.OOMKills
		rep := takeNetwork(p.sb, true)
		act := takeActivity(p.sb, true)
		s.keepActivity(p)
		res.MemoryPeakBytes = usage.PeakBytes
		if err := p.destroy(); err != nil {
			e.log.Error("clean up session sandbox", "session", s.id, "err", err)
		}
		s.proc = nil
		if !end.timedOut && !end.cancelled && oomKills == 0 {
			res = e.sandboxError(res, fmt.Errorf("the session's sandbox ended unexpectedly: %v", endCause(p, end)))
		} else {
			res = outcome(res, job, nil, end, oomKills)
		}
		res.StateLost = true
		res.Message += "; the session's state was lost, and its next call starts a fresh sandbox (files in /workspace are gone too)"
		return res, rep, act
	}
	rep := takeNetwork(p.sb, false)
	act := takeActivity(p.sb, false)
	if exit.Error != "" {
		return e.sandboxError(res, fmt.Errorf("could not run the %s cell: %s", s.lang.Name, exit.Error)), rep, act
	}
	res.MemoryPeakBytes = p.sb.Usage().PeakBytes
	res = outcome(res, job, exit, end, 0)
	res.StateLost = lost || exit.StateLost
	if lost && s.attached {
		note := "this server attached to the session's sandbox after another served it (or after a restart): variables and imports from earlier calls are gone (files in /workspace remain)"
		if res.Message != "" {
			note = "; " + note
		}
		res.Message += note
	}
	s.attached = false
	if exit.StateLost {
		res.Message += "; the interpreter had to be restarted: variables and imports from earlier calls are gone (files in /workspace remain)"
	}
	if res.Status == sandbox.StatusError && !exit.StateLost {
		res.Message += " (see stderr); the session keeps its state"
	}
	return res, rep, act
}

// drop destroys p, the session's sandbox, or with detach lets go of it
// (box.detach), keeping its activity; the session has no sandbox after.
// The caller owns the session.
func (s *session) drop(p *box, detach bool) {
	s.keepActivity(p)
	if err := p.end(detach); err != nil {
		p.log.Error("clean up session sandbox", "session", s.id, "detach", detach, "err", err)
	}
	s.stMu.Lock()
	s.proc = nil
	s.stMu.Unlock()
}

// keepActivity keeps the whole activity of p, a sandbox of the session
// about to be destroyed, for the session's end.
func (s *session) keepActivity(p *box) {
	if a := totalActivity(p.sb); a != nil {
		s.past = append(s.past, a)
	}
}

// WriteFiles writes files into the session's workspace.
func (e *Engine) WriteFiles(ctx context.Context, id string, files []sandbox.File) error {
	s, err := e.lookup(ctx, id)
	if err != nil {
		return err
	}
	if _, _, err := e.cfg.Policy.Check(sandbox.Job{Language: s.lang.Name, Code: "files", Files: files}); err != nil {
		return err
	}
	return e.call(ctx, id, func(ctx context.Context, s *session) error {
		exit, err := e.fileOp(ctx, s, agent.Request{Op: agent.OpWrite, Files: agentFiles(files)})
		if err == nil && exit.Error != "" {
			err = &sandbox.InputError{Field: "files", Msg: exit.Error}
		}
		return err
	})
}

// ReadFile returns a file of the session's workspace.
func (e *Engine) ReadFile(ctx context.Context, id, name string) (sandbox.OutputFile, error) {
	if err := sandbox.CheckPath(name); err != nil {
		return sandbox.OutputFile{}, &sandbox.InputError{Field: "path", Msg: err.Error()}
	}
	var file sandbox.OutputFile
	err := e.call(ctx, id, func(ctx context.Context, s *session) error {
		max := e.cfg.Policy.OutputFileLimits().MaxFileBytes
		exit, err := e.fileOp(ctx, s, agent.Request{Op: agent.OpRead, Path: name, MaxBytes: max})
		switch {
		case err != nil:
			return err
		case exit.Error != "":
			return &sandbox.InputError{Field: "path", Msg: exit.Error}
		case len(exit.Files) != 1 || exit.Files[0].Path != path.Clean(name) || int64(len(exit.Files[0].Data)) > max:
			return sandbox.WithClass(errors.New("the sandbox answered a file read with something else"), sandbox.ErrUnavailable)
		}
		f := exit.Files[0]
		file = sandbox.OutputFile{Path: f.Path, Size: int64(len(f.Data)), Data: f.Data, Type: "file"}
		return nil
	})
	return file, err
}

// maxListedFiles bounds a workspace listing.
const maxListedFiles = 1000

// ListFiles lists the session's workspace below dir.
func (e *Engine) ListFiles(ctx context.Context, id, dir string) ([]sandbox.OutputFile, error) {
	if dir == "" {
		dir = "."
	}
	if dir != "." {
		if err := sandbox.CheckPath(dir); err != nil {
			return nil, &sandbox.InputError{Field: "path", Msg: err.Error()}
		}
	}
	var files []sandbox.OutputFile
	err := e.call(ctx, id, func(ctx context.Context, s *session) error {
		exit, err := e.fileOp(ctx, s, agent.Request{Op: agent.OpList, Path: dir, MaxFiles: maxListedFiles})
		switch {
		case err != nil:
			return err
		case exit.Error != "":
			return &sandbox.InputError{Field: "path", Msg: exit.Error}
		}
		for _, f := range exit.Files {
			if len(files) == maxListedFiles || sandbox.CheckPath(f.Path) != nil {
				continue
			}
			files = append(files, sandbox.OutputFile{Path: f.Path, Size: f.Size, Type: f.Type})
		}
		return nil
	})
	return files, err
}

// fileOp sends a file operation to the session's agent.
func (e *Engine) fileOp(ctx context.Context, s *session, req agent.Request) (*agent.Exit, error) {
	budget := 2*e.cfg.Policy.OutputFileLimits().MaxFileBytes + 1<<20
	for _, f := range req.Files {
		budget += int64(len(f.Data))
	}
	p := s.proc
	exit, end := p.request(ctx, req, budget, fileOpTimeout, nil, nil)
	if exit == nil {
		s.keepActivity(p)
		_ = p.destroy()
		s.proc, s.reportLost = nil, true
		if end.cancelled {
			return nil, ctx.Err()
		}
		return nil, sandbox.WithClass(fmt.Errorf("the session's sandbox failed during a file operation; its state was lost: %v", endCause(p, end)), sandbox.ErrUnavailable)
	}
	return exit, nil
}

// endCause says why p's agent stopped answering: what broke its event
// stream, else how the sandbox ended.
func endCause(p *box, end ending) string {
	if end.err != nil {
		return end.err.Error()
	}
	return p.sb.ExitReport()
}

// CloseSession ends a session at once, even in the middle of a call or
// while its sandbox starts, and returns once its sandbox is gone (or ctx
// ends).
func (e *Engine) CloseSession(ctx context.Context, id string) error {
	_, err := e.CloseSessionActivity(ctx, id)
	return err
}

// CloseSessionActivity is CloseSession that also returns what the
// session's sandboxes did over its whole life (nil if not monitored).
func (e *Engine) CloseSessionActivity(ctx context.Context, id string) (*sandbox.Activity, error) {
	t := e.table()
	t.mu.Lock()
	s, ok := t.m[id]
	t.mu.Unlock()
	if store := e.store(); !ok && store != nil {
		return nil, e.closeStored(ctx, store, id)
	}
	if !ok || s.owner != sandbox.OwnerFrom(ctx) || !e.closeSession(s, "closed") {
		return nil, fmt.Errorf("session %q: %w", id, sandbox.ErrNoSession)
	}
	select {
	case <-s.gone:
		return s.final, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// closeSession closes s, and reports false if it was closed already. A
// boot or call in progress is cancelled, and ends the session itself when
// it returns; an idle session ends here.
func (e *Engine) closeSession(s *session, why string) bool {
	return e.closeSessionHow(s, why, false)
}

// closeSessionHow is closeSession; detach makes it let go of a stored
// session (see session.detach) rather than end it, and then why is "".
func (e *Engine) closeSessionHow(s *session, why string, detach bool) bool {
	s.stMu.Lock()
	was := s.state
	if s.move(sessionClosed) != nil {
		s.stMu.Unlock()
		return false
	}
	s.why, s.detach = why, detach
	var p *box
	if was == sessionReady || was == sessionLost {
		p, s.proc = s.proc, nil
	}
	s.stMu.Unlock()
	s.cancel()
	if was == sessionReady || was == sessionLost {
		e.endSession(s, p)
	}
	return true
}

// endSession destroys a closed session's sandbox, if it has one, and takes
// the session out of the table. It runs once per session, on the path that
// owned the session when it closed.
func (e *Engine) endSession(s *session, p *box) {
	if p != nil {
		s.keepActivity(p)
	}
	s.final = mergeActivities(s.past)
	s.stMu.Lock()
	detach := s.detach
	s.stMu.Unlock()
	if p != nil {
		if err := p.end(detach); err != nil {
			e.log.Error("clean up session sandbox", "session", s.id, "detach", detach, "err", err)
		}
	}
	if store := e.store(); store != nil && !detach && s.why != "" {
		// Another server may hold the session's sandbox, or a newer one.
		ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
		if _, err := store.EndSession(ctx, s.id); err != nil {
			e.log.Error("remove the session's stored sandbox", "session", s.id, "err", err)
		}
		cancel()
	}
	t := e.table()
	t.mu.Lock()
	delete(t.m, s.id)
	t.mu.Unlock()
	defer close(s.gone) // after OnEnd: a closer that returns finds the end reported
	if s.why == "" {
		return // it never began: its creator hears why
	}
	e.log.Info("session ended", "session", s.id, "why", s.why, "calls", s.calls.Load())
	if end := t.cfg.OnEnd; end != nil {
		info := e.info(s)
		info.Activity = s.final
		end(info, s.why)
	}
}

// CloseSessions ends every session, refuses new ones and stops the
// expiry of idle sessions; a server calls it before exit. It returns once
// every session's sandbox is gone. With a SessionStore it ends none: it
// lets go of them (their sandboxes stay for other servers to attach to).
func (e *Engine) CloseSessions() {
	t := e.table()
	t.mu.Lock()
	t.closed = true
	all := slices.Collect(maps.Values(t.m))
	t.mu.Unlock()
	t.stopMu.Do(func() {
		close(t.stop)
		t.janitor.Do(func() { close(t.stopped) }) // it never started
	})
	detach := e.store() != nil
	for _, s := range all {
		if detach {
			// Stored sessions outlive this server: another, or this one
			// restarted, attaches to them.
			e.closeSessionHow(s, "", true)
		} else {
			e.closeSession(s, "server shutting down")
		}
	}
	for _, s := range all {
		<-s.gone
	}
	<-t.stopped
}

// ListSessions describes the live sessions, oldest first: those starting,
// idle or in a call.
func (e *Engine) ListSessions() []sandbox.SessionInfo {
	t := e.table()
	t.mu.Lock()
	var out []sandbox.SessionInfo
	for _, s := range t.m {
		if s.current() != sessionClosed {
			out = append(out, e.info(s))
		}
	}
	t.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out
}

func (e *Engine) info(s *session) sandbox.SessionInfo {
	last := time.Unix(0, s.lastUsed.Load())
	return sandbox.SessionInfo{ID: s.id, Owner: s.owner, Language: s.lang.Name, Created: s.created, LastUsed: last,
		ExpiresAt: e.table().expires(s.created, last), Calls: int(s.calls.Load())}
}

// expires is when a session created and last used then ends unless used
// again.
func (t *sessionTable) expires(created, lastUsed time.Time) time.Time {
	expires := lastUsed.Add(t.cfg.IdleTimeout)
	if end := created.Add(t.cfg.MaxLifetime); end.Before(expires) {
		expires = end
	}
	return expires
}

// tick is how often the janitor looks for expired sessions.
func (t *sessionTable) tick() time.Duration {
	return min(5*time.Second, t.cfg.IdleTimeout/4+time.Millisecond)
}

// expireSessions ends sessions that were idle too long or lived too long,
// until CloseSessions.
func (e *Engine) expireSessions() {
	t := e.table()
	defer close(t.stopped)
	tick := time.NewTicker(t.tick())
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
		case <-t.stop:
			return
		}
		now := time.Now()
		var expired []*session
		var why []string
		t.mu.Lock()
		for _, s := range t.m {
			idle := now.Sub(time.Unix(0, s.lastUsed.Load()))
			st := s.current()
			switch {
			case st == sessionClosed:
				continue // already being closed
			case now.Sub(s.created) > t.cfg.MaxLifetime:
				why = append(why, "reached its maximum lifetime")
			case idle > t.cfg.IdleTimeout && (st == sessionReady || st == sessionLost):
				why = append(why, "idle timeout")
			default:
				continue
			}
			expired = append(expired, s)
		}
		t.mu.Unlock()
		store := e.store()
		for i, s := range expired {
			if store != nil && why[i] == "idle timeout" {
				e.expireStored(store, s)
				continue
			}
			e.closeSession(s, why[i])
		}
		if store != nil && t.cfg.SweepStore {
			e.sweepStore(store, now)
		}
	}
}
