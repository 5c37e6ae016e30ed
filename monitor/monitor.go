package monitor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"
	"google.golang.org/protobuf/proto"
	pb "gvisor.dev/gvisor/pkg/sentry/seccheck/points/points_go_proto"
	"gvisor.dev/gvisor/pkg/sentry/seccheck/sinks/remote/wire"

	"github.com/safe-run/safe-run/sandbox"
)

// Options configure a Monitor.
type Options struct {
	// Level chooses the trace points (SessionConfig); "" is LevelDefault.
	Level Level
	// Rules are the rules applied; nil is DefaultRules (give an empty
	// non-nil slice for none).
	Rules []Rule
	// OnKill is called once per Monitor, on its own goroutine, with the
	// first hit of a rule whose action is kill: the caller ends the run.
	OnKill func(hit sandbox.RuleHit)
	// Log receives the monitor's own troubles (a lost stream); nil is
	// slog.Default().
	Log *slog.Logger
	// Limits bound what the stream can make the monitor do; each zero
	// field takes its default.
	Limits Limits
	// ExpectStart says the sandbox starts fresh (not restored from a
	// checkpoint): its stream must carry the container/start point, and
	// Take reports monitoring lost when it has not come.
	// runsc runs a sandbox whose session the sentry refuses (an unknown
	// point or field, in its boot log) unmonitored, its socket silent.
	ExpectStart bool
}

// Limits bound the monitor's memory and CPU whatever the stream holds.
type Limits struct {
	// MaxMessage is the largest message read whole (default 64 KiB); of a
	// longer one (an execve with a huge argv) the leading fields that fit
	// are decoded, the rest dropped, so it cannot hide the program start.
	MaxMessage int
	// EventsPerSecond is the sustained rate of messages decoded (default
	// 20000, Burst 2x); beyond it the monitor reads slower, runsc drops
	// points rather than wait, and the activity counts them (Dropped).
	EventsPerSecond int
	// MaxEvents is the number of messages after which monitoring ends
	// (Lost says so), default 5,000,000.
	MaxEvents int64
	// MaxProcesses caps Activity.Processes (default 256).
	MaxProcesses int
	// MaxArgs and MaxArgLen cap each process's argv (default 16 args of
	// 256 bytes); MaxPathLen caps each path or address (default 512).
	MaxArgs, MaxArgLen, MaxPathLen int
	// MaxList caps every other list of the activity (default 128).
	MaxList int
	// MaxTracked caps what the rules remember over the sandbox's life:
	// live processes, written paths, rule hits already reported (default
	// 4096 each).
	MaxTracked int
	// MaxConnections is how many sink connections the monitor accepts over
	// its life (default 4; runsc makes one per sandbox).
	MaxConnections int
	// HandshakeTimeout bounds the sink's handshake (default 10 s).
	HandshakeTimeout time.Duration
	// Settle bounds how long Take and Close wait for what the socket
	// already holds to be read (default 200 ms).
	Settle time.Duration
}

// withDefaults fills in the zero fields of l.
func (l Limits) withDefaults() Limits {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&l.MaxMessage, 64<<10)
	def(&l.EventsPerSecond, 20000)
	def(&l.MaxProcesses, 256)
	def(&l.MaxArgs, 16)
	def(&l.MaxArgLen, 256)
	def(&l.MaxPathLen, 512)
	def(&l.MaxList, 128)
	def(&l.MaxTracked, 4096)
	def(&l.MaxConnections, 4)
	if l.MaxEvents <= 0 {
		l.MaxEvents = 5_000_000
	}
	if l.HandshakeTimeout <= 0 {
		l.HandshakeTimeout = 10 * time.Second
	}
	if l.Settle <= 0 {
		l.Settle = 200 * time.Millisecond
	}
	if l.MaxMessage < 4096 {
		l.MaxMessage = 4096 // the sink's handshake may be up to 10 KiB, see handshake
	}
	return l
}

// Monitor serves the trace sink of one sandbox and accumulates its activity.
type Monitor struct {
	path    string
	level   Level
	lim     Limits
	log     *slog.Logger
	onKill  func(sandbox.RuleHit)
	expect  bool
	ln      *net.UnixListener
	limiter *rate.Limiter
	ctx     context.Context
	cancel  context.CancelFunc
	closing atomic.Bool
	wg      sync.WaitGroup

	// idler wakes settle when a connection's reader goes idle.
	idler idler

	mu    sync.Mutex
	conns []*conn
	st    *state
}

// conn is one sink connection.
type conn struct {
	*net.UnixConn
	// idle is set when the reader found the queue empty, and cleared
	// before each read: with an empty queue it says every message read has
	// been applied (settle).
	idle atomic.Bool
}

// idler wakes the goroutines that settle when a reader goes idle: a
// waiter takes the channel, then checks; a reader that goes idle closes
// it. A reader pays only an atomic load while nobody waits.
type idler struct {
	waiting atomic.Bool
	mu      sync.Mutex
	ch      chan struct{}
}

// wait returns a channel closed at the next idle.
func (w *idler) wait() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch == nil {
		w.ch = make(chan struct{})
		w.waiting.Store(true)
	}
	return w.ch
}

// idle wakes the waiters, if any.
func (w *idler) idle() {
	if !w.waiting.Load() {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch != nil {
		close(w.ch)
		w.ch = nil
		w.waiting.Store(false)
	}
}

// Start listens on socketPath (a new SOCK_SEQPACKET Unix socket; the file
// must not exist) for runsc's remote sink, and consumes what it sends.
func Start(socketPath string, opts Options) (*Monitor, error) {
	level := opts.Level
	if level == "" {
		level = LevelDefault
	}
	if _, err := ParseLevel(string(level)); err != nil {
		return nil, err
	}
	if level == LevelOff {
		return nil, fmt.Errorf("start monitor: level off has nothing to monitor; do not start one")
	}
	rules := opts.Rules
	if rules == nil {
		rules = DefaultRules()
	}
	for i, r := range rules {
		if err := r.check(); err != nil {
			return nil, fmt.Errorf("start monitor: rule %d (%q): %v", i+1, r.Name, err)
		}
	}
	lim := opts.Limits.withDefaults()
	log := opts.Log
	if log == nil {
		log = slog.Default()
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: socketPath, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("start monitor: listen on %s: %w", socketPath, err)
	}
	ln.SetUnlinkOnClose(true)
	// Only runsc (the same user as safe-run) connects; the sandbox has no
	// path to the host's socket.
	if err := os.Chmod(socketPath, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("start monitor: chmod %s: %w", socketPath, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &Monitor{
		path: socketPath, level: level, lim: lim, log: log, onKill: opts.OnKill, expect: opts.ExpectStart,
		ln: ln, ctx: ctx, cancel: cancel,
		limiter: rate.NewLimiter(rate.Limit(lim.EventsPerSecond), 2*lim.EventsPerSecond),
		st:      newState(rules, lim),
	}
	m.wg.Add(1)
	go m.accept()
	return m, nil
}

// accept serves the sink's connections, at most MaxConnections in all.
func (m *Monitor) accept() {
	defer m.wg.Done()
	for n := 0; ; n++ {
		c, err := m.ln.AcceptUnix()
		if err != nil {
			return // closed
		}
		if n >= m.lim.MaxConnections {
			c.Close()
			m.lose(fmt.Sprintf("more than %d trace connections", m.lim.MaxConnections))
			continue
		}
		m.mu.Lock()
		if m.closing.Load() {
			m.mu.Unlock()
			c.Close()
			return
		}
		cn := &conn{UnixConn: c}
		m.conns = append(m.conns, cn)
		m.mu.Unlock()
		m.wg.Add(1)
		go m.serve(cn)
	}
}

// serve consumes one sink connection until it ends. Reading never makes the
// sandbox wait: the sink writes without blocking (a full socket makes it
// drop the point and count it in the next header's DroppedCount, with the
// "retries" its configuration gives, none by default), so a slow monitor
// costs points, not the program's time.
func (m *Monitor) serve(c *conn) {
	defer m.wg.Done()
	defer m.idler.idle()
	defer c.idle.Store(true)
	defer c.Close()
	if err := m.handshake(c.UnixConn); err != nil {
		if !m.closing.Load() {
			m.lose("handshake: " + err.Error())
		}
		return
	}
	rc, err := c.SyscallConn()
	if err != nil {
		m.lose("trace connection: " + err.Error())
		return
	}
	buf := make([]byte, m.lim.MaxMessage)
	for {
		if !m.closing.Load() {
			if err := m.limiter.Wait(m.ctx); err != nil && !m.closing.Load() {
				return
			}
		}
		n, flags, err := c.read(rc, buf, &m.idler)
		if err != nil || !m.consume(buf[:n], flags) {
			switch {
			case err == nil:
			case errors.Is(err, io.EOF), m.closing.Load():
			default:
				m.lose("reading the trace stream: " + err.Error())
			}
			return
		}
	}
}

// read receives one message without blocking in the kernel (the runtime's
// poller waits), keeping idle for settle and waking its waiters when the
// queue is found empty.
func (c *conn) read(rc syscall.RawConn, buf []byte, w *idler) (n, flags int, err error) {
	rerr := rc.Read(func(fd uintptr) bool {
		c.idle.Store(false)
		n, _, flags, _, err = unix.Recvmsg(int(fd), buf, nil, unix.MSG_DONTWAIT)
		if err == unix.EAGAIN || err == unix.EINTR {
			c.idle.Store(true)
			w.idle()
			return false // wait until readable
		}
		if err == nil && n == 0 && flags&unix.MSG_TRUNC == 0 {
			// Zero bytes are the peer's end, or an empty message,
			// which the sink never sends (it must not pass as an end).
			pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
			if _, perr := unix.Poll(pfd, 0); perr == nil && pfd[0].Revents&(unix.POLLRDHUP|unix.POLLHUP) != 0 {
				err = io.EOF
			} else {
				err = errEmpty
			}
		}
		return true
	})
	if rerr != nil {
		return 0, 0, rerr
	}
	if err != nil {
		return 0, 0, err
	}
	return n, flags, nil
}

// errEmpty is an empty message on the stream.
var errEmpty = errors.New("an empty message")

// consume decodes and applies one message; false ends the stream.
func (m *Monitor) consume(b []byte, flags int) bool {
	msg, err := decode(b, flags&syscall.MSG_TRUNC != 0)
	if err != nil {
		m.lose(err.Error())
		return false
	}
	return m.handle(msg)
}

// handshake answers the sink's opening message (a bare pb.Handshake with
// its wire version, no header) with the monitor's version.
func (m *Monitor) handshake(c *net.UnixConn) error {
	if err := c.SetDeadline(time.Now().Add(m.lim.HandshakeTimeout)); err != nil {
		return err
	}
	// The sink reads our answer into 10 KiB and sends its own as small.
	buf := make([]byte, 10240)
	n, _, flags, _, err := c.ReadMsgUnix(buf, nil)
	if err != nil {
		return fmt.Errorf("read: %w", err)
	}
	if flags&syscall.MSG_TRUNC != 0 {
		return fmt.Errorf("message over %d bytes", len(buf))
	}
	var hs pb.Handshake
	if err := proto.Unmarshal(buf[:n], &hs); err != nil {
		return fmt.Errorf("not a handshake message: %v", err)
	}
	if hs.Version < 1 {
		return fmt.Errorf("sink version %d, the monitor speaks %d", hs.Version, wire.CurrentVersion)
	}
	out, err := proto.Marshal(&pb.Handshake{Version: wire.CurrentVersion})
	if err != nil {
		return err
	}
	if _, err := c.Write(out); err != nil {
		return fmt.Errorf("answer: %w", err)
	}
	return c.SetDeadline(time.Time{})
}

// handle applies one decoded message; false ends the stream.
func (m *Monitor) handle(msg message) bool {
	m.mu.Lock()
	wasLost := m.st.lost != ""
	ok := m.st.apply(msg)
	lost := m.st.lost
	kill := m.st.takeKill()
	m.mu.Unlock()
	if kill != nil && m.onKill != nil {
		go m.onKill(*kill)
	}
	if !wasLost && lost != "" {
		m.log.Warn("monitoring ended early", "socket", m.path, "reason", lost)
	}
	return ok
}

// lose ends monitoring with a reason.
func (m *Monitor) lose(why string) {
	m.mu.Lock()
	wasLost := m.st.lost != ""
	m.st.lose(why)
	kill := m.st.takeKill()
	m.mu.Unlock()
	if !wasLost {
		m.log.Warn("monitoring ended early", "socket", m.path, "reason", why)
	}
	if kill != nil && m.onKill != nil {
		go m.onKill(*kill)
	}
}

// SessionConfig is the JSON trace-session document for this monitor's level
// and socket, in the form runsc reads with --pod-init-config FILE (and
// `runsc trace create --config FILE` also accepts).
func (m *Monitor) SessionConfig() []byte {
	return sessionConfig(m.level, m.path)
}

// Take returns the activity since the previous Take (a session call's
// report; a pooled sandbox's warm-up is dropped by taking it), after
// waiting at most Limits.Settle for what the socket already holds.
func (m *Monitor) Take() sandbox.Activity {
	m.settle()
	m.check()
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.st.take()
}

// check ends monitoring when the stream shows runsc is not reporting: it
// never connected, or (ExpectStart) sent no container/start. Take checks;
// Close and Total (a view of so far) do not. By the time they are
// called, the sandbox has started: runsc connects before it boots the
// sandbox, and the sentry sends container/start before the first program
// runs.
func (m *Monitor) check() {
	m.mu.Lock()
	connected, started, lost := len(m.conns) > 0, m.st.started, m.st.lost != ""
	m.mu.Unlock()
	switch {
	case lost:
	case !connected:
		m.lose("runsc never connected to the monitor's socket")
	case m.expect && !started:
		m.lose("no container/start point: runsc did not install the trace session (its boot log says why)")
	}
}

// Total returns the activity of the sandbox's whole life so far (a
// session's tree at close_session).
func (m *Monitor) Total() sandbox.Activity {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.st.total()
}

// Close reads what the socket already holds (for at most Limits.Settle),
// then stops listening and ends the consumer. It never blocks for long;
// Take and Total still answer after it. Whether runsc reported at all is
// judged by Take, a run's report, and not here: a sandbox removed before
// it ran anything (a pool's refill at shutdown, killed before runsc
// connected) has nothing to report and lost nothing.
func (m *Monitor) Close() error {
	if m.closing.Load() {
		return nil
	}
	m.settle()
	m.mu.Lock()
	m.closing.Store(true)
	conns := m.conns
	m.mu.Unlock()
	m.cancel()
	err := m.ln.Close()
	for _, c := range conns {
		c.SetReadDeadline(time.Now().Add(m.lim.Settle))
	}
	done := make(chan struct{})
	go func() { m.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * m.lim.Settle):
		for _, c := range conns {
			c.Close()
		}
		<-done
	}
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("close monitor %s: %w", m.path, err)
	}
	return nil
}

// settle waits, at most Limits.Settle, until the connections' receive
// queues are empty and their readers idle: what the sandbox did before now
// is then in the state. It sleeps on the readers' idle notice, not on a
// clock: it returns as soon as the last message queued is applied.
func (m *Monitor) settle() {
	var deadline *time.Timer
	for {
		wake := m.idler.wait() // before the check: an idle after it wakes us
		if m.settled() {
			break
		}
		if deadline == nil {
			deadline = time.NewTimer(m.lim.Settle)
		}
		select {
		case <-wake:
		case <-deadline.C:
			return
		}
	}
	if deadline != nil {
		deadline.Stop()
	}
}

// settled reports whether every connection's queue is empty and its reader
// idle. The queue is looked at first: a message read after an idle
// reader's check would have been queued at it.
func (m *Monitor) settled() bool {
	m.mu.Lock()
	conns := m.conns
	m.mu.Unlock()
	for _, c := range conns {
		if pending(c.UnixConn) || !c.idle.Load() {
			return false
		}
	}
	return true
}

// pending reports whether c has messages not yet read.
func pending(c *net.UnixConn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return false
	}
	n := 0
	if err := rc.Control(func(fd uintptr) {
		n, err = unix.IoctlGetInt(int(fd), unix.SIOCINQ)
	}); err != nil {
		return false
	}
	return err == nil && n > 0
}
