package audit

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/safe-run/safe-run/sandbox"
)

// The events of the session calls, named after the MCP tools that make them.
const (
	EventCreateSession = "create_session"
	EventCloseSession  = "close_session"
	EventWriteFile     = "write_file"
	EventReadFile      = "read_file"
	EventListFiles     = "list_files"
)

// Appender keeps records; *Log keeps them in a hash-chained file. Append
// returns once the record is durable; an error means it was not kept.
type Appender interface {
	Append(Record) error
}

// Runner is a sandbox.Runner and sandbox.Sessions that keeps a record of
// every run and session call it passes on to Runner and Sessions, and of
// every session's end (SessionEnded). It is the one place where records are
// made, for the CLI and the server alike. Like sandbox.ResultCache it wraps
// another runner; it goes outside the cache, so that a result the cache
// answers is recorded too (as Cached).
//
// What a record says of the caller comes from the call's context: the
// request id (sandbox.WithRequestID) and the client's name and version
// (sandbox.WithClient).
//
// It fails closed. When a record cannot be written, the call that produced
// it returns a *FailedError instead of its result, and every later call
// that would run code or touch a session is refused with one before it
// reaches Runner or Sessions, until the process is restarted with a
// writable log. An audit log is only worth having if nothing runs
// unrecorded; a server that went on running code unaudited would make it
// worthless exactly when someone is filling the disk. CloseSession alone
// is never refused: it runs no code and frees a sandbox that nothing else
// would free until it expires. A record that is not kept goes to Logger
// instead. The errors are of class sandbox.ErrUnavailable and state the
// fact; the edges add what the operator must do.
//
// The zero value is not usable; set Log, and Runner or Sessions.
type Runner struct {
	// Runner runs the one-shot jobs.
	Runner sandbox.Runner
	// Sessions serves the session calls.
	Sessions sandbox.Sessions
	// Log keeps the records.
	Log Appender
	// Logger receives the records that could not be kept; nil means
	// slog.Default().
	Logger *slog.Logger

	// failed holds the first write error; once set, it is never cleared.
	failed atomic.Pointer[error]
}

// FailedError is the error of a call made when, or after, the audit log
// failed. It is of class sandbox.ErrUnavailable.
type FailedError struct {
	// Ran says the call itself happened and only its record was lost, so
	// its result is withheld; false says it was refused and nothing ran.
	Ran bool
	// Err is the error of the write that failed.
	Err error
}

func (e *FailedError) Error() string {
	if e.Ran {
		return fmt.Sprintf("the call ran but its audit record could not be written (%v), so its result is withheld", e.Err)
	}
	return fmt.Sprintf("refused: the audit log could not be written (%v), and nothing runs unrecorded", e.Err)
}

func (e *FailedError) Unwrap() []error { return []error{e.Err, sandbox.ErrUnavailable} }

// Policy returns the policy of the runner it wraps.
func (r *Runner) Policy() sandbox.Policy { return r.Runner.Policy() }

// Run runs job with the wrapped Runner and records the run.
func (r *Runner) Run(ctx context.Context, job sandbox.Job) (sandbox.Result, error) {
	if err := r.refusal(); err != nil {
		return sandbox.Result{}, err
	}
	res, err := r.Runner.Run(ctx, job)
	return r.ran(ctx, "", job, res, err)
}

// RunInSession runs job in session id and records the run.
func (r *Runner) RunInSession(ctx context.Context, id string, job sandbox.Job) (sandbox.Result, error) {
	if err := r.refusal(); err != nil {
		return sandbox.Result{}, err
	}
	res, err := r.Sessions.RunInSession(ctx, id, job)
	return r.ran(ctx, id, job, res, err)
}

// ran records a run and returns its outcome, or the error that withholds
// it.
func (r *Runner) ran(ctx context.Context, sessionID string, job sandbox.Job, res sandbox.Result, err error) (sandbox.Result, error) {
	if lost := r.keep(ctx, r.runRecord(sessionID, job, res, err)); lost != nil {
		return sandbox.Result{}, lost
	}
	return res, err
}

// runRecord describes a run of job: its result, or the runner's refusal.
// The job's limits are recorded as the policy completes them.
func (r *Runner) runRecord(sessionID string, job sandbox.Job, res sandbox.Result, err error) Record {
	if checked, _, cerr := r.Policy().Check(job); cerr == nil {
		job = checked
	}
	if err != nil {
		return Record{Event: EventRun, SessionID: sessionID, Language: job.Language, Image: job.Image, Code: job.Code,
			Limits: LimitsOf(job.Limits), Status: "refused", Message: err.Error(), NetworkAsked: job.Network, Packages: job.Packages}
	}
	rec := RunRecord(job, res)
	rec.SessionID = sessionID
	return rec
}

// CreateSession starts a session and records it.
func (r *Runner) CreateSession(ctx context.Context, spec sandbox.SessionSpec) (sandbox.SessionInfo, error) {
	if err := r.refusal(); err != nil {
		return sandbox.SessionInfo{}, err
	}
	start := time.Now()
	info, err := r.Sessions.CreateSession(ctx, spec)
	if lost := r.called(ctx, Record{Event: EventCreateSession, SessionID: info.ID, Language: spec.Language,
		NetworkAsked: spec.Network, Packages: spec.Packages}, start, err); lost != nil {
		return sandbox.SessionInfo{}, lost
	}
	return info, err
}

// WriteFiles writes files into session id and records the call, with the
// first file's path.
func (r *Runner) WriteFiles(ctx context.Context, id string, files []sandbox.File) error {
	if err := r.refusal(); err != nil {
		return err
	}
	rec := Record{Event: EventWriteFile, SessionID: id}
	if len(files) > 0 {
		rec.Path = files[0].Path
	}
	start := time.Now()
	err := r.Sessions.WriteFiles(ctx, id, files)
	if lost := r.called(ctx, rec, start, err); lost != nil {
		return lost
	}
	return err
}

// ReadFile reads a file of session id and records the call.
func (r *Runner) ReadFile(ctx context.Context, id, path string) (sandbox.OutputFile, error) {
	if err := r.refusal(); err != nil {
		return sandbox.OutputFile{}, err
	}
	start := time.Now()
	f, err := r.Sessions.ReadFile(ctx, id, path)
	if lost := r.called(ctx, Record{Event: EventReadFile, SessionID: id, Path: path}, start, err); lost != nil {
		return sandbox.OutputFile{}, lost
	}
	return f, err
}

// ListFiles lists session id's workspace below dir and records the call.
func (r *Runner) ListFiles(ctx context.Context, id, dir string) ([]sandbox.OutputFile, error) {
	if err := r.refusal(); err != nil {
		return nil, err
	}
	start := time.Now()
	files, err := r.Sessions.ListFiles(ctx, id, dir)
	if lost := r.called(ctx, Record{Event: EventListFiles, SessionID: id, Path: dir}, start, err); lost != nil {
		return nil, lost
	}
	return files, err
}

// CloseSession ends session id and records the call. It is never refused
// (see Runner).
func (r *Runner) CloseSession(ctx context.Context, id string) error {
	start := time.Now()
	err := r.Sessions.CloseSession(ctx, id)
	if lost := r.called(ctx, Record{Event: EventCloseSession, SessionID: id}, start, err); lost != nil {
		return lost
	}
	return err
}

// ListSessions describes the live sessions. It reads only the sessions'
// own table, so it is neither recorded nor refused.
func (r *Runner) ListSessions() []sandbox.SessionInfo { return r.Sessions.ListSessions() }

// SessionEnded records the end of a session, however it ended; it has the
// signature of the sessions' end hook (OnEnd), since a session also ends
// without a call: idle, too old, or when the server stops.
func (r *Runner) SessionEnded(info sandbox.SessionInfo, reason string) {
	_ = r.write(Record{Time: time.Now().UTC(), Event: EventSessionEnd, SessionID: info.ID, Language: info.Language,
		Status: "ok", Message: reason, DurationMS: time.Since(info.Created).Milliseconds(), Activity: info.Activity})
}

// CloseSessionActivity is CloseSession returning the session's whole
// activity, where the wrapped Sessions report it (sandbox.ActivityCloser);
// the session_end record holds it too.
func (r *Runner) CloseSessionActivity(ctx context.Context, id string) (*sandbox.Activity, error) {
	ac, ok := r.Sessions.(sandbox.ActivityCloser)
	if !ok {
		return nil, r.CloseSession(ctx, id)
	}
	start := time.Now()
	act, err := ac.CloseSessionActivity(ctx, id)
	if lost := r.called(ctx, Record{Event: EventCloseSession, SessionID: id}, start, err); lost != nil {
		return nil, lost
	}
	return act, err
}

// called records a session call that began at start and ended with err.
func (r *Runner) called(ctx context.Context, rec Record, start time.Time, err error) error {
	rec.Status, rec.DurationMS = "ok", time.Since(start).Milliseconds()
	if err != nil {
		rec.Status, rec.Message = "error", err.Error()
	}
	return r.keep(ctx, rec)
}

// refusal is the error refusing every call after the log failed; nil
// while it works.
func (r *Runner) refusal() error {
	if err := r.failed.Load(); err != nil {
		return &FailedError{Err: *err}
	}
	return nil
}

// keep fills in what the context knows of the call — time, request id,
// client — and writes rec.
func (r *Runner) keep(ctx context.Context, rec Record) error {
	rec.Time = time.Now()
	rec.RequestID = sandbox.RequestIDFrom(ctx)
	client := sandbox.ClientFrom(ctx)
	rec.ClientName, rec.ClientVersion = client.Name, client.Version
	return r.write(rec)
}

// write appends rec to the log. It returns nil, or the *FailedError that
// must replace the call's result because the record was not kept. After
// the first failure it writes no more: the log's state is unknown.
func (r *Runner) write(rec Record) error {
	var err error
	if failed := r.failed.Load(); failed != nil {
		err = *failed
	} else if err = r.Log.Append(rec); err == nil {
		return nil
	}
	r.failed.CompareAndSwap(nil, &err)
	// The record goes to the process's log instead, so that it is not
	// lost; as small as it would have been in the audit log.
	code := HashCode(rec.Code)
	rec = Bounded(rec)
	logger := r.Logger
	if logger == nil {
		logger = slog.Default()
	}
	logger.Error("audit log write failed: refusing all further code until restart",
		"err", err, "event", rec.Event, "request_id", rec.RequestID, "session", rec.SessionID,
		"client", rec.ClientName, "client_version", rec.ClientVersion, "language", rec.Language,
		"code_sha256", code, "status", rec.Status, "duration_ms", rec.DurationMS)
	return &FailedError{Ran: true, Err: err}
}

var (
	_ sandbox.Runner   = (*Runner)(nil)
	_ sandbox.Sessions = (*Runner)(nil)
)
