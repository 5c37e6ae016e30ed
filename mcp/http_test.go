package mcp

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
)

// nextHandler stands for the MCP endpoint behind the guard: it reads the
// body and records that it ran and what the read returned.
type nextHandler struct {
	mu      sync.Mutex
	called  bool
	body    []byte
	readErr error
}

func (n *nextHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	n.mu.Lock()
	n.called, n.body, n.readErr = true, body, err
	n.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// seen returns what the handler recorded.
func (n *nextHandler) seen() (called bool, body []byte, readErr error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.called, n.body, n.readErr
}

func TestGuard(t *testing.T) {
	const token = "s3cret-token"
	tests := []struct {
		name    string
		cfg     HTTPConfig
		host    string
		headers map[string]string
		body    string
		want    int
	}{
		// Host, against DNS rebinding.
		{name: "foreign host", host: "evil.example:8080", want: http.StatusForbidden},
		{name: "foreign host without port", host: "evil.example", want: http.StatusForbidden},
		{name: "empty host", host: "", want: http.StatusForbidden},
		{name: "localhost", host: "localhost:1234", want: http.StatusNoContent},
		{name: "localhost upper case", host: "LOCALHOST:1234", want: http.StatusNoContent},
		{name: "localhost without port", host: "localhost", want: http.StatusNoContent},
		{name: "subdomain of localhost", host: "app.localhost:80", want: http.StatusNoContent},
		{name: "localhost as a subdomain", host: "localhost.evil.example", want: http.StatusForbidden},
		{name: "ipv4 loopback", host: "127.0.0.1:9", want: http.StatusNoContent},
		{name: "other ipv4 loopback", host: "127.0.0.5:9", want: http.StatusNoContent},
		{name: "ipv6 loopback", host: "[::1]:9", want: http.StatusNoContent},
		{name: "ipv6 loopback without port", host: "[::1]", want: http.StatusNoContent},
		{name: "private address", host: "10.0.0.1:9", want: http.StatusForbidden},
		{name: "unspecified address", host: "0.0.0.0:9", want: http.StatusForbidden},
		{name: "allowed host", cfg: HTTPConfig{AllowedHosts: []string{"mcp.example.com"}}, host: "mcp.example.com", want: http.StatusNoContent},
		{name: "allowed host with port", cfg: HTTPConfig{AllowedHosts: []string{"mcp.example.com"}}, host: "mcp.example.com:8443", want: http.StatusNoContent},
		{name: "allowed host other case", cfg: HTTPConfig{AllowedHosts: []string{"mcp.example.com"}}, host: "MCP.Example.COM", want: http.StatusNoContent},
		{name: "allowed ipv6 host", cfg: HTTPConfig{AllowedHosts: []string{"2001:db8::1"}}, host: "[2001:db8::1]:8080", want: http.StatusNoContent},
		{name: "not the allowed host", cfg: HTTPConfig{AllowedHosts: []string{"mcp.example.com"}}, host: "other.example.com", want: http.StatusForbidden},
		{name: "suffix of the allowed host", cfg: HTTPConfig{AllowedHosts: []string{"mcp.example.com"}}, host: "evilmcp.example.com", want: http.StatusForbidden},
		{name: "any host", cfg: HTTPConfig{AllowedHosts: []string{"*"}}, host: "evil.example:8080", want: http.StatusNoContent},

		// Origin, against web pages.
		{name: "no origin", host: "localhost", want: http.StatusNoContent},
		{name: "foreign origin", host: "localhost", headers: map[string]string{"Origin": "https://evil.example"}, want: http.StatusForbidden},
		{name: "localhost origin", host: "localhost", headers: map[string]string{"Origin": "http://localhost:3000"}, want: http.StatusNoContent},
		{name: "ipv4 loopback origin", host: "localhost", headers: map[string]string{"Origin": "http://127.0.0.1"}, want: http.StatusNoContent},
		{name: "ipv6 loopback origin", host: "localhost", headers: map[string]string{"Origin": "https://[::1]:8443"}, want: http.StatusNoContent},
		{name: "localhost prefix origin", host: "localhost", headers: map[string]string{"Origin": "http://localhost.evil.example"}, want: http.StatusForbidden},
		{name: "null origin", host: "localhost", headers: map[string]string{"Origin": "null"}, want: http.StatusForbidden},
		{name: "file origin", host: "localhost", headers: map[string]string{"Origin": "file://localhost"}, want: http.StatusForbidden},
		{name: "websocket origin", host: "localhost", headers: map[string]string{"Origin": "ws://localhost"}, want: http.StatusForbidden},
		{name: "extension origin", host: "localhost", headers: map[string]string{"Origin": "chrome-extension://abcdef"}, want: http.StatusForbidden},
		{name: "allowed origin", cfg: HTTPConfig{AllowedOrigins: []string{"https://app.example.com"}}, host: "localhost",
			headers: map[string]string{"Origin": "https://app.example.com"}, want: http.StatusNoContent},
		{name: "origin not in the allowed list", cfg: HTTPConfig{AllowedOrigins: []string{"https://app.example.com"}}, host: "localhost",
			headers: map[string]string{"Origin": "https://app.example.com:444"}, want: http.StatusForbidden},
		{name: "foreign origin with a good token", cfg: HTTPConfig{Token: token}, host: "localhost",
			headers: map[string]string{"Origin": "https://evil.example", "Authorization": "Bearer " + token}, want: http.StatusForbidden},
		{name: "foreign host with a good token", cfg: HTTPConfig{Token: token}, host: "evil.example",
			headers: map[string]string{"Authorization": "Bearer " + token}, want: http.StatusForbidden},

		// Token.
		{name: "no token configured", host: "localhost", want: http.StatusNoContent},
		{name: "missing authorization", cfg: HTTPConfig{Token: token}, host: "localhost", want: http.StatusUnauthorized},
		{name: "wrong token", cfg: HTTPConfig{Token: token}, host: "localhost",
			headers: map[string]string{"Authorization": "Bearer wrong"}, want: http.StatusUnauthorized},
		{name: "token prefix", cfg: HTTPConfig{Token: token}, host: "localhost",
			headers: map[string]string{"Authorization": "Bearer " + token[:4]}, want: http.StatusUnauthorized},
		{name: "token with suffix", cfg: HTTPConfig{Token: token}, host: "localhost",
			headers: map[string]string{"Authorization": "Bearer " + token + "x"}, want: http.StatusUnauthorized},
		{name: "token without scheme", cfg: HTTPConfig{Token: token}, host: "localhost",
			headers: map[string]string{"Authorization": token}, want: http.StatusUnauthorized},
		{name: "basic scheme", cfg: HTTPConfig{Token: token}, host: "localhost",
			headers: map[string]string{"Authorization": "Basic " + token}, want: http.StatusUnauthorized},
		{name: "good token", cfg: HTTPConfig{Token: token}, host: "localhost",
			headers: map[string]string{"Authorization": "Bearer " + token}, want: http.StatusNoContent},
		// The scheme is case-insensitive (RFC 7235); the token is not.
		{name: "lower-case scheme", cfg: HTTPConfig{Token: token}, host: "localhost",
			headers: map[string]string{"Authorization": "bearer " + token}, want: http.StatusNoContent},
		{name: "good token from an allowed host", cfg: HTTPConfig{Token: token, AllowedHosts: []string{"*"}}, host: "mcp.example.com",
			headers: map[string]string{"Authorization": "Bearer " + token}, want: http.StatusNoContent},

		// Body size.
		{name: "body over the limit", cfg: HTTPConfig{MaxBodyBytes: 10}, host: "localhost", body: strings.Repeat("x", 11), want: http.StatusRequestEntityTooLarge},
		{name: "body at the limit", cfg: HTTPConfig{MaxBodyBytes: 10}, host: "localhost", body: strings.Repeat("x", 10), want: http.StatusNoContent},
		{name: "no limit", host: "localhost", body: strings.Repeat("x", 1<<16), want: http.StatusNoContent},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			next := &nextHandler{}
			req := httptest.NewRequest(http.MethodPost, "http://localhost"+HTTPPath, strings.NewReader(tt.body))
			req.Host = tt.host
			for k, v := range tt.headers {
				req.Header.Set(k, v)
			}
			rec := httptest.NewRecorder()
			guard(tt.cfg, next).ServeHTTP(rec, req)
			if rec.Code != tt.want {
				t.Fatalf("status %d, want %d; body %q", rec.Code, tt.want, rec.Body.String())
			}
			called, body, readErr := next.seen()
			if passed := tt.want == http.StatusNoContent; called != passed {
				t.Errorf("next handler called = %v, want %v", called, passed)
			}
			if called && (readErr != nil || string(body) != tt.body) {
				t.Errorf("next handler read %d bytes, err %v; want the %d-byte body", len(body), readErr, len(tt.body))
			}
			auth := rec.Header().Get("WWW-Authenticate")
			if tt.want == http.StatusUnauthorized {
				if !strings.HasPrefix(auth, "Bearer") {
					t.Errorf("WWW-Authenticate = %q, want a Bearer challenge", auth)
				}
			} else if auth != "" {
				t.Errorf("WWW-Authenticate = %q on a %d response", auth, rec.Code)
			}
		})
	}
}

// A chunked body has no Content-Length to refuse up front; the guard must
// still cut it at MaxBodyBytes.
func TestGuardChunkedBodyOverLimit(t *testing.T) {
	const limit = 100
	tests := []struct {
		name    string
		size    int
		wantErr bool
	}{
		{"under the limit", limit - 1, false},
		{"at the limit", limit, false},
		{"over the limit", limit + 1, true},
		{"far over the limit", 64 << 10, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			next := &nextHandler{}
			srv := httptest.NewServer(guard(HTTPConfig{MaxBodyBytes: limit}, next))
			defer srv.Close()
			// OneByteReader hides the length, so the client sends the body
			// chunked.
			body := iotest.OneByteReader(strings.NewReader(strings.Repeat("x", tt.size)))
			req, err := http.NewRequest(http.MethodPost, srv.URL+HTTPPath, body)
			if err != nil {
				t.Fatal(err)
			}
			if req.ContentLength != 0 && req.ContentLength != -1 {
				t.Fatalf("request has Content-Length %d; the test needs a chunked body", req.ContentLength)
			}
			resp, err := srv.Client().Do(req)
			if err == nil {
				resp.Body.Close()
			}
			// The server may close the connection after a body over the
			// limit, so the client's error is not checked; what the
			// handler read is. Close waits for the handler to finish.
			srv.Close()
			called, got, readErr := next.seen()
			if !called {
				t.Fatalf("next handler not called (client error %v)", err)
			}
			if !tt.wantErr {
				if readErr != nil || len(got) != tt.size {
					t.Fatalf("next handler read %d bytes, err %v; want all %d", len(got), readErr, tt.size)
				}
				return
			}
			var maxErr *http.MaxBytesError
			if !errors.As(readErr, &maxErr) {
				t.Fatalf("next handler's read error = %v, want *http.MaxBytesError", readErr)
			}
			if len(got) > limit {
				t.Errorf("next handler read %d bytes, over the %d-byte limit", len(got), limit)
			}
		})
	}
}

// HTTPHandler puts the guard in front of the Streamable HTTP endpoint.
func TestHTTPHandler(t *testing.T) {
	h := HTTPHandler(NewServer(Config{Runner: &fakeRunner{}, Environment: testEnv(), Logger: quietLogger()}),
		HTTPConfig{Token: "tok", MaxBodyBytes: 1 << 20})
	initialize := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}`
	tests := []struct {
		name    string
		path    string
		host    string
		headers map[string]string
		body    string
		want    int
	}{
		{name: "foreign host", path: HTTPPath, host: "evil.example:8080",
			headers: map[string]string{"Authorization": "Bearer tok"}, body: initialize, want: http.StatusForbidden},
		{name: "foreign origin", path: HTTPPath, host: "127.0.0.1:8080",
			headers: map[string]string{"Authorization": "Bearer tok", "Origin": "https://evil.example"}, body: initialize, want: http.StatusForbidden},
		{name: "no token", path: HTTPPath, host: "127.0.0.1:8080", body: initialize, want: http.StatusUnauthorized},
		{name: "body too large", path: HTTPPath, host: "127.0.0.1:8080",
			headers: map[string]string{"Authorization": "Bearer tok"}, body: strings.Repeat(" ", 1<<20+1), want: http.StatusRequestEntityTooLarge},
		{name: "initialize", path: HTTPPath, host: "127.0.0.1:8080",
			headers: map[string]string{"Authorization": "Bearer tok"}, body: initialize, want: http.StatusOK},
		{name: "other path", path: "/other", host: "127.0.0.1:8080",
			headers: map[string]string{"Authorization": "Bearer tok"}, body: initialize, want: http.StatusNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodPost, "http://localhost"+tt.path, strings.NewReader(tt.body))
			req.Host = tt.host
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			for k, v := range tt.headers {
				req.Header.Set(k, v)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tt.want {
				t.Fatalf("status %d, want %d; body %q", rec.Code, tt.want, rec.Body.String())
			}
			if tt.want == http.StatusOK && !strings.Contains(rec.Body.String(), `"safe-run"`) {
				t.Errorf("initialize response does not name the server: %q", rec.Body.String())
			}
		})
	}
}

func TestIsLoopbackHost(t *testing.T) {
	tests := []struct {
		host string
		want bool
	}{
		{"localhost", true},
		{"LocalHost", true},
		{"foo.localhost", true},
		{"FOO.LOCALHOST", true},
		{"127.0.0.1", true},
		{"127.0.0.5", true},
		{"127.255.255.254", true},
		{"::1", true},
		{"[::1]", true},
		{"::ffff:127.0.0.1", true},
		{"10.0.0.1", false},
		{"0.0.0.0", false},
		{"::", false},
		{"example.com", false},
		{"localhost.example.com", false},
		{"notlocalhost", false},
		{"", false},
		{"localhost:8080", false}, // a port is not part of a host
	}
	for _, tt := range tests {
		t.Run(tt.host, func(t *testing.T) {
			if got := IsLoopbackHost(tt.host); got != tt.want {
				t.Errorf("IsLoopbackHost(%q) = %v, want %v", tt.host, got, tt.want)
			}
		})
	}
}
