package netstack

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
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

// TestStackSlowClientHelloChecked: on a port other than 80 and 443 a
// connection whose first bytes are a TLS record gets the SNI check too;
// a ClientHello sent slower than the peek wait must not pass unchecked.
func TestStackSlowClientHelloChecked(t *testing.T) {
	_, tlsSrv := upstream(t)
	tp := portOf(tlsSrv)
	sb := newSandbox(t, []string{fmt.Sprintf("tls.test=127.0.0.1:%d", tp)}, egress.Limits{}, loopback)
	addr, found := sb.lookup(t, "tls.test")
	if !found {
		t.Fatal("tls.test not answered")
	}
	c, err := sb.Dial(addr, tp)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	tc := tls.Client(&slowStart{Conn: c, pause: 3 * peekTimeout}, &tls.Config{ServerName: "evil.test", InsecureSkipVerify: true})
	if err := tc.Handshake(); err == nil {
		t.Fatal("a ClientHello naming evil.test, sent in two parts, completed its handshake on tls.test's connection")
	}
}
