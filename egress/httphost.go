package egress

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// MaxHTTPHead is the most of an HTTP request head ParseHTTPHost reads.
const MaxHTTPHead = 8 << 10

// ParseHTTPHost reads the host an HTTP/1.x request names: its Host header
// with the port stripped, normalised (see NormalizeName) or an IP address
// as written without brackets. complete false means b is a valid beginning
// of a request head and more bytes are needed. It refuses a head over
// MaxHTTPHead, a method that is not a token, CONNECT (a transparent
// connection has no proxy to ask), a version other than 1.0 and 1.1, a
// header line that is not "name: value", no Host or more than one, and an
// absolute-form target ("http://host/…") naming another host than Host
// (without Host, the target's host is the one).
func ParseHTTPHost(b []byte) (host string, complete bool, err error) {
	head := b
	if len(head) > MaxHTTPHead {
		head = head[:MaxHTTPHead]
	}
	end := headEnd(head)
	if end < 0 {
		if err := checkMethodPrefix(head); err != nil {
			return "", false, err
		}
		if len(b) >= MaxHTTPHead {
			return "", false, fmt.Errorf("HTTP request head over %d bytes", MaxHTTPHead)
		}
		return "", false, nil
	}
	lines := strings.Split(strings.TrimSuffix(string(head[:end]), "\n"), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimSuffix(l, "\r")
	}
	target, err := requestLine(lines[0])
	if err != nil {
		return "", false, err
	}
	var hosts []string
	for _, l := range lines[1:] {
		k, v, err := headerLine(l)
		if err != nil {
			return "", false, err
		}
		if strings.EqualFold(k, "host") {
			hosts = append(hosts, v)
		}
	}
	if len(hosts) > 1 {
		return "", false, errors.New("HTTP request with more than one Host header")
	}
	var fromTarget string
	if !strings.HasPrefix(target, "/") && strings.Contains(target, "://") {
		if _, ok := cutSchemePrefix(target); !ok {
			return "", false, fmt.Errorf("HTTP request target %.80q: only http:// and https:// targets", target)
		}
	}
	if rest, ok := cutSchemePrefix(target); ok {
		authority, _, _ := strings.Cut(rest, "/")
		authority, _, _ = strings.Cut(authority, "?")
		if strings.Contains(authority, "@") {
			return "", false, errors.New("HTTP request target with user information")
		}
		h, err := hostOf(authority)
		if err != nil {
			return "", false, fmt.Errorf("HTTP request target: %w", err)
		}
		fromTarget = h
	}
	if len(hosts) == 0 {
		if fromTarget == "" {
			return "", false, errors.New("HTTP request without a Host header")
		}
		return fromTarget, true, nil
	}
	h, err := hostOf(hosts[0])
	if err != nil {
		return "", false, fmt.Errorf("HTTP Host header: %w", err)
	}
	if fromTarget != "" && fromTarget != h {
		return "", false, fmt.Errorf("HTTP request target names %s, its Host header %s", fromTarget, h)
	}
	return h, true, nil
}

// headEnd is the offset of the head's blank line (a line feed, with or
// without a carriage return, right after another), or -1.
func headEnd(b []byte) int {
	start := 0
	for {
		i := bytes.IndexByte(b[start:], '\n')
		if i < 0 {
			return -1
		}
		if line := b[start : start+i]; len(line) == 0 || len(line) == 1 && line[0] == '\r' {
			return start
		}
		start += i + 1
	}
}

// checkMethodPrefix refuses, before the head is complete, bytes that
// cannot begin a request (a TLS record, binary data).
func checkMethodPrefix(b []byte) error {
	for i, c := range b {
		if c == ' ' && i > 0 {
			return nil
		}
		if !isTchar(c) {
			return fmt.Errorf("not an HTTP request (byte %#02x in the method)", c)
		}
	}
	return nil
}

func requestLine(l string) (string, error) {
	method, rest, ok1 := strings.Cut(l, " ")
	target, version, ok2 := strings.Cut(rest, " ")
	if !ok1 || !ok2 || method == "" || target == "" {
		return "", fmt.Errorf("HTTP request line %.80q is not METHOD target HTTP/1.1", l)
	}
	if !isToken(method) {
		return "", fmt.Errorf("HTTP method %.40q is not a token", method)
	}
	if method == "CONNECT" {
		return "", errors.New("HTTP CONNECT is not forwarded: connect to the host itself")
	}
	if version != "HTTP/1.1" && version != "HTTP/1.0" {
		return "", fmt.Errorf("HTTP version %.40q (only HTTP/1.0 and HTTP/1.1)", version)
	}
	for i := 0; i < len(target); i++ {
		if target[i] <= ' ' || target[i] == 0x7f {
			return "", fmt.Errorf("HTTP request target has the byte %#02x", target[i])
		}
	}
	return target, nil
}

func headerLine(l string) (string, string, error) {
	k, v, ok := strings.Cut(l, ":")
	if !ok || k == "" || !isToken(k) {
		return "", "", fmt.Errorf("HTTP header line %.80q is not name: value", l)
	}
	v = strings.Trim(v, " \t")
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < ' ' && c != '\t' || c == 0x7f {
			return "", "", fmt.Errorf("HTTP header %.40q has the byte %#02x", k, c)
		}
	}
	return k, v, nil
}

// cutSchemePrefix cuts "http://" or "https://" (any case) off an
// absolute-form target.
func cutSchemePrefix(t string) (string, bool) {
	for _, s := range []string{"http://", "https://"} {
		if len(t) >= len(s) && strings.EqualFold(t[:len(s)], s) {
			return t[len(s):], true
		}
	}
	return "", false
}

// hostOf is the host of "host", "host:port", "[v6]" or "[v6]:port".
func hostOf(hp string) (string, error) {
	h, port := hp, ""
	if strings.HasPrefix(hp, "[") {
		end := strings.Index(hp, "]")
		if end < 0 {
			return "", fmt.Errorf("%.80q lacks ]", hp)
		}
		h, port = hp[1:end], hp[end+1:]
		if port != "" {
			p, ok := strings.CutPrefix(port, ":")
			if !ok {
				return "", fmt.Errorf("%.80q: after ] comes :port", hp)
			}
			port = p
		}
		a, err := netip.ParseAddr(h)
		if err != nil || !a.Is6() || a.Zone() != "" {
			return "", fmt.Errorf("%.80q is not an IPv6 address", h)
		}
		h = a.String()
	} else if i := strings.LastIndexByte(hp, ':'); i >= 0 {
		h, port = hp[:i], hp[i+1:]
	}
	if port != "" {
		if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			return "", fmt.Errorf("port %.20q is not a number", port)
		}
	}
	if strings.HasPrefix(hp, "[") {
		return h, nil
	}
	if a, err := netip.ParseAddr(h); err == nil && a.Is4() {
		return a.String(), nil
	}
	n, err := NormalizeName(h)
	if err != nil {
		return "", err
	}
	return n, nil
}

func isToken(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isTchar(s[i]) {
			return false
		}
	}
	return s != ""
}

// isTchar is RFC 9110's tchar.
func isTchar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}
