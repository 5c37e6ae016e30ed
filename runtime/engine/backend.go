package engine

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"time"

	"github.com/safe-run/safe-run/egress"
	"github.com/safe-run/safe-run/sandbox"
)

// Backend starts sandboxes whose first process is safe-run's agent. It is
// the seam between the engine and a sandbox technology: the gVisor backend
// (package gvisor) starts them with runsc on this host; another backend
// implements the same few methods and plugs in without any change to the
// engine, to mcp/ or to the rest of cmd/. Implementations are safe for
// concurrent use.
type Backend interface {
	// Start starts a sandbox for spec. The agent in it sends its Ready
	// event when it can take requests. On error nothing is left behind.
	Start(spec StartSpec) (Sandbox, error)
	// Wait blocks until every sandbox the backend started has been
	// destroyed, including cleanup it finishes in the background, or ctx
	// ends.
	Wait(ctx context.Context) error
	// Live counts the sandboxes started and not yet destroyed.
	Live() int
}

// StartSpec is what a backend needs to start one sandbox.
type StartSpec struct {
	// Job holds the limits the sandbox is built with and the image it runs
	// (Job.Image; empty means the backend's default image). Its code is not
	// part of the sandbox: requests bring it.
	Job sandbox.Job
	// KeepAlive makes the agent serve requests until its request stream
	// ends (a session), instead of exactly one.
	KeepAlive bool
	// Log is the sandbox's logger; the backend adds its id under the key
	// "sandbox".
	Log *slog.Logger
	// Mark, if set, is told when the sandbox reaches a phase of the
	// backend's own (such as "cgroup_created"), for debug timings.
	Mark func(phase string)
	// NetworkLimits cap the sandbox's network, when Job.Network gives it
	// one (the policy's NetworkLimits).
	NetworkLimits egress.Limits
	// Background starts the sandbox at the lowest CPU priority the
	// backend has: it is a refill of the warm pool, which must use only
	// CPU that runs leave idle. Prioritizer.Foreground raises it once a run
	// needs it.
	Background bool
	// Session, for a session's sandbox (KeepAlive), is the session's
	// record, which a SessionStore keeps with the sandbox; a backend
	// without one ignores it.
	Session *SessionRecord
}

// Prioritizer is the optional capability of a Sandbox started with
// StartSpec.Background: it can raise the sandbox to the CPU priority of
// any other.
type Prioritizer interface {
	// Foreground gives the sandbox the CPU priority of a run's sandbox.
	Foreground()
}

// CPUMeter is the optional capability of a Sandbox that can tell the CPU
// time its processes have used so far. The pool uses it to know how far a
// refill running in the background got: its CPU, unlike its age, does not
// depend on how much CPU runs left it.
type CPUMeter interface {
	// CPUUsed is the CPU time (user and system) the sandbox used so far.
	CPUUsed() (time.Duration, error)
}

// Sandbox is one started sandbox. Its agent speaks the protocol of package
// agent: JSON requests on Requests, JSON events on Events. The engine owns
// that protocol; the backend only carries the bytes and the sandbox's life.
type Sandbox interface {
	// ID names the sandbox in results, logs and on the host.
	ID() string
	// Requests is the agent's request stream.
	Requests() io.Writer
	// Events is the agent's event stream; it ends when the agent does.
	Events() io.ReadCloser
	// Ready is called once the agent can take requests (its Ready event;
	// for a restored sandbox, once the engine has primed it), before any
	// request of a run. It returns an error if the sandbox must not be
	// used after all (for instance because a limit cannot be enforced).
	Ready() error
	// Exited is closed once the sandbox's processes have ended.
	Exited() <-chan struct{}
	// ExitReport says how the sandbox ended, for an error message, such as
	// "runsc exit status 1: <its last log line>". It is read after Exited.
	ExitReport() string
	// Usage reports the memory the sandbox used and whether it was killed
	// for using too much. After Exited it is final.
	Usage() Usage
	// MemoryNow is the memory the sandbox uses at this moment, for sizing
	// the warm pool.
	MemoryNow() (int64, error)
	// Kill ends the sandbox's processes at once and returns when they have
	// ended.
	Kill()
	// Destroy removes every trace of the sandbox, whatever state it is in,
	// and reports what it could not remove. The engine calls it once.
	Destroy() error
}

// Usage is what a sandbox used.
type Usage struct {
	// OOMKills counts processes killed for exceeding the memory limit.
	OOMKills uint64
	// PeakBytes is the most memory the sandbox used at once.
	PeakBytes int64
}

// Checkpointer is the optional capability of a backend that can save a
// warm sandbox and start others from that image; the warm pool uses it
// when the backend has it (found by a type assertion).
type Checkpointer interface {
	// FindCheckpoint returns the image stored for sandboxes of spec warmed
	// as tag says, or "" if there is none. An error that is ErrNoCheckpoints
	// says this backend keeps none (it was configured without a place for
	// them).
	FindCheckpoint(spec StartSpec, tag string) (image string, err error)
	// Checkpoint saves sb, a warm sandbox started for spec, as that image.
	// It ends sb; the caller still destroys it.
	Checkpoint(ctx context.Context, sb Sandbox, spec StartSpec, tag string) (image string, err error)
	// Restore starts a sandbox for spec from image. Its agent sends no
	// Ready event (it sent one before the checkpoint).
	Restore(spec StartSpec, image string) (Sandbox, error)
	// Forget removes an image a restore failed from.
	Forget(image string) error
}

// PoolMarker is the optional capability of a Sandbox that can show on the
// host whether it waits in the warm pool, so that operators (and the
// benchmark) can tell a pooled sandbox from one starting or running.
type PoolMarker interface {
	// MarkPooled marks the sandbox as waiting in language's pool, or, for
	// "", as taken from it.
	MarkPooled(language string)
}

// NetworkReporter is the optional capability of a Sandbox started with a
// network (StartSpec.Job.Network not empty): it hands over what the host
// decided for the sandbox's DNS questions and connections.
type NetworkReporter interface {
	// TakeNetwork returns the records since the previous call (records of
	// connections still open carry Open and their bytes so far) and
	// forgets them; final makes it end the sandbox's network first, so
	// that every connection's last record is in. Report.Failure says the
	// network died.
	TakeNetwork(final bool) egress.Report
}

// ErrNoCheckpoints is returned by a Checkpointer that keeps no checkpoints.
var ErrNoCheckpoints = errors.New("this backend keeps no checkpoints")

// ActivityReporter is the optional capability of a Sandbox whose backend
// monitors what its processes do (package monitor, for gVisor). A backend
// without it gives results without an Activity.
type ActivityReporter interface {
	// TakeActivity returns what the sandbox did since the previous call
	// and forgets it, or nil if the sandbox is not monitored; final says
	// the sandbox's program has ended, and waits briefly for its last
	// events. A kill rule that fired shows in Activity.Rules; the backend
	// has killed the sandbox then.
	TakeActivity(final bool) *sandbox.Activity
	// TotalActivity returns everything the sandbox did in its life (a
	// session's whole tree), or nil if it is not monitored.
	TotalActivity() *sandbox.Activity
}

// SessionStore is the optional capability of a backend that keeps each
// session's record with its sandbox, where every server using the same
// backend finds it (the Kubernetes backend: on the session's claim in the
// API). With it the engine holds no session only in memory: asked for a
// session it does not hold, it finds the record here and attaches a new
// agent to the session's sandbox, so that any server serves any session
// and a restarted server keeps them; closing and expiry act on the store.
// It is found by a type assertion; without it (the gVisor backend) a
// session lives and dies with the server that created it.
type SessionStore interface {
	// FindSession returns the record of session id; an error wrapping
	// sandbox.ErrNoSession if the store has none.
	FindSession(ctx context.Context, id string) (SessionRecord, error)
	// StoredSessions returns the record of every stored session.
	StoredSessions(ctx context.Context) ([]SessionRecord, error)
	// AttachSession starts a new agent in the running sandbox of the
	// session spec.Session names (its SandboxID) and returns it as a
	// Sandbox whose agent sends its Ready event. The sandbox's files are
	// the session's; its interpreter starts afresh. The returned Sandbox
	// is a StoredSandbox, and becomes the session's Holder.
	AttachSession(spec StartSpec) (Sandbox, error)
	// EndSession removes the sandbox of session id, whichever server holds
	// it, and its record; ended is false if there was nothing to remove.
	EndSession(ctx context.Context, id string) (ended bool, err error)
}

// SessionRecord is what a SessionStore keeps of a session: what any
// engine needs to serve it.
type SessionRecord struct {
	ID       string
	Owner    string // sandbox.SessionSpec.Owner
	Language string
	Limits   sandbox.Limits
	Network  []string
	Packages []string
	Created  time.Time
	// LastUsed is when a request last went to the session's sandbox, or a
	// call last held it, from whichever server.
	LastUsed time.Time
	// SandboxID is the sandbox that holds the session.
	SandboxID string
	// Holder names the agent connection that attached to the sandbox last
	// (opaque, the backend's): the one whose interpreter is the session's.
	Holder string
}

// StoredSandbox is the capability of a sandbox a SessionStore started or
// attached to for a session.
type StoredSandbox interface {
	// Holder is this connection's name, as SessionRecord.Holder gives the
	// latest.
	Holder() string
	// Detach ends this server's connection (its agent) and leaves the
	// sandbox and the session's record to other servers. The engine calls
	// it instead of Destroy, once.
	Detach() error
	// Touch records in the store that the session is in use now.
	Touch(ctx context.Context) error
}
