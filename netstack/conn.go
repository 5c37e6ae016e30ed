package netstack

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"

	"github.com/safe-run/safe-run/egress"
)

// names hands names addresses from a prefix, the same address for a name
// for the stack's life, up to a bound.
type names struct {
	mu     sync.Mutex
	base   uint32
	size   uint32
	max    int
	byName map[string]netip.Addr
	byAddr map[netip.Addr]string
}

func newNames(p netip.Prefix, max int) *names {
	b := p.Masked().Addr().As4()
	return &names{
		base:   uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]),
		size:   1 << (32 - p.Bits()),
		max:    max,
		byName: map[string]netip.Addr{},
		byAddr: map[netip.Addr]string{},
	}
}

// addr is name's address; false when the table is full.
func (n *names) addr(name string) (netip.Addr, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if a, ok := n.byName[name]; ok {
		return a, true
	}
	off := uint32(len(n.byName)) + 1 // skip the network address
	if len(n.byName) >= n.max || off >= n.size-1 {
		return netip.Addr{}, false
	}
	v := n.base + off
	a := netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	n.byName[name], n.byAddr[a] = a, name
	return a, true
}

// name is the name an address was handed out for.
func (n *names) name(a netip.Addr) (string, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	name, ok := n.byAddr[a]
	return name, ok
}

// conn is one connection let through: the sandbox's side (down) and the
// host's (up).
type conn struct {
	st  *Stack
	rec egress.Connection

	http bool // the first bytes were an HTTP request: every later one is checked too

	mu     sync.Mutex
	reason string // why it was ended early, first wins
	ep     tcpip.Endpoint
	down   *gonet.TCPConn
	up     net.Conn
}

// attach gives the connection its two sides; false when it was shut while
// dialling (both are then closed).
func (c *conn) attach(ep tcpip.Endpoint, down *gonet.TCPConn, up net.Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.reason != "" {
		ep.Abort()
		down.Close()
		up.Close()
		return false
	}
	c.ep, c.down, c.up = ep, down, up
	return true
}

// shut ends the connection early: the sandbox sees a reset.
func (c *conn) shut(reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.reason == "" {
		c.reason = reason
	}
	if c.ep != nil {
		c.ep.Abort()
		c.up.Close()
	}
}

func (c *conn) shutReason() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reason
}

// serve checks the first bytes, then copies both ways until both are done
// or a cap ends it, and writes the close record.
func (c *conn) serve(t target) {
	st := c.st
	first, err := c.sniff(t)
	if err != nil {
		c.shut(err.Error())
		c.down.Close()
		c.rec.Decision, c.rec.Reason = egress.Denied, err.Error()
		st.record(c.rec)
		return
	}
	c.rec.Decision, c.rec.Open = egress.Allowed, true
	c.rec = st.record(c.rec)

	var out, in int64
	done := make(chan struct{})
	var up net.Conn = c.up
	var resp *firstResponse
	if c.http {
		resp = &firstResponse{Conn: c.up, switched: make(chan bool, 1)}
		up = resp
	}
	go func() {
		defer close(done)
		if c.http {
			c.copyRequests(first, t.name, &out, resp.switched)
			return
		}
		if len(first) > 0 && c.pass(c.up, first, &out, &st.bytesOut, st.cfg.Limits.MaxBytesOut, "out") != nil {
			return
		}
		c.copy(c.up, c.down, &out, &st.bytesOut, st.cfg.Limits.MaxBytesOut, "out")
	}()
	c.copy(c.down, up, &in, &st.bytesIn, st.cfg.Limits.MaxBytesIn, "in")
	if resp != nil {
		resp.decide(false)
	}
	<-done
	c.down.Close()
	c.up.Close()
	c.rec.Open, c.rec.BytesOut, c.rec.BytesIn = false, out, in
	c.rec.Reason = c.shutReason()
	st.record(c.rec)
}

// copy moves bytes from src to dst until src ends (then half-closes dst)
// or anything fails (then shuts the connection).
func (c *conn) copy(dst, src net.Conn, n *int64, total interface{ Add(int64) int64 }, limit int64, dir string) {
	buf := make([]byte, 32<<10)
	for {
		k, err := src.Read(buf)
		if k > 0 {
			if c.pass(dst, buf[:k], n, total, limit, dir) != nil {
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) && c.shutReason() == "" {
				if cw, ok := dst.(interface{ CloseWrite() error }); ok {
					cw.CloseWrite()
					return
				}
			}
			c.shut("")
			return
		}
	}
}

// pass writes b to dst within the run's byte cap for dir.
func (c *conn) pass(dst net.Conn, b []byte, n *int64, total interface{ Add(int64) int64 }, limit int64, dir string) error {
	over := total.Add(int64(len(b))) - limit
	if over > 0 {
		b = b[:max(0, int64(len(b))-over)]
	}
	k, err := dst.Write(b)
	*n += int64(k)
	if over > 0 {
		c.shut("byte cap of " + itoa(limit) + " " + dir + " reached")
		return errCap
	}
	if err != nil {
		c.shut("")
	}
	return err
}

var errCap = errors.New("byte cap reached")

// copyRequests moves the sandbox's HTTP requests upstream through an
// egress.HTTPRequests: each request's Host must be name (the first one's
// was checked already, the later ones would otherwise reach any virtual
// host of a shared front end); bytes go up only as far as the checker
// allows, and a refusal resets the connection with its reason. switched
// says, once, whether the first response switched protocols.
func (c *conn) copyRequests(first []byte, name string, n *int64, switched <-chan bool) {
	st := c.st
	hr := &egress.HTTPRequests{Check: func(host string) error {
		if host != name {
			return deny("a later request names another host (%s)", clip(host))
		}
		return nil
	}}
	var pending []byte // taken in from offset sent on, not forwarded yet
	var sent int64
	forward := func(allowed int64, err error) error {
		if k := allowed - sent; k > 0 {
			if e := c.pass(c.up, pending[:k], n, &st.bytesOut, st.cfg.Limits.MaxBytesOut, "out"); e != nil {
				return e
			}
			pending = append(pending[:0], pending[k:]...)
			sent = allowed
		}
		if err != nil {
			var d *denial
			if !errors.As(err, &d) {
				err = deny("HTTP request refused: %v", err)
			}
			c.shut(err.Error())
			return err
		}
		return nil
	}
	take := func(b []byte) error {
		pending = append(pending, b...)
		if err := forward(hr.Write(b)); err != nil {
			return err
		}
		if hr.Waiting() {
			return forward(hr.Switched(<-switched))
		}
		return nil
	}
	if len(first) > 0 && take(first) != nil {
		return
	}
	buf := make([]byte, 32<<10)
	for {
		k, err := c.down.Read(buf)
		if k > 0 && take(buf[:k]) != nil {
			return
		}
		if err != nil {
			if cw, ok := c.up.(interface{ CloseWrite() error }); ok && errors.Is(err, io.EOF) && c.shutReason() == "" {
				cw.CloseWrite()
				return
			}
			c.shut("")
			return
		}
	}
}

// firstResponse reads the upstream side and tells, once, whether its
// first response switched protocols (an upgrade's 101).
type firstResponse struct {
	net.Conn
	switched chan bool
	head     []byte
	done     bool
}

func (r *firstResponse) Read(b []byte) (int, error) {
	k, err := r.Conn.Read(b)
	if !r.done {
		const want = "HTTP/1.1 101 "
		r.head = append(r.head, b[:min(k, len(want)-len(r.head))]...)
		if len(r.head) == len(want) || !strings.HasPrefix(want, string(r.head)) {
			r.decide(string(r.head) == want || string(r.head) == "HTTP/1.0 101 ")
		}
	}
	return k, err
}

// decide sends the answer unless it was sent.
func (r *firstResponse) decide(ok bool) {
	if !r.done {
		r.done = true
		r.switched <- ok
	}
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

// sniff reads the first bytes and checks the name they carry: on 443 a
// TLS ClientHello whose SNI must be the name, on 80 an HTTP request whose
// Host must be; on other ports the same when they look like either, else
// nothing. IP-literal destinations (CIDR entries) carry no name to check.
func (c *conn) sniff(t target) ([]byte, error) {
	if t.name == "" {
		return nil, nil
	}
	required := t.port == 443 || t.port == 80
	wait := peekTimeout
	if required {
		wait = sniffTimeout
	}
	c.down.SetReadDeadline(time.Now().Add(wait))
	defer c.down.SetReadDeadline(time.Time{})
	buf := make([]byte, 0, 2048)
	// kind is the protocol the check parses, 443 (TLS) or 80 (HTTP): the
	// port's on 80 and 443, else what the first bytes look like, decided
	// once and kept for the reads that complete them.
	kind := t.port
	for {
		if len(buf) == cap(buf) {
			if len(buf) >= maxSniff {
				return nil, deny("first bytes too long to find the name")
			}
			buf = append(buf, make([]byte, len(buf))...)[:len(buf)]
		}
		k, err := c.down.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+k]
		if len(buf) > 0 {
			if !required {
				switch {
				case buf[0] == 0x16: // TLS handshake record
					kind = 443
				case looksHTTP(buf):
					kind = 80
				case len(buf) >= 8:
					return buf, nil // neither: pass
				}
				if kind != t.port {
					// TLS or HTTP from now on: the check is required, with
					// the full wait, or a ClientHello sent slower than
					// the peek would pass unchecked.
					required = true
					c.down.SetReadDeadline(time.Now().Add(sniffTimeout))
				}
			}
			var name string
			var complete bool
			var perr error
			switch kind {
			case 443:
				name, complete, perr = egress.ParseSNI(buf)
				if perr != nil {
					return nil, deny("not a TLS ClientHello on port %d", t.port)
				}
				if complete {
					return buf, checkName("SNI", name, t.name)
				}
			case 80:
				name, complete, perr = egress.ParseHTTPHost(buf)
				if perr != nil {
					return nil, deny("not an HTTP request on port %d", t.port)
				}
				if complete {
					c.http = true
					return buf, checkName("Host header", name, t.name)
				}
			}
		}
		if err != nil {
			if !required {
				// Best effort off 80/443: a server that speaks first, or a
				// client whose first bytes are too few to tell, passes.
				return buf, nil
			}
			if len(buf) == 0 {
				if t.port == 443 {
					return nil, deny("no TLS ClientHello")
				}
				return nil, deny("no HTTP request")
			}
			return nil, deny("first bytes incomplete: %v", cause(err))
		}
	}
}

// checkName says whether the name the first bytes carry is the one the
// sandbox connected to.
func checkName(what, got, want string) error {
	if got == "" {
		return deny("no %s", what)
	}
	n, err := egress.NormalizeName(got)
	if err != nil || n != want {
		return deny("%s names another host (%s)", what, clip(got))
	}
	return nil
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

var httpMethods = []string{"GET ", "HEAD ", "POST ", "PUT ", "DELETE ", "OPTIONS ", "PATCH ", "CONNECT ", "TRACE "}

// looksHTTP says whether b starts (or may start) an HTTP/1.x request.
func looksHTTP(b []byte) bool {
	for _, m := range httpMethods {
		n := min(len(b), len(m))
		if string(b[:n]) == m[:n] {
			return true
		}
	}
	return false
}
