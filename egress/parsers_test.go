package egress

import (
	"crypto/tls"
	"net"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

// dnsQuery builds a query for name and type.
func dnsQuery(t testing.TB, h dnsmessage.Header, qs ...dnsmessage.Question) []byte {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, h)
	if err := b.StartQuestions(); err != nil {
		t.Fatal(err)
	}
	for _, q := range qs {
		if err := b.Question(q); err != nil {
			t.Fatal(err)
		}
	}
	m, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func question(name string, typ dnsmessage.Type) dnsmessage.Question {
	return dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET}
}

// testLookup allows pypi.org and xn--bcher-kva.de, each at an address.
func testLookup(asked *[]string) func(string) (netip.Addr, bool) {
	return func(name string) (netip.Addr, bool) {
		*asked = append(*asked, name)
		switch name {
		case "pypi.org":
			return netip.MustParseAddr("198.19.0.1"), true
		case "xn--bcher-kva.de":
			return netip.MustParseAddr("198.19.0.2"), true
		}
		return netip.Addr{}, false
	}
}

func TestAnswerDNS(t *testing.T) {
	rd := dnsmessage.Header{ID: 0x1234, RecursionDesired: true}
	tests := []struct {
		name   string
		query  []byte
		rcode  dnsmessage.RCode
		answer string // the A answer, "" for none
		qname  string // AnswerDNS's name
		ok     bool
	}{
		{"allowed A", dnsQuery(t, rd, question("pypi.org.", dnsmessage.TypeA)), dnsmessage.RCodeSuccess, "198.19.0.1", "pypi.org", true},
		{"allowed A, other case", dnsQuery(t, rd, question("PyPI.ORG.", dnsmessage.TypeA)), dnsmessage.RCodeSuccess, "198.19.0.1", "pypi.org", true},
		{"allowed A, punycode upper case", dnsQuery(t, rd, question("XN--BCHER-KVA.de.", dnsmessage.TypeA)), dnsmessage.RCodeSuccess, "198.19.0.2", "xn--bcher-kva.de", true},
		{"allowed AAAA", dnsQuery(t, rd, question("pypi.org.", dnsmessage.TypeAAAA)), dnsmessage.RCodeSuccess, "", "pypi.org", true},
		{"allowed TXT", dnsQuery(t, rd, question("pypi.org.", dnsmessage.TypeTXT)), dnsmessage.RCodeSuccess, "", "pypi.org", true},
		{"allowed MX", dnsQuery(t, rd, question("pypi.org.", dnsmessage.TypeMX)), dnsmessage.RCodeSuccess, "", "pypi.org", true},
		{"denied A", dnsQuery(t, rd, question("evil.test.", dnsmessage.TypeA)), dnsmessage.RCodeNameError, "", "evil.test", false},
		{"denied AAAA", dnsQuery(t, rd, question("evil.test.", dnsmessage.TypeAAAA)), dnsmessage.RCodeNameError, "", "evil.test", false},
		{"below an allowed name", dnsQuery(t, rd, question("x.pypi.org.", dnsmessage.TypeA)), dnsmessage.RCodeNameError, "", "x.pypi.org", false},
		{"invalid name", dnsQuery(t, rd, question("exa_mple.com.", dnsmessage.TypeA)), dnsmessage.RCodeNameError, "", "exa_mple.com", false},
		{"unprintable name", dnsQuery(t, rd, dnsmessage.Question{Name: dnsmessage.Name{Data: [255]byte{'a', '\n', 'b', '\\', '.', 't', 'e', 's', 't', '.'}, Length: 10}, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}), dnsmessage.RCodeNameError, "", `a\x0ab\x5c.test`, false},
		{"root", dnsQuery(t, rd, question(".", dnsmessage.TypeNS)), dnsmessage.RCodeNameError, "", "", false},
		{"class CHAOS", dnsQuery(t, rd, dnsmessage.Question{Name: dnsmessage.MustNewName("pypi.org."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassCHAOS}), dnsmessage.RCodeRefused, "", "pypi.org", false},
		{"two questions", dnsQuery(t, rd, question("pypi.org.", dnsmessage.TypeA), question("evil.test.", dnsmessage.TypeA)), dnsmessage.RCodeFormatError, "", "", false},
		{"no question", dnsQuery(t, rd), dnsmessage.RCodeFormatError, "", "", false},
		{"opcode NOTIFY", dnsQuery(t, dnsmessage.Header{ID: 7, OpCode: 4}, question("pypi.org.", dnsmessage.TypeA)), dnsmessage.RCodeNotImplemented, "", "", false},
	}
	for _, tt := range tests {
		var asked []string
		reply, name, ok, err := AnswerDNS(tt.query, testLookup(&asked))
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		if name != tt.qname || ok != tt.ok {
			t.Errorf("%s: name %q ok %v; want %q %v", tt.name, name, ok, tt.qname, tt.ok)
		}
		var p dnsmessage.Parser
		h, err := p.Start(reply)
		if err != nil {
			t.Errorf("%s: the reply does not parse: %v", tt.name, err)
			continue
		}
		var qh dnsmessage.Parser
		want, _ := qh.Start(tt.query)
		if !h.Response || h.ID != want.ID || h.RCode != tt.rcode || h.RecursionDesired != want.RecursionDesired {
			t.Errorf("%s: reply header %+v; want a response to %d with %v", tt.name, h, want.ID, tt.rcode)
		}
		qs, _ := p.AllQuestions()
		if tt.qname != "" && len(qs) != 1 {
			t.Errorf("%s: the question is not echoed: %v", tt.name, qs)
		}
		answers, err := p.AllAnswers()
		if err != nil {
			t.Errorf("%s: answers: %v", tt.name, err)
		}
		got := ""
		for _, a := range answers {
			r, isA := a.Body.(*dnsmessage.AResource)
			if !isA || a.Header.TTL != DNSTTL {
				t.Errorf("%s: answer %v", tt.name, a)
				continue
			}
			got = netip.AddrFrom4(r.A).String()
		}
		if got != tt.answer || len(answers) > 1 {
			t.Errorf("%s: answers %v; want %q", tt.name, answers, tt.answer)
		}
		// The name echoed keeps the sandbox's case (resolvers check it).
		if len(qs) == 1 {
			var q dnsmessage.Parser
			q.Start(tt.query)
			orig, _ := q.Question()
			if qs[0].Name.String() != orig.Name.String() {
				t.Errorf("%s: question %q echoed as %q", tt.name, orig.Name, qs[0].Name)
			}
		}
	}
}

func TestAnswerDNSErrors(t *testing.T) {
	valid := dnsQuery(t, dnsmessage.Header{ID: 1}, question("pypi.org.", dnsmessage.TypeA))
	response := dnsQuery(t, dnsmessage.Header{ID: 1, Response: true}, question("pypi.org.", dnsmessage.TypeA))
	dotted := append(slicesClone(valid[:12]), append([]byte{8, 'p', 'y', 'p', 'i', '.', 'o', 'r', 'g', 0}, 0, 1, 0, 1)...)
	tests := []struct {
		name  string
		query []byte
	}{
		{"empty", nil},
		{"short header", valid[:11]},
		{"truncated question", valid[:len(valid)-2]},
		{"a response", response},
		{"a dot inside a label", dotted},
		{"too big", append(slicesClone(valid), make([]byte, MaxDNSQuery)...)},
	}
	for _, tt := range tests {
		called := false
		reply, _, ok, err := AnswerDNS(tt.query, func(string) (netip.Addr, bool) { called = true; return netip.Addr{}, true })
		if err == nil || reply != nil || ok || called {
			t.Errorf("%s: reply %x, ok %v, err %v, lookup called %v; want an error and no reply", tt.name, reply, ok, err, called)
		}
	}
}

func slicesClone(b []byte) []byte { return append([]byte(nil), b...) }

// clientHello is what crypto/tls sends first for the config.
func clientHello(t testing.TB, cfg *tls.Config) []byte {
	t.Helper()
	c, s := net.Pipe()
	done := make(chan bool)
	go func() {
		tls.Client(c, cfg).Handshake()
		c.Close()
		close(done)
	}()
	// The handshake ends before the bytes are used: a fuzz target's
	// coverage must not change under it.
	defer func() { <-done }()
	var out []byte
	buf := make([]byte, 1<<16)
	for {
		n, err := s.Read(buf)
		out = append(out, buf[:n]...)
		if _, complete, perr := ParseSNI(out); complete || perr != nil || err != nil {
			break
		}
	}
	s.Close()
	return out
}

func TestParseSNI(t *testing.T) {
	tests := []struct {
		name string
		cfg  *tls.Config
		want string
	}{
		{"a name", &tls.Config{ServerName: "pypi.org"}, "pypi.org"},
		{"upper case", &tls.Config{ServerName: "PyPI.Org"}, "pypi.org"},
		{"punycode", &tls.Config{ServerName: "xn--bcher-kva.de"}, "xn--bcher-kva.de"},
		{"TLS 1.2 only", &tls.Config{ServerName: "api.example.com", MaxVersion: tls.VersionTLS12}, "api.example.com"},
		{"an IP address sends no SNI", &tls.Config{ServerName: "203.0.113.7"}, ""},
		{"no name", &tls.Config{InsecureSkipVerify: true}, ""},
	}
	for _, tt := range tests {
		hello := clientHello(t, tt.cfg)
		name, complete, err := ParseSNI(hello)
		if err != nil || !complete || name != tt.want {
			t.Errorf("%s: ParseSNI = %q, %v, %v; want %q", tt.name, name, complete, err, tt.want)
			continue
		}
		// Every prefix is a valid beginning that needs more.
		for i := 0; i < len(hello); i++ {
			if name, complete, err := ParseSNI(hello[:i]); err != nil || complete || name != "" {
				t.Fatalf("%s: ParseSNI of the first %d bytes = %q, %v, %v; want more needed", tt.name, i, name, complete, err)
			}
		}
		// What follows the record changes nothing.
		if name, complete, err := ParseSNI(append(hello, 0x17, 3, 3, 0, 1, 0)); err != nil || !complete || name != tt.want {
			t.Errorf("%s: with bytes after the record: %q, %v, %v", tt.name, name, complete, err)
		}
	}
}

// hello builds a ClientHello record around extensions.
func hello(exts ...[]byte) []byte {
	body := []byte{3, 3}
	body = append(body, make([]byte, 32)...)
	body = append(body, 0)                // session id
	body = append(body, 0, 2, 0x13, 0x01) // cipher suites
	body = append(body, 1, 0)             // compression
	var e []byte
	for _, x := range exts {
		e = append(e, x...)
	}
	if exts != nil {
		body = append(body, byte(len(e)>>8), byte(len(e)))
		body = append(body, e...)
	}
	hs := append([]byte{1, byte(len(body) >> 16), byte(len(body) >> 8), byte(len(body))}, body...)
	return append([]byte{0x16, 3, 1, byte(len(hs) >> 8), byte(len(hs))}, hs...)
}

func ext(typ int, data []byte) []byte {
	return append([]byte{byte(typ >> 8), byte(typ), byte(len(data) >> 8), byte(len(data))}, data...)
}

func sniExt(names ...string) []byte {
	var list []byte
	for _, n := range names {
		list = append(list, 0, byte(len(n)>>8), byte(len(n)))
		list = append(list, n...)
	}
	return ext(0, append([]byte{byte(len(list) >> 8), byte(len(list))}, list...))
}

func TestParseSNIErrors(t *testing.T) {
	good := hello(sniExt("pypi.org"))
	if name, complete, err := ParseSNI(good); name != "pypi.org" || !complete || err != nil {
		t.Fatalf("the hand-made ClientHello: %q %v %v", name, complete, err)
	}
	for _, v := range []struct{ sent, want string }{
		{"pypi.org.", "pypi.org"},
		{"PyPI.ORG", "pypi.org"},
		{"bücher.de", "xn--bcher-kva.de"},
		{"XN--BCHER-KVA.de.", "xn--bcher-kva.de"},
	} {
		if name, complete, err := ParseSNI(hello(sniExt(v.sent))); name != v.want || !complete || err != nil {
			t.Errorf("SNI %q: %q %v %v; want %q", v.sent, name, complete, err, v.want)
		}
	}
	if name, complete, err := ParseSNI(hello()); name != "" || !complete || err != nil {
		t.Errorf("no extensions: %q %v %v", name, complete, err)
	}
	if name, complete, err := ParseSNI(hello(ext(10, []byte{0, 2, 0, 29}))); name != "" || !complete || err != nil {
		t.Errorf("extensions without SNI: %q %v %v", name, complete, err)
	}
	long := hello(sniExt("pypi.org"), ext(21, make([]byte, 20000)))
	long[3], long[4] = 0x40, 0x00 // a record of 16 KiB, holding part of the ClientHello
	tests := []struct {
		name string
		b    []byte
	}{
		{"HTTP", []byte("GET / HTTP/1.1\r\n")},
		{"a TLS alert", []byte{0x15, 3, 3, 0, 2, 2, 40}},
		{"SSLv2-like version", []byte{0x16, 2, 0}},
		{"record over 16 KiB", []byte{0x16, 3, 1, 0x40, 0x01}},
		{"record too short", []byte{0x16, 3, 1, 0, 2, 1, 0}},
		{"a ServerHello", []byte{0x16, 3, 3, 0, 10, 2}},
		{"hello over several records", long[:6000]},
		{"hello longer than its record", append(slicesClone(good[:5+1]), append([]byte{0, 0xff, 0xff}, good[9:]...)...)},
		{"two SNI extensions", hello(sniExt("pypi.org"), sniExt("evil.test"))},
		{"two names", hello(sniExt("pypi.org", "evil.test"))},
		{"an empty name", hello(sniExt(""))},
		{"a bad name", hello(sniExt("exa_mple.com"))},
		{"two trailing dots", hello(sniExt("pypi.org.."))},
		{"invalid UTF-8", hello(sniExt("b\xffcher.de"))},
		{"an IP address", hello(sniExt("127.0.0.1"))},
		{"name type 1", hello(ext(0, []byte{0, 4, 1, 0, 1, 'a'}))},
		{"empty server_name list", hello(ext(0, []byte{0, 0}))},
		{"truncated extension", hello(ext(0, []byte{0, 9, 0, 0, 6, 'a'}))},
		{"a repeated extension", hello(ext(10, nil), ext(10, nil))},
	}
	for _, tt := range tests {
		name, complete, err := ParseSNI(tt.b)
		if err == nil {
			t.Errorf("%s: ParseSNI = %q, %v; want an error", tt.name, name, complete)
		}
	}
}

func TestParseHTTPHost(t *testing.T) {
	tests := []struct {
		req  string
		want string
	}{
		{"GET / HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "pypi.org"},
		{"GET / HTTP/1.1\r\nhost: PyPI.Org.:8080\r\nAccept: */*\r\n\r\nbody", "pypi.org"},
		{"GET / HTTP/1.1\nHost: pypi.org\n\n", "pypi.org"},
		{"POST /x?y=1 HTTP/1.0\r\nContent-Length: 0\r\nHOST:\tpypi.org \r\n\r\n", "pypi.org"},
		{"GET / HTTP/1.1\r\nHost: bücher.de\r\n\r\n", "xn--bcher-kva.de"},
		{"GET / HTTP/1.1\r\nHost: 203.0.113.7:80\r\n\r\n", "203.0.113.7"},
		{"GET / HTTP/1.1\r\nHost: [2001:DB8::1]:80\r\n\r\n", "2001:db8::1"},
		{"GET / HTTP/1.1\r\nHost: [::1]\r\n\r\n", "::1"},
		{"GET http://pypi.org/simple/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "pypi.org"},
		{"GET HTTP://PYPI.ORG:80/ HTTP/1.1\r\nHost: pypi.org:80\r\n\r\n", "pypi.org"},
		{"GET http://pypi.org HTTP/1.0\r\n\r\n", "pypi.org"},
		{"GET http://pypi.org?x HTTP/1.0\r\n\r\n", "pypi.org"},
		{"OPTIONS * HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "pypi.org"},
		{"M-SEARCH / HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "pypi.org"},
	}
	for _, tt := range tests {
		host, complete, err := ParseHTTPHost([]byte(tt.req))
		if err != nil || !complete || host != tt.want {
			t.Errorf("ParseHTTPHost(%q) = %q, %v, %v; want %q", tt.req, host, complete, err, tt.want)
			continue
		}
		head := tt.req[:strings.Index(tt.req, "\n\n")+1]
		if i := strings.Index(tt.req, "\r\n\r\n"); i >= 0 && (strings.Index(tt.req, "\n\n") < 0 || i < strings.Index(tt.req, "\n\n")) {
			head = tt.req[:i+3]
		}
		for i := 0; i <= len(head); i++ {
			if host, complete, err := ParseHTTPHost([]byte(tt.req[:i])); err != nil || complete || host != "" {
				t.Fatalf("ParseHTTPHost of the first %d bytes of %q = %q, %v, %v; want more needed", i, tt.req, host, complete, err)
			}
		}
	}
}

func TestParseHTTPHostErrors(t *testing.T) {
	tests := []struct {
		req  string
		want string
	}{
		{"\x16\x03\x01\x02\x00\x01", "not an HTTP request"},
		{"GE\x00T / HTTP/1.1\r\n", "not an HTTP request"},
		{"GET / HTTP/1.1\r\n\r\n", "without a Host"},
		{"GET / HTTP/1.1\r\nHost: pypi.org\r\nHost: evil.test\r\n\r\n", "more than one Host"},
		{"GET / HTTP/1.1\r\nHost: pypi.org\r\nhOST: pypi.org\r\n\r\n", "more than one Host"},
		{"GET / HTTP/1.1\r\nHost: \r\n\r\n", "empty host name"},
		{"GET / HTTP/1.1\r\nHost: exa_mple.com\r\n\r\n", "Host header"},
		{"GET / HTTP/1.1\r\nHost: pypi.org:http\r\n\r\n", "not a number"},
		{"GET / HTTP/1.1\r\nHost: [::1\r\n\r\n", "lacks ]"},
		{"GET / HTTP/1.1\r\nHost: [pypi.org]\r\n\r\n", "not an IPv6"},
		{"GET / HTTP/1.1\r\nHost: 127.1\r\n\r\n", "numeric label"},
		{"GET http://evil.test/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "target names evil.test"},
		{"GET http://user@pypi.org/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "user information"},
		{"GET ftp://pypi.org/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "request target"},
		{"0 A:// HTTP/1.0\n\n", "only http:// and https://"},
		{"GET a://pypi.org/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "only http:// and https://"},
		{"CONNECT evil.test:443 HTTP/1.1\r\nHost: evil.test:443\r\n\r\n", "CONNECT"},
		{"G(T / HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "is not a token"},
		{"GET / HTTP/2.0\r\nHost: pypi.org\r\n\r\n", "HTTP version"},
		{"GET / HTTP/1.1 x\r\nHost: pypi.org\r\n\r\n", "HTTP version"},
		{"GET /\r\nHost: pypi.org\r\n\r\n", "not METHOD target"},
		{"GET  / HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "not METHOD target"},
		{"GET / HTTP/1.1\r\n Host: evil.test\r\nHost: pypi.org\r\n\r\n", "not name: value"},
		{"GET / HTTP/1.1\r\nHost : pypi.org\r\n\r\n", "not name: value"},
		{"GET / HTTP/1.1\r\nX-A\r\nHost: pypi.org\r\n\r\n", "not name: value"},
		{"GET / HTTP/1.1\r\nHost: pypi.org\rHost: evil.test\r\n\r\n", "has the byte"},
		{"GET / HTTP/1.1\r\nHost: pypi.org\x00\r\n\r\n", "has the byte"},
		{"\r\nGET / HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "not METHOD target"},
		{"GET / HTTP/1.1\r\nX: " + strings.Repeat("a", MaxHTTPHead) + "\r\nHost: pypi.org\r\n\r\n", "over 8192 bytes"},
	}
	for _, tt := range tests {
		host, complete, err := ParseHTTPHost([]byte(tt.req))
		if err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("ParseHTTPHost(%.60q) = %q, %v, %v; want one line with %q", tt.req, host, complete, err, tt.want)
		}
	}
}

func TestLog(t *testing.T) {
	var l Log
	if r, d := l.Take(); r != nil || d != 0 {
		t.Fatalf("the zero Log: %v %d", r, d)
	}
	l.Add(Connection{ID: 1, Kind: KindDNS, Name: "pypi.org", Decision: Allowed})
	l.Add(Connection{ID: 2, Kind: KindTCP, Name: "pypi.org", Port: 443, Addr: "151.101.0.223:443", Decision: Allowed, Open: true})
	l.Add(Connection{ID: 3, Kind: KindTCP, Name: "evil.test", Port: 443, Decision: Denied, Reason: "not in the allowlist"})
	l.Add(Connection{ID: 2, Decision: Allowed, BytesOut: 10, BytesIn: 20, Open: true})
	got, dropped := l.Take()
	want := []Connection{
		{ID: 1, Kind: KindDNS, Name: "pypi.org", Decision: Allowed},
		{ID: 2, Kind: KindTCP, Name: "pypi.org", Port: 443, Addr: "151.101.0.223:443", Decision: Allowed, BytesOut: 10, BytesIn: 20, Open: true},
		{ID: 3, Kind: KindTCP, Name: "evil.test", Port: 443, Decision: Denied, Reason: "not in the allowlist"},
	}
	if !reflect.DeepEqual(got, want) || dropped != 0 {
		t.Fatalf("Take = %+v, %d; want %+v", got, dropped, want)
	}
	if got, _ := l.Take(); len(got) != 0 {
		t.Fatalf("a second Take: %+v", got)
	}
	// The open connection closes after the Take: returned again, whole.
	l.Add(Connection{ID: 2, BytesOut: 100, BytesIn: 2000})
	got, _ = l.Take()
	want = []Connection{{ID: 2, Kind: KindTCP, Name: "pypi.org", Port: 443, Addr: "151.101.0.223:443", Decision: Allowed, BytesOut: 100, BytesIn: 2000}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("the close: %+v; want %+v", got, want)
	}
	// Once closed, it is not completed again.
	l.Add(Connection{ID: 2, Kind: KindTCP, Decision: Denied})
	if got, _ := l.Take(); len(got) != 1 || got[0].Name != "" {
		t.Fatalf("a record under a closed ID: %+v", got)
	}
}

func TestLogCap(t *testing.T) {
	var l Log
	for i := range MaxRecords + 50 {
		l.Add(Connection{ID: uint64(i), Kind: KindUDP, Decision: Denied})
	}
	l.Add(Connection{ID: MaxRecords + 10, Kind: KindUDP, Decision: Denied}) // dropped already: counted once
	l.Add(Connection{ID: 5, Kind: KindUDP, Decision: Denied, Reason: "merged"})
	got, dropped := l.Take()
	if len(got) != MaxRecords || dropped != 50 || got[5].Reason != "merged" {
		t.Fatalf("Take = %d records, %d dropped; want %d, 50", len(got), dropped, MaxRecords)
	}
	l.Add(Connection{ID: 1, Kind: KindUDP, Decision: Denied})
	if got, dropped := l.Take(); len(got) != 1 || dropped != 0 {
		t.Fatalf("after the cap: %d records, %d dropped", len(got), dropped)
	}
}

func TestLogConcurrent(t *testing.T) {
	var l Log
	done := make(chan bool)
	for g := range 4 {
		go func() {
			for i := range 200 {
				l.Add(Connection{ID: uint64(g*1000 + i), Kind: KindTCP, Decision: Allowed})
			}
			done <- true
		}()
	}
	total := 0
	for range 4 {
		<-done
		r, _ := l.Take()
		total += len(r)
	}
	r, _ := l.Take()
	if total+len(r) != 800 {
		t.Fatalf("%d records; want 800", total+len(r))
	}
}
