package engine_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/safe-run/safe-run/agent"
	"github.com/safe-run/safe-run/runtime/engine"
)

// fakeBackend is an engine.Backend without runsc: each sandbox is a
// goroutine running a fake agent that speaks the real protocol (JSON lines
// over pipes), as a test scripts it.
type fakeBackend struct {
	mu       sync.Mutex
	agent    func(a *fakeAgent) // what every new sandbox's agent does
	startErr error              // if set, Start fails with it
	readyErr error              // if set, Sandbox.Ready fails with it
	// destroyErr, if set, is what Destroy reports it could not remove.
	destroyErr error
	boxes      []*fakeSandbox

	live sync.WaitGroup
	n    atomic.Int64 // started and not yet destroyed
	cpu  atomic.Int64 // the CPU (ns) each new sandbox reports used at first
}

var _ engine.Backend = (*fakeBackend)(nil)

// newFake returns a backend whose agents serve with handle.
func newFake(handle handler) *fakeBackend {
	return &fakeBackend{agent: serve(handle)}
}

// setAgent changes what the agents of sandboxes started from now on do.
func (f *fakeBackend) setAgent(agent func(a *fakeAgent)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.agent = agent
}

// setStartErr makes Start fail with err from now on (nil: succeed).
func (f *fakeBackend) setStartErr(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.startErr = err
}

func (f *fakeBackend) Start(spec engine.StartSpec) (engine.Sandbox, error) {
	return f.start(spec, "", true)
}

// start starts a sandbox whose agent sends its Ready event if ready says so
// (a restored agent sent it before its checkpoint).
func (f *fakeBackend) start(spec engine.StartSpec, restoredFrom string, ready bool) (*fakeSandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.startErr != nil {
		return nil, fmt.Errorf("start sandbox: %w", f.startErr)
	}
	sb := &fakeSandbox{
		b: f, id: fmt.Sprintf("fake-%d", len(f.boxes)+1), spec: spec, restoredFrom: restoredFrom, readyErr: f.readyErr,
		killed: make(chan struct{}), exited: make(chan struct{}),
	}
	sb.cpu.Store(f.cpu.Load())
	sb.reqR, sb.reqW = io.Pipe()
	sb.evR, sb.evW = io.Pipe()
	f.boxes = append(f.boxes, sb)
	f.live.Add(1)
	f.n.Add(1)
	a := &fakeAgent{sb: sb, spec: spec, dec: json.NewDecoder(sb.reqR), skipReady: !ready}
	run := f.agent
	go func() {
		defer close(sb.exited)
		defer sb.reqR.Close()
		defer sb.evW.Close()
		run(a)
	}()
	return sb, nil
}

func (f *fakeBackend) Wait(ctx context.Context) error {
	done := make(chan struct{})
	go func() { f.live.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (f *fakeBackend) Live() int { return int(f.n.Load()) }

// sandboxes returns the sandboxes started so far, in order.
func (f *fakeBackend) sandboxes() []*fakeSandbox {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*fakeSandbox(nil), f.boxes...)
}

// sandbox returns the sandbox called id, or nil.
func (f *fakeBackend) sandbox(id string) *fakeSandbox {
	for _, sb := range f.sandboxes() {
		if sb.id == id {
			return sb
		}
	}
	return nil
}

// fakeSandbox is one fake sandbox: the agent goroutine and its two pipes.
type fakeSandbox struct {
	b            *fakeBackend
	id           string
	spec         engine.StartSpec
	restoredFrom string // the checkpoint image it was restored from, if any
	readyErr     error

	reqR *io.PipeReader // the agent's end of the requests
	reqW *io.PipeWriter
	evR  *io.PipeReader // the host's end of the events
	evW  *io.PipeWriter

	killOnce sync.Once
	killed   chan struct{} // closed by Kill
	exited   chan struct{} // closed when the agent goroutine has returned
	oomKills atomic.Uint64

	destroyOnce sync.Once
	destroys    atomic.Int32 // calls of Destroy

	markMu sync.Mutex
	marks  []string // MarkPooled calls, in order

	foreground atomic.Bool  // Foreground was called
	cpu        atomic.Int64 // CPUUsed, in nanoseconds
}

var (
	_ engine.Sandbox     = (*fakeSandbox)(nil)
	_ engine.PoolMarker  = (*fakeSandbox)(nil)
	_ engine.Prioritizer = (*fakeSandbox)(nil)
	_ engine.CPUMeter    = (*fakeSandbox)(nil)
)

// CPUUsed is what the test set in cpu, or the backend's cpu when the
// sandbox started.
func (s *fakeSandbox) CPUUsed() (time.Duration, error) { return time.Duration(s.cpu.Load()), nil }

// Foreground records that the sandbox was raised to a run's priority.
func (s *fakeSandbox) Foreground() { s.foreground.Store(true) }

func (s *fakeSandbox) ID() string                { return s.id }
func (s *fakeSandbox) Requests() io.Writer       { return s.reqW }
func (s *fakeSandbox) Events() io.ReadCloser     { return s.evR }
func (s *fakeSandbox) Exited() <-chan struct{}   { return s.exited }
func (s *fakeSandbox) MemoryNow() (int64, error) { return 30 << 20, nil }

func (s *fakeSandbox) Ready() error {
	if s.readyErr != nil {
		s.Kill()
	}
	return s.readyErr
}

func (s *fakeSandbox) ExitReport() string {
	select {
	case <-s.killed:
		return "fake sandbox killed"
	case <-s.exited:
		return "fake agent exited"
	default:
		return "fake agent still running"
	}
}

func (s *fakeSandbox) Usage() engine.Usage {
	return engine.Usage{OOMKills: s.oomKills.Load(), PeakBytes: 42 << 20}
}

// Kill ends the agent: its pipes break, as when a sandbox's processes die.
func (s *fakeSandbox) Kill() {
	s.killOnce.Do(func() {
		close(s.killed)
		s.reqR.CloseWithError(errors.New("sandbox killed"))
		s.evW.Close()
	})
	<-s.exited
}

// Destroy ends the agent (a session's sees the end of its requests, as
// with a real backend) and counts the sandbox gone.
func (s *fakeSandbox) Destroy() error {
	s.destroys.Add(1)
	s.destroyOnce.Do(func() {
		s.reqW.Close()
		select {
		case <-s.exited:
		case <-time.After(2 * time.Second):
			s.Kill()
		}
		s.b.n.Add(-1)
		s.b.live.Done()
	})
	return s.b.destroyErr
}

func (s *fakeSandbox) MarkPooled(language string) {
	s.markMu.Lock()
	defer s.markMu.Unlock()
	s.marks = append(s.marks, language)
}

// pooledMarks returns the MarkPooled calls so far.
func (s *fakeSandbox) pooledMarks() []string {
	s.markMu.Lock()
	defer s.markMu.Unlock()
	return append([]string(nil), s.marks...)
}

// isDestroyed reports whether Destroy was called.
func (s *fakeSandbox) isDestroyed() bool { return s.destroys.Load() > 0 }

// fakeAgent is the agent side of one fake sandbox.
type fakeAgent struct {
	sb        *fakeSandbox
	spec      engine.StartSpec
	dec       *json.Decoder
	skipReady bool // restored: the Ready event was sent before the checkpoint
	state     map[string]int
	files     map[string][]byte
}

// send writes events to the host; false means the pipe broke.
func (a *fakeAgent) send(evs ...agent.Event) bool {
	for _, ev := range evs {
		data, err := json.Marshal(ev)
		if err != nil {
			panic(err)
		}
		if !a.raw(string(data) + "\n") {
			return false
		}
	}
	return true
}

// raw writes bytes to the event stream as they are.
func (a *fakeAgent) raw(s string) bool {
	_, err := io.WriteString(a.sb.evW, s)
	return err == nil
}

// next reads the next request; false means the request stream ended.
func (a *fakeAgent) next() (agent.Request, bool) {
	var req agent.Request
	if err := a.dec.Decode(&req); err != nil {
		return req, false
	}
	return req, true
}

// hang blocks until the sandbox is killed or its request stream ends (it
// is destroyed).
func (a *fakeAgent) hang() {
	ended := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, a.sb.reqR); close(ended) }()
	select {
	case <-a.sb.killed:
	case <-ended:
	}
}

// oom records an OOM kill; the agent dies when its handler returns nil.
func (a *fakeAgent) oom() { a.sb.oomKills.Add(1) }

// handler answers one request with events; nil means the agent dies
// without answering.
type handler func(a *fakeAgent, req agent.Request) []agent.Event

// ready is the agent's first event.
var ready = agent.Event{Ready: &agent.Ready{Version: agent.ProtocolVersion}}

// serve is the agent's main loop, like the real one: Ready, then one
// request (or, for a session, requests until their stream ends), each
// answered by handle.
func serve(handle handler) func(a *fakeAgent) {
	return func(a *fakeAgent) {
		if !a.skipReady && !a.send(ready) {
			return
		}
		for {
			req, ok := a.next()
			if !ok {
				return
			}
			evs := handle(a, req)
			if evs == nil || !a.send(evs...) || !a.spec.KeepAlive && req.Op == agent.OpRun {
				return
			}
		}
	}
}

// exit is an event ending a request with exit.
func exit(e agent.Exit) []agent.Event { return []agent.Event{{Exit: &e}} }

// stdout is an Output event of stdout.
func stdout(s string) agent.Event {
	return agent.Event{Output: &agent.Output{Stream: agent.Stdout, Data: []byte(s)}}
}

// replies answers warm-ups, file writes and unknown operations with a
// plain Exit, and runs with what run returns.
func replies(run handler) handler {
	return func(a *fakeAgent, req agent.Request) []agent.Event {
		if req.Op == agent.OpRun {
			return run(a, req)
		}
		return exit(agent.Exit{})
	}
}

// printCode answers a run by printing its code: the program's file is the
// request's first file.
var printCode = replies(func(a *fakeAgent, req agent.Request) []agent.Event {
	code := string(req.Files[0].Data)
	return append([]agent.Event{stdout(code)}, exit(agent.Exit{StdoutBytes: int64(len(code))})...)
})

// discard is a logger for engines under test: their errors are expected.
var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// newEngine returns an engine over b configured by cfg, and checks when the
// test ends that closing it leaves nothing behind: every sandbox destroyed
// exactly once, none live, and no goroutine of the engine or of the fake.
func newEngine(t *testing.T, b engine.Backend, cfg engine.Config) *engine.Engine {
	t.Helper()
	t.Cleanup(func() { checkNoGoroutines(t) }) // runs last
	cfg.Backend = b
	if cfg.Logger == nil {
		cfg.Logger = discard
	}
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatalf("engine.New: %v", err)
	}
	t.Cleanup(func() {
		e.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := e.Wait(ctx); err != nil {
			t.Errorf("Wait after Close: %v (%d sandboxes live)", err, e.LiveSandboxes())
		}
		if n := e.LiveSandboxes(); n != 0 {
			t.Errorf("after Close and Wait, %d sandboxes are live", n)
		}
		var fake *fakeBackend
		switch b := b.(type) {
		case *fakeBackend:
			fake = b
		case *fakeCheckpointer:
			fake = b.fakeBackend
		}
		if fake == nil {
			return
		}
		for _, sb := range fake.sandboxes() {
			if n := sb.destroys.Load(); n != 1 {
				t.Errorf("sandbox %s was destroyed %d times, want once", sb.id, n)
			}
		}
	})
	return e
}

// checkNoGoroutines fails the test if a goroutine of the engine (such as
// its session janitor) or of the fake outlives it. Goroutines that are
// about to return get a few seconds.
func checkNoGoroutines(t *testing.T) {
	t.Helper()
	var left []string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		left = leftGoroutines()
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, g := range left {
		t.Errorf("goroutine left behind:\n%s", g)
	}
}

// leftGoroutines returns the stacks of goroutines running code of package
// engine or of the fake, other than the tests themselves.
func leftGoroutines() []string {
	var buf bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&buf, 2)
	var left []string
	for _, g := range strings.Split(buf.String(), "\n\n") {
		if strings.Contains(g, "\ntesting.tRunner(") || strings.Contains(g, "\ntesting.runExample") {
			continue
		}
		if strings.Contains(g, "/runtime/engine.") || strings.Contains(g, "engine_test.(*fake") ||
			strings.Contains(g, "engine_test.serve") || strings.Contains(g, "engine_test.(*fakeBackend)") {
			left = append(left, g)
		}
	}
	return left
}

// eventually polls cond until it holds, for at most ten seconds (a
// generous bound for a loaded host, not a timing assertion).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
	}
}

// fakeCheckpointer is a fakeBackend with the optional Checkpointer
// capability: images are names in memory, and a restored sandbox's agent
// skips its Ready event as a real restored one does.
type fakeCheckpointer struct {
	*fakeBackend

	mu          sync.Mutex
	images      map[string]string // tag → image
	checkpoints int
	restores    int
	forgotten   []string
	// restoreErr, if set, says whether the nth restore (from 1) fails.
	restoreErr func(n int) error
}

var _ engine.Checkpointer = (*fakeCheckpointer)(nil)

func newFakeCheckpointer(handle handler) *fakeCheckpointer {
	return &fakeCheckpointer{fakeBackend: newFake(handle), images: map[string]string{}}
}

func (c *fakeCheckpointer) FindCheckpoint(spec engine.StartSpec, tag string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.images[tag], nil
}

func (c *fakeCheckpointer) Checkpoint(ctx context.Context, sb engine.Sandbox, spec engine.StartSpec, tag string) (string, error) {
	c.mu.Lock()
	c.checkpoints++
	image := fmt.Sprintf("image-%d", c.checkpoints)
	c.images[tag] = image
	c.mu.Unlock()
	sb.Kill() // a checkpoint ends the sandbox
	return image, nil
}

func (c *fakeCheckpointer) Restore(spec engine.StartSpec, image string) (engine.Sandbox, error) {
	c.mu.Lock()
	c.restores++
	n := c.restores
	c.mu.Unlock()
	if c.restoreErr != nil {
		if err := c.restoreErr(n); err != nil {
			return nil, err
		}
	}
	sb, err := c.start(spec, image, false)
	if err != nil {
		return nil, err
	}
	return sb, nil
}

func (c *fakeCheckpointer) Forget(image string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forgotten = append(c.forgotten, image)
	for tag, im := range c.images {
		if im == image {
			delete(c.images, tag)
		}
	}
	return nil
}

// counts returns how many checkpoints and restores were made, and the
// images forgotten.
func (c *fakeCheckpointer) counts() (checkpoints, restores int, forgotten []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.checkpoints, c.restores, append([]string(nil), c.forgotten...)
}
