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
func helperBin(t *testing.T) string {
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

// TestHelperProtocol runs the binary as the backend does, a socketpair
// standing in for the TAP device: config on stdin, the link on fd 3,
// events on fd 4, EOF on stdin to finish.
func TestHelperProtocol(t *testing.T) {
	bin := helperBin(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello "+r.Host) }))
	defer up.Close()
	port := netip.MustParseAddrPort(up.Listener.Addr().String()).Port()

	fds, err := netstacktest.Socketpair()
	if err != nil {
		t.Fatal(err)
	}
	linkFile := os.NewFile(uintptr(fds[0]), "link")
	evR, evW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.ExtraFiles = []*os.File{linkFile, evW}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	linkFile.Close()
	evW.Close()
	cfg, _ := json.Marshal(egress.HelperConfig{
		Allow: []string{fmt.Sprintf("ok.test=127.0.0.1:%d", port)}, Link: "packet", MTU: 1500,
		Gateway: egress.GatewayAddr, Sandbox: egress.SandboxAddr, PrefixLen: egress.LinkPrefixLen,
	})
	stdin.Write(append(cfg, '\n'))

	events := make(chan egress.HelperEvent, 100)
	go func() {
		defer close(events)
		sc := bufio.NewScanner(evR)
		for sc.Scan() {
			var ev egress.HelperEvent
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				t.Errorf("event line %q: %v", sc.Bytes(), err)
			}
			events <- ev
		}
	}()
	select {
	case ev := <-events:
		if !ev.Ready {
			t.Fatalf("first event %+v; want ready\n%s", ev, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("no ready event\n%s", stderr.String())
	}

	c, err := netstacktest.NewClient(fds[1])
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, found, err := c.Lookup("evil.test"); err != nil || found {
		t.Fatalf("evil.test: found %v, %v; want NXDOMAIN", found, err)
	}
	addr, found, err := c.Lookup("ok.test")
	if err != nil || !found {
		t.Fatalf("ok.test: found %v, %v", found, err)
	}
	conn, err := c.Dial(addr, port)
	if err != nil {
		t.Fatal(err)
	}
	conn.SetDeadline(time.Now().Add(15 * time.Second))
	fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: ok.test\r\nConnection: close\r\n\r\n")
	resp, err := io.ReadAll(conn)
	conn.Close()
	if !strings.HasSuffix(string(resp), "hello ok.test") {
		t.Fatalf("response %q, %v", resp, err)
	}
	// A datagram to anywhere but the gateway's port 53 is dropped and recorded.
	u, err := gonet.DialUDP(c.S, nil, &tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4([4]byte{203, 0, 113, 7}), Port: 443}, ipv4.ProtocolNumber)
	if err != nil {
		t.Fatal(err)
	}
	u.Write([]byte("quic?"))
	u.Close()

	var got []egress.Connection
	want := func(name string, ok func(egress.Connection) bool) {
		t.Helper()
		deadline := time.After(20 * time.Second)
		for {
			for _, r := range got {
				if ok(r) {
					return
				}
			}
			select {
			case ev, more := <-events:
				if !more {
					t.Fatalf("no %s record among %+v\n%s", name, got, stderr.String())
				}
				if ev.Conn != nil {
					got = append(got, *ev.Conn)
				}
			case <-deadline:
				t.Fatalf("no %s record among %+v\n%s", name, got, stderr.String())
			}
		}
	}
	want("dns denied", func(r egress.Connection) bool { return r.Kind == egress.KindDNS && r.Name == "evil.test" && r.Decision == egress.Denied })
	want("tcp close", func(r egress.Connection) bool { return r.Kind == egress.KindTCP && r.Name == "ok.test" && !r.Open && r.BytesIn > 0 })
	want("udp drop", func(r egress.Connection) bool { return r.Kind == egress.KindUDP && r.Addr == "203.0.113.7:443" })

	stdin.Close() // finish
	for range events {
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("helper exit: %v\n%s", err, stderr.String())
	}
	unix.Close(fds[1])
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
