package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/safe-run/safe-run/runtime/engine"
)

// claimSandbox is one sandbox: a SandboxClaim, its Pod once bound, and the
// agent exec'd into the Pod, whose stdin and stdout are the protocol's
// streams. It is the engine.Sandbox this backend hands out.
type claimSandbox struct {
	b         *Backend
	name      string // the claim's, and the sandbox's ID
	log       *slog.Logger
	keepAlive bool
	mark      func(string)
	// holder names this connection on a session's claim
	// (AnnotationHolder); "" for a run.
	holder string

	ctx    context.Context // ends the exec (Kill, Destroy)
	cancel context.CancelFunc

	stdinR  *io.PipeReader
	stdinW  *io.PipeWriter
	eventsR *io.PipeReader
	eventsW *io.PipeWriter
	stderr  tailBuffer

	touched atomic.Int64 // unix seconds of the last last-used update

	mu      sync.Mutex
	pod     *corev1.Pod // once running
	sbName  string      // the claim's Sandbox, once bound
	report  string      // how it ended; set before exited closes
	oom     bool
	usageOK bool // oom is final

	exited      chan struct{}
	destroyOnce sync.Once
	destroyErr  error
}

var _ engine.Sandbox = (*claimSandbox)(nil)

func (b *Backend) newClaimSandbox(name, holder string, spec engine.StartSpec, log *slog.Logger) *claimSandbox {
	p := &claimSandbox{b: b, name: name, holder: holder, log: log, keepAlive: spec.KeepAlive, mark: spec.Mark, exited: make(chan struct{})}
	if p.mark == nil {
		p.mark = func(string) {}
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.stdinR, p.stdinW = io.Pipe()
	p.eventsR, p.eventsW = io.Pipe()
	go p.run()
	return p
}

func (p *claimSandbox) ID() string              { return p.name }
func (p *claimSandbox) Requests() io.Writer     { return requestWriter{p} }
func (p *claimSandbox) Events() io.ReadCloser   { return p.eventsR }
func (p *claimSandbox) Exited() <-chan struct{} { return p.exited }
func (p *claimSandbox) Ready() error            { return nil }

// MemoryNow is not measured: the Pod's memory is the kubelet's to read,
// and the engine's own pool, which sizes itself by it, is not used with
// this backend (agent-sandbox's warm pool is).
func (p *claimSandbox) MemoryNow() (int64, error) {
	return 0, errors.New("the kubernetes backend does not measure a sandbox's memory")
}

// agentCommand is the agent exec'd for a sandbox: it runs as the Pod's
// user (65534, with no capabilities), so it runs programs as itself
// rather than switching to another user as it does in a local sandbox.
func (p *claimSandbox) agentCommand() []string {
	cmd := []string{p.b.cfg.Agent, "--workdir", p.b.cfg.Workdir}
	if !p.keepAlive {
		cmd = append(cmd, "--one-shot")
	}
	return cmd
}

// run waits for the claim's Pod, then carries the agent's streams until
// its exec ends.
func (p *claimSandbox) run() {
	report := p.serve()
	p.mu.Lock()
	p.report = report
	p.mu.Unlock()
	p.stdinR.CloseWithError(io.ErrClosedPipe)
	p.eventsW.Close()
	close(p.exited)
}

func (p *claimSandbox) serve() string {
	pod, err := p.b.awaitPod(p.ctx, p.name)
	if err != nil {
		if p.ctx.Err() != nil {
			return "killed before its Pod ran"
		}
		return err.Error()
	}
	p.mark("pod_running")
	p.mu.Lock()
	p.pod = pod
	p.sbName = pod.Name
	p.mu.Unlock()
	ex, err := p.b.exec(pod, p.agentCommand())
	if err != nil {
		return err.Error()
	}
	err = ex.StreamWithContext(p.ctx, remotecommand.StreamOptions{Stdin: p.stdinR, Stdout: p.eventsW, Stderr: &p.stderr})
	if p.ctx.Err() != nil && err != nil {
		return "killed"
	}
	return exitReport(err, p.stderr.String())
}

// ExitReport says how the agent's exec ended, or why it never started.
func (p *claimSandbox) ExitReport() string {
	select {
	case <-p.exited:
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.report
	default:
		return "the agent still runs"
	}
}

// Usage reports an OOM kill of the Pod's container (the sandbox's memory
// limit is the container's): gVisor's sentry and everything in it go with
// it. Peak memory is not measured.
func (p *claimSandbox) Usage() engine.Usage {
	p.mu.Lock()
	pod, oom, final := p.pod, p.oom, p.usageOK
	p.mu.Unlock()
	if pod == nil || final {
		return usage(oom)
	}
	select {
	case <-p.exited:
	default:
		return usage(false)
	}
	// The kubelet reports the container's end a moment after the exec
	// stream breaks; wait a little for it.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	for {
		var now corev1.Pod
		err := p.b.get(ctx, podsResource, pod.Name, &now)
		if err == nil && OOMKilled(&now) {
			oom = true
			break
		}
		if err != nil || p.endedOrderly() || ctx.Err() != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	p.mu.Lock()
	p.oom, p.usageOK = oom, true
	p.mu.Unlock()
	return usage(oom)
}

// endedOrderly says the sandbox ended as the agent or the backend meant:
// the agent exited 0, or the sandbox was killed. Any other end may be the
// container's death under it, whose OOM kill the kubelet reports only a
// moment later.
func (p *claimSandbox) endedOrderly() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.HasPrefix(p.report, "agent exit status 0") || strings.HasPrefix(p.report, "killed")
}

func usage(oom bool) engine.Usage {
	if oom {
		return engine.Usage{OOMKills: 1}
	}
	return engine.Usage{}
}

// Kill ends the agent's exec and deletes the claim, so that agent-sandbox
// ends the Pod and whatever runs in it; it returns once the exec is over.
func (p *claimSandbox) Kill() {
	p.cancel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.b.remove(ctx, claimsResource, p.name); err != nil {
		p.log.Warn("delete claim", "claim", p.name, "err", err)
	}
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		p.log.Error("the agent's exec did not end after its claim was deleted")
	}
}

// Destroy ends the exec and deletes the claim and its Sandbox (the Pod
// goes with the Sandbox, which owns it; the Sandbox is deleted here too
// rather than left to the garbage collector, which a control plane without
// a controller manager lacks). Sandboxes are single use, as locally.
func (p *claimSandbox) Destroy() error {
	p.destroyOnce.Do(func() { p.destroyErr = p.remove() })
	return p.destroyErr
}

// Detach ends this server's agent in a session's sandbox, as Destroy
// does, and leaves the claim, its Sandbox and Pod (and the files in its
// workspace) to the server that attaches next (engine.StoredSandbox).
func (p *claimSandbox) Detach() error {
	p.destroyOnce.Do(func() {
		defer p.b.forget(p.name)
		p.endExec()
	})
	return p.destroyErr
}

// Holder names this connection on the session's claim.
func (p *claimSandbox) Holder() string { return p.holder }

// Touch records on the session's claim that it is in use now.
func (p *claimSandbox) Touch(ctx context.Context) error {
	return p.b.touch(ctx, p.name, time.Now())
}

// endExec ends the agent's exec: its stdin closes, so that a session's
// agent exits (and its interpreter with it), then the stream is cancelled.
func (p *claimSandbox) endExec() {
	p.stdinW.Close()
	select {
	case <-p.exited:
	case <-time.After(2 * time.Second):
	}
	p.cancel()
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		p.log.Error("the agent's exec did not end when cancelled")
	}
}

func (p *claimSandbox) remove() error {
	defer p.b.forget(p.name)
	p.endExec()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var errs []error
	if err := p.b.remove(ctx, claimsResource, p.name); err != nil {
		errs = append(errs, fmt.Errorf("delete claim %s: %w", p.name, err))
	}
	p.mu.Lock()
	sb := p.sbName
	p.mu.Unlock()
	if sb != "" {
		if err := p.b.remove(ctx, sandboxesResource, sb); err != nil {
			errs = append(errs, fmt.Errorf("delete sandbox %s: %w", sb, err))
		}
	}
	return errors.Join(errs...)
}

// requestWriter carries the engine's requests to the agent, and records
// on a session's claim that it was used, at most every few seconds, so
// that the claim's state in the API says which sessions are alive.
type requestWriter struct{ p *claimSandbox }

func (w requestWriter) Write(b []byte) (int, error) {
	if p := w.p; p.keepAlive {
		now := time.Now()
		if last := p.touched.Load(); now.Unix()-last >= touchEvery && p.touched.CompareAndSwap(last, now.Unix()) {
			go p.touch(now)
		}
	}
	return w.p.stdinW.Write(b)
}

// touchEvery is how often, at most, a session's claim's last use is
// recorded, in seconds: the annotation's resolution, so that every call
// is recorded and any server can expire the session by it.
const touchEvery = 1

func (p *claimSandbox) touch(now time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.b.touch(ctx, p.name, now); err != nil && !apierrors.IsNotFound(err) {
		p.log.Warn("record the session's last use on its claim", "err", err)
	}
}

// tailBuffer keeps the last 4 KiB written to it: the agent's stderr.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tailBuffer) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, b...)
	if over := len(t.buf) - 4096; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(b), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}
