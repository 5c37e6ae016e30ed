package main

// Threat cases of the network allowlist (issue 16): code in a sandbox with
// a network reaches the servers its call names and nothing else. The
// servers are the test's own, on the host's loopback, reached only through
// pinned entries (allowed.test=127.0.0.1:PORT): so every allowed path is
// the pinned one, and the blocked-range logic is tested by the very same
// servers reached without a pin. Each case runs through `safe-run run` and
// run_code, as root and (scripts/test-rootless.sh) as uid 65534, and checks
// both what the program saw and the network report the result carries.
//
// The servers count their connections and remember each request's path,
// which carries a token per case: a denied case passes only if no request
// with its token arrived, and the harness's own 127.0.0.1 canary listener
// (assertHostClean) never got a connection from any case.

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/safe-run/safe-run/egress"
	"github.com/safe-run/safe-run/internal/pkgindex"
)

// netServers are the upstream servers of the network cases, on the host.
type netServers struct {
	http, tls   *countingListener
	httpPort    int
	tlsPort     int
	caFile      string
	udp         *net.UDPConn
	udpPort     int
	udpN        atomic.Int64
	hostIP      string // a non-loopback address of the host, "" if it has none
	rebind      string // a name with a dot the host resolves to a blocked address, "" if it has none
	hostsRebind bool   // rebind comes from the host's own /etc/hosts, so TestThreatNetwork runs the case
	mu          sync.Mutex
	requests    []netRequest
	snis        []string
	tlsAccepted atomic.Int64
}

// netRequest is one HTTP request a test server answered.
type netRequest struct {
	path, host string
	at         time.Time
}

// countingListener counts the connections it accepts.
type countingListener struct {
	net.Listener
	n atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// The names the servers are pinned under, and the names no entry has.
const (
	netAllowed = "allowed.test" // plain HTTP
	netSecure  = "secure.test"  // HTTPS with the test CA
	netIDN     = "bücher.test"  // the plain server again, under an IDN
	netDenied  = "evil.test"
	netBody    = "hello-from-test-server"
)

// startNetServers starts the plain HTTP server, the HTTPS server (with a CA
// of its own, written to a file for --net-ca) and a UDP listener. They
// listen on every address (dual stack), so that an IP literal of any of the
// host's addresses would reach them if the helper dialled it.
func startNetServers(t *testing.T) *netServers {
	t.Helper()
	s := &netServers{}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.requests = append(s.requests, netRequest{path: r.URL.Path, host: r.Host, at: time.Now()})
		s.mu.Unlock()
		if n, err := strconv.Atoi(r.URL.Query().Get("bytes")); err == nil {
			w.Header().Set("Content-Length", strconv.Itoa(n))
			chunk := bytes.Repeat([]byte("x"), 64<<10)
			for n > 0 {
				k := min(n, len(chunk))
				if _, err := w.Write(chunk[:k]); err != nil {
					return
				}
				n -= k
			}
			return
		}
		fmt.Fprintf(w, "%s %s", netBody, r.URL.Path)
	})
	listen := func() *countingListener {
		l, err := net.Listen("tcp", ":0")
		if err != nil {
			t.Fatal(err)
		}
		return &countingListener{Listener: l}
	}
	s.http, s.tls = listen(), listen()
	s.httpPort, s.tlsPort = s.http.Addr().(*net.TCPAddr).Port, s.tls.Addr().(*net.TCPAddr).Port
	plain := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	go plain.Serve(s.http)

	caPEM, cert, err := pkgindex.NewCA(netSecure)
	if err != nil {
		t.Fatal(err)
	}
	s.caFile = filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(s.caFile, caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	secure := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second, TLSConfig: &tls.Config{
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			s.mu.Lock()
			s.snis = append(s.snis, hello.ServerName)
			s.mu.Unlock()
			return &cert, nil
		},
	}}
	go secure.ServeTLS(s.tls, "", "")
	t.Cleanup(func() { plain.Close(); secure.Close() })

	udp, err := net.ListenUDP("udp", &net.UDPAddr{})
	if err != nil {
		t.Fatal(err)
	}
	s.udp, s.udpPort = udp, udp.LocalAddr().(*net.UDPAddr).Port
	go func() {
		buf := make([]byte, 65536)
		for {
			if _, _, err := udp.ReadFromUDP(buf); err != nil {
				return
			}
			s.udpN.Add(1)
		}
	}()
	t.Cleanup(func() { udp.Close() })
	s.hostIP = hostAddress()
	s.rebind = rebindName()
	s.hostsRebind = s.rebind != "" && rebindOverride == ""
	return s
}

// hostAddress returns one of the host's own non-loopback IPv4 addresses.
func hostAddress() string {
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() && !p.Addr().IsLoopback() {
			return p.Addr().String()
		}
	}
	return ""
}

// netRebindName is the rebinding case's name where the test provides it:
// TestThreatNetworkRebinding's server resolves it to 127.0.0.1.
const netRebindName = "rebind.safe-run.test"

// rebindOverride, when set, is the name rebindName returns.
var rebindOverride string

// rebindName returns a name of the host's /etc/hosts, with a dot (an
// allowlist entry needs one), that maps to a blocked address: the
// rebinding case's name. Such a name must be pinned to be reached.
func rebindName() string {
	if rebindOverride != "" {
		return rebindOverride
	}
	data, _ := os.ReadFile("/etc/hosts")
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(strings.SplitN(line, "#", 2)[0])
		if len(f) < 2 {
			continue
		}
		addr, err := netip.ParseAddr(f[0])
		if err != nil {
			continue
		}
		if _, blocked := egress.Blocked(addr, nil); !blocked {
			continue
		}
		for _, name := range f[1:] {
			if strings.Contains(strings.Trim(name, "."), ".") {
				return name
			}
		}
	}
	return ""
}

// entries are the server's allowlist: the two servers pinned, the plain
// one again under an IDN, and the rebinding name (if the host has one) on
// the plain server's port without a pin — a name the host resolves to a
// blocked address, which only a pin may reach.
func (s *netServers) entries() []string {
	e := []string{
		fmt.Sprintf("%s=127.0.0.1:%d", netAllowed, s.httpPort),
		fmt.Sprintf("%s=127.0.0.1:%d", netSecure, s.tlsPort),
		fmt.Sprintf("%s=127.0.0.1:%d", netIDN, s.httpPort),
	}
	if s.rebind != "" {
		e = append(e, fmt.Sprintf("%s:%d", s.rebind, s.httpPort))
	}
	return e
}

// sawToken reports whether a request whose path holds token arrived, and
// which.
func (s *netServers) sawToken(token string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, r := range s.requests {
		if strings.Contains(r.path, token) {
			out = append(out, r.host+r.path)
		}
	}
	return out
}

// hellos counts the ClientHellos the TLS server received.
func (s *netServers) hellos() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.snis)
}

func (s *netServers) sawSNI(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.snis {
		if strings.EqualFold(strings.TrimSuffix(n, "."), name) {
			return true
		}
	}
	return false
}

// netPrelude is the Python the probes share: out() prints one result line
// per attempt, err() names a failure by its class, raw() makes an HTTP
// request over a plain socket, dns() asks the sandbox's name server
// directly (bypassing /etc/hosts) and returns the first A record.
const netPrelude = `import socket, errno, ssl, struct, sys, time
def out(label, v): print("RESULT", label, v, flush=True)
def err(e):
    if isinstance(e, socket.gaierror): return "nxdomain"
    if isinstance(e, ConnectionRefusedError): return "refused"
    if isinstance(e, ConnectionResetError): return "reset"
    if isinstance(e, (socket.timeout, TimeoutError)): return "timeout"
    if isinstance(e, ssl.SSLError): return "tls"
    if isinstance(e, OSError) and e.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT): return "unreachable"
    return "other:" + type(e).__name__ + ":" + str(e)
def answer(data):
    data = data.decode(errors="replace")
    if "` + netBody + `" in data: return "LEAK ok " + data.split("\r\n\r\n", 1)[-1][:120]
    return "closed-empty" if not data else "got:" + data[:60]
def raw(label, host, port, path, hosthdr=None, family=0):
    try:
        if family:
            s = socket.socket(family, socket.SOCK_STREAM); s.settimeout(10); s.connect((host, port))
        else:
            s = socket.create_connection((host, port), timeout=10)
    except Exception as e:
        out(label, "connect-" + err(e)); return
    try:
        s.sendall(("GET %s HTTP/1.0\r\nHost: %s\r\n\r\n" % (path, hosthdr or host)).encode())
        data = b""
        while True:
            b = s.recv(65536)
            if not b: break
            data += b
        out(label, answer(data))
    except Exception as e:
        out(label, "after-" + err(e))
def dns(name):
    q = struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0) + b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0" + struct.pack(">HH", 1, 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(5)
    s.sendto(q, ("198.18.0.1", 53))
    r = s.recv(512)
    if r[3] & 0xf: return None
    an = struct.unpack(">H", r[6:8])[0]
    if an == 0: return None
    return socket.inet_ntoa(r[-4:])
`

// The probes' outcomes, as regular expressions of a RESULT line's value.
const (
	wantOK      = `LEAK ok ` + netBody
	wantNX      = `connect-nxdomain`
	wantRefused = `connect-refused`
	// A connection refused at connect, or, where the sandbox's own stack
	// refuses the destination first (IPv6, its own loopback), unreachable.
	wantNoConnect = `connect-(refused|unreachable)`
	// The connection was accepted (its first bytes are read before the
	// decision), then ended without an answer.
	wantCut = `(after-(reset|tls|timeout)|closed-empty|connect-refused)`
)

// wantRecord is a record the run's network report must hold.
type wantRecord struct {
	kind, name string
	port       int
	decision   string
	reason     string // a regular expression the record's Reason matches
}

// netCase is one attack (or positive flow) of the allowlist.
type netCase struct {
	name string
	// protection names the check the case exercises: the one whose absence
	// makes it fail.
	protection string
	lang, code string
	// results are the RESULT lines the program must print: label → regexp.
	results map[string]string
	records []wantRecord
	// control: run the identical probe on the host, where it must report
	// LEAK — the probe can see a breach.
	control bool
	// expect lists the servers the case may reach: "http", "tls". Any
	// other server that accepts a connection during the case fails it.
	expect []string
	// dials lists the servers the helper may connect to without passing
	// on a byte: where the decision reads the connection's first bytes,
	// the upstream dial (made before the sandbox's handshake completes)
	// has happened already.
	dials []string
	// needs, when set to "", skips the case: the host lacks what it needs
	// (the rebinding case: a dotted name /etc/hosts maps to a blocked
	// address).
	needs string
}

// netCases are the attack list of issue 16 (and the positive flows that
// show the path works at all).
func netCases(s *netServers) []netCase {
	hp, tp := s.httpPort, s.tlsPort
	hostIP := s.hostIP
	if hostIP == "" {
		hostIP = "127.0.0.1"
	}
	allowedURL := fmt.Sprintf("http://%s:%d/{{TOKEN}}", netAllowed, hp)
	secureURL := fmt.Sprintf("https://%s:%d/{{TOKEN}}", netSecure, tp)
	return []netCase{
		{
			name: "allowed host from Python socket, urllib, http.client and requests", protection: "the pinned path itself (positive flow)",
			lang: "python", expect: []string{"http", "tls"},
			code: netPrelude + fmt.Sprintf(`
import urllib.request, http.client, requests
raw("socket", %[1]q, %[2]d, "/{{TOKEN}}/socket")
def get(label, f):
    try: out(label, "LEAK ok " + f())
    except Exception as e: out(label, "fail-" + err(e))
get("urllib", lambda: urllib.request.urlopen(%[3]q + "/urllib", timeout=10).read().decode())
get("urllib-tls", lambda: urllib.request.urlopen(%[4]q + "/urllib-tls", timeout=10).read().decode())
def hc():
    c = http.client.HTTPConnection(%[1]q, %[2]d, timeout=10); c.request("GET", "/{{TOKEN}}/http.client"); return c.getresponse().read().decode()
get("http.client", hc)
get("requests", lambda: requests.get(%[3]q + "/requests", timeout=10).text)
get("requests-tls", lambda: requests.get(%[4]q + "/requests-tls", timeout=10).text)
`, netAllowed, hp, allowedURL, secureURL),
			results: map[string]string{"socket": wantOK, "urllib": wantOK, "urllib-tls": wantOK, "http.client": wantOK, "requests": wantOK, "requests-tls": wantOK},
			records: []wantRecord{
				{kind: egress.KindDNS, name: netAllowed, decision: egress.Allowed},
				{kind: egress.KindTCP, name: netAllowed, port: hp, decision: egress.Allowed},
				{kind: egress.KindTCP, name: netSecure, port: tp, decision: egress.Allowed},
			},
		},
		{
			name: "allowed host from Node fetch and https.get", protection: "the pinned path itself (positive flow); the CA given with --net-ca",
			lang: "node", expect: []string{"http", "tls"},
			code: fmt.Sprintf(`const https = require("https");
const out = (l, v) => console.log("RESULT", l, v);
(async () => {
  try { out("fetch", "LEAK ok " + await (await fetch(%[1]q + "/fetch")).text()); } catch (e) { out("fetch", "fail-" + (e.cause && e.cause.code || e)); }
  try { out("fetch-tls", "LEAK ok " + await (await fetch(%[2]q + "/fetch-tls")).text()); } catch (e) { out("fetch-tls", "fail-" + (e.cause && e.cause.code || e)); }
  await new Promise(done => https.get(%[2]q + "/https.get", res => { let b = ""; res.on("data", d => b += d); res.on("end", () => { out("https.get", "LEAK ok " + b); done(); }); })
    .on("error", e => { out("https.get", "fail-" + e.code); done(); }));
})();`, allowedURL, secureURL),
			results: map[string]string{"fetch": wantOK, "fetch-tls": wantOK, "https.get": wantOK},
			records: []wantRecord{{kind: egress.KindTCP, name: netSecure, port: tp, decision: egress.Allowed}},
		},
		{
			name: "allowed host from curl", protection: "the pinned path itself (positive flow)",
			lang: "bash", expect: []string{"http", "tls"},
			code: fmt.Sprintf(`echo "RESULT curl $(curl -sS --max-time 10 %[1]s/curl 2>&1 | sed 's/^%[3]s/LEAK ok %[3]s/')"
echo "RESULT curl-tls $(curl -sS --max-time 10 %[2]s/curl-tls 2>&1 | sed 's/^%[3]s/LEAK ok %[3]s/')"`, allowedURL, secureURL, netBody),
			results: map[string]string{"curl": wantOK, "curl-tls": wantOK},
			records: []wantRecord{{kind: egress.KindTCP, name: netAllowed, port: hp, decision: egress.Allowed}},
		},
		{
			name: "a name not in the allowlist: NXDOMAIN, and its connect refused", protection: "DNS answers only allowed names (AnswerDNS/AllowsName)",
			lang: "python",
			code: netPrelude + fmt.Sprintf(`
raw("name", %[1]q, %[2]d, "/{{TOKEN}}/name")
raw("name-443", %[1]q, 443, "/{{TOKEN}}/name-443")
try: out("getaddrinfo", "LEAK " + str(socket.getaddrinfo(%[1]q, 80)))
except Exception as e: out("getaddrinfo", "connect-" + err(e))
a = dns(%[1]q)
out("dns", "LEAK " + a if a else "connect-nxdomain")
`, netDenied, hp),
			results: map[string]string{"name": wantNX, "name-443": wantNX, "getaddrinfo": wantNX, "dns": wantNX},
			records: []wantRecord{{kind: egress.KindDNS, name: netDenied, decision: egress.Denied, reason: "."}},
		},
		{
			name: "IP literals of the allowed server (loopback and the host's own address): refused", protection: "IP destinations only through a CIDR entry (MatchAddr); the handshake completes only after a dial succeeded",
			lang: "python", control: true,
			code: netPrelude + fmt.Sprintf(`
raw("loopback", "127.0.0.1", %[1]d, "/{{TOKEN}}/loopback")
raw("host-ip", %[2]q, %[1]d, "/{{TOKEN}}/host-ip")
`, hp, hostIP),
			// The sandbox's own loopback refuses 127.0.0.1 before the helper
			// sees it; the host's address is the helper's decision.
			results: map[string]string{"loopback": wantNoConnect, "host-ip": wantRefused},
			records: []wantRecord{{kind: egress.KindTCP, port: hp, decision: egress.Denied, reason: "."}},
		},
		{
			name: "the host's own loopback services: unreachable by any address", protection: "no route to the host's loopback: the sandbox's 127.0.0.1 is its own, the host's addresses are blocked (Blocked's host list)",
			lang: "python",
			code: netPrelude + fmt.Sprintf(`
raw("canary", "127.0.0.1", {{TCP_PORT}}, "/{{TOKEN}}/canary")
raw("canary-host-ip", %[1]q, {{TCP_PORT}}, "/{{TOKEN}}/canary-host-ip")
raw("canary-mapped", "::ffff:127.0.0.1", {{TCP_PORT}}, "/{{TOKEN}}/canary-mapped", family=socket.AF_INET6)
raw("canary-gateway", "198.18.0.1", {{TCP_PORT}}, "/{{TOKEN}}/canary-gateway")
`, hostIP),
			// The harness's canary listener (assertHostClean) is on 127.0.0.1 only.
			results: map[string]string{"canary": wantNoConnect, "canary-host-ip": wantNoConnect, "canary-mapped": wantNoConnect, "canary-gateway": wantNoConnect},
		},
		{
			name: "an allowed name the host resolves to loopback, without a pin: refused (rebinding)", protection: "every resolved address checked against the blocked ranges in the dialer's Control hook (Blocked)",
			lang: "python",
			code: netPrelude + fmt.Sprintf(`
a = dns(%[2]q)
out("dns", "answered" if a else "nxdomain")
if a: raw("rebind", a, %[1]d, "/{{TOKEN}}/rebind", hosthdr=%[2]q)
`, hp, s.rebind),
			results: map[string]string{"dns": "answered", "rebind": wantRefused},
			records: []wantRecord{{kind: egress.KindTCP, name: s.rebind, port: hp, decision: egress.Denied, reason: "(?i)loopback|blocked|private|host's own"}},
			needs:   s.rebind,
		},
		{
			name: "the allowed host on another port: refused", protection: "name:port matched at connect (Match)",
			lang: "python", expect: nil,
			code: netPrelude + fmt.Sprintf(`
raw("tls-port", %[1]q, %[2]d, "/{{TOKEN}}/tls-port")
raw("port-22", %[1]q, 22, "/{{TOKEN}}/port-22")
`, netAllowed, tp),
			results: map[string]string{"tls-port": wantRefused, "port-22": wantRefused},
			records: []wantRecord{{kind: egress.KindTCP, name: netAllowed, port: tp, decision: egress.Denied, reason: "."}},
		},
		{
			name: "TLS to the allowed server with the SNI of another name, or none: refused", protection: "the ClientHello's SNI must equal the name (ParseSNI)",
			lang: "python",
			code: netPrelude + fmt.Sprintf(`
def tls(label, sni):
    ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
    try: s = socket.create_connection((%[1]q, %[2]d), timeout=10)
    except Exception as e: out(label, "connect-" + err(e)); return
    try:
        t = ctx.wrap_socket(s, server_hostname=sni)
        t.sendall(b"GET /{{TOKEN}}/" + label.encode() + b" HTTP/1.0\r\nHost: %[1]s\r\n\r\n")
        out(label, answer(t.recv(65536)))
    except Exception as e: out(label, "after-" + err(e))
tls("sni-other", %[3]q)
tls("sni-none", None)
`, netSecure, tp, netDenied),
			results: map[string]string{"sni-other": wantCut, "sni-none": wantCut}, dials: []string{"tls"},
			records: []wantRecord{{kind: egress.KindTCP, name: netSecure, port: tp, decision: egress.Denied, reason: "(?i)sni"}},
		},
		{
			name: "HTTP to the allowed server with another Host: refused", protection: "the request's Host must equal the name (ParseHTTPHost)",
			lang: "python",
			code: netPrelude + fmt.Sprintf(`
raw("host-other", %[1]q, %[2]d, "/{{TOKEN}}/host-other", hosthdr=%[3]q)
`, netAllowed, hp, netDenied),
			results: map[string]string{"host-other": wantCut}, dials: []string{"http"},
			records: []wantRecord{{kind: egress.KindTCP, name: netAllowed, port: hp, decision: egress.Denied, reason: "(?i)host"}},
		},
		{
			name: "IPv4-mapped loopback, IPv6 loopback, the metadata address and the gateway: refused", protection: "always-blocked ranges, mapped addresses judged as IPv4; IPv6 dropped",
			lang: "python", control: true,
			code: netPrelude + fmt.Sprintf(`
raw("mapped", "::ffff:127.0.0.1", %[1]d, "/{{TOKEN}}/mapped", family=socket.AF_INET6)
raw("ipv6-loopback", "::1", %[1]d, "/{{TOKEN}}/ipv6-loopback", family=socket.AF_INET6)
if "ON_HOST" not in globals(): raw("metadata", "169.254.169.254", 80, "/{{TOKEN}}/metadata")
raw("gateway", "198.18.0.1", %[1]d, "/{{TOKEN}}/gateway")
`, hp),
			results: map[string]string{"mapped": wantNoConnect, "ipv6-loopback": wantNoConnect, "metadata": wantNoConnect, "gateway": wantNoConnect},
			records: []wantRecord{{kind: egress.KindTCP, port: 80, decision: egress.Denied, reason: "."}},
		},
		{
			name: "UDP to any address and QUIC to 443: nothing leaves", protection: "UDP other than DNS dropped",
			lang: "python", control: true,
			code: netPrelude + fmt.Sprintf(`
quic = bytes([0xc0, 0, 0, 0, 1, 8]) + bytes(8) + bytes(1200)
targets = [("127.0.0.1", {{UDP_PORT}}), (%[1]q, {{UDP_PORT}}), ("203.0.113.7", {{UDP_PORT}}), ("198.18.0.1", {{UDP_PORT}})]
try:
    a = dns(%[2]q)
    if a: targets += [(a, {{UDP_PORT}}), (a, 443)]
except Exception as e: pass
for host, port in targets:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for _ in range(5):
        try: s.sendto(quic if port == 443 else b"{{TOKEN}}", (host, port))
        except Exception as e: pass
try: s.sendto(b"{{TOKEN}}", (%[1]q, {{UDP_PORT}}))
except Exception as e: pass
time.sleep(0.5)
out("udp", "sent")
`, hostIP, netAllowed),
			results: map[string]string{"udp": "sent"},
			records: []wantRecord{{kind: egress.KindUDP, decision: egress.Denied}},
		},
		{
			name: "case, trailing-dot and punycode variants of a name: the same decision", protection: "names normalised before every decision (NormalizeName) in DNS, Match and the Host check",
			lang: "python", expect: []string{"http"},
			code: netPrelude + fmt.Sprintf(`
for i, v in enumerate([%[1]q, %[2]q, %[3]q, %[4]q, %[5]q]):
    raw("allowed-%%d" %% i, v, %[6]d, "/{{TOKEN}}/variant-%%d" %% i, hosthdr=v.encode("idna").decode())
for i, v in enumerate([%[7]q, %[8]q, %[9]q]):
    raw("denied-%%d" %% i, v, %[6]d, "/{{TOKEN}}/denied-%%d" %% i)
`, strings.ToUpper(netAllowed), netAllowed+".", "Allowed.Test.", netIDN, "xn--bcher-kva.test", hp,
				strings.ToUpper(netDenied), netDenied+".", "xn--vil-cma.test"),
			results: map[string]string{"allowed-0": wantOK, "allowed-1": wantOK, "allowed-2": wantOK, "allowed-3": wantOK, "allowed-4": wantOK,
				"denied-0": wantNX, "denied-1": wantNX, "denied-2": wantNX},
			records: []wantRecord{{kind: egress.KindTCP, name: "xn--bcher-kva.test", port: hp, decision: egress.Allowed}},
		},
	}
}

// netHarness is the threat harness with a server that allows the test
// servers: its MCP server replaces the harness's (assertHostClean checks
// it), and CLI runs get the same list.
type netHarness struct {
	*threatHarness
	s       *netServers
	cliArgs []string // --allow-net … --net-ca … for `safe-run run`
}

func newNetHarness(t *testing.T, extra ...string) *netHarness {
	t.Helper()
	h := newThreatHarness(t)
	s := startNetServers(t)
	var args []string
	for _, e := range s.entries() {
		args = append(args, "--allow-net", e)
	}
	args = append(append(args, "--net-ca", s.caFile), extra...)
	// The harness's own server (no network) stops first, with its warm
	// pool: the host checks look at the new server's state only.
	old := h.server
	old.client.Close()
	h.assertNoLeftovers(t, old.stateDir)
	h.server = startServerEnv(t, "stdio", h.env(), append(append([]string{}, h.serverArgs...), args...)...)
	h.serverPid = serverPid(t, h.server.stateDir)
	h.pollIDs(h.server.stateDir)
	return &netHarness{threatHarness: h, s: s, cliArgs: args}
}

// run runs code through via with the call's network (nil: none).
func (n *netHarness) run(t *testing.T, via, lang, code string, network []string) *threatRun {
	t.Helper()
	if via == "cli" {
		args := append([]string{}, n.cliArgs...)
		for _, e := range network {
			args = append(args, "--net", e)
		}
		return n.runCLI(t, lang, code, 90*time.Second, args...)
	}
	req := map[string]any{"language": lang, "code": code, "timeout_seconds": 90}
	if network != nil {
		req["network"] = network
	}
	return mcpRun(t, n.server, req)
}

// report is the run's network report, from either path.
func (r *threatRun) report(t *testing.T) *egress.Report {
	t.Helper()
	if r.via == "cli" {
		return r.result.Network
	}
	raw, ok := r.mcpOut["network"]
	if !ok || raw == nil {
		return nil
	}
	data, _ := json.Marshal(raw)
	var rep egress.Report
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatalf("structured output's network: %v\n%s", err, data)
	}
	return &rep
}

// results parses the RESULT lines of a probe's stdout.
func results(stdout string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(stdout, "\n") {
		if f := strings.SplitN(line, " ", 3); len(f) == 3 && f[0] == "RESULT" {
			out[f[1]] = f[2]
		}
	}
	return out
}

// checkResults asserts each wanted RESULT line, and that nothing leaked
// where the case wants no LEAK.
func checkResults(t *testing.T, r *threatRun, want map[string]string) {
	t.Helper()
	got := results(r.stdout)
	for label, re := range want {
		v, ok := got[label]
		if !ok {
			t.Errorf("%s: the probe printed no result for %s\nstdout %s\nstderr %s", r.via, label, r.stdout, r.stderr)
			continue
		}
		if !regexp.MustCompile("^(" + re + ")").MatchString(v) {
			t.Errorf("%s: %s = %q, want %s", r.via, label, v, re)
		}
	}
}

// checkRecords asserts the report holds each wanted record.
func checkRecords(t *testing.T, via string, rep *egress.Report, want []wantRecord) {
	t.Helper()
	if rep == nil {
		if len(want) > 0 {
			t.Errorf("%s: the result carries no network report", via)
		}
		return
	}
	for _, w := range want {
		found := false
		for _, c := range rep.Connections {
			if c.Kind == w.kind && (w.name == "" || c.Name == w.name) && (w.port == 0 || int(c.Port) == w.port) && c.Decision == w.decision &&
				(w.reason == "" || regexp.MustCompile(w.reason).MatchString(c.Reason)) {
				found = true
				break
			}
		}
		if !found {
			data, _ := json.MarshalIndent(rep, "", " ")
			t.Errorf("%s: no %s record for %q port %d decided %s (reason /%s/) in the report:\n%s", via, w.kind, w.name, w.port, w.decision, w.reason, data)
		}
	}
}

func (n *netHarness) expand(code, token string) string {
	return strings.NewReplacer("{{TOKEN}}", token, "{{TCP_PORT}}", strconv.Itoa(n.tcp.Addr().(*net.TCPAddr).Port),
		"{{UDP_PORT}}", strconv.Itoa(n.s.udpPort)).Replace(code)
}

func TestThreatNetwork(t *testing.T) {
	n := newNetHarness(t)
	entries := n.s.entries()
	for _, tc := range netCases(n.s) {
		if isRebinding(tc) && !n.s.hostsRebind {
			// TestThreatNetworkRebinding runs it, with a name of its own.
			continue
		}
		t.Run(tc.name, func(t *testing.T) { runNetCase(t, n, tc, entries) })
	}
}

// TestThreatNetworkRebinding is the rebinding case: an allowed name, not
// pinned, that the host resolves to its loopback must be refused at the
// dial. The server runs with an /etc/hosts of its own (a mount namespace,
// of a user namespace without root) mapping rebind.safe-run.test to
// 127.0.0.1, since a host's own file has no such dotted name to spare.
func TestThreatNetworkRebinding(t *testing.T) {
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Fatalf("the rebinding case needs unshare (util-linux): %v", err)
	}
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	hostsData, _ := os.ReadFile("/etc/hosts")
	hosts := filepath.Join(dir, "hosts")
	if err := os.WriteFile(hosts, append(hostsData, []byte("\n127.0.0.1 "+netRebindName+"\n")...), 0o644); err != nil {
		t.Fatal(err)
	}
	userns := ""
	if os.Geteuid() != 0 {
		userns = "--user --map-root-user "
	}
	wrapper := filepath.Join(dir, "safe-run")
	script := fmt.Sprintf("#!/bin/sh\n# safe-run with a private /etc/hosts\nexec unshare %s--mount sh -c 'mount --bind %s /etc/hosts && exec %s \"$@\"' sh \"$@\"\n",
		userns, hosts, binary(t))
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SAFE_RUN_BIN", wrapper)
	restore := rebindOverride
	rebindOverride = netRebindName
	t.Cleanup(func() { rebindOverride = restore })
	n := newNetHarness(t)
	entries := n.s.entries()
	ran := false
	for _, tc := range netCases(n.s) {
		if isRebinding(tc) {
			ran = true
			t.Run(tc.name, func(t *testing.T) { runNetCase(t, n, tc, entries) })
		}
	}
	if !ran {
		t.Fatal("no rebinding case in netCases")
	}
}

// isRebinding tells the rebinding case, which needs a name of its own.
func isRebinding(tc netCase) bool { return strings.Contains(tc.name, "(rebinding)") }

// runNetCase runs one case through the CLI and MCP with its host checks,
// and its control on the host.
func runNetCase(t *testing.T, n *netHarness, tc netCase, entries []string) {
	t.Logf("protection: %s", tc.protection)
	for _, via := range []string{"cli", "mcp"} {
		t.Run(via, func(t *testing.T) {
			token := "tok-" + randomHex(6)
			httpN, tlsN, udpN, hellos := n.s.http.n.Load(), n.s.tls.n.Load(), n.s.udpN.Load(), n.s.hellos()
			r := n.run(t, via, tc.lang, n.expand(tc.code, token), entries)
			t.Logf("%s stdout:\n%s", via, r.stdout)
			if r.status != "ok" {
				t.Errorf("%s: status %s (exit %d), want ok: %s\nstderr %s", via, r.status, r.exitCode, r.message, r.stderr)
			}
			checkResults(t, r, tc.results)
			checkRecords(t, via, r.report(t), tc.records)
			positive := len(tc.expect) > 0
			if seen := n.s.sawToken(token); !positive && len(seen) > 0 {
				t.Errorf("%s: the test server answered requests of a denied case: %v", via, seen)
			}
			if !slicesContains(tc.expect, "http") && !slicesContains(tc.dials, "http") && n.s.http.n.Load() != httpN {
				t.Errorf("%s: the plain server accepted %d connections in a case that must not reach it", via, n.s.http.n.Load()-httpN)
			}
			if !slicesContains(tc.expect, "tls") && !slicesContains(tc.dials, "tls") && n.s.tls.n.Load() != tlsN {
				t.Errorf("%s: the TLS server accepted %d connections in a case that must not reach it", via, n.s.tls.n.Load()-tlsN)
			}
			if !slicesContains(tc.expect, "tls") && n.s.hellos() != hellos {
				t.Errorf("%s: the TLS server received %d ClientHellos in a case that must not reach it", via, n.s.hellos()-hellos)
			}
			if n.s.sawSNI(netDenied) {
				t.Errorf("%s: the TLS server saw a ClientHello naming %s", via, netDenied)
			}
			if d := n.s.udpN.Load() - udpN; d != 0 {
				t.Errorf("%s: the host's UDP listener received %d datagrams", via, d)
			}
			if !positive && strings.Contains(r.stdout, "LEAK") {
				t.Errorf("%s: the probe reached a server:\n%s", via, r.stdout)
			}
			n.assertHostClean(t)
		})
	}
	if tc.control {
		t.Run("control", func(t *testing.T) {
			udpN := n.s.udpN.Load()
			out := n.control(t, "python", "ON_HOST = True\n"+n.expand(tc.code, "control-"+randomHex(4)))
			t.Logf("on the host:\n%s", out)
			if !strings.Contains(out, "LEAK") && n.s.udpN.Load() == udpN {
				t.Errorf("on the host, without the sandbox, the probe reached nothing; it cannot detect a breach:\n%s", out)
			}
		})
	}

}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestThreatNetworkWithoutNetwork: a call that asks for no network gets
// none, though the server allows some — no DNS, no route, no helper.
// Protection: a job without Network gets runsc --network=none (the pool's
// sandboxes too).
func TestThreatNetworkWithoutNetwork(t *testing.T) {
	n := newNetHarness(t)
	code := netPrelude + fmt.Sprintf(`
raw("name", %[1]q, %[2]d, "/{{TOKEN}}/name")
raw("gateway-dns", "198.18.0.1", 53, "/{{TOKEN}}/gateway-dns")
raw("host-ip", %[3]q, %[2]d, "/{{TOKEN}}/host-ip")
try: out("dns", "LEAK " + str(dns(%[1]q)))
except Exception as e: out("dns", "connect-" + err(e))
`, netAllowed, n.s.httpPort, cmpOr(n.s.hostIP, "127.0.0.1"))
	for _, via := range []string{"cli", "mcp"} {
		t.Run(via, func(t *testing.T) {
			token := "tok-" + randomHex(6)
			r := n.run(t, via, "python", n.expand(code, token), nil)
			t.Logf("stdout:\n%s", r.stdout)
			checkResults(t, r, map[string]string{"name": wantNX, "gateway-dns": wantNoConnect, "host-ip": wantNoConnect, "dns": `connect-(unreachable|timeout|refused)`})
			if rep := r.report(t); rep != nil {
				t.Errorf("a run without network carries a network report: %+v", rep)
			}
			if seen := n.s.sawToken(token); len(seen) > 0 {
				t.Errorf("the test server answered a run without network: %v", seen)
			}
			n.assertHostClean(t)
		})
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// TestThreatNetworkCaps: the connection and byte caps end connections and
// are reported. Protection: Limits enforced by the helper.
func TestThreatNetworkCaps(t *testing.T) {
	n := newNetHarness(t, "--net-max-connections", "3", "--net-max-bytes", "200000")
	n.cliArgs = append(n.cliArgs, "--net-max-connections", "3", "--net-max-bytes", "200000")
	conns := netPrelude + fmt.Sprintf(`
for i in range(6):
    raw("conn-%%d" %% i, %[1]q, %[2]d, "/{{TOKEN}}/conn-%%d" %% i)
`, netAllowed, n.s.httpPort)
	bytesCode := netPrelude + fmt.Sprintf(`
got = 0
try:
    s = socket.create_connection((%[1]q, %[2]d), timeout=10)
    s.sendall(b"GET /{{TOKEN}}/big?bytes=4000000 HTTP/1.0\r\nHost: %[1]s\r\n\r\n")
    while True:
        b = s.recv(65536)
        if not b: break
        got += len(b)
    out("big", "eof %%d" %% got)
except Exception as e:
    out("big", "%%s %%d" %% (err(e), got))
`, netAllowed, n.s.httpPort)
	for _, via := range []string{"cli", "mcp"} {
		t.Run(via+" connections", func(t *testing.T) {
			r := n.run(t, via, "python", n.expand(conns, "tok-"+randomHex(6)), n.s.entries())
			t.Logf("stdout:\n%s", r.stdout)
			checkResults(t, r, map[string]string{"conn-0": wantOK, "conn-1": wantOK, "conn-2": wantOK,
				"conn-3": wantRefused, "conn-4": wantRefused, "conn-5": wantRefused})
			checkRecords(t, via, r.report(t), []wantRecord{{kind: egress.KindTCP, name: netAllowed, decision: egress.Denied, reason: "(?i)connection.*cap|cap.*connection"}})
			n.assertHostClean(t)
		})
		t.Run(via+" bytes", func(t *testing.T) {
			r := n.run(t, via, "python", n.expand(bytesCode, "tok-"+randomHex(6)), n.s.entries())
			t.Logf("stdout:\n%s", r.stdout)
			got := results(r.stdout)["big"]
			f := strings.Fields(got)
			if len(f) != 2 {
				t.Fatalf("big: %q\nstderr %s", got, r.stderr)
			}
			if k, _ := strconv.Atoi(f[1]); k >= 4000000 || k > 400000 {
				t.Errorf("the download got %d bytes past a cap of 200000", k)
			}
			checkRecords(t, via, r.report(t), []wantRecord{{kind: egress.KindTCP, name: netAllowed, decision: egress.Allowed, reason: "(?i)byte"}})
			n.assertHostClean(t)
		})
	}
}

// netHelpers lists the network helpers (processes named safe-run-net)
// below a process whose command line holds stateDir.
func netHelpers(stateDir string) []int {
	var out []int
	procs, _ := filepath.Glob("/proc/[0-9]*/comm")
	for _, p := range procs {
		comm, _ := os.ReadFile(p)
		if strings.TrimSpace(string(comm)) != "safe-run-net" {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		for anc := parentPid(pid); anc > 1; anc = parentPid(anc) {
			cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", anc))
			if bytes.Contains(cmdline, []byte(stateDir)) {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}

// TestThreatNetworkHelperKilled: killing the network helper mid-run leaves
// the sandbox without network (nothing falls back to the host's) and the
// run ends with the program's own status and a report naming the failure.
// Protection: fail closed — the sandbox's only link ends in the helper.
func TestThreatNetworkHelperKilled(t *testing.T) {
	n := newNetHarness(t)
	// The helper is killed once the server sees "got-first", which the
	// program sends only after the answer to "first" reached it: killed at
	// "first" itself, the answer could still be on its way back.
	code := netPrelude + fmt.Sprintf(`
raw("first", %[1]q, %[2]d, "/{{TOKEN}}/first")
raw("mark", %[1]q, %[2]d, "/{{TOKEN}}/got-first")
last, i, end = None, 0, time.time() + 8
while time.time() < end:
    time.sleep(0.25); i += 1
    try:
        s = socket.create_connection((%[1]q, %[2]d), timeout=1)
        s.sendall(b"GET /{{TOKEN}}/after-%%d HTTP/1.0\r\nHost: %[1]s\r\n\r\n" %% i)
        last = answer(s.recv(65536))
    except Exception as e:
        last = "fail-" + err(e)
out("last", last)
`, netAllowed, n.s.httpPort)
	for _, via := range []string{"cli", "mcp"} {
		t.Run(via, func(t *testing.T) {
			token := "tok-" + randomHex(6)
			stateDir := n.cliState
			if via == "mcp" {
				stateDir = n.server.stateDir
			}
			done := make(chan *threatRun, 1)
			go func() { done <- n.run(t, via, "python", n.expand(code, token), n.s.entries()) }()
			var killed time.Time
			for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline) && killed.IsZero(); time.Sleep(20 * time.Millisecond) {
				if len(n.s.sawToken(token+"/got-first")) == 0 {
					continue
				}
				pids := netHelpers(stateDir)
				if len(pids) != 1 {
					t.Fatalf("want one network helper below %s, found %v", stateDir, pids)
				}
				if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
					t.Fatalf("kill the helper %d: %v", pids[0], err)
				}
				killed = time.Now()
			}
			r := <-done
			t.Logf("stdout:\n%s", r.stdout)
			if killed.IsZero() {
				t.Fatalf("the run's first answer never arrived: %s %s", r.stdout, r.stderr)
			}
			if r.status != "ok" || r.exitCode != 0 {
				t.Errorf("status %s exit %d, want the program's own ok/0: %s", r.status, r.exitCode, r.message)
			}
			checkResults(t, r, map[string]string{"first": wantOK, "last": `fail-`})
			n.s.mu.Lock()
			for _, req := range n.s.requests {
				if strings.Contains(req.path, token+"/after") && req.at.After(killed.Add(100*time.Millisecond)) {
					t.Errorf("a request arrived after the helper was killed: %s", req.path)
				}
			}
			n.s.mu.Unlock()
			if rep := r.report(t); rep == nil || rep.Failure == "" {
				t.Errorf("the report does not say the network failed: %+v", rep)
			}
			n.assertHostClean(t)
		})
	}
}

// TestThreatNetworkTwoSandboxes: two sandboxes alive at once, each with a
// different allowlist, cannot use each other's names. Protection: one
// helper, one allowlist and one netns per sandbox.
func TestThreatNetworkTwoSandboxes(t *testing.T) {
	n := newNetHarness(t)
	entries := n.s.entries()
	lists := [][]string{{entries[0]}, {entries[1]}}
	probe := func(own string, ownPort int, other string, otherPort int) string {
		return netPrelude + fmt.Sprintf(`
time.sleep(2)
raw("own", %[1]q, %[2]d, "/{{TOKEN}}/own")
raw("other", %[3]q, %[4]d, "/{{TOKEN}}/other")
`, own, ownPort, other, otherPort)
	}
	// allowed.test is plain HTTP; its probe on secure.test uses plain HTTP
	// too, which the TLS server would still accept — it must not see it.
	codes := []string{probe(netAllowed, n.s.httpPort, netSecure, n.s.tlsPort), probe(netSecure, n.s.tlsPort, netAllowed, n.s.httpPort)}
	wants := []map[string]string{{"own": wantOK, "other": wantNX}, {"own": `(got:HTTP/1.[01] 400|closed-empty|after-reset)`, "other": wantNX}}

	t.Run("cli", func(t *testing.T) {
		var wg sync.WaitGroup
		runs := make([]*threatRun, 2)
		tokens := []string{"tok-" + randomHex(6), "tok-" + randomHex(6)}
		for i := range 2 {
			wg.Add(1)
			go func() { defer wg.Done(); runs[i] = n.run(t, "cli", "python", n.expand(codes[i], tokens[i]), lists[i]) }()
		}
		wg.Wait()
		for i, r := range runs {
			checkResults(t, r, wants[i])
			checkRecords(t, "cli", r.report(t), []wantRecord{{kind: egress.KindDNS, decision: egress.Denied}})
		}
		if seen := n.s.sawToken(tokens[1] + "/other"); len(seen) > 0 {
			t.Errorf("the second sandbox reached the first's server: %v", seen)
		}
		n.assertHostClean(t)
	})
	t.Run("mcp sessions", func(t *testing.T) {
		ids := make([]string, 2)
		for i := range 2 {
			res, out := n.server.tool(t, "create_session", map[string]any{"language": "python", "network": lists[i]})
			if res.IsError {
				t.Fatalf("create_session: %s", text(res))
			}
			ids[i], _ = out["session_id"].(string)
			defer n.server.tool(t, "close_session", map[string]any{"session_id": ids[i]})
		}
		var wg sync.WaitGroup
		runs := make([]*threatRun, 2)
		for i := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				runs[i] = mcpRun(t, n.server, map[string]any{"session_id": ids[i], "language": "python", "code": n.expand(codes[i], "tok-"+randomHex(6)), "timeout_seconds": 60})
			}()
		}
		wg.Wait()
		for i, r := range runs {
			checkResults(t, r, wants[i])
		}
	})
}
