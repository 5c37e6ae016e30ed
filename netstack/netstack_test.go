package netstack

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/safe-run/safe-run/egress"
	"github.com/safe-run/safe-run/netstack/netstacktest"
)

// sandbox is the helper's stack with the sandbox's on the other end of
// a socketpair.
type sandbox struct {
	*netstacktest.Client
	helper  *Stack
	records netstacktest.Seen[egress.Connection]
}

func newSandbox(t testing.TB, allow []string, limits egress.Limits, resolve Resolver) *sandbox {
	t.Helper()
	fds, err := netstacktest.Socketpair()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
	a, err := egress.Parse(allow)
	if err != nil {
		t.Fatal(err)
	}
	ep, err := netstacktest.Link(fds[0], 1500, HelperMAC)
	if err != nil {
		t.Fatal(err)
	}
	sb := &sandbox{}
	sb.helper, err = New(ep, Config{
		Allow: a, Limits: limits, Gateway: egress.GatewayAddr, PrefixLen: egress.LinkPrefixLen,
		Resolve: resolve,
		Record:  sb.records.Add,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sb.helper.Close)
	sb.Client, err = netstacktest.NewClient(fds[1])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sb.Client.Close)
	return sb
}

// lookup is Lookup, failing the test on an error.
func (sb *sandbox) lookup(t testing.TB, name string) (netip.Addr, bool) {
	t.Helper()
	a, ok, err := sb.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	return a, ok
}

// get sends an HTTP GET naming host over c and returns the body, or the
// error that ended it.
func get(c net.Conn, host string) (string, error) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(15 * time.Second))
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// waitRecord waits for a record matching want (the helper writes a close
// record after the connection is done).
func (sb *sandbox) waitRecord(t testing.TB, want func(egress.Connection) bool) egress.Connection {
	t.Helper()
	return sb.records.Wait(t, "matching record", want)
}

func upstream(t testing.TB) (plain, tlsSrv *httptest.Server) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Host == "big.test" {
			w.Write(bytes.Repeat([]byte("x"), bigSize))
			return
		}
		io.WriteString(w, "hello "+r.Host)
	})
	plain, tlsSrv = httptest.NewServer(h), httptest.NewTLSServer(h)
	t.Cleanup(plain.Close)
	t.Cleanup(tlsSrv.Close)
	return plain, tlsSrv
}

// bigSize is the body upstream sends big.test.
const bigSize = 8 << 20

func portOf(s *httptest.Server) uint16 {
	return netip.MustParseAddrPort(s.Listener.Addr().String()).Port()
}

func loopback(context.Context, string) ([]netip.Addr, error) {
	return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
}

func TestStackDecisions(t *testing.T) {
	plain, tlsSrv := upstream(t)
	pp, tp := portOf(plain), portOf(tlsSrv)
	sb := newSandbox(t, []string{
		fmt.Sprintf("ok.test=127.0.0.1:%d", pp),
		fmt.Sprintf("tls.test=127.0.0.1:%d", tp),
		fmt.Sprintf("loop.test:%d", pp), // unpinned: resolves to loopback on the host
		fmt.Sprintf("big.test=127.0.0.1:%d", pp),
	}, egress.Limits{}, loopback)

	denied := func(name, reason string) func(egress.Connection) bool {
		return func(c egress.Connection) bool {
			return c.Kind == egress.KindTCP && c.Name == name && c.Decision == egress.Denied && strings.Contains(c.Reason, reason)
		}
	}
	refused := func(t *testing.T, addr netip.Addr, port uint16) {
		t.Helper()
		if c, err := sb.Dial(addr, port); err == nil {
			c.Close()
			t.Fatalf("connect to %v:%d succeeded; want refused", addr, port)
		}
	}

	ok, found := sb.lookup(t, "ok.test")
	if !found || !egress.SyntheticPrefix.Contains(ok) {
		t.Fatalf("ok.test → %v %v; want a synthetic address", ok, found)
	}

	t.Run("allowed name works, recorded open and closed with bytes", func(t *testing.T) {
		c, err := sb.Dial(ok, pp)
		if err != nil {
			t.Fatal(err)
		}
		body, err := get(c, "ok.test")
		if err != nil || body != "hello ok.test" {
			t.Fatalf("GET: %q %v", body, err)
		}
		open := sb.waitRecord(t, func(c egress.Connection) bool { return c.Name == "ok.test" && c.Open && c.Decision == egress.Allowed })
		sb.waitRecord(t, func(c egress.Connection) bool {
			return c.ID == open.ID && !c.Open && c.BytesOut > 0 && c.BytesIn > 0 && c.Addr == fmt.Sprintf("127.0.0.1:%d", pp)
		})
	})
	t.Run("a large body arrives whole, counted", func(t *testing.T) {
		addr, _ := sb.lookup(t, "big.test")
		c, err := sb.Dial(addr, pp)
		if err != nil {
			t.Fatal(err)
		}
		if body, err := get(c, "big.test"); err != nil || len(body) != bigSize {
			t.Fatalf("GET big.test: %d bytes, %v; want %d", len(body), err, bigSize)
		}
		sb.waitRecord(t, func(c egress.Connection) bool { return c.Name == "big.test" && !c.Open && c.BytesIn > bigSize })
	})
	t.Run("the same name gets the same address", func(t *testing.T) {
		if again, _ := sb.lookup(t, "OK.test"); again != ok {
			t.Fatalf("second answer %v, first %v", again, ok)
		}
	})
	t.Run("TLS with the right SNI works", func(t *testing.T) {
		addr, _ := sb.lookup(t, "tls.test")
		c, err := sb.Dial(addr, tp)
		if err != nil {
			t.Fatal(err)
		}
		tc := tls.Client(c, &tls.Config{ServerName: "tls.test", InsecureSkipVerify: true})
		if body, err := get(tc, "tls.test"); err != nil || body != "hello tls.test" {
			t.Fatalf("GET over TLS: %q %v", body, err)
		}
	})
	t.Run("denied name is NXDOMAIN", func(t *testing.T) {
		if a, found := sb.lookup(t, "evil.test"); found {
			t.Fatalf("evil.test → %v; want NXDOMAIN", a)
		}
		sb.waitRecord(t, func(c egress.Connection) bool {
			return c.Kind == egress.KindDNS && c.Name == "evil.test" && c.Decision == egress.Denied
		})
	})
	t.Run("IP literal refused", func(t *testing.T) {
		// (The sandbox's own stack will not send to 127.0.0.1 at all.)
		refused(t, netip.MustParseAddr("203.0.113.7"), 80)
		sb.waitRecord(t, func(c egress.Connection) bool {
			return c.Addr == "203.0.113.7:80" && c.Decision == egress.Denied && strings.Contains(c.Reason, "IP address not in the allowlist")
		})
	})
	t.Run("synthetic address never handed out refused", func(t *testing.T) {
		refused(t, netip.MustParseAddr("198.19.200.200"), pp)
		sb.waitRecord(t, func(c egress.Connection) bool { return strings.Contains(c.Reason, "never handed out") })
	})
	t.Run("allowed name on another port refused", func(t *testing.T) {
		refused(t, ok, 443)
		sb.waitRecord(t, denied("ok.test", "not in the allowlist"))
	})
	t.Run("unpinned name resolving to loopback refused", func(t *testing.T) {
		addr, found := sb.lookup(t, "loop.test")
		if !found {
			t.Fatal("loop.test: NXDOMAIN; want an answer (the name is allowed)")
		}
		refused(t, addr, pp)
		sb.waitRecord(t, denied("loop.test", "loopback"))
	})
	t.Run("SNI mismatch refused", func(t *testing.T) {
		addr, _ := sb.lookup(t, "tls.test")
		c, err := sb.Dial(addr, tp)
		if err != nil {
			t.Fatal(err)
		}
		tc := tls.Client(c, &tls.Config{ServerName: "other.test", InsecureSkipVerify: true})
		if _, err := get(tc, "tls.test"); err == nil {
			t.Fatal("TLS with SNI other.test went through")
		}
		sb.waitRecord(t, denied("tls.test", "SNI names another host"))
	})
	t.Run("Host mismatch refused", func(t *testing.T) {
		c, err := sb.Dial(ok, pp)
		if err != nil {
			t.Fatal(err)
		}
		if body, err := get(c, "evil.test"); err == nil {
			t.Fatalf("GET with Host evil.test went through: %q", body)
		}
		sb.waitRecord(t, denied("ok.test", "Host header names another host"))
	})
}

func TestStackCaps(t *testing.T) {
	plain, _ := upstream(t)
	pp := portOf(plain)
	tests := []struct {
		name   string
		limits egress.Limits
		check  func(t *testing.T, sb *sandbox, addr netip.Addr)
	}{
		{"connection cap refuses and is reported", egress.Limits{MaxConnections: 1}, func(t *testing.T, sb *sandbox, addr netip.Addr) {
			c, err := sb.Dial(addr, pp)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := get(c, "ok.test"); err != nil {
				t.Fatal(err)
			}
			if c, err := sb.Dial(addr, pp); err == nil {
				c.Close()
				t.Fatal("second connection went through a cap of 1")
			}
			sb.waitRecord(t, func(c egress.Connection) bool { return strings.Contains(c.Reason, "connection cap of 1 reached") })
		}},
		{"byte cap closes and is reported", egress.Limits{MaxBytesIn: 10}, func(t *testing.T, sb *sandbox, addr netip.Addr) {
			c, err := sb.Dial(addr, pp)
			if err != nil {
				t.Fatal(err)
			}
			if body, err := get(c, "ok.test"); err == nil {
				t.Fatalf("response beyond a 10-byte cap: %q", body)
			}
			sb.waitRecord(t, func(c egress.Connection) bool {
				return !c.Open && c.BytesIn == 10 && strings.Contains(c.Reason, "byte cap of 10 in reached")
			})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sb := newSandbox(t, []string{fmt.Sprintf("ok.test=127.0.0.1:%d", pp)}, tt.limits, nil)
			addr, _ := sb.lookup(t, "ok.test")
			tt.check(t, sb, addr)
		})
	}
}

func TestStackCloseWritesLastRecords(t *testing.T) {
	// An upstream that never answers keeps the connection open until Close.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	port := netip.MustParseAddrPort(ln.Addr().String()).Port()
	sb := newSandbox(t, []string{fmt.Sprintf("idle.test=127.0.0.1:%d", port)}, egress.Limits{}, nil)
	addr, _ := sb.lookup(t, "idle.test")
	c, err := sb.Dial(addr, port)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("hello\n"))
	open := sb.waitRecord(t, func(c egress.Connection) bool { return c.Open })
	sb.helper.Close()
	sb.waitRecord(t, func(c egress.Connection) bool { return c.ID == open.ID && !c.Open && c.Reason == "helper finished" })
}

// BenchmarkRequest is one HTTP request through the helper's stack: DNS
// answered once, then connect, GET, response, close per iteration.
func BenchmarkRequest(b *testing.B) {
	plain, _ := upstream(b)
	pp := portOf(plain)
	sb := newSandbox(b, []string{fmt.Sprintf("ok.test=127.0.0.1:%d", pp)}, egress.Limits{MaxConnections: 1 << 30}, nil)
	addr, _ := sb.lookup(b, "ok.test")
	var took []time.Duration
	for b.Loop() {
		start := time.Now()
		c, err := sb.Dial(addr, pp)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := get(c, "ok.test"); err != nil {
			b.Fatal(err)
		}
		took = append(took, time.Since(start))
	}
	netstacktest.ReportLatency(b, took)
}
