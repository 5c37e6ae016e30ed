package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/safe-run/safe-run/agent"
	"github.com/safe-run/safe-run/runtime/engine"
	"github.com/safe-run/safe-run/sandbox"
)

// echoBackend is about the smallest engine.Backend there is: its sandboxes
// are goroutines, and their agent answers every request by printing the
// code it was sent. A real backend starts an isolated sandbox whose first
// process is safe-run-agent, and connects its stdin and stdout instead.
type echoBackend struct {
	started atomic.Int64
	live    atomic.Int64
	gone    sync.WaitGroup
}

func (b *echoBackend) Start(spec engine.StartSpec) (engine.Sandbox, error) {
	reqR, reqW := io.Pipe()
	evR, evW := io.Pipe()
	s := &echoSandbox{b: b, id: fmt.Sprintf("echo-%d", b.started.Add(1)), requests: reqW, events: evR, exited: make(chan struct{})}
	b.live.Add(1)
	b.gone.Add(1)
	go s.agent(reqR, evW, spec.KeepAlive)
	return s, nil
}

func (b *echoBackend) Wait(ctx context.Context) error {
	done := make(chan struct{})
	go func() { b.gone.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (b *echoBackend) Live() int { return int(b.live.Load()) }

// echoSandbox is one sandbox of echoBackend.
type echoSandbox struct {
	b        *echoBackend
	id       string
	requests *io.PipeWriter // to the agent
	events   *io.PipeReader // from the agent
	exited   chan struct{}
	destroy  sync.Once
}

// agent speaks the agent protocol: Ready, then for each request one Output
// event and one Exit; a one-shot agent stops after its first run.
func (s *echoSandbox) agent(requests io.ReadCloser, events io.WriteCloser, keepAlive bool) {
	defer close(s.exited)
	defer events.Close()
	defer requests.Close()
	enc, dec := json.NewEncoder(events), json.NewDecoder(requests)
	_ = enc.Encode(agent.Event{Ready: &agent.Ready{Version: agent.ProtocolVersion}})
	for {
		var req agent.Request
		if dec.Decode(&req) != nil {
			return // the host closed the request stream
		}
		code := req.Code // a session's cell
		if req.Op == agent.OpRun {
			code = string(req.Files[0].Data) // a run's program is its first file
		}
		_ = enc.Encode(agent.Event{Output: &agent.Output{Stream: agent.Stdout, Data: []byte(code)}})
		_ = enc.Encode(agent.Event{Exit: &agent.Exit{Code: 0, StdoutBytes: int64(len(code))}})
		if !keepAlive {
			return
		}
	}
}

func (s *echoSandbox) ID() string                { return s.id }
func (s *echoSandbox) Requests() io.Writer       { return s.requests }
func (s *echoSandbox) Events() io.ReadCloser     { return s.events }
func (s *echoSandbox) Ready() error              { return nil }
func (s *echoSandbox) Exited() <-chan struct{}   { return s.exited }
func (s *echoSandbox) ExitReport() string        { return "the echo agent exited" }
func (s *echoSandbox) Usage() engine.Usage       { return engine.Usage{} }
func (s *echoSandbox) MemoryNow() (int64, error) { return 0, nil }

// Kill ends the agent: it sees the end of its requests.
func (s *echoSandbox) Kill() {
	s.requests.Close()
	<-s.exited
}

func (s *echoSandbox) Destroy() error {
	s.destroy.Do(func() {
		s.Kill()
		s.b.live.Add(-1)
		s.b.gone.Done()
	})
	return nil
}

// The engine runs a job in a fresh sandbox of its backend and destroys the
// sandbox afterwards.
func ExampleEngine_Run() {
	e, err := engine.New(engine.Config{Backend: &echoBackend{}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer e.Close()
	res, err := e.Run(context.Background(), sandbox.Job{Language: "python", Code: `print("hello")`})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(res.Status, res.ExitCode, res.SandboxID)
	fmt.Println(res.Stdout)
	// The sandbox is removed in the background once the result is known.
	_ = e.Wait(context.Background())
	fmt.Println("live sandboxes:", e.LiveSandboxes())
	// Output:
	// ok 0 echo-1
	// print("hello")
	// live sandboxes: 0
}

// A session keeps one sandbox for many calls, until it is closed.
func ExampleEngine_RunInSession() {
	e, err := engine.New(engine.Config{Backend: &echoBackend{}})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	info, err := e.CreateSession(ctx, sandbox.SessionSpec{Language: "python"})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, code := range []string{"x = 41", "x + 1"} {
		res, err := e.RunInSession(ctx, info.ID, sandbox.Job{Code: code})
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(res.Status, res.SandboxID, res.Stdout)
	}
	fmt.Println("sessions:", len(e.ListSessions()))
	e.Close() // closes every session
	if err := e.Wait(ctx); err != nil {
		fmt.Println(err)
	}
	fmt.Println("sessions:", len(e.ListSessions()), "live sandboxes:", e.LiveSandboxes())
	// Output:
	// ok echo-1 x = 41
	// ok echo-1 x + 1
	// sessions: 1
	// sessions: 0 live sandboxes: 0
}
