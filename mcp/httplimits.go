package mcp

// The HTTP server's own limits: how long a client may take to send a body
// or to take a response, and how many bytes of results may wait in memory
// for clients to read them. A client that never reads would otherwise keep
// every copy of its results (the result, its JSON) alive for as long as it
// keeps the connection.

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"golang.org/x/sync/semaphore"

	"github.com/safe-run/safe-run/sandbox"
)

// writeChunk is the most written under one write deadline: a client that
// reads slowly but steadily is never cut off, one that stops is.
const writeChunk = 64 << 10

// maxBudgetWait is the longest a result waits for room among the results
// in flight before it is refused.
const maxBudgetWait = 10 * time.Second

// limitHTTP wraps next with the body read deadline, the per-write deadline
// and the budget of results in flight.
func limitHTTP(cfg HTTPConfig, next http.Handler) http.Handler {
	budget := newResponseBudget(cfg)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		if cfg.BodyTimeout > 0 && r.Body != nil && r.Body != http.NoBody {
			// Only while the body is read: a deadline left on the connection
			// would cancel the request when it passes, ending a long run.
			_ = rc.SetReadDeadline(time.Now().Add(cfg.BodyTimeout))
			r.Body = &bodyDeadline{ReadCloser: r.Body, rc: rc}
		}
		if cfg.WriteTimeout > 0 {
			// A kept-alive connection keeps the last response's deadline.
			_ = rc.SetWriteDeadline(time.Time{})
			dw := &deadlineWriter{ResponseWriter: w, rc: rc, timeout: cfg.WriteTimeout}
			defer dw.extend() // the server flushes the rest after the handler
			w = dw
		}
		if budget != nil {
			t := &responseTicket{budget: budget}
			defer t.release()
			r = r.WithContext(context.WithValue(r.Context(), ticketKey{}, t))
		}
		next.ServeHTTP(w, r)
	})
}

// bodyDeadline lifts the read deadline once the body is read.
type bodyDeadline struct {
	io.ReadCloser
	rc *http.ResponseController
}

func (b *bodyDeadline) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

// deadlineWriter gives every chunk written and every flush its own write
// deadline; SSE streams of long runs stay open while the client reads.
type deadlineWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
}

func (w *deadlineWriter) extend() { _ = w.rc.SetWriteDeadline(time.Now().Add(w.timeout)) }

func (w *deadlineWriter) Write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		w.extend()
		n, err := w.ResponseWriter.Write(p[:min(len(p), writeChunk)])
		written += n
		if err != nil {
			return written, err
		}
		p = p[n:]
	}
	return written, nil
}

// Flush sends what is buffered, under a deadline of its own.
func (w *deadlineWriter) Flush() {
	w.extend()
	_ = w.rc.Flush()
}

// Unwrap lets http.ResponseController reach the connection.
func (w *deadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// responseBudget bounds the bytes of results between their run's end and
// the end of their response's write: each at most perResponse, together at
// most max.
type responseBudget struct {
	sem              *semaphore.Weighted
	max, perResponse int64
	held             atomic.Int64
	wait             time.Duration
}

// newResponseBudget is cfg's budget, nil if it sets none.
func newResponseBudget(cfg HTTPConfig) *responseBudget {
	if cfg.MaxResponseBytes <= 0 || cfg.MaxInFlightBytes <= 0 {
		return nil
	}
	return &responseBudget{sem: semaphore.NewWeighted(cfg.MaxInFlightBytes), max: cfg.MaxInFlightBytes,
		perResponse: cfg.MaxResponseBytes, wait: min(maxBudgetWait, max(cfg.WriteTimeout, time.Second))}
}

type ticketKey struct{}

// responseTicket is what one HTTP request holds of the budget; it gives it
// back when the response is written or has failed.
type responseTicket struct {
	budget *responseBudget
	mu     sync.Mutex
	n      int64
}

func (t *responseTicket) reserve(ctx context.Context, n int64) error {
	ctx, cancel := context.WithTimeout(ctx, t.budget.wait)
	defer cancel()
	if err := t.budget.sem.Acquire(ctx, n); err != nil {
		return err
	}
	t.budget.held.Add(n)
	t.mu.Lock()
	t.n += n
	t.mu.Unlock()
	return nil
}

func (t *responseTicket) release() {
	t.mu.Lock()
	n := t.n
	t.n = 0
	t.mu.Unlock()
	if n > 0 {
		t.budget.held.Add(-n)
		t.budget.sem.Release(n)
	}
}

// fitResponse makes a run's result fit the response limits of the HTTP
// request in ctx (none over stdio, whose one client reads its own pipe).
// Output files that would take the response over the per-response limit
// are left out, last first, each saying why; a result that still does not
// fit, or finds no room among the results in flight, is answered with a
// tool error saying so instead. The room is reserved until the response
// is written.
func fitResponse(ctx context.Context, res sandbox.Result) (sandbox.Result, *mcpgo.CallToolResult) {
	t, _ := ctx.Value(ticketKey{}).(*responseTicket)
	if t == nil {
		return res, nil
	}
	b := t.budget
	n := responseSize(res)
	if n > b.perResponse {
		// A copy: the result cache may hold the same files.
		res.Files = slices.Clone(res.Files)
		for i := len(res.Files) - 1; i >= 0 && n > b.perResponse; i-- {
			f := &res.Files[i]
			if f.Skipped != "" {
				continue
			}
			n -= fileResponseSize(*f)
			f.Data = nil
			f.Skipped = fmt.Sprintf("the response would be over this server's %s limit (--max-response)", sandbox.FormatBytes(b.perResponse))
		}
	}
	if n > b.perResponse {
		return res, mcpgo.NewToolResultError(fmt.Sprintf("The run ended (status %s), but its output is %s as JSON, over this server's %s response limit (--max-response); print less, or write it to files in out/.",
			res.Status, sandbox.FormatBytes(n), sandbox.FormatBytes(b.perResponse)))
	}
	if err := t.reserve(ctx, n); err != nil {
		return res, mcpgo.NewToolResultError(fmt.Sprintf("The run ended (status %s), but its result (%s) was dropped: the server already holds %s of responses that clients have not finished reading (limit %s, --max-responses-in-flight); try again shortly.",
			res.Status, sandbox.FormatBytes(n), sandbox.FormatBytes(b.held.Load()), sandbox.FormatBytes(b.max)))
	}
	return res, nil
}

// responseOverhead covers the envelope and the fields of fixed size.
const responseOverhead = 4 << 10

// responseSize bounds the size of res's response as JSON: stdout and
// stderr in the structured content and their excerpts in the text, and
// the returned files, as base64 or as text.
func responseSize(res sandbox.Result) int64 {
	n := int64(responseOverhead) + jsonLen(res.Stdout) + jsonLen(res.Stderr) + jsonLen(res.Message) +
		jsonLen(textExcerpt(res.Stdout, "stdout")) + jsonLen(textExcerpt(res.Stderr, "stderr"))
	for _, f := range res.Files {
		n += 2*jsonLen(f.Path) + 256 // listed in the structured content and named in the text
		if f.Skipped == "" {
			n += fileResponseSize(f)
		}
	}
	return n
}

// fileResponseSize is the most a returned file adds: base64, or JSON text
// if it is valid UTF-8 and may be returned as text.
func fileResponseSize(f sandbox.OutputFile) int64 {
	n := int64(len(f.Path)) + 4*((int64(len(f.Data))+2)/3) + 128
	if utf8.Valid(f.Data) {
		n = max(n, int64(len(f.Path))+jsonLen(string(f.Data))+128)
	}
	return n
}

// jsonLen is the length of s as a JSON string, as encoding/json writes it
// (HTML characters escaped, invalid UTF-8 replaced).
func jsonLen(s string) int64 {
	n := int64(2)
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\' || c == '\n' || c == '\r' || c == '\t' || c == '\b' || c == '\f':
				n += 2
			case c < 0x20 || c == '<' || c == '>' || c == '&':
				n += 6
			default:
				n++
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			n += 6
		case r == '\u2028' || r == '\u2029':
			n += 6
		default:
			n += int64(size)
		}
		i += size
	}
	return n
}

// textOutputBytes is how much of stdout and of stderr, each, the text
// content repeats (half from the head, half from the tail): the structured
// content has them whole, and a result should not carry them twice.
const textOutputBytes = 16 << 10

// textExcerpt is s for the text content: whole if short, else its head
// and tail around a line saying what is left out and where it is.
func textExcerpt(s, name string) string {
	if len(s) <= textOutputBytes {
		return s
	}
	head, tail := s[:textOutputBytes/2], s[len(s)-textOutputBytes/2:]
	// Cut at rune boundaries, within a rune's length.
	for i := 0; i < utf8.UTFMax && len(head) > 0 && !utf8.RuneStart(s[len(head)]); i++ {
		head = head[:len(head)-1]
	}
	for i := 0; i < utf8.UTFMax && len(tail) > 0 && !utf8.RuneStart(tail[0]); i++ {
		tail = tail[1:]
	}
	return fmt.Sprintf("%s\n[... %d bytes of %s left out here; the structured content's %q has them all ...]\n%s",
		head, len(s)-len(head)-len(tail), name, name, tail)
}

// LimitConnections caps the connections l has open at once at n: one more
// is answered 503 with a line naming the limit and closed.
func LimitConnections(l net.Listener, n int) net.Listener {
	return &connLimiter{Listener: l, max: int64(n), refusing: make(chan struct{}, refusingAtOnce)}
}

// refusingAtOnce bounds the refusals being sent at once; beyond it a
// connection is closed without one.
const refusingAtOnce = 32

type connLimiter struct {
	net.Listener
	max      int64
	open     atomic.Int64
	refusing chan struct{}
}

func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) <= l.max {
			return &limitedConn{Conn: c, release: sync.OnceFunc(func() { l.open.Add(-1) })}, nil
		}
		l.open.Add(-1)
		select {
		case l.refusing <- struct{}{}:
			go func() {
				defer func() { <-l.refusing }()
				l.refuse(c)
			}()
		default:
			c.Close()
		}
	}
}

// refuse answers c with a 503 and closes it after reading what the client
// sent, so that closing does not reset the connection before the client
// has read the answer.
func (l *connLimiter) refuse(c net.Conn) {
	defer c.Close()
	body := fmt.Sprintf("server busy: all %d connections (--max-connections) are in use; retry later, or close idle connections\n", l.max)
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	_, err := fmt.Fprintf(c, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\nRetry-After: 1\r\n\r\n%s", len(body), body)
	if err != nil {
		return
	}
	if tc, ok := c.(interface{ CloseWrite() error }); ok {
		_ = tc.CloseWrite()
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(c, 1<<20))
}

// limitedConn gives its place back when closed.
type limitedConn struct {
	net.Conn
	release func()
}

func (c *limitedConn) Close() error {
	c.release()
	return c.Conn.Close()
}

// CloseWrite lets the HTTP server half-close before closing, as it does
// with TCP connections, so that a client still gets an early answer.
func (c *limitedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
