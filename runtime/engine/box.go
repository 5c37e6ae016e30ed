package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/safe-run/safe-run/agent"
)

// status is where a sandbox is in its life. It changes only through
// box.changeStatus, which refuses a move the table below does not allow,
// so that no path can, say, send a request to a sandbox being destroyed or
// destroy one twice.
type status int

const (
	statusStarting  status = iota // the backend started it; its agent has not answered yet
	statusReady                   // its agent is waiting for a request
	statusRunning                 // a request is in flight
	statusExited                  // its agent's stream ended: it died or was killed
	statusDestroyed               // nothing of it is left
)

var statusNames = [...]string{"starting", "ready", "running", "exited", "destroyed"}

func (s status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("status %d", int(s))
}

// statusMoves are the allowed transitions. Any live status may end in
// exited (the sandbox died) or destroyed (its owner is done with it).
var statusMoves = map[status][]status{
	statusStarting:  {statusReady, statusExited, statusDestroyed},
	statusReady:     {statusRunning, statusExited, statusDestroyed},
	statusRunning:   {statusReady, statusExited, statusDestroyed},
	statusExited:    {statusDestroyed},
	statusDestroyed: nil,
}

// box is the engine's handle on one backend sandbox: its lifecycle and the
// host side of the agent protocol (requests out, events in, bounded).
type box struct {
	sb  Sandbox
	log *slog.Logger

	mu     sync.Mutex
	status status

	sendMu sync.Mutex
	events chan agent.Event // from the agent, in order; closed when its stream ends
	// eventsErr says why the stream ended early; read after events closes.
	eventsErr error
	budget    eventBudget

	start  time.Time
	phases []any // slog attributes: milliseconds from start to each phase

	destroyOnce sync.Once
	destroyErr  error
}

// changeStatus moves the box to status to, or says why it cannot.
func (b *box) changeStatus(to status) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.changeStatusLocked(to)
}

func (b *box) changeStatusLocked(to status) error {
	for _, ok := range statusMoves[b.status] {
		if ok == to {
			b.status = to
			return nil
		}
	}
	return fmt.Errorf("sandbox %s: cannot go from %s to %s", b.id(), b.status, to)
}

// requireStatus returns an error unless the box is in one of want.
func (b *box) requireStatus(want ...status) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, w := range want {
		if b.status == w {
			return nil
		}
	}
	return fmt.Errorf("sandbox %s is %s, not %v", b.id(), b.status, want)
}

// current returns the box's status.
func (b *box) current() status {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.status
}

func (b *box) id() string { return b.sb.ID() }

// mark records that the sandbox reached a phase, for debug logs.
func (b *box) mark(phase string) {
	b.phases = append(b.phases, slog.Float64(phase, float64(time.Since(b.start).Microseconds())/1000))
}

// startBox starts a sandbox for spec and begins reading its agent's events.
// A restored sandbox's agent is ready at once (it answered before its
// checkpoint); any other is starting until its Ready event.
func (e *Engine) startBox(spec StartSpec, restore string) (*box, error) {
	if restore != "" {
		return e.newBox(spec, func(spec StartSpec) (Sandbox, error) {
			return e.cfg.Backend.(Checkpointer).Restore(spec, restore)
		}, true)
	}
	return e.newBox(spec, e.cfg.Backend.Start, false)
}

// newBox starts a sandbox with start and begins reading its agent's
// events; ready says its agent will send no Ready event.
func (e *Engine) newBox(spec StartSpec, start func(StartSpec) (Sandbox, error), ready bool) (*box, error) {
	b := &box{start: time.Now(), events: make(chan agent.Event, 64)}
	spec.Log = e.log
	spec.Mark = b.mark
	var err error
	if b.sb, err = start(spec); err != nil {
		return nil, err
	}
	b.log = e.log.With("sandbox", b.sb.ID())
	if ready {
		b.status = statusReady
	}
	go b.readEvents()
	return b, nil
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
	// Once spent, the budget stays spent: the JSON decoder drops an error
	// returned with bytes that complete an event, so an agent writing one
	// event per write would otherwise never be stopped.
	if br.b.left.Load() < 0 {
		return 0, errOverBudget
	}
	n, err := br.r.Read(p)
	if br.b.left.Add(-int64(n)) < 0 {
		return n, errOverBudget
	}
	return n, err
}

// readEvents decodes the agent's events until its stream ends.
func (b *box) readEvents() {
	defer close(b.events)
	stream := b.sb.Events()
	defer stream.Close()
	b.budget.reset(1 << 20) // the Ready event and its framing
	dec := json.NewDecoder(budgetReader{stream, &b.budget})
	for {
		var ev agent.Event
		if err := dec.Decode(&ev); err != nil {
			switch {
			case errors.Is(err, errOverBudget):
				b.eventsErr = err
			case !errors.Is(err, io.EOF) && !errors.Is(err, os.ErrClosed):
				b.eventsErr = fmt.Errorf("malformed event from the sandbox: %w", err)
			}
			if b.eventsErr != nil {
				// An agent that broke the protocol is not waited for: left
				// running, it would hold the request until its deadline
				// (reported as a timeout) or the start for startTimeout.
				b.sb.Kill()
			}
			// Keep the writers from blocking until they die.
			_, _ = io.Copy(io.Discard, stream)
			return
		}
		b.events <- ev
	}
}

var errNotStarted = errors.New("sandbox did not start")

// startTimeout bounds how long a sandbox may take to come up, however
// loaded the host: beyond it the sandbox is broken, not slow.
const startTimeout = 60 * time.Second

// killGrace is how long after the program's timeout the host waits for the
// agent's own report before it kills the whole sandbox.
const killGrace = 500 * time.Millisecond

// awaitReady waits for the agent's Ready event.
func (b *box) awaitReady(ctx context.Context, observe func(time.Duration)) error {
	timer := time.NewTimer(startTimeout)
	defer timer.Stop()
	for {
		select {
		case ev, ok := <-b.events:
			switch {
			case !ok:
				<-b.sb.Exited()
				_ = b.changeStatus(statusExited)
				return fmt.Errorf("%w (%s)", errNotStarted, b.sb.ExitReport())
			case ev.Ready != nil:
				b.mark("agent_ready")
				if err := b.sb.Ready(); err != nil {
					b.kill()
					return err
				}
				if err := b.changeStatus(statusReady); err != nil {
					return err
				}
				if observe != nil {
					observe(time.Since(b.start))
				}
				return nil
			}
		case <-timer.C:
			b.kill()
			return fmt.Errorf("%w within %s (%s)", errNotStarted, startTimeout, b.sb.ExitReport())
		case <-ctx.Done():
			b.kill()
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
func (b *box) request(ctx context.Context, req agent.Request, budget int64, deadline time.Duration, stdout, stderr *stream) (*agent.Exit, ending) {
	if err := b.changeStatus(statusRunning); err != nil {
		return nil, ending{err: err}
	}
	b.budget.reset(budget)
	go func() {
		// The pipe holds 64 KiB; larger requests wait for the agent to read.
		// If the agent is gone, the write fails and the end of its event
		// stream tells what happened.
		b.sendMu.Lock()
		defer b.sendMu.Unlock()
		_ = json.NewEncoder(b.sb.Requests()).Encode(req)
	}()
	timer := time.NewTimer(deadline)
	defer timer.Stop()
	for {
		select {
		case ev, ok := <-b.events:
			switch {
			case !ok:
				select {
				case <-b.sb.Exited():
				case <-time.After(5 * time.Second):
				}
				_ = b.changeStatus(statusExited)
				return nil, ending{err: b.eventsErr}
			case ev.Output != nil && ev.Output.Stream == agent.Stdout && stdout != nil:
				stdout.write(ev.Output.Data)
			case ev.Output != nil && ev.Output.Stream == agent.Stderr && stderr != nil:
				stderr.write(ev.Output.Data)
			case ev.Exit != nil:
				_ = b.changeStatus(statusReady)
				return ev.Exit, ending{}
			}
		case <-timer.C:
			b.kill()
			return nil, ending{timedOut: true}
		case <-ctx.Done():
			b.kill()
			return nil, ending{cancelled: true}
		}
	}
}

// call sends a request that runs no program and checks its answer.
func (b *box) call(ctx context.Context, req agent.Request) error {
	exit, end := b.request(ctx, req, 1<<20, startTimeout+killGrace, nil, nil)
	switch {
	case exit != nil && exit.Error != "":
		return fmt.Errorf("sandbox %s: %s", b.id(), exit.Error)
	case exit != nil:
		return nil
	case end.cancelled:
		return ctx.Err()
	case end.timedOut:
		return fmt.Errorf("sandbox %s did not answer within %s", b.id(), startTimeout)
	case end.err != nil:
		return fmt.Errorf("sandbox %s: %w", b.id(), end.err)
	}
	<-b.sb.Exited()
	return fmt.Errorf("sandbox %s ended without answering (%s)", b.id(), b.sb.ExitReport())
}

// kill ends the sandbox's processes at once.
func (b *box) kill() {
	b.sb.Kill()
	b.mu.Lock()
	if b.status != statusDestroyed {
		_ = b.changeStatusLocked(statusExited)
	}
	b.mu.Unlock()
}

// exited reports whether the sandbox's processes have ended.
func (b *box) exited() bool {
	select {
	case <-b.sb.Exited():
		return true
	default:
		return false
	}
}

// destroy removes every trace of the sandbox. Only the first call does the
// work; later ones wait for it and report the same.
func (b *box) destroy() error {
	b.destroyOnce.Do(func() {
		b.destroyErr = b.sb.Destroy()
		b.mark("cleaned_up")
		if err := b.changeStatus(statusDestroyed); err != nil {
			b.log.Error("destroy sandbox", "err", err)
		}
	})
	return b.destroyErr
}

// detach ends this server's connection to a stored session's sandbox and
// leaves the sandbox to other servers (StoredSandbox.Detach); any other
// sandbox is destroyed. Like destroy, only the first call does the work.
func (b *box) detach() error {
	d, ok := b.sb.(StoredSandbox)
	if !ok {
		return b.destroy()
	}
	b.destroyOnce.Do(func() {
		b.destroyErr = d.Detach()
		b.mark("detached")
		if err := b.changeStatus(statusDestroyed); err != nil {
			b.log.Error("detach sandbox", "err", err)
		}
	})
	return b.destroyErr
}

// end destroys the box's sandbox, or with detach lets go of it (detach).
func (b *box) end(detach bool) error {
	if detach {
		return b.detach()
	}
	return b.destroy()
}

// holder is the name of the box's connection to a stored session's
// sandbox, or "" for any other sandbox.
func (b *box) holder() string {
	if d, ok := b.sb.(StoredSandbox); ok {
		return d.Holder()
	}
	return ""
}
