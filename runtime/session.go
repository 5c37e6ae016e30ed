package runtime

import (
	"context"
	"errors"
	"fmt"
	"path"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/safe-run/safe-run/agent"
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
	// OnEnd, if set, is told of every session that ends and why: closed,
	// idle timeout, maximum lifetime, or the server shutting down. It is
	// called once the session's sandbox is gone, and must not block.
	OnEnd func(info sandbox.SessionInfo, reason string)
}

func (c SessionConfig) withDefaults() SessionConfig {
	if c.MaxSessions == 0 {
		c.MaxSessions = 8
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = 10 * time.Minute
	}
	if c.MaxLifetime == 0 {
		c.MaxLifetime = time.Hour
	}
	return c
}

// fileOpTimeout bounds a session's file operations.
const fileOpTimeout = 30 * time.Second

var _ sandbox.Sessions = (*Runtime)(nil)

// session is one long-lived sandbox with a persistent interpreter.
type session struct {
	id     string
	owner  string // sandbox.SessionSpec.Owner: only calls acting for it find the session
	lang   sandbox.Language
	limits sandbox.Limits // of the session's sandbox, and defaults of its calls

	mu        sync.Mutex   // one call at a time
	proc      *sandboxProc // nil once its sandbox died; the next call starts another
	stateLost bool         // the sandbox died since the last call: say so in the next

	created  time.Time
	lastUsed atomic.Int64 // unix nanoseconds
	calls    atomic.Int64
	busy     atomic.Bool
	closed   atomic.Bool
}

type sessionTable struct {
	cfg     SessionConfig
	mu      sync.Mutex
	m       map[string]*session
	janitor sync.Once
}

func (rt *Runtime) table() *sessionTable {
	rt.sessionsOnce.Do(func() {
		rt.sessions = &sessionTable{cfg: rt.cfg.Sessions.withDefaults(), m: map[string]*session{}}
	})
	return rt.sessions
}

// CreateSession starts a session: its sandbox, with the agent waiting for
// cells. The interpreter itself starts with the first call.
func (rt *Runtime) CreateSession(ctx context.Context, spec sandbox.SessionSpec) (sandbox.SessionInfo, error) {
	job, lang, err := rt.cfg.Policy.Check(sandbox.Job{Language: spec.Language, Code: "session", Limits: spec.Limits})
	if err != nil {
		return sandbox.SessionInfo{}, err
	}
	if lang.Interpreter == "" {
		return sandbox.SessionInfo{}, &sandbox.InputError{Field: "language", Msg: fmt.Sprintf("%q %v", lang.Name, sandbox.ErrSessionsUnsupported)}
	}
	t := rt.table()
	s := &session{id: "session-" + uuid.NewString()[:13], owner: spec.Owner, lang: lang, limits: job.Limits, created: time.Now()}
	s.lastUsed.Store(s.created.UnixNano())
	t.mu.Lock()
	if len(t.m) >= t.cfg.MaxSessions {
		t.mu.Unlock()
		return sandbox.SessionInfo{}, fmt.Errorf("%w (the limit is %d)", sandbox.ErrTooManySessions, t.cfg.MaxSessions)
	}
	t.m[s.id] = s // reserve the place while the sandbox starts
	t.mu.Unlock()
	t.janitor.Do(func() { go rt.expireSessions() })

	if err := rt.startSessionSandbox(ctx, s); err != nil {
		t.mu.Lock()
		delete(t.m, s.id)
		t.mu.Unlock()
		return sandbox.SessionInfo{}, err
	}
	rt.log.Info("session created", "session", s.id, "language", lang.Name, "sandbox", s.proc.id)
	return rt.info(s), nil
}

func (rt *Runtime) startSessionSandbox(ctx context.Context, s *session) error {
	p, err := rt.startSandbox(sandbox.Job{Language: s.lang.Name, Limits: s.limits}, false, "")
	if err != nil {
		return fmt.Errorf("start the session's sandbox: %w", err)
	}
	if err := p.awaitReady(ctx); err != nil {
		_ = p.destroy()
		return fmt.Errorf("start the session's sandbox: %w", err)
	}
	s.proc = p
	return nil
}

// lookup finds a live session of the owner ctx acts for; another owner's
// session is reported exactly as an unknown one.
func (rt *Runtime) lookup(ctx context.Context, id string) (*session, error) {
	t := rt.table()
	t.mu.Lock()
	s, ok := t.m[id]
	t.mu.Unlock()
	if !ok || s.closed.Load() || s.owner != sandbox.OwnerFrom(ctx) {
		return nil, fmt.Errorf("session %q: %w", id, sandbox.ErrNoSession)
	}
	return s, nil
}

// call runs f with the session's sandbox, one call at a time, starting a
// new sandbox if the last one died.
func (rt *Runtime) call(ctx context.Context, id string, f func(s *session) error) error {
	s, err := rt.lookup(ctx, id)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() {
		return fmt.Errorf("session %q: %w", id, sandbox.ErrNoSession)
	}
	s.busy.Store(true)
	defer func() {
		s.busy.Store(false)
		s.lastUsed.Store(time.Now().UnixNano())
	}()
	if s.proc == nil {
		if err := rt.startSessionSandbox(ctx, s); err != nil {
			return err
		}
	}
	return f(s)
}

// RunInSession runs job's code in the session's interpreter.
func (rt *Runtime) RunInSession(ctx context.Context, id string, job sandbox.Job) (sandbox.Result, error) {
	s, err := rt.lookup(ctx, id)
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
	if job, _, err = rt.cfg.Policy.Check(job); err != nil {
		return sandbox.Result{}, err
	}

	start := time.Now()
	var res sandbox.Result
	err = rt.call(ctx, id, func(s *session) error {
		s.calls.Add(1)
		res = rt.evalCell(ctx, s, job)
		return nil
	})
	res.DurationMS = time.Since(start).Milliseconds()
	return res, err
}

// evalCell runs one cell; if the sandbox dies or is killed on the way, the
// session loses its state and gets a new sandbox at its next call.
func (rt *Runtime) evalCell(ctx context.Context, s *session, job sandbox.Job) sandbox.Result {
	p := s.proc
	res := sandbox.Result{SandboxID: p.id, ExitCode: -1}
	req := agent.Request{
		Op: agent.OpEval, Interpreter: s.lang.Interpreter, Code: job.Code, Stdin: job.Stdin,
		Files: agentFiles(job.Files), Timeout: job.Limits.Timeout, OutputBytes: job.Limits.OutputBytes,
		Collect: rt.collect(job),
	}
	stdout, stderr := newStreams(job)
	// The agent interrupts the cell at its timeout and kills the
	// interpreter agent.InterruptGrace later; the host waits a little longer.
	exit, end := p.request(ctx, req, rt.eventBudget(job), job.Limits.Timeout+agent.InterruptGrace+killGrace+time.Second, stdout, stderr)
	res = finishStreams(res, exit, stdout, stderr)
	res.Files = rt.outputFiles(job, exit)
	lost := s.stateLost
	s.stateLost = false
	if exit == nil {
		// The sandbox is gone: it was killed at the deadline or on cancel, or
		// it died, for example out of memory.
		oomKills, peak := p.usage()
		res.MemoryPeakBytes = peak
		if err := p.destroy(); err != nil {
			rt.log.Error("clean up session sandbox", "session", s.id, "err", err)
		}
		s.proc = nil
		if !end.timedOut && !end.cancelled && oomKills == 0 {
			res = rt.sandboxError(res, fmt.Errorf("the session's sandbox ended unexpectedly: %v", end.err))
		} else {
			res = outcome(res, job, nil, end, oomKills)
		}
		res.StateLost = true
		res.Message += "; the session's state was lost, and its next call starts a fresh sandbox (files in /workspace are gone too)"
		return res
	}
	if exit.Error != "" {
		return rt.sandboxError(res, fmt.Errorf("could not run the %s cell: %s", s.lang.Name, exit.Error))
	}
	_, res.MemoryPeakBytes = p.usage()
	res = outcome(res, job, exit, end, 0)
	res.StateLost = lost || exit.StateLost
	if exit.StateLost {
		res.Message += "; the interpreter had to be restarted: variables and imports from earlier calls are gone (files in /workspace remain)"
	}
	if res.Status == sandbox.StatusError && !exit.StateLost {
		res.Message += " (see stderr); the session keeps its state"
	}
	return res
}

// WriteFiles writes files into the session's workspace.
func (rt *Runtime) WriteFiles(ctx context.Context, id string, files []sandbox.File) error {
	s, err := rt.lookup(ctx, id)
	if err != nil {
		return err
	}
	if _, _, err := rt.cfg.Policy.Check(sandbox.Job{Language: s.lang.Name, Code: "files", Files: files}); err != nil {
		return err
	}
	return rt.call(ctx, id, func(s *session) error {
		exit, err := rt.fileOp(ctx, s, agent.Request{Op: agent.OpWrite, Files: agentFiles(files)})
		if err == nil && exit.Error != "" {
			err = &sandbox.InputError{Field: "files", Msg: exit.Error}
		}
		return err
	})
}

// ReadFile returns a file of the session's workspace.
func (rt *Runtime) ReadFile(ctx context.Context, id, name string) (sandbox.OutputFile, error) {
	if err := sandbox.CheckPath(name); err != nil {
		return sandbox.OutputFile{}, &sandbox.InputError{Field: "path", Msg: err.Error()}
	}
	var file sandbox.OutputFile
	err := rt.call(ctx, id, func(s *session) error {
		max := rt.cfg.Policy.OutputFileLimits().MaxFileBytes
		exit, err := rt.fileOp(ctx, s, agent.Request{Op: agent.OpRead, Path: name, MaxBytes: max})
		switch {
		case err != nil:
			return err
		case exit.Error != "":
			return &sandbox.InputError{Field: "path", Msg: exit.Error}
		case len(exit.Files) != 1 || exit.Files[0].Path != path.Clean(name) || int64(len(exit.Files[0].Data)) > max:
			return errors.New("the sandbox answered a file read with something else")
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
func (rt *Runtime) ListFiles(ctx context.Context, id, dir string) ([]sandbox.OutputFile, error) {
	if dir == "" {
		dir = "."
	}
	if dir != "." {
		if err := sandbox.CheckPath(dir); err != nil {
			return nil, &sandbox.InputError{Field: "path", Msg: err.Error()}
		}
	}
	var files []sandbox.OutputFile
	err := rt.call(ctx, id, func(s *session) error {
		exit, err := rt.fileOp(ctx, s, agent.Request{Op: agent.OpList, Path: dir, MaxFiles: maxListedFiles})
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
func (rt *Runtime) fileOp(ctx context.Context, s *session, req agent.Request) (*agent.Exit, error) {
	budget := 2*rt.cfg.Policy.OutputFileLimits().MaxFileBytes + 1<<20
	for _, f := range req.Files {
		budget += int64(len(f.Data))
	}
	exit, end := s.proc.request(ctx, req, budget, fileOpTimeout, nil, nil)
	if exit == nil {
		_ = s.proc.destroy()
		s.proc, s.stateLost = nil, true
		if end.cancelled {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("the session's sandbox failed during a file operation; its state was lost: %v", end.err)
	}
	return exit, nil
}

// CloseSession ends a session at once, even in the middle of a call.
func (rt *Runtime) CloseSession(ctx context.Context, id string) error {
	t := rt.table()
	t.mu.Lock()
	s, ok := t.m[id]
	ok = ok && s.owner == sandbox.OwnerFrom(ctx)
	if ok {
		delete(t.m, id)
	}
	t.mu.Unlock()
	if !ok {
		return fmt.Errorf("session %q: %w", id, sandbox.ErrNoSession)
	}
	rt.closeSession(s, "closed")
	return nil
}

func (rt *Runtime) closeSession(s *session, why string) {
	s.closed.Store(true)
	if p := s.proc; p != nil && s.busy.Load() {
		p.kill() // a running call returns at once
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		if err := s.proc.destroy(); err != nil {
			rt.log.Error("clean up session sandbox", "session", s.id, "err", err)
		}
		s.proc = nil
	}
	rt.log.Info("session ended", "session", s.id, "why", why, "calls", s.calls.Load())
	if end := rt.table().cfg.OnEnd; end != nil {
		end(rt.info(s), why)
	}
}

// CloseSessions ends every session; a server calls it before exit.
func (rt *Runtime) CloseSessions() {
	t := rt.table()
	t.mu.Lock()
	all := t.m
	t.m = map[string]*session{}
	t.mu.Unlock()
	var wg sync.WaitGroup
	for _, s := range all {
		wg.Add(1)
		go func() { defer wg.Done(); rt.closeSession(s, "server shutting down") }()
	}
	wg.Wait()
}

// ListSessions describes the live sessions, oldest first.
func (rt *Runtime) ListSessions() []sandbox.SessionInfo {
	t := rt.table()
	t.mu.Lock()
	var out []sandbox.SessionInfo
	for _, s := range t.m {
		if !s.closed.Load() {
			out = append(out, rt.info(s))
		}
	}
	t.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out
}

func (rt *Runtime) info(s *session) sandbox.SessionInfo {
	cfg := rt.table().cfg
	last := time.Unix(0, s.lastUsed.Load())
	expires := last.Add(cfg.IdleTimeout)
	if end := s.created.Add(cfg.MaxLifetime); end.Before(expires) {
		expires = end
	}
	return sandbox.SessionInfo{ID: s.id, Owner: s.owner, Language: s.lang.Name, Created: s.created, LastUsed: last,
		ExpiresAt: expires, Calls: int(s.calls.Load())}
}

// expireSessions ends sessions that were idle too long or lived too long.
func (rt *Runtime) expireSessions() {
	t := rt.table()
	tick := time.NewTicker(min(5*time.Second, t.cfg.IdleTimeout/4+time.Millisecond))
	defer tick.Stop()
	for range tick.C {
		now := time.Now()
		var expired []*session
		var why []string
		t.mu.Lock()
		for _, s := range t.m {
			idle := now.Sub(time.Unix(0, s.lastUsed.Load()))
			switch {
			case s.closed.Load():
				continue // already being closed
			case now.Sub(s.created) > t.cfg.MaxLifetime:
				why = append(why, "reached its maximum lifetime")
			case idle > t.cfg.IdleTimeout && !s.busy.Load():
				why = append(why, "idle timeout")
			default:
				continue
			}
			expired = append(expired, s)
			s.closed.Store(true) // no new call; it leaves the table once freed
		}
		t.mu.Unlock()
		for i, s := range expired {
			rt.closeSession(s, why[i])
			t.mu.Lock()
			delete(t.m, s.id)
			t.mu.Unlock()
		}
	}
}
