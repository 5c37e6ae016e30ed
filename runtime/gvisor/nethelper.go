package gvisor

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/safe-run/safe-run/bundle"
	"github.com/safe-run/safe-run/egress"
	"github.com/safe-run/safe-run/runtime/engine"
)

// helperReadyTimeout bounds how long the network helper may take to say
// its stack is up; beyond it the sandbox fails to start.
const helperReadyTimeout = 10 * time.Second

// helperFinishTimeout bounds how long the helper may take, after its
// input ends, to write its last records and exit.
const helperFinishTimeout = 2 * time.Second

// netHelperProc is a sandbox's network helper (safe-run-net): the
// user-space stack on the host side of the sandbox's link, which decides
// every DNS question and connection and reports them as events.
type netHelperProc struct {
	cmd   *exec.Cmd
	stdin *os.File
	allow []string
	done  chan struct{} // closed when the event stream has ended
	// synced gets the helper's marks (see sync).
	synced chan struct{}

	log egress.Log // the records since the last take

	mu       sync.Mutex
	failure  string
	finished bool // its input was closed on purpose
}

var _ engine.NetworkReporter = (*sandboxProc)(nil)

// startNetHelper starts the helper for the link n with the job's allowlist
// and limits, and returns once it is ready.
func (g *Backend) startNetHelper(n *sandboxNet, allow []string, limits egress.Limits) (*netHelperProc, error) {
	path, err := g.cfg.netHelper()
	if err != nil {
		return nil, err
	}
	conf, err := json.Marshal(egress.HelperConfig{
		Allow: allow, Limits: limits, Link: helperLink(n.kind), MTU: n.mtu,
		Gateway: egress.GatewayAddr, Sandbox: egress.SandboxAddr, PrefixLen: egress.LinkPrefixLen,
		HostAddrs: hostAddrs(),
	})
	if err != nil {
		return nil, err
	}
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	eventsR, eventsW, err := os.Pipe()
	if err != nil {
		closeFiles(stdinR, stdinW)
		return nil, err
	}
	h := &netHelperProc{stdin: stdinW, allow: allow, done: make(chan struct{}), synced: make(chan struct{}, 1)}
	h.cmd = exec.Command(path)
	h.cmd.Stdin, h.cmd.Stderr = stdinR, os.Stderr
	h.cmd.ExtraFiles = []*os.File{n.file, eventsW} // fd 3, fd 4
	h.cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	h.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if HostRoot() {
		// It needs no privilege: the link is already open.
		h.cmd.SysProcAttr.Credential = &syscall.Credential{Uid: 65534, Gid: 65534}
	}
	err = h.cmd.Start()
	closeFiles(stdinR, eventsW)
	if err != nil {
		closeFiles(stdinW, eventsR)
		return nil, fmt.Errorf("start network helper %s: %w", path, err)
	}
	// The helper holds the link now; ours would keep it open after it died.
	n.file.Close()
	n.file = nil
	ready := make(chan error, 1)
	go h.readEvents(eventsR, ready)
	_, werr := stdinW.Write(append(conf, '\n'))
	select {
	case err = <-ready:
	case <-time.After(helperReadyTimeout):
		err = fmt.Errorf("the network helper was not ready after %s", helperReadyTimeout)
	}
	if werr != nil && err == nil {
		// Its input closed, and yet ready: it cannot be told to finish.
		err = fmt.Errorf("configure network helper: %w", werr)
	}
	if err != nil {
		h.kill()
		return nil, err
	}
	return h, nil
}

// helperLink is HelperConfig.Link for a link kind.
func helperLink(kind string) string {
	if kind == LinkVeth {
		return "packet"
	}
	return "tap"
}

// hostAddrs are the host's own addresses, which no sandbox may reach.
func hostAddrs() []netip.Addr {
	addrs, _ := net.InterfaceAddrs()
	var out []netip.Addr
	for _, a := range addrs {
		if p, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(p.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out
}

// readEvents reads the helper's events until its stream ends: the first
// must be ready (sent on ready), the rest are records.
func (h *netHelperProc) readEvents(r *os.File, ready chan<- error) {
	defer close(h.done)
	defer r.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	first := true
	for sc.Scan() {
		var ev egress.HelperEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			h.fail(fmt.Sprintf("the network helper sent a bad event: %v", err))
			break
		}
		switch {
		case ev.Error != "":
			h.fail("the network helper failed: " + ev.Error)
		case ev.Ready && first:
			first = false
			ready <- nil
		case ev.Conn != nil:
			h.log.Add(*ev.Conn)
		case ev.Synced:
			select {
			case h.synced <- struct{}{}:
			default:
			}
		}
	}
	_ = h.cmd.Wait()
	if first {
		ready <- fmt.Errorf("the network helper exited before it was ready (%v)%s", h.cmd.ProcessState, h.failureSuffix())
		return
	}
	h.mu.Lock()
	if !h.finished && h.failure == "" {
		h.failure = fmt.Sprintf("the network helper exited during the run (%v): the sandbox had no network from then on", h.cmd.ProcessState)
	}
	h.mu.Unlock()
}

func (h *netHelperProc) failureSuffix() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.failure == "" {
		return ""
	}
	return ": " + h.failure
}

func (h *netHelperProc) fail(msg string) {
	h.mu.Lock()
	if h.failure == "" {
		h.failure = msg
	}
	h.mu.Unlock()
}

// take returns the report since the last take; final ends the helper
// first, so that every connection's last record is in.
func (h *netHelperProc) take(final bool) egress.Report {
	if final {
		h.finish()
	} else {
		h.settle()
	}
	rep := egress.Report{Allowlist: h.allow}
	rep.Connections, rep.Dropped = h.log.Take()
	if rep.Connections == nil {
		rep.Connections = []egress.Connection{}
	}
	h.mu.Lock()
	rep.Failure = h.failure
	h.mu.Unlock()
	return rep
}

// settleTimeout bounds how long a session call's take waits for the close
// records of connections its program closed.
const settleTimeout = 500 * time.Millisecond

// settle waits, a bounded time, for the helper's mark after the records
// so far (sync), then until no record since the last take is of an open
// connection: the program's close reaches the helper a moment after
// the call's exit report reaches the host, and its record (with the bytes)
// belongs to this call. A connection the program keeps open past the call
// is reported open, and again when it closes.
func (h *netHelperProc) settle() {
	deadline := time.Now().Add(settleTimeout)
	h.sync(deadline)
	for h.log.Open() > 0 && time.Now().Before(deadline) {
		select {
		case <-h.done:
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// sync waits, until deadline, for the helper's mark after every record
// it has written so far: the records of the decisions of a call that just
// ended are then in the log, even if they were still in the pipe.
func (h *netHelperProc) sync(deadline time.Time) {
	h.mu.Lock()
	finished := h.finished
	h.mu.Unlock()
	if finished {
		return
	}
	select { // a mark left over from an earlier sync that timed out
	case <-h.synced:
	default:
	}
	if _, err := h.stdin.Write([]byte("sync\n")); err != nil {
		return
	}
	select {
	case <-h.synced:
	case <-h.done:
	case <-time.After(time.Until(deadline)):
	}
}

// finish closes the helper's input, which makes it close every connection
// and exit, and waits a bounded time for that.
func (h *netHelperProc) finish() {
	h.mu.Lock()
	already := h.finished
	h.finished = true
	h.mu.Unlock()
	if !already {
		h.stdin.Close()
	}
	select {
	case <-h.done:
	case <-time.After(helperFinishTimeout):
		h.fail(fmt.Sprintf("the network helper did not finish within %s; its last records are missing", helperFinishTimeout))
		h.kill()
	}
}

// kill ends the helper at once and waits for its event stream to end.
func (h *netHelperProc) kill() {
	h.mu.Lock()
	h.finished = true
	h.mu.Unlock()
	_ = h.cmd.Process.Kill()
	h.stdin.Close()
	select {
	case <-h.done:
	case <-time.After(5 * time.Second):
		// The stream may be held open by nobody else; Wait returns then.
	}
}

// TakeNetwork hands over the network's records (engine.NetworkReporter).
func (p *sandboxProc) TakeNetwork(final bool) egress.Report {
	if p.net == nil {
		return egress.Report{}
	}
	return p.net.take(final)
}

// resolvConf points the sandbox's resolver at the helper.
var resolvConf = "nameserver " + egress.GatewayAddr.String() + "\n"

// setUpNetwork gives the sandbox with image root rootfs its network: the
// resolver and CA files in the run directory, the namespace and link, and
// the helper, ready. Destroy removes them.
func (p *sandboxProc) setUpNetwork(rootfs string, allow []string, limits egress.Limits) (*bundle.Network, error) {
	g := p.g
	kind, err := chooseLink(g.cfg.NetLink)
	if err != nil {
		return nil, err
	}
	// The root is read-only: the file bound over must exist.
	if _, err := os.Stat(filepath.Join(rootfs, bundle.ResolvConfPath)); err != nil {
		return nil, fmt.Errorf("the image has no %s to point the sandbox's resolver at the host (%v); add the file to the image", bundle.ResolvConfPath, err)
	}
	bn := &bundle.Network{ResolvConf: filepath.Join(p.dir, "resolv.conf")}
	if err := writeSandboxFile(bn.ResolvConf, []byte(resolvConf)); err != nil {
		return nil, fmt.Errorf("write resolv.conf: %w", err)
	}
	if bn.CABundle, err = p.caBundle(rootfs); err != nil {
		return nil, err
	}
	if p.netNS, err = createNet(p.dir, kind); err != nil {
		return nil, err
	}
	bn.NetNS = p.netNS.nsPath
	p.mark("netns_created")
	if p.net, err = g.startNetHelper(p.netNS, allow, limits); err != nil {
		return nil, err
	}
	p.mark("net_helper_ready")
	return bn, nil
}

// caBundle writes the CA bundle of a networked sandbox into the run
// directory: the image's, plus Config.NetworkCA. An image without one gets
// none bound (the mount point must exist), unless extra CAs were asked for.
func (p *sandboxProc) caBundle(rootfs string) (string, error) {
	image, err := os.ReadFile(filepath.Join(rootfs, bundle.CABundlePath))
	missing := errors.Is(err, os.ErrNotExist)
	if err != nil && !missing {
		return "", fmt.Errorf("read the image's CA bundle: %w", err)
	}
	extra := p.g.cfg.NetworkCA
	switch {
	case missing && extra == "":
		return "", nil
	case missing:
		return "", fmt.Errorf("the image has no %s to add the network CAs %s to; install ca-certificates in the image", bundle.CABundlePath, extra)
	}
	if extra != "" {
		more, err := os.ReadFile(extra)
		if err != nil {
			return "", fmt.Errorf("read network CAs: %w", err)
		}
		image = append(append(image, '\n'), more...)
	}
	path := filepath.Join(p.dir, "ca-certificates.crt")
	if err := writeSandboxFile(path, image); err != nil {
		return "", fmt.Errorf("write CA bundle: %w", err)
	}
	return path, nil
}

// writeSandboxFile writes a file the sandbox's programs read through a
// bind mount: readable by all, whatever the umask (the service's 0077 made
// resolv.conf unreadable to the sandbox's user, whose resolver then asked
// 127.0.0.1).
func writeSandboxFile(path string, data []byte) error {
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return err
	}
	return os.Chmod(path, 0o644)
}
