package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"

	"github.com/safe-run/safe-run/egress"
	"github.com/safe-run/safe-run/netstack/netstacktest"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// helperBin is $SAFE_RUN_NET_HELPER (make's TEST_ENV: bin/safe-run-net),
// else the helper built as `make build` builds it (static, no cgo:
// AllThreadsSyscall needs that).
func helperBin(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("SAFE_RUN_NET_HELPER"); p != "" {
		return p
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "safe-run-net-test")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "safe-run-net")
		cmd := exec.Command("go", "build", "-o", binPath, ".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}

// TestLockdownRefuses starts the binary in its self-test mode: after the
// lockdown it tries to exec a program and to open a file; both must fail
// with EPERM from the seccomp filter.
func TestLockdownRefuses(t *testing.T) {
	bin := helperBin(t)
	for _, what := range []string{"execve", "open"} {
		t.Run(what, func(t *testing.T) {
			out, err := exec.Command(bin, "-selftest", what).CombinedOutput()
			if err != nil || !strings.Contains(string(out), "operation not permitted") {
				t.Fatalf("selftest %s: %v\n%s", what, err, out)
			}
		})
	}
}

// helper is the binary running as the backend runs it, a socketpair
// standing in for the TAP device: config on stdin, the link on fd 3,
// events on fd 4 (read all the time, as the backend must), EOF on stdin
// to finish.
type helper struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr bytes.Buffer
	client *netstacktest.Client
	done   chan struct{} // the event stream ended
	events netstacktest.Seen[egress.HelperEvent]

	badLine error // the first event line that was no HelperEvent; read after done
}

func startHelper(tb testing.TB, bin string, allow []string, limits egress.Limits) *helper {
	tb.Helper()
	fds, err := netstacktest.Socketpair()
	if err != nil {
		tb.Fatal(err)
	}
	linkFile := os.NewFile(uintptr(fds[0]), "link")
	evR, evW, err := os.Pipe()
	if err != nil {
		tb.Fatal(err)
	}
	h := &helper{cmd: exec.Command(bin), done: make(chan struct{})}
	h.cmd.ExtraFiles = []*os.File{linkFile, evW}
	h.cmd.Stderr = &h.stderr
	if h.stdin, err = h.cmd.StdinPipe(); err != nil {
		tb.Fatal(err)
	}
	if err := h.cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	linkFile.Close()
	evW.Close()
	tb.Cleanup(func() { h.cmd.Process.Kill(); h.cmd.Wait() })
	cfg, _ := json.Marshal(egress.HelperConfig{
		Allow: allow, Limits: limits, Link: "packet", MTU: 1500,
		Gateway: egress.GatewayAddr, Sandbox: egress.SandboxAddr, PrefixLen: egress.LinkPrefixLen,
	})
	h.stdin.Write(append(cfg, '\n'))
	go func() {
		defer close(h.done)
		sc := bufio.NewScanner(evR)
		for sc.Scan() {
			var ev egress.HelperEvent
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil && h.badLine == nil {
				h.badLine = fmt.Errorf("event line %q: %v", sc.Bytes(), err)
			}
			h.events.Add(ev)
		}
	}()
	h.events.Wait(tb, "ready event", func(ev egress.HelperEvent) bool { return ev.Ready }, &h.stderr)
	if first := h.events.All()[0]; !first.Ready {
		tb.Fatalf("first event %+v; want ready", first)
	}
	if h.client, err = netstacktest.NewClient(fds[1]); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { h.client.Close(); unix.Close(fds[1]) })
	return h
}

// record waits for a connection record matching ok.
func (h *helper) record(tb testing.TB, what string, ok func(egress.Connection) bool) {
	tb.Helper()
	h.events.Wait(tb, what+" record", func(ev egress.HelperEvent) bool { return ev.Conn != nil && ok(*ev.Conn) }, &h.stderr)
}

// finish closes stdin and waits for the exit.
func (h *helper) finish(tb testing.TB) {
	tb.Helper()
	h.stdin.Close()
	<-h.done
	if err := h.cmd.Wait(); err != nil {
		tb.Fatalf("helper exit: %v\n%s", err, h.stderr.String())
	}
	if h.badLine != nil {
		tb.Fatal(h.badLine)
	}
}

func upstream(tb testing.TB) uint16 {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello "+r.Host) }))
	tb.Cleanup(up.Close)
	return netip.MustParseAddrPort(up.Listener.Addr().String()).Port()
}

// get is one HTTP request to ok.test through the helper.
func get(c *netstacktest.Client, addr netip.Addr, port uint16) (string, error) {
	conn, err := c.Dial(addr, port)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(15 * time.Second))
	fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: ok.test\r\nConnection: close\r\n\r\n")
	resp, err := io.ReadAll(conn)
	return string(resp), err
}

func TestHelperProtocol(t *testing.T) {
	port := upstream(t)
	h := startHelper(t, helperBin(t), []string{fmt.Sprintf("ok.test=127.0.0.1:%d", port)}, egress.Limits{})
	c := h.client
	if _, found, err := c.Lookup("evil.test"); err != nil || found {
		t.Fatalf("evil.test: found %v, %v; want NXDOMAIN", found, err)
	}
	addr, found, err := c.Lookup("ok.test")
	if err != nil || !found {
		t.Fatalf("ok.test: found %v, %v", found, err)
	}
	if resp, err := get(c, addr, port); !strings.HasSuffix(resp, "hello ok.test") {
		t.Fatalf("response %q, %v", resp, err)
	}
	// A datagram to anywhere but the gateway's port 53 is dropped and recorded.
	u, err := gonet.DialUDP(c.S, nil, &tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4([4]byte{203, 0, 113, 7}), Port: 443}, ipv4.ProtocolNumber)
	if err != nil {
		t.Fatal(err)
	}
	u.Write([]byte("quic?"))
	u.Close()

	h.record(t, "dns denied", func(r egress.Connection) bool {
		return r.Kind == egress.KindDNS && r.Name == "evil.test" && r.Decision == egress.Denied
	})
	h.record(t, "tcp open", func(r egress.Connection) bool { return r.Kind == egress.KindTCP && r.Name == "ok.test" && r.Open })
	h.record(t, "tcp close", func(r egress.Connection) bool {
		return r.Kind == egress.KindTCP && r.Name == "ok.test" && !r.Open && r.BytesIn > 0
	})
	h.record(t, "udp drop", func(r egress.Connection) bool { return r.Kind == egress.KindUDP && r.Addr == "203.0.113.7:443" })
	// A further line on stdin is answered with a mark in the event stream.
	if _, err := h.stdin.Write([]byte("sync\n")); err != nil {
		t.Fatal(err)
	}
	h.events.Wait(t, "synced event", func(ev egress.HelperEvent) bool { return ev.Synced }, &h.stderr)
	h.finish(t)
}

// BenchmarkHelperRequest is one HTTP request through the helper binary
// (DNS answered once); it reports the helper's peak RSS.
func BenchmarkHelperRequest(b *testing.B) {
	port := upstream(b)
	h := startHelper(b, helperBin(b), []string{fmt.Sprintf("ok.test=127.0.0.1:%d", port)}, egress.Limits{MaxConnections: 1 << 30})
	addr, _, err := h.client.Lookup("ok.test")
	if err != nil {
		b.Fatal(err)
	}
	idle := rssMiB(b, h.cmd.Process.Pid, "VmRSS")
	var took []time.Duration
	for b.Loop() {
		start := time.Now()
		if _, err := get(h.client, addr, port); err != nil {
			b.Fatal(err)
		}
		took = append(took, time.Since(start))
	}
	netstacktest.ReportLatency(b, took)
	b.ReportMetric(idle, "idle-rss-MiB")
	b.ReportMetric(rssMiB(b, h.cmd.Process.Pid, "VmHWM"), "peak-rss-MiB")
	h.finish(b)
}

// rssMiB is a memory field of /proc/PID/status, in MiB.
func rssMiB(tb testing.TB, pid int, field string) float64 {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == field+":" {
			kb, _ := strconv.Atoi(f[1])
			return float64(kb) / 1024
		}
	}
	tb.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// TestHelperBadConfig: a bad configuration line is one error event and one
// log line naming the problem, exit 1.
func TestHelperBadConfig(t *testing.T) {
	bin := helperBin(t)
	tests := []struct{ line, want string }{
		{`not json`, "parse the configuration line"},
		{`{"allow":["ok.test"],"link":"tap","mtu":0}`, "mtu 0 is out of range"},
		{`{"allow":["ok.test"],"link":"wire","mtu":1500}`, "is neither"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			evR, evW, _ := os.Pipe()
			cmd := exec.Command(bin)
			cmd.Stdin = strings.NewReader(tt.line + "\n")
			cmd.ExtraFiles = []*os.File{os.Stdin, evW}
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Start()
			evW.Close()
			if err != nil {
				t.Fatal(err)
			}
			ev, _ := io.ReadAll(evR)
			err = cmd.Wait()
			if err == nil || !strings.Contains(string(ev), tt.want) || !strings.Contains(stderr.String(), tt.want) {
				t.Fatalf("exit %v; events %q; stderr %q; want %q", err, ev, stderr.String(), tt.want)
			}
		})
	}
}
