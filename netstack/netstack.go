// Package netstack is the host's side of a sandbox's network: a user-space
// TCP/IP stack (gVisor's pkg/tcpip, at the pin runsc is built from) facing
// the sandbox's link, which answers DNS only for allowed names, decides
// every TCP connection against the allowlist, dials the allowed ones from
// the host and copies their bytes, and reports each decision as an
// egress.Connection record.
//
// It has a home of its own because it is the only package besides the
// network helper's binary (cmd/safe-run-net) that imports gVisor's network
// stack: safe-run's own binary never links it and stays small, and the
// stack, which parses the sandbox's hostile frames, runs only in that
// unprivileged, seccomp-confined helper process.
package netstack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/time/rate"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/safe-run/safe-run/egress"
)

// HelperMAC is the link address of the helper's side of the link, locally
// administered so that it names no vendor's device.
var HelperMAC = tcpip.LinkAddress("\x02\x00\xc6\x12\x00\x01")

// Bounds of what one sandbox can make the helper hold, whatever its Limits.
const (
	// MaxOpen caps the connections open at once (each holds two copying
	// goroutines and two sockets).
	MaxOpen = 512
	// maxInFlight caps the handshakes being decided at once (each a
	// goroutine dialling the host).
	maxInFlight = 128
	// MaxNames caps the names handed synthetic addresses.
	MaxNames = 4096
	// dialTimeout bounds one dial from the host.
	dialTimeout = 10 * time.Second
	// sniffTimeout bounds the wait for a ClientHello or request head on
	// the ports where one is required (80, 443).
	sniffTimeout = 5 * time.Second
	// peekTimeout is how long other ports wait for first bytes before the
	// connection is let through unsniffed (server-speaks-first protocols).
	peekTimeout = 300 * time.Millisecond

	// tcpBufferDefault and tcpBufferMax bound each connection's send and
	// receive buffers in the helper's stack (see New): with the two 32 KiB
	// copy buffers and the HTTP checker's held bytes (a head, at most
	// 8 KiB, plus one read), a connection holds about 2×256+64+40 KiB, so
	// 512 connections about 310 MiB (gVisor's defaults: up to 4 MiB each
	// way). Measured: the 64 MiB download (BenchmarkDownload) is as fast.
	tcpBufferDefault = 128 << 10
	tcpBufferMax     = 256 << 10
	// timeWait is the stack's TCP TIME-WAIT (see New).
	timeWait = 100 * time.Millisecond
	// maxSniff caps the first bytes read to find the SNI or Host: a whole
	// TLS record (a ClientHello fits in one) with its header.
	maxSniff = 5 + 1<<14
)

// Resolver resolves a host name on the host; tests inject one.
type Resolver func(ctx context.Context, name string) ([]netip.Addr, error)

// Config is what a Stack decides by.
type Config struct {
	// Allow is the sandbox's allowlist.
	Allow egress.Allowlist
	// Limits cap the sandbox's network; zero fields take the defaults.
	Limits egress.Limits
	// Gateway is the helper's address on the link, PrefixLen its subnet's.
	Gateway   netip.Addr
	PrefixLen int
	// HostAddrs are the host's own addresses, always blocked.
	HostAddrs []netip.Addr
	// Resolve resolves names on the host; nil uses net.DefaultResolver.
	Resolve Resolver
	// Record receives every decision; called from many goroutines, one
	// call at a time.
	Record func(egress.Connection)
	// Log is the stack's log; nil discards.
	Log *slog.Logger
}

// Stack is one sandbox's user-space network on the host.
type Stack struct {
	cfg   Config
	s     *stack.Stack
	names *names
	dns   *gonet.UDPConn

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	recMu  sync.Mutex
	nextID atomic.Uint64
	// The rates of the records a sandbox can cause without bound (each
	// UDP datagram, DNS question, refused connect); the rest are not
	// written.
	udpRate  *rate.Limiter
	dnsRate  *rate.Limiter
	denyRate *rate.Limiter

	mu     sync.Mutex
	open   map[*conn]struct{}
	total  int
	closed bool

	bytesOut, bytesIn atomic.Int64
}

const nicID = 1

// New builds the stack on a link endpoint (ethernet frames) and starts
// serving: ARP and DNS for cfg.Gateway, TCP to any address.
func New(ep stack.LinkEndpoint, cfg Config) (*Stack, error) {
	if cfg.Limits.MaxConnections <= 0 {
		cfg.Limits.MaxConnections = egress.DefaultMaxConnections
	}
	if cfg.Limits.MaxBytesOut <= 0 {
		cfg.Limits.MaxBytesOut = egress.DefaultMaxBytes
	}
	if cfg.Limits.MaxBytesIn <= 0 {
		cfg.Limits.MaxBytesIn = egress.DefaultMaxBytes
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Record == nil {
		cfg.Record = func(egress.Connection) {}
	}
	if cfg.Resolve == nil {
		cfg.Resolve = func(ctx context.Context, name string) ([]netip.Addr, error) {
			// Rooted: the host's search domains must not turn a name under
			// an allowed wildcard into one the operator never named.
			return net.DefaultResolver.LookupNetIP(ctx, "ip", strings.TrimSuffix(name, ".")+".")
		}
	}
	if !cfg.Gateway.Is4() {
		return nil, fmt.Errorf("netstack: gateway %v is not an IPv4 address", cfg.Gateway)
	}
	// No IPv6 protocol: the NIC drops every IPv6 frame. No ICMP either:
	// nothing the sandbox sends is echoed or forwarded.
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol},
		HandleLocal:        false,
	})
	// A short TIME-WAIT: the forwarder has no listener to hand a new SYN on
	// a TIME-WAIT 4-tuple to, so the sandbox reusing a port (it picks them
	// at random) would stall until TIME-WAIT ends; the link is one local
	// hop, where the old duplicates TIME-WAIT guards against do not linger.
	tw := tcpip.TCPTimeWaitTimeoutOption(timeWait)
	s.SetTransportProtocolOption(tcp.ProtocolNumber, &tw)
	// Bounded buffers: gVisor's defaults let each connection's buffers grow
	// to 4 MiB each way, which with MaxConnections open to an upstream that
	// stops reading is gigabytes of the host's memory.
	snd := tcpip.TCPSendBufferSizeRangeOption{Min: tcp.MinBufferSize, Default: tcpBufferDefault, Max: tcpBufferMax}
	rcv := tcpip.TCPReceiveBufferSizeRangeOption{Min: tcp.MinBufferSize, Default: tcpBufferDefault, Max: tcpBufferMax}
	for _, opt := range []tcpip.SettableTransportProtocolOption{&snd, &rcv} {
		if err := s.SetTransportProtocolOption(tcp.ProtocolNumber, opt); err != nil {
			s.Close()
			return nil, fmt.Errorf("netstack: TCP buffer sizes: %s", err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	st := &Stack{
		cfg:      cfg,
		s:        s,
		names:    newNames(egress.SyntheticPrefix, MaxNames),
		ctx:      ctx,
		cancel:   cancel,
		udpRate:  rate.NewLimiter(10, 20),
		dnsRate:  rate.NewLimiter(100, 200),
		denyRate: rate.NewLimiter(100, 300),
		open:     map[*conn]struct{}{},
	}
	fail := func(op string, err tcpip.Error) (*Stack, error) {
		cancel()
		s.Close()
		return nil, fmt.Errorf("netstack: %s: %s", op, err)
	}
	if err := s.CreateNIC(nicID, ep); err != nil {
		return fail("create NIC", err)
	}
	// Promiscuous: accept packets for every destination (each connection is
	// to a synthetic or literal address, never the gateway's). Spoofing:
	// answer from those addresses.
	if err := s.SetPromiscuousMode(nicID, true); err != nil {
		return fail("promiscuous mode", err)
	}
	if err := s.SetSpoofing(nicID, true); err != nil {
		return fail("spoofing", err)
	}
	gw := tcpip.AddrFrom4(cfg.Gateway.As4())
	if err := s.AddProtocolAddress(nicID, tcpip.ProtocolAddress{
		Protocol:          ipv4.ProtocolNumber,
		AddressWithPrefix: tcpip.AddressWithPrefix{Address: gw, PrefixLen: cfg.PrefixLen},
	}, stack.AddressProperties{}); err != nil {
		return fail("add address", err)
	}
	s.SetRouteTable([]tcpip.Route{{Destination: header4Any(), NIC: nicID}})

	fwd := tcp.NewForwarder(s, 0, maxInFlight, st.forward)
	s.SetTransportProtocolHandler(tcp.ProtocolNumber, fwd.HandlePacket)
	s.SetTransportProtocolHandler(udp.ProtocolNumber, st.dropUDP)

	dns, err := gonet.DialUDP(s, &tcpip.FullAddress{NIC: nicID, Addr: gw, Port: 53}, nil, ipv4.ProtocolNumber)
	if err != nil {
		cancel()
		s.Close()
		return nil, fmt.Errorf("netstack: listen for DNS: %w", err)
	}
	st.dns = dns
	st.wg.Add(1)
	go st.serveDNS()
	return st, nil
}

// header4Any is the IPv4 default route's destination.
func header4Any() tcpip.Subnet {
	sn, _ := tcpip.NewSubnet(tcpip.AddrFrom4([4]byte{}), tcpip.MaskFromBytes(make([]byte, 4)))
	return sn
}

// Close ends every connection (each writes its close record), stops the
// stack and returns once nothing of it runs.
func (st *Stack) Close() {
	st.mu.Lock()
	st.closed = true
	open := make([]*conn, 0, len(st.open))
	for c := range st.open {
		open = append(open, c)
	}
	st.mu.Unlock()
	st.cancel()
	for _, c := range open {
		c.shut("helper finished")
	}
	st.dns.Close()
	st.wg.Wait()
	st.s.Close()
	st.s.Wait()
}

func (st *Stack) record(c egress.Connection) egress.Connection {
	if c.ID == 0 {
		c.ID = st.nextID.Add(1)
	}
	st.recMu.Lock()
	defer st.recMu.Unlock()
	st.cfg.Record(c)
	return c
}

// dropUDP takes every datagram no endpoint wants (anything but DNS to the
// gateway): dropped, recorded at a bounded rate, no ICMP answer.
func (st *Stack) dropUDP(id stack.TransportEndpointID, _ *stack.PacketBuffer) bool {
	if st.udpRate.Allow() {
		st.record(egress.Connection{
			Kind: egress.KindUDP, Port: id.LocalPort,
			Addr:     netip.AddrPortFrom(addrOf(id.LocalAddress), id.LocalPort).String(),
			Decision: egress.Denied, Reason: "UDP other than DNS is dropped",
		})
	}
	return true
}

func addrOf(a tcpip.Address) netip.Addr {
	ip, _ := netip.AddrFromSlice(a.AsSlice())
	return ip
}

// serveDNS answers the sandbox's questions: allowed names get a synthetic
// address, others NXDOMAIN.
func (st *Stack) serveDNS() {
	defer st.wg.Done()
	buf := make([]byte, 4096)
	for {
		n, from, err := st.dns.ReadFrom(buf)
		if err != nil {
			if st.ctx.Err() == nil {
				st.cfg.Log.Warn("dns read", "err", err)
			}
			return
		}
		reply, name, ok, err := egress.AnswerDNS(buf[:n], st.lookup)
		if err != nil {
			if st.dnsRate.Allow() {
				st.record(egress.Connection{Kind: egress.KindDNS, Port: 53, Decision: egress.Denied, Reason: "malformed DNS question"})
			}
			if reply == nil {
				continue
			}
		}
		if err == nil && st.dnsRate.Allow() {
			c := egress.Connection{Kind: egress.KindDNS, Name: name, Port: 53, Decision: egress.Allowed}
			switch {
			case ok:
			case st.cfg.Allow.AllowsName(name):
				c.Decision, c.Reason = egress.Denied, fmt.Sprintf("more than %d names asked for", MaxNames)
			default:
				c.Decision, c.Reason = egress.Denied, "not in the allowlist"
			}
			st.record(c)
		}
		if reply != nil {
			st.dns.WriteTo(reply, from)
		}
	}
}

// lookup hands an allowed name its synthetic address.
func (st *Stack) lookup(name string) (netip.Addr, bool) {
	if !st.cfg.Allow.AllowsName(name) {
		return netip.Addr{}, false
	}
	return st.names.addr(name)
}

// denial is a refused connection's reason.
type denial struct{ reason string }

func (d *denial) Error() string { return d.reason }

func deny(format string, args ...any) error { return &denial{fmt.Sprintf(format, args...)} }

// forward decides one connection request from the sandbox; it runs in a
// goroutine of its own (the forwarder's, bounded by maxInFlight).
func (st *Stack) forward(r *tcp.ForwarderRequest) {
	id := r.ID()
	dst, port := addrOf(id.LocalAddress), id.LocalPort
	rec := egress.Connection{Kind: egress.KindTCP, Port: port, Dst: netip.AddrPortFrom(dst, port).String()}
	refuse := func(err error) {
		r.Complete(true)
		if st.denyRate.Allow() {
			rec.Decision, rec.Reason = egress.Denied, err.Error()
			st.record(rec)
		}
	}
	target, err := st.decide(dst, port, &rec)
	if err != nil {
		refuse(err)
		return
	}
	c := &conn{st: st, rec: rec}
	if err := st.admit(c); err != nil {
		refuse(err)
		return
	}
	defer st.release(c)
	ctx, cancel := context.WithTimeout(st.ctx, dialTimeout)
	up, addr, err := st.dial(ctx, target)
	cancel()
	if err != nil {
		refuse(err)
		return
	}
	c.rec.Addr = addr.String()
	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	if terr != nil {
		r.Complete(true)
		up.Close()
		c.rec.Decision, c.rec.Reason = egress.Denied, "handshake with the sandbox failed: "+terr.String()
		st.record(c.rec)
		return
	}
	r.Complete(false)
	if !c.attach(ep, gonet.NewTCPConn(&wq, ep), up) {
		c.rec.Decision, c.rec.Reason = egress.Denied, c.shutReason()
		st.record(c.rec)
		return
	}
	c.serve(target)
}

// target is where an allowed connection goes.
type target struct {
	name string         // the name the sandbox asked for; "" for an IP literal
	pin  netip.AddrPort // dial this instead of resolving name
	addr netip.Addr     // an IP literal's destination
	port uint16
}

// decide maps a destination to what the allowlist allows there.
func (st *Stack) decide(dst netip.Addr, port uint16, rec *egress.Connection) (target, error) {
	if egress.SyntheticPrefix.Contains(dst) {
		name, ok := st.names.name(dst)
		if !ok {
			rec.Addr = netip.AddrPortFrom(dst, port).String()
			return target{}, deny("an address DNS never handed out")
		}
		rec.Name = name
		e, ok := st.cfg.Allow.Match(name, port)
		if !ok {
			return target{}, deny("not in the allowlist")
		}
		return target{name: name, pin: e.Pin, port: port}, nil
	}
	rec.Addr = netip.AddrPortFrom(dst, port).String()
	if dst == st.cfg.Gateway {
		return target{}, deny("the gateway accepts no connections")
	}
	if !st.cfg.Allow.MatchAddr(dst, port) {
		return target{}, deny("IP address not in the allowlist")
	}
	if why, blocked := egress.Blocked(dst, st.cfg.HostAddrs); blocked {
		return target{}, deny("%s", why)
	}
	return target{addr: dst, port: port}, nil
}

// admit counts a connection against the caps.
func (st *Stack) admit(c *conn) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	switch {
	case st.closed:
		return deny("helper finished")
	case st.total >= st.cfg.Limits.MaxConnections:
		return deny("connection cap of %d reached", st.cfg.Limits.MaxConnections)
	case len(st.open) >= MaxOpen:
		return deny("%d connections open at once", MaxOpen)
	}
	st.total++
	st.open[c] = struct{}{}
	st.wg.Add(1)
	return nil
}

func (st *Stack) release(c *conn) {
	st.mu.Lock()
	delete(st.open, c)
	st.mu.Unlock()
	st.wg.Done()
}

// dial connects from the host: a pin as given, a literal as given, a name
// resolved here with every address checked against the blocked ranges
// (again in the dialer's Control, on the address actually dialled).
func (st *Stack) dial(ctx context.Context, t target) (net.Conn, netip.AddrPort, error) {
	var d net.Dialer
	if t.pin.IsValid() {
		c, err := d.DialContext(ctx, "tcp", t.pin.String())
		if err != nil {
			return nil, t.pin, deny("dial %s: %s", t.pin, cause(err))
		}
		return c, t.pin, nil
	}
	what := nameOr(t.name, t.addr.String())
	d.Control = func(_, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return deny("dial %s: %v", address, err)
		}
		if why, blocked := egress.Blocked(ap.Addr(), st.cfg.HostAddrs); blocked {
			return deny("%s resolves to %s", what, why)
		}
		return nil
	}
	ips := []netip.Addr{t.addr}
	if t.name != "" {
		var err error
		ips, err = st.cfg.Resolve(ctx, t.name)
		if err != nil || len(ips) == 0 {
			return nil, netip.AddrPort{}, deny("%s does not resolve on the host", t.name)
		}
	}
	last := error(deny("%s has no address", what))
	for _, ip := range ips {
		ip = ip.Unmap()
		if why, blocked := egress.Blocked(ip, st.cfg.HostAddrs); blocked {
			last = deny("%s resolves to %s", what, why)
			continue
		}
		a := netip.AddrPortFrom(ip, t.port)
		c, err := d.DialContext(ctx, "tcp", a.String())
		if err == nil {
			return c, a, nil
		}
		last = err
	}
	var den *denial
	if errors.As(last, &den) {
		return nil, netip.AddrPort{}, den
	}
	return nil, netip.AddrPort{}, deny("dial %s: %s", what, cause(last))
}

func nameOr(name, other string) string {
	if name != "" {
		return name
	}
	return other
}

// cause is an error's innermost message, without the Go operation chain.
func cause(err error) string {
	for {
		u := errors.Unwrap(err)
		if u == nil {
			return err.Error()
		}
		err = u
	}
}
