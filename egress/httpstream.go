package egress

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// maxChunkLine bounds a chunk-size line (size and extensions).
const maxChunkLine = 4 << 10

// HTTPRequests follows the framing of an HTTP/1.x request stream (the
// bytes a client sends on one connection) so that every request's Host is
// checked, not only the first one's: on a kept-alive connection to a
// shared front end a later request could otherwise reach another virtual
// host. Write takes the stream in pieces of any size and says how much of
// it may be forwarded: the bytes of a request head only once the whole
// head is read and its Host passed Check, body bytes as they come, a chunk
// line or trailer line once it is whole and valid. What it cannot follow
// the way every server would, it refuses: both Content-Length and
// Transfer-Encoding, differing Content-Lengths, a final coding other than
// chunked, a malformed chunk, a line ending in a bare LF, a head over
// MaxHTTPHead, HTTP/2's preface. A refusal is final.
//
// Upgrades: when the first request of the connection asks for one
// (Connection: upgrade with Upgrade, as websockets do), the bytes after it
// are held until the caller says, from the response, whether the protocol
// switched (Switched): if so, checking stops — the tunnel stays with the
// host the request named, and what flows in it is not HTTP; if not, the
// held bytes are checked as the next request. An upgrade asked for by a
// later request is not honoured: checking goes on, so a tunnel opened
// there is refused as not HTTP.
type HTTPRequests struct {
	// Check says whether a request may name host (normalised, as
	// ParseHTTPHost returns it); its error is the refusal.
	Check func(host string) error

	state    int
	off      int64  // bytes of the stream taken in so far
	allowed  int64  // bytes of the stream that may be forwarded
	buf      []byte // the head, chunk line or trailer read so far
	remain   uint64 // body or chunk bytes left
	trailer  int    // trailer bytes so far
	requests int
	upgrade  bool // the current request asks for an upgrade
	held     []byte
	err      error
}

const (
	stHead = iota
	stBody
	stChunkSize
	stChunkData
	stChunkEnd
	stTrailer
	stWait // after an upgrade request: held until Switched
	stPass // upgraded: no more checking
)

// Write takes the next bytes of the stream and returns the offset in the
// whole stream up to which bytes may be forwarded; after an error, the
// connection must be ended (bytes up to the offset returned are the
// requests before the refused one).
func (h *HTTPRequests) Write(p []byte) (allowed int64, err error) {
	if h.err != nil {
		return h.allowed, h.err
	}
	for len(p) > 0 && h.err == nil {
		var n int
		n, h.err = h.step(p)
		p = p[n:]
	}
	return h.allowed, h.err
}

// Waiting says whether bytes are held until Switched is called.
func (h *HTTPRequests) Waiting() bool { return h.err == nil && h.state == stWait }

// UpgradeAsked says whether the connection's first request asked for an
// upgrade and its answer is still awaited (Switched is due), whether or
// not bytes are held yet.
func (h *HTTPRequests) UpgradeAsked() bool {
	return h.err == nil && (h.state == stWait || h.requests == 1 && h.upgrade)
}

// Switched tells, after an upgrade request, whether the response switched
// protocols (101): if so everything from now on may be forwarded, else the
// bytes held are checked as the next request.
func (h *HTTPRequests) Switched(ok bool) (allowed int64, err error) {
	if h.err != nil {
		return h.allowed, h.err
	}
	h.upgrade = false
	if h.state != stWait {
		if ok && h.requests == 1 {
			h.state = stWait // the request's body is still coming: pass after it
			h.upgrade = true
		}
		return h.allowed, nil
	}
	held := h.held
	h.held = nil
	if ok {
		h.state = stPass
		h.off += int64(len(held))
		h.allowed = h.off
		return h.allowed, nil
	}
	h.state = stHead
	return h.Write(held)
}

// step consumes a prefix of p (at least one byte, unless it fails).
func (h *HTTPRequests) step(p []byte) (int, error) {
	switch h.state {
	case stPass:
		h.off += int64(len(p))
		h.allowed = h.off
		return len(p), nil
	case stWait:
		if len(h.held)+len(p) > MaxHTTPHead {
			return 0, fmt.Errorf("over %d bytes sent before the upgrade was answered", MaxHTTPHead)
		}
		h.held = append(h.held, p...)
		return len(p), nil
	case stHead:
		return h.head(p)
	case stBody, stChunkData:
		n := len(p)
		if uint64(n) > h.remain {
			n = int(h.remain)
		}
		h.remain -= uint64(n)
		h.advance(n)
		if h.remain == 0 {
			if h.state == stBody {
				h.endRequest()
			} else {
				h.state = stChunkEnd
			}
		}
		return n, nil
	case stChunkEnd:
		want := "\r\n"[len(h.buf)]
		if p[0] != want {
			return 0, errors.New("HTTP chunk data not followed by CRLF")
		}
		h.buf = append(h.buf, p[0])
		h.off++
		if len(h.buf) == 2 {
			h.buf = h.buf[:0]
			h.allowed = h.off
			h.state = stChunkSize
		}
		return 1, nil
	case stChunkSize, stTrailer:
		return h.line(p)
	}
	return 0, errors.New("HTTP stream checker in an unknown state")
}

func (h *HTTPRequests) advance(n int) {
	h.off += int64(n)
	h.allowed = h.off
}

// head reads a request head; once whole, checks it and sets up its body.
func (h *HTTPRequests) head(p []byte) (int, error) {
	old := len(h.buf)
	take := min(len(p), MaxHTTPHead-old)
	h.buf = append(h.buf, p[:take]...)
	if h.buf[0] == '\r' || h.buf[0] == '\n' {
		return 0, errors.New("HTTP: an empty line where a request should begin")
	}
	from := max(0, old-3)
	i := bytes.Index(h.buf[from:], []byte("\r\n\r\n"))
	if i < 0 {
		if err := bareLF(h.buf); err != nil {
			return 0, err
		}
		if err := checkMethodPrefix(h.buf); err != nil {
			return 0, err
		}
		if len(h.buf) >= MaxHTTPHead {
			return 0, fmt.Errorf("HTTP request head over %d bytes", MaxHTTPHead)
		}
		h.off += int64(take)
		return take, nil
	}
	end := from + i + 4
	head := h.buf[:end]
	used := end - old
	if err := bareLF(head); err != nil {
		return 0, err
	}
	if bytes.HasPrefix(head, []byte("PRI * HTTP/2.0\r\n")) {
		return 0, errors.New("HTTP/2 with prior knowledge cannot be followed: use HTTP/1.1 or TLS")
	}
	host, complete, err := ParseHTTPHost(head)
	if err != nil {
		return 0, err
	}
	if !complete {
		return 0, errors.New("HTTP request head not understood")
	}
	if err := h.Check(host); err != nil {
		return 0, err
	}
	body, chunked, upgrade, err := framing(head)
	if err != nil {
		return 0, err
	}
	h.requests++
	h.upgrade = upgrade
	h.buf = h.buf[:0]
	h.advance(used)
	switch {
	case chunked:
		h.state = stChunkSize
	case body > 0:
		h.state, h.remain = stBody, body
	default:
		h.endRequest()
	}
	return used, nil
}

// endRequest: the next request, or the wait for an upgrade's answer.
func (h *HTTPRequests) endRequest() {
	h.state = stHead
	if h.upgrade && h.requests == 1 {
		h.state = stWait
	}
}

// line reads a chunk-size line or a trailer line.
func (h *HTTPRequests) line(p []byte) (int, error) {
	limit := maxChunkLine
	if h.state == stTrailer {
		limit = MaxHTTPHead - h.trailer
	}
	i := bytes.IndexByte(p, '\n')
	if i < 0 {
		if len(h.buf)+len(p) > limit {
			return 0, errors.New("HTTP chunk line or trailer too long")
		}
		h.buf = append(h.buf, p...)
		h.off += int64(len(p))
		return len(p), nil
	}
	if len(h.buf)+i+1 > limit {
		return 0, errors.New("HTTP chunk line or trailer too long")
	}
	h.buf = append(h.buf, p[:i+1]...)
	l := h.buf
	if len(l) < 2 || l[len(l)-2] != '\r' {
		return 0, errors.New("HTTP chunk line or trailer ends in a bare LF")
	}
	l = l[:len(l)-2]
	if h.state == stChunkSize {
		size, err := chunkSize(l)
		if err != nil {
			return 0, err
		}
		if size == 0 {
			h.state, h.trailer = stTrailer, 0
		} else {
			h.state, h.remain = stChunkData, size
		}
	} else if len(l) == 0 {
		h.endRequest()
	} else {
		if _, _, err := headerLine(string(l)); err != nil || bytes.IndexByte(l, '\r') >= 0 {
			return 0, fmt.Errorf("HTTP trailer %.80q is not name: value", l)
		}
		h.trailer += len(h.buf)
	}
	h.buf = h.buf[:0]
	h.advance(i + 1)
	return i + 1, nil
}

// chunkSize parses "hex[;ext...]".
func chunkSize(l []byte) (uint64, error) {
	n := 0
	for n < len(l) && isHex(l[n]) {
		n++
	}
	if n == 0 || n > 15 {
		return 0, fmt.Errorf("HTTP chunk size %.40q is not 1 to 15 hex digits", l)
	}
	if n < len(l) && l[n] != ';' {
		return 0, fmt.Errorf("HTTP chunk line %.40q: after the size only ;extensions", l)
	}
	for _, c := range l[n:] {
		if c < ' ' && c != '\t' || c == 0x7f {
			return 0, fmt.Errorf("HTTP chunk extension has the byte %#02x", c)
		}
	}
	v, err := strconv.ParseUint(string(l[:n]), 16, 64)
	if err != nil {
		return 0, fmt.Errorf("HTTP chunk size %.40q: %w", l[:n], err)
	}
	return v, nil
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// bareLF refuses a line feed without a carriage return before it: servers
// differ on whether it ends a line, which would let a header hide.
func bareLF(b []byte) error {
	for i, c := range b {
		if c == '\n' && (i == 0 || b[i-1] != '\r') {
			return errors.New("HTTP line ending in a bare LF (not CRLF)")
		}
		if c == '\r' && i+1 < len(b) && b[i+1] != '\n' {
			return errors.New("HTTP: a bare CR in the head")
		}
	}
	return nil
}

// framing reads, from a head ParseHTTPHost accepted, how long its body is
// (Content-Length, or chunked) and whether it asks for an upgrade.
func framing(head []byte) (length uint64, chunked, upgrade bool, err error) {
	lines := strings.Split(strings.TrimSuffix(string(head), "\r\n\r\n"), "\r\n")
	http10 := strings.HasSuffix(lines[0], " HTTP/1.0")
	var cl []string
	var te []string
	var conn []string
	hasUpgrade := false
	for _, l := range lines[1:] {
		k, v, err := headerLine(l)
		if err != nil {
			return 0, false, false, err
		}
		switch strings.ToLower(k) {
		case "content-length":
			for _, s := range strings.Split(v, ",") {
				cl = append(cl, strings.Trim(s, " \t"))
			}
		case "transfer-encoding":
			for _, s := range strings.Split(v, ",") {
				te = append(te, strings.ToLower(strings.Trim(s, " \t")))
			}
		case "connection":
			for _, s := range strings.Split(v, ",") {
				conn = append(conn, strings.ToLower(strings.Trim(s, " \t")))
			}
		case "upgrade":
			hasUpgrade = true
		}
	}
	upgrade = hasUpgrade && contains(conn, "upgrade")
	if len(te) > 0 {
		if len(cl) > 0 {
			return 0, false, false, errors.New("HTTP request with both Content-Length and Transfer-Encoding")
		}
		if http10 {
			return 0, false, false, errors.New("HTTP/1.0 request with Transfer-Encoding")
		}
		for i, c := range te {
			if c == "" || !isToken(c) {
				return 0, false, false, fmt.Errorf("HTTP Transfer-Encoding %q is not a list of codings", strings.Join(te, ", "))
			}
			if c == "chunked" && i != len(te)-1 {
				return 0, false, false, errors.New("HTTP Transfer-Encoding with chunked not last, or more than once")
			}
		}
		if te[len(te)-1] != "chunked" {
			return 0, false, false, fmt.Errorf("HTTP Transfer-Encoding %q: the final coding must be chunked", strings.Join(te, ", "))
		}
		return 0, true, upgrade, nil
	}
	for _, s := range cl {
		if s != cl[0] {
			return 0, false, false, errors.New("HTTP request with differing Content-Lengths")
		}
	}
	if len(cl) > 0 {
		s := cl[0]
		if s == "" || len(s) > 18 || strings.TrimLeft(s, "0123456789") != "" {
			return 0, false, false, fmt.Errorf("HTTP Content-Length %.40q is not a number", s)
		}
		length, _ = strconv.ParseUint(s, 10, 64)
	}
	return length, false, upgrade, nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
