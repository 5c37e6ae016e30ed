package netstack

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/safe-run/safe-run/egress"
)

// TestStackHTTPKeepAliveHostChecked: the Host of every request on a
// kept-alive HTTP connection must be the name connected to, not only the
// first one's — else a second request reaches another virtual host of a
// shared front end (a CDN serving an allowed name serves anyone's).
func TestStackHTTPKeepAliveHostChecked(t *testing.T) {
	plain, _ := upstream(t)
	pp := portOf(plain)
	sb := newSandbox(t, []string{fmt.Sprintf("ok.test=127.0.0.1:%d", pp)}, egress.Limits{}, loopback)
	addr, found := sb.lookup(t, "ok.test")
	if !found {
		t.Fatal("ok.test not answered")
	}
	for _, tc := range []struct {
		name  string
		split bool // the second request in a later segment than the first
	}{
		{"second request in the same segment", false},
		{"second request after the first response", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := sb.Dial(addr, pp)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			first := "GET / HTTP/1.1\r\nHost: ok.test\r\n\r\n"
			second := "GET / HTTP/1.1\r\nHost: evil.test\r\nConnection: close\r\n\r\n"
			br := bufio.NewReader(c)
			if tc.split {
				io.WriteString(c, first)
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatalf("first response: %v", err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				io.WriteString(c, second)
			} else {
				io.WriteString(c, first+second)
			}
			for {
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					return // the connection ended before evil.test was served
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if string(b) == "hello evil.test" {
					t.Fatalf("a second request with Host: evil.test was forwarded on ok.test's connection")
				}
			}
		})
	}
}

// slowStart sends its first write in two parts with a pause between, as
// a client may: the pause must not let the rest through unchecked.
type slowStart struct {
	net.Conn
	pause time.Duration
	done  bool
}

func (s *slowStart) Write(b []byte) (int, error) {
	if s.done || len(b) < 11 {
		return s.Conn.Write(b)
	}
	s.done = true
	n, err := s.Conn.Write(b[:10])
	if err != nil {
		return n, err
	}
	time.Sleep(s.pause)
	k, err := s.Conn.Write(b[10:])
	return n + k, err
}

// TestStackSlowFirstBytesChecked: on a port other than 80 and 443 a
// connection whose first bytes are a TLS record or an HTTP request gets the
// name check too, however those bytes arrive. A ClientHello or request
// head sent in two parts, the second after the peek wait, must not pass
// unchecked; nor may the check lose track of what it is reading: split
// first bytes once left it waiting for its full wait and then denied the
// connection as "first bytes incomplete", which a ClientHello larger than
// one segment (Go's is 1.5 KB) met under load.
func TestStackSlowFirstBytesChecked(t *testing.T) {
	plain, tlsSrv := upstream(t)
	pp, tp := portOf(plain), portOf(tlsSrv)
	sb := newSandbox(t, []string{fmt.Sprintf("tls.test=127.0.0.1:%d", tp), fmt.Sprintf("ok.test=127.0.0.1:%d", pp)},
		egress.Limits{}, loopback)
	for _, tt := range []struct {
		name, target, sent string
		tls                bool
		pause              time.Duration
		denied             string // the record's reason; "" when the request must work
	}{
		{"ClientHello in two parts, right SNI", "tls.test", "tls.test", true, 3 * peekTimeout, ""},
		{"ClientHello in two parts without a pause, right SNI", "tls.test", "tls.test", true, 0, ""},
		{"ClientHello in two parts, SNI of another host", "tls.test", "evil.test", true, 3 * peekTimeout, "SNI names another host"},
		{"request head in two parts, right Host", "ok.test", "ok.test", false, 3 * peekTimeout, ""},
		{"request head in two parts, Host of another host", "ok.test", "evil.test", false, 3 * peekTimeout, "Host header names another host"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			addr, found := sb.lookup(t, tt.target)
			if !found {
				t.Fatalf("%s not answered", tt.target)
			}
			port := pp
			if tt.tls {
				port = tp
			}
			c, err := sb.Dial(addr, port)
			if err != nil {
				t.Fatal(err)
			}
			var conn net.Conn = &slowStart{Conn: c, pause: tt.pause}
			if tt.tls {
				conn = tls.Client(conn, &tls.Config{ServerName: tt.sent, InsecureSkipVerify: true})
			}
			start := time.Now()
			body, err := get(conn, tt.sent)
			if tt.denied == "" {
				if err != nil || body != "hello "+tt.sent {
					t.Fatalf("GET after %v: %q %v; want the upstream's answer", time.Since(start), body, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("%s, sent in two parts, went through on %s's connection: %q", tt.sent, tt.target, body)
			}
			sb.waitRecord(t, func(c egress.Connection) bool {
				return c.Name == tt.target && c.Decision == egress.Denied && strings.Contains(c.Reason, tt.denied)
			})
		})
	}
}
