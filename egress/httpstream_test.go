package egress

import (
	"errors"
	"strings"
	"testing"
)

func okTest(host string) error {
	if host != "ok.test" {
		return errors.New("another host (" + host + ")")
	}
	return nil
}

// feed writes in to a fresh checker whole or byte by byte.
func feed(in string, byByte bool) (int64, error) {
	h := &HTTPRequests{Check: okTest}
	if !byByte {
		return h.Write([]byte(in))
	}
	var n int64
	var err error
	for i := 0; i < len(in); i++ {
		if n, err = h.Write([]byte{in[i]}); err != nil {
			break
		}
	}
	return n, err
}

func TestHTTPRequests(t *testing.T) {
	const get = "GET / HTTP/1.1\r\nHost: ok.test\r\n\r\n"
	const evil = "GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n"
	const post = "POST / HTTP/1.1\r\nHost: ok.test\r\n"
	const chunked = post + "Transfer-Encoding: chunked\r\n\r\n"
	const upgrade = "GET /ws HTTP/1.1\r\nHost: ok.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
	for _, tc := range []struct {
		name    string
		in      string
		allowed int    // bytes forwarded; -1: all of in
		refused string // a part of the error; "" none
	}{
		{"one request", get, -1, ""},
		{"pipelined, same host", get + get + get, -1, ""},
		{"pipelined, another host", get + evil, len(get), "another host (evil.test)"},
		{"head held until whole", get + "GET / HTTP/1.1\r\nHost: ok.te", len(get), ""},
		{"content-length body", "POST / HTTP/1.1\r\nHost: ok.test\r\nContent-Length: 5\r\n\r\nhello" + get, -1, ""},
		{"body is not a head", "POST / HTTP/1.1\r\nHost: ok.test\r\nContent-Length: 35\r\n\r\n" + evil + get, -1, ""},
		{"body then another host", post + "Content-Length: 2\r\n\r\nhi" + evil, len(post + "Content-Length: 2\r\n\r\nhi"), "evil.test"},
		{"same content-lengths", "POST / HTTP/1.1\r\nHost: ok.test\r\nContent-Length: 2\r\nContent-Length: 2, 2\r\n\r\nhi" + get, -1, ""},
		{"differing content-lengths", "POST / HTTP/1.1\r\nHost: ok.test\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nhi", 0, "differing Content-Lengths"},
		{"content-length not a number", "POST / HTTP/1.1\r\nHost: ok.test\r\nContent-Length: +2\r\n\r\nhi", 0, "not a number"},
		{"chunked", "POST / HTTP/1.1\r\nHost: ok.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nA;ext=\"x\"\r\n0123456789\r\n0\r\n\r\n" + get, -1, ""},
		{"chunked with trailers", "POST / HTTP/1.1\r\nHost: ok.test\r\nTransfer-Encoding: gzip, chunked\r\n\r\n1\r\nx\r\n0\r\nDigest: a\r\nX-Y: b\r\n\r\n" + get, -1, ""},
		{"chunk data hides a head", "POST / HTTP/1.1\r\nHost: ok.test\r\nTransfer-Encoding: chunked\r\n\r\n23\r\n" + evil + "\r\n0\r\n\r\n", -1, ""},
		{"chunked then another host", "POST / HTTP/1.1\r\nHost: ok.test\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + evil, len(chunked + "0\r\n\r\n"), "evil.test"},
		{"malformed chunk size", "POST / HTTP/1.1\r\nHost: ok.test\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", len(chunked), "chunk size"},
		{"chunk size with space", "POST / HTTP/1.1\r\nHost: ok.test\r\nTransfer-Encoding: chunked\r\n\r\n5 \r\nhello\r\n", len(chunked), "after the size"},
		{"chunk without CRLF", "POST / HTTP/1.1\r\nHost: ok.test\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nxy", len(chunked + "1\r\nx"), "CRLF"},
		{"chunk size overflow", "POST / HTTP/1.1\r\nHost: ok.test\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000000\r\n", len(chunked), "hex digits"},
		{"chunk line bare LF", "POST / HTTP/1.1\r\nHost: ok.test\r\nTransfer-Encoding: chunked\r\n\r\n0\n\r\n", len(chunked), "bare LF"},
		{"bad trailer", "POST / HTTP/1.1\r\nHost: ok.test\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n bad\r\n\r\n", len(chunked + "0\r\n"), "trailer"},
		{"CL and TE", "POST / HTTP/1.1\r\nHost: ok.test\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 0, "both Content-Length and Transfer-Encoding"},
		{"chunked, identity", "POST / HTTP/1.1\r\nHost: ok.test\r\nTransfer-Encoding: chunked, identity\r\n\r\n", 0, "chunked not last"},
		{"identity", "POST / HTTP/1.1\r\nHost: ok.test\r\nTransfer-Encoding: identity\r\n\r\n", 0, "final coding must be chunked"},
		{"chunked twice", "POST / HTTP/1.1\r\nHost: ok.test\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", 0, "more than once"},
		{"empty coding", "POST / HTTP/1.1\r\nHost: ok.test\r\nTransfer-Encoding: , chunked\r\n\r\n", 0, "not a list"},
		{"TE on HTTP/1.0", "POST / HTTP/1.0\r\nHost: ok.test\r\nTransfer-Encoding: chunked\r\n\r\n", 0, "HTTP/1.0"},
		{"obs-fold", "GET / HTTP/1.1\r\nHost: ok.test\r\nX: a\r\n Transfer-Encoding: chunked\r\n\r\n", 0, "not name: value"},
		{"bare LF", "GET / HTTP/1.1\nHost: ok.test\n\n", 0, "bare LF"},
		{"bare LF hides a header", "GET / HTTP/1.1\r\nHost: ok.test\r\nX: a\nContent-Length: 35\r\n\r\n" + evil, 0, "bare LF"},
		{"bare CR", "GET / HTTP/1.1\r\nHost: ok.test\r\nX: a\rb\r\n\r\n", 0, "bare CR"},
		{"empty line first", "\r\n" + get, 0, "empty line"},
		{"two hosts", "GET / HTTP/1.1\r\nHost: ok.test\r\nHost: evil.test\r\n\r\n", 0, "more than one Host"},
		{"no host", "GET / HTTP/1.1\r\n\r\n", 0, "without a Host"},
		{"HTTP/2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 0, "HTTP/2"},
		{"not HTTP later", get + "\x16\x03\x01", len(get), "not an HTTP request"},
		{"head over the bound", "GET / HTTP/1.1\r\nHost: ok.test\r\nX: " + strings.Repeat("a", MaxHTTPHead) + "\r\n\r\n", 0, "over"},
		{"absolute target elsewhere", "GET http://evil.test/ HTTP/1.1\r\nHost: ok.test\r\n\r\n", 0, "target names"},
		{"upgrade holds what follows", "GET /ws HTTP/1.1\r\nHost: ok.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n\x81\x05hello", len(upgrade), ""},
		{"upgrade on a later request is not honoured", get + "GET /ws HTTP/1.1\r\nHost: ok.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n\x81\x05hello", len(get + upgrade), "not an HTTP request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := int64(tc.allowed)
			if tc.allowed < 0 {
				want = int64(len(tc.in))
			}
			for _, byByte := range []bool{false, true} {
				n, err := feed(tc.in, byByte)
				if tc.refused == "" && err != nil || tc.refused != "" && (err == nil || !strings.Contains(err.Error(), tc.refused)) {
					t.Fatalf("byte by byte %v: error %v, want one with %q", byByte, err, tc.refused)
				}
				if n != want {
					t.Fatalf("byte by byte %v: %d bytes allowed, want %d", byByte, n, want)
				}
			}
		})
	}
}

// TestHTTPRequestsSwitched: after an upgrade request the bytes held pass
// when the protocol switched, and are checked as the next request when not.
func TestHTTPRequestsSwitched(t *testing.T) {
	const up = "GET /ws HTTP/1.1\r\nHost: ok.test\r\nConnection: keep-alive, Upgrade\r\nUpgrade: websocket\r\n\r\n"
	const evil = "GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n"
	for _, tc := range []struct {
		name     string
		switched bool
		refused  bool
	}{
		{"switched: the tunnel passes", true, false},
		{"declined: the next request is checked", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &HTTPRequests{Check: okTest}
			n, err := h.Write([]byte(up + evil))
			if err != nil || n != int64(len(up)) || !h.Waiting() || !h.UpgradeAsked() {
				t.Fatalf("Write: %d, %v, waiting %v", n, err, h.Waiting())
			}
			n, err = h.Switched(tc.switched)
			if (err != nil) != tc.refused {
				t.Fatalf("Switched(%v): %v", tc.switched, err)
			}
			want := int64(len(up + evil))
			if tc.refused {
				want = int64(len(up))
			}
			if n != want {
				t.Fatalf("Switched(%v): %d allowed, want %d", tc.switched, n, want)
			}
		})
	}
}
