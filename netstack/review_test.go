package netstack

import (
	"bufio"
	"fmt"
	"io"
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
