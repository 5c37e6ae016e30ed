// Package engine runs jobs in sandboxes whatever starts them: it speaks
// the host side of the agent protocol (requests, bounded event streams,
// output caps), classifies how each run ended into a sandbox.Result, keeps
// the session table and the warm pool, and tracks every sandbox through
// one explicit lifecycle. It implements sandbox.Runner and sandbox.Sessions.
//
// A Backend starts the sandboxes; package gvisor is the one for this host.
// The engine has a package of its own so that a second backend — a
// Kubernetes one, say — reuses all of this by implementing Backend alone.
package engine

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/safe-run/safe-run/sandbox"
)

// Config configures an Engine. Backend is required.
type Config struct {
	// Backend starts the sandboxes.
	Backend Backend
	// Policy validates jobs and supplies default limits.
	Policy sandbox.Policy
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

// Engine runs jobs and sessions in sandboxes of its Backend. It is safe for
// concurrent use.
type Engine struct {
	cfg      Config
	log      *slog.Logger
	sessions *sessionTable
	pool     *pool // nil without one
}

var (
	_ sandbox.Runner   = (*Engine)(nil)
	_ sandbox.Sessions = (*Engine)(nil)
)

// New returns an Engine over cfg.Backend, with its warm pool filling.
func New(cfg Config) (*Engine, error) {
	if cfg.Backend == nil {
		return nil, errors.New("engine: no backend")
	}
	if err := cfg.Policy.Validate(); err != nil {
		return nil, sandbox.WithClass(err, sandbox.ErrInvalid)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	e := &Engine{cfg: cfg, log: cfg.Logger}
	e.sessions = newSessionTable(cfg.Sessions)
	if _, ok := cfg.Backend.(SessionStore); ok && cfg.Sessions.SweepStore {
		// Sessions other servers left expire here too.
		e.sessions.janitor.Do(func() { go e.expireSessions() })
	}
	if len(cfg.Pool.Size) > 0 {
		var err error
		if e.pool, err = newPool(e, cfg.Pool); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// Close destroys the warm pool's sandboxes and closes every session. Runs
// in progress go on; Wait waits for them.
func (e *Engine) Close() {
	e.pool.close()
	e.CloseSessions()
}

// Wait blocks until every sandbox has been destroyed — runs ended and
// cleaned up, sessions closed — or ctx ends. A server calls it after
// cancelling its runs and closing its sessions, before exit.
func (e *Engine) Wait(ctx context.Context) error { return e.cfg.Backend.Wait(ctx) }

// LiveSandboxes counts the sandboxes started and not yet destroyed.
func (e *Engine) LiveSandboxes() int { return e.cfg.Backend.Live() }

// PoolSizes returns how many warm sandboxes are ready, per pooled language.
func (e *Engine) PoolSizes() map[string]int { return e.pool.sizes() }

// Policy returns the policy jobs are checked against.
func (e *Engine) Policy() sandbox.Policy { return e.cfg.Policy }

// spec is the start spec of a sandbox for job: the image it names, else
// its language's (empty: the backend's default).
func (e *Engine) spec(job sandbox.Job, keepAlive bool) StartSpec {
	if job.Image == "" {
		lang, _ := e.cfg.Policy.Language(job.Language)
		job.Image = lang.Image
	}
	spec := StartSpec{Job: job, KeepAlive: keepAlive}
	if len(job.Network) > 0 {
		spec.NetworkLimits = e.cfg.Policy.NetworkLimits
	}
	return spec
}
