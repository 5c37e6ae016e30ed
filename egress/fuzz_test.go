package egress

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

// FuzzParse checks that Parse never panics, that its errors are one line,
// that a parsed list round-trips through Strings and narrows to a list
// allowing the same,
// and that each entry's own destinations match it.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"pypi.org",
		"pypi\nnpm\n*.example.com:8443",
		"mirror.test=127.0.0.1:8443\nmirror.test:443",
		"203.0.113.0/24:443\n[2001:db8::/32]:443\n2001:db8::/48",
		"bücher.de\nXN--BCHER-KVA.DE.",
		"*.corp.example\npkg.corp.example=10.0.0.5:443",
		"10.0.0.0/8\n::ffff:127.0.0.1",
		"a.test=[::1]:80\na.test=127.0.0.1:81",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		entries := strings.Split(in, "\n")
		a, err := Parse(entries)
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("Parse(%q): the error has several lines: %q", entries, err)
			}
			return
		}
		strs := a.Strings()
		again, err := Parse(strs)
		if err != nil || !reflect.DeepEqual(again, a) {
			t.Fatalf("Parse(%q) = %#v; Parse(%q) = %#v, %v", entries, a, strs, again, err)
		}
		n, err := a.Narrow(strs)
		if err != nil {
			t.Fatalf("%q does not narrow to itself: %v", strs, err)
		}
		// Narrowed to itself, the list allows what it did: no more, no less.
		if _, err := a.Narrow(n.Strings()); err != nil {
			t.Fatalf("%q narrowed to itself gives %q, which it does not allow: %v", strs, n.Strings(), err)
		}
		if _, err := n.Narrow(strs); err != nil {
			t.Fatalf("%q narrowed to itself gives %q, which does not allow it: %v", strs, n.Strings(), err)
		}
		for _, e := range a.Entries {
			for _, p := range portsOf(e.Ports) {
				switch {
				case e.Prefix.IsValid():
					if _, blocked := Blocked(e.Prefix.Addr(), nil); !blocked && !a.MatchAddr(e.Prefix.Addr(), p) {
						t.Fatalf("%s does not allow its own address on %d", e, p)
					}
				case !strings.HasPrefix(e.Host, "*."):
					m, ok := a.Match(e.Host, p)
					if !ok || m.Host != e.Host || !a.AllowsName(e.Host) {
						t.Fatalf("%s: Match(%s, %d) = %v, %v", e, e.Host, p, m, ok)
					}
				default:
					name := "x." + strings.TrimPrefix(e.Host, "*.")
					if _, err := NormalizeName(name); err != nil {
						break
					}
					if _, ok := a.Match(name, p); !ok || !a.AllowsName(name) {
						t.Fatalf("%s does not match %s:%d", e, name, p)
					}
				}
			}
		}
	})
}

// FuzzAnswerDNS checks that AnswerDNS never panics, that every reply
// parses as a response to the query, that only a name lookup allowed is
// answered, and that an answer is the lookup's.
func FuzzAnswerDNS(f *testing.F) {
	rd := dnsmessage.Header{ID: 0xbeef, RecursionDesired: true}
	f.Add(dnsQuery(f, rd, question("pypi.org.", dnsmessage.TypeA)))
	f.Add(dnsQuery(f, rd, question("Evil.Test.", dnsmessage.TypeAAAA)))
	f.Add(dnsQuery(f, rd, question("a.b.", dnsmessage.TypeA), question("c.d.", dnsmessage.TypeA)))
	f.Add(dnsQuery(f, dnsmessage.Header{OpCode: 5}, question("x.y.", dnsmessage.TypeSOA)))
	f.Add([]byte{0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1})
	f.Fuzz(func(t *testing.T, query []byte) {
		var asked []string
		lookup := func(name string) (netip.Addr, bool) {
			asked = append(asked, name)
			if len(name)%2 == 0 {
				return netip.MustParseAddr("198.19.0.9"), true
			}
			return netip.Addr{}, false
		}
		reply, name, ok, err := AnswerDNS(query, lookup)
		if err != nil {
			if reply != nil || ok {
				t.Fatalf("an error with a reply: %v", err)
			}
			return
		}
		for i := 0; i < len(name); i++ {
			if name[i] <= ' ' || name[i] >= 0x7f {
				t.Fatalf("name %q has an unprintable byte", name)
			}
		}
		if len(asked) > 1 {
			t.Fatalf("lookup asked %q", asked)
		}
		if ok && (len(asked) != 1 || asked[0] != name || len(name)%2 != 0) {
			t.Fatalf("ok for %q after asking %q", name, asked)
		}
		var qp, rp dnsmessage.Parser
		qh, _ := qp.Start(query)
		h, err := rp.Start(reply)
		if err != nil {
			t.Fatalf("the reply does not parse: %v", err)
		}
		if !h.Response || h.ID != qh.ID {
			t.Fatalf("reply header %+v to %+v", h, qh)
		}
		if ok != (h.RCode == dnsmessage.RCodeSuccess) {
			t.Fatalf("ok %v with %v", ok, h.RCode)
		}
		if _, err := rp.AllQuestions(); err != nil {
			t.Fatalf("the reply's questions: %v", err)
		}
		answers, err := rp.AllAnswers()
		if err != nil || len(answers) > 1 || len(answers) == 1 && !ok {
			t.Fatalf("answers %v, %v (ok %v)", answers, err, ok)
		}
		if len(reply) > 512 {
			t.Fatalf("a reply of %d bytes", len(reply))
		}
	})
}

// FuzzParseSNI checks that ParseSNI never panics, that a name it returns
// is normalised, that more bytes change nothing once complete, and that
// a prefix of a complete ClientHello only needs more.
func FuzzParseSNI(f *testing.F) {
	// Small key shares keep the seeds short, so that minimising is quick.
	f.Add(clientHello(f, &tls.Config{ServerName: "pypi.org", CurvePreferences: []tls.CurveID{tls.X25519}}))
	f.Add(clientHello(f, &tls.Config{ServerName: "x.example", MaxVersion: tls.VersionTLS12}))
	f.Add(hello(sniExt("pypi.org")))
	f.Add(hello())
	f.Add(hello(sniExt("a.b", "c.d")))
	f.Add([]byte{0x16, 3, 1, 0x40, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		name, complete, err := ParseSNI(b)
		if err != nil {
			if complete || name != "" {
				t.Fatalf("an error with %q, %v", name, complete)
			}
			return
		}
		if !complete {
			if name != "" || len(b) > 5+maxTLSRecord {
				t.Fatalf("incomplete with %q after %d bytes", name, len(b))
			}
			return
		}
		if name != "" {
			if n, err := NormalizeName(name); err != nil || n != name {
				t.Fatalf("name %q is not normalised (%q, %v)", name, n, err)
			}
		}
		if n2, c2, err := ParseSNI(append(slices.Clone(b), 1, 2, 3)); n2 != name || !c2 || err != nil {
			t.Fatalf("more bytes: %q, %v, %v; was %q", n2, c2, err, name)
		}
		cut := 5 + (int(b[3])<<8|int(b[4]))/2
		if n2, c2, err := ParseSNI(b[:cut]); n2 != "" || c2 || err != nil {
			t.Fatalf("the first %d bytes: %q, %v, %v", cut, n2, c2, err)
		}
	})
}

// FuzzParseHTTPHost checks that ParseHTTPHost never panics, that a host it
// returns is normalised, that a prefix of the head only needs more, and
// that where net/http reads the same request it finds the same host.
func FuzzParseHTTPHost(f *testing.F) {
	f.Add([]byte("GET / HTTP/1.1\r\nHost: pypi.org\r\n\r\n"))
	f.Add([]byte("GET http://pypi.org/ HTTP/1.0\r\nhost: PYPI.org:80\r\n\r\n"))
	f.Add([]byte("POST /x HTTP/1.1\nHost: [2001:db8::1]:8080\nContent-Length: 1\n\nx"))
	f.Add([]byte("GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n"))
	f.Add([]byte("\x16\x03\x01\x00\x05"))
	f.Fuzz(func(t *testing.T, b []byte) {
		host, complete, err := ParseHTTPHost(b)
		if err != nil {
			if complete || host != "" || strings.Contains(err.Error(), "\n") {
				t.Fatalf("an error with %q, %v: %q", host, complete, err)
			}
			return
		}
		if !complete {
			if host != "" || len(b) >= MaxHTTPHead {
				t.Fatalf("incomplete with %q after %d bytes", host, len(b))
			}
			return
		}
		if a, err := netip.ParseAddr(host); err == nil {
			if a.String() != host {
				t.Fatalf("address %q not canonical", host)
			}
		} else if n, err := NormalizeName(host); err != nil || n != host {
			t.Fatalf("host %q is not normalised (%q, %v)", host, n, err)
		}
		end := headEnd(b)
		for _, cut := range []int{end / 2, end} {
			if h2, c2, err := ParseHTTPHost(b[:cut]); h2 != "" || c2 || err != nil {
				t.Fatalf("the first %d bytes: %q, %v, %v", cut, h2, c2, err)
			}
		}
		req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(b)))
		if err != nil {
			return
		}
		h := req.Host
		if hh, _, err := net.SplitHostPort(h); err == nil {
			h = hh
		}
		h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
		if a, err := netip.ParseAddr(h); err == nil {
			h = a.String()
		} else if n, err := NormalizeName(h); err == nil {
			h = n
		}
		if h != host {
			t.Fatalf("net/http reads the host %q (%q), ParseHTTPHost %q", req.Host, h, host)
		}
	})
}

// FuzzHTTPRequests checks that HTTPRequests never panics, never allows
// more than it was given, and decides the same whether the stream comes
// whole or split in two at any point.
func FuzzHTTPRequests(f *testing.F) {
	f.Add([]byte("GET / HTTP/1.1\r\nHost: ok.test\r\n\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n"), 20)
	f.Add([]byte("POST / HTTP/1.1\r\nHost: ok.test\r\nContent-Length: 3\r\n\r\nabcGET / HTTP/1.1\r\nHost: ok.test\r\n\r\n"), 50)
	f.Add([]byte("POST / HTTP/1.1\r\nHost: ok.test\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n0\r\nT: v\r\n\r\n"), 64)
	f.Add([]byte("POST / HTTP/1.1\r\nHost: ok.test\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"), 5)
	f.Add([]byte("GET /ws HTTP/1.1\r\nHost: ok.test\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n\x81\x00"), 77)
	f.Add([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 3)
	check := func(host string) error {
		if host != "ok.test" {
			return errors.New("another host")
		}
		return nil
	}
	f.Fuzz(func(t *testing.T, b []byte, at int) {
		whole := &HTTPRequests{Check: check}
		n1, err1 := whole.Write(b)
		if n1 < 0 || n1 > int64(len(b)) {
			t.Fatalf("allowed %d of %d bytes", n1, len(b))
		}
		if len(b) == 0 {
			return
		}
		at = int(uint(at) % uint(len(b)+1))
		split := &HTTPRequests{Check: check}
		n2, err2 := split.Write(b[:at])
		if err2 == nil {
			n2, err2 = split.Write(b[at:])
		}
		if n1 != n2 || (err1 == nil) != (err2 == nil) || whole.Waiting() != split.Waiting() {
			t.Fatalf("whole: %d, %v; split at %d: %d, %v", n1, err1, at, n2, err2)
		}
		if err1 != nil && strings.Contains(err1.Error(), "\n") {
			t.Fatalf("an error of several lines: %q", err1)
		}
	})
}
