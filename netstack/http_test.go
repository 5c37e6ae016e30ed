package netstack

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/safe-run/safe-run/egress"
)

// upgrader answers the first request with 101 and then echoes (switch
// true), or with a kept-alive 200 to every request, naming its Host.
func upgrader(t *testing.T, switchProto bool) uint16 {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					if switchProto {
						io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
						io.Copy(c, br)
						return
					}
					body := "hello " + req.Host
					fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
				}
			}()
		}
	}()
	return netip.MustParseAddrPort(l.Addr().String()).Port()
}

// TestStackHTTPUpgrade: after an upgrade request the tunnel passes once
// the server switched; when it declined, the next request is checked
// (else asking for an upgrade would be a way around the check), and the
// close record names the refusal.
func TestStackHTTPUpgrade(t *testing.T) {
	const up = "GET /ws HTTP/1.1\r\nHost: ok.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
	for _, tc := range []struct {
		name     string
		switched bool
	}{
		{"switched: the tunnel passes", true},
		{"declined: a later request for another host is refused", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			port := upgrader(t, tc.switched)
			sb := newSandbox(t, []string{fmt.Sprintf("ok.test=127.0.0.1:%d", port)}, egress.Limits{}, loopback)
			addr, found := sb.lookup(t, "ok.test")
			if !found {
				t.Fatal("ok.test not answered")
			}
			c, err := sb.Dial(addr, port)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			br := bufio.NewReader(c)
			io.WriteString(c, up)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("upgrade response: %v", err)
			}
			if tc.switched {
				const frame = "\x81\x05not HTTP at all"
				io.WriteString(c, frame)
				got := make([]byte, len(frame))
				if _, err := io.ReadFull(br, got); err != nil || string(got) != frame {
					t.Fatalf("tunnel echoed %q, %v", got, err)
				}
				return
			}
			io.Copy(io.Discard, resp.Body)
			io.WriteString(c, "GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n")
			if resp, err := http.ReadResponse(br, nil); err == nil {
				b, _ := io.ReadAll(resp.Body)
				t.Fatalf("a request for evil.test after a declined upgrade was answered: %q", b)
			}
			sb.waitRecord(t, func(r egress.Connection) bool {
				return !r.Open && strings.Contains(r.Reason, "a later request names another host (evil.test)")
			})
		})
	}
}

// BenchmarkDownload: 64 MiB from an upstream on loopback to the sandbox
// through the helper's stack (the sandbox's own stack is the test's).
func BenchmarkDownload(b *testing.B) {
	const size = 64 << 20
	chunk := make([]byte, 1<<20)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(size))
		for i := 0; i < size/len(chunk); i++ {
			w.Write(chunk)
		}
	}))
	b.Cleanup(srv.Close)
	port := portOf(srv)
	sb := newSandbox(b, []string{fmt.Sprintf("dl.test=127.0.0.1:%d", port)}, egress.Limits{MaxConnections: 1 << 30, MaxBytesIn: 1 << 40}, loopback)
	addr, _ := sb.lookup(b, "dl.test")
	b.SetBytes(size)
	for b.Loop() {
		c, err := sb.Dial(addr, port)
		if err != nil {
			b.Fatal(err)
		}
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: dl.test\r\nConnection: close\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			b.Fatal(err)
		}
		if n, err := io.Copy(io.Discard, resp.Body); err != nil || n != size {
			b.Fatalf("%d bytes, %v", n, err)
		}
		c.Close()
	}
}
