package gvisor

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/safe-run/safe-run/bundle"
	"github.com/safe-run/safe-run/egress"
	"github.com/safe-run/safe-run/rootfs"
	"github.com/safe-run/safe-run/runtime/engine"
	"github.com/safe-run/safe-run/sandbox"
)

// standInEnv makes the test binary act as a stand-in network helper: until
// cmd/safe-run-net lands, it speaks the helper's protocol (a HelperConfig
// on stdin, ready on fd 4, EOF on stdin ends it) and reports, as one
// record, the first ARP frame the sandbox sends over the link on fd 3 —
// which shows that the namespace, the link and runsc's --network=sandbox
// carry the sandbox's traffic to the helper.
const standInEnv = "SAFE_RUN_TEST_NET_STANDIN"

// standInARP is the Reason of the stand-in's record of an ARP frame.
const standInARP = "stand-in: ARP frame seen"

func standInHelperMain() {
	if os.Getenv(standInEnv) != "1" {
		return
	}
	in := bufio.NewReader(os.Stdin)
	line, err := in.ReadBytes('\n')
	var cfg egress.HelperConfig
	if err != nil || json.Unmarshal(line, &cfg) != nil || cfg.MTU == 0 {
		os.Exit(2)
	}
	link, events := os.NewFile(3, "link"), os.NewFile(4, "events")
	enc := json.NewEncoder(events)
	_ = enc.Encode(egress.HelperEvent{Ready: true})
	go func() {
		buf := make([]byte, cfg.MTU+64)
		for {
			n, err := link.Read(buf)
			if err != nil {
				return
			}
			if n >= 14 && buf[12] == 0x08 && buf[13] == 0x06 {
				_ = enc.Encode(egress.HelperEvent{Conn: &egress.Connection{ID: 1, Kind: egress.KindUDP, Decision: egress.Denied, Reason: standInARP}})
				return
			}
		}
	}()
	_, _ = in.ReadBytes('\n') // EOF: finish
	os.Exit(0)
}

// standInHelper installs this test binary as a stand-in helper that uid
// 65534 can run, and returns its path and the mark of its processes.
func standInHelper(t *testing.T) (path, mark string) {
	t.Helper()
	path, mark = standInHelperB(t)
	checkNoHelperLeft(t, mark)
	return path, mark
}

// checkNoHelperLeft fails t if, when the test ends, a process still names
// mark. Called before the runtime is made, its cleanup runs after the
// runtime's.
func checkNoHelperLeft(t *testing.T, mark string) {
	t.Cleanup(func() {
		if pids := processesNaming([]byte(mark)); len(pids) > 0 {
			t.Errorf("network helpers left running: %v", pids)
		}
	})
}

// standInHelperB is standInHelper without the check for leftovers.
func standInHelperB(t testing.TB) (path, mark string) {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "standin")
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	path = filepath.Join(dir, "safe-run-net")
	script := "#!/bin/sh\n" + standInEnv + "=1 exec " + bin + " \"$@\"\n"
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path, bin
}

// netProbe prints what a networked sandbox sees, and sends one frame (the
// connect makes gVisor ask for the gateway's address).
const netProbe = `
import socket, time
print(open("/etc/resolv.conf").read().strip())
import os
print("links", sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:]))
print("eth0 has inet6:", "eth0" in set(l.split()[-1] for l in open("/proc/net/if_inet6")))
s = socket.socket(); s.settimeout(1)
try:
    s.connect(("198.18.0.1", 80))
except OSError as e:
    print("connect", type(e).__name__)
`

func TestNetworkedSandbox(t *testing.T) {
	for _, link := range []string{LinkTap, LinkVeth} {
		t.Run(link, func(t *testing.T) {
			helper, _ := standInHelper(t)
			rt := newTestRuntimeWith(t, func(cfg *testConfig) { cfg.NetHelper, cfg.NetLink = helper, link; allowNet(t, cfg, "example.test") })
			res := mustRun(t, rt, sandbox.Job{Language: "python", Code: netProbe, Network: []string{"example.test"}})
			if f, err := openTun(); link == LinkTap && err != nil {
				// A user who cannot open /dev/net/tun (0600 here) gets
				// veth by default; asking for a TAP fails, and says why.
				wantStatus(t, res, sandbox.StatusSandboxError)
				if !strings.Contains(res.Message, "/dev/net/tun") || !strings.Contains(res.Message, "veth") {
					t.Errorf("message = %q, want it to name /dev/net/tun and the veth link", res.Message)
				}
				return
			} else if f != nil {
				f.Close()
			}
			wantStatus(t, res, sandbox.StatusOK)
			// No IPv6 address on the link: runsc would copy a link-local one.
			for _, want := range []string{"nameserver 198.18.0.1", "'eth0'", "connect ", "eth0 has inet6: False"} {
				if !strings.Contains(res.Stdout, want) {
					t.Errorf("stdout lacks %q:\n%s", want, res.Stdout)
				}
			}
			if res.Network == nil {
				t.Fatalf("no network report; message: %s", res.Message)
			}
			if res.Network.Failure != "" || len(res.Network.Connections) != 1 || res.Network.Connections[0].Reason != standInARP {
				t.Errorf("report = %+v, want the stand-in's one ARP record", *res.Network)
			}
			if !strings.Contains(res.Message, "network: denied") {
				t.Errorf("message lacks the denial line: %q", res.Message)
			}
		})
	}
}

func TestNetworkHelperKilled(t *testing.T) {
	helper, mark := standInHelper(t)
	rt := newTestRuntimeWith(t, func(cfg *testConfig) { cfg.NetHelper = helper; allowNet(t, cfg, "example.test") })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for ctx.Err() == nil {
			for _, pid := range processesNaming([]byte(mark)) {
				// Killed once the run is under way: the helper is ready
				// milliseconds after it starts, the program sleeps 4 s.
				time.Sleep(time.Second)
				_ = syscall.Kill(pid, syscall.SIGKILL)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	code := "import time\nfor _ in range(40):\n    time.sleep(0.1)\nprint('done')\n"
	res := mustRun(t, rt, sandbox.Job{Language: "python", Code: code, Network: []string{"example.test"}})
	wantStatus(t, res, sandbox.StatusOK)
	if res.Network == nil || !strings.Contains(res.Network.Failure, "exited during the run") {
		t.Fatalf("report = %+v, want a failure saying the helper died", res.Network)
	}
	if !strings.Contains(res.Message, "network: the network helper exited") {
		t.Errorf("message lacks the failure: %q", res.Message)
	}
}

func TestNetworkCheck(t *testing.T) {
	helper, _ := standInHelper(t)
	link, err := NetworkCheck(Config{NetHelper: helper, Agent: "/nonexistent/agent"})
	if err != nil {
		t.Fatalf("NetworkCheck: %v", err)
	}
	if want, _ := chooseLink(""); link != want {
		t.Errorf("link = %s, want %s", link, want)
	}
	if _, err := NetworkCheck(Config{NetHelper: "/nonexistent/safe-run-net"}); err == nil || !strings.Contains(err.Error(), "safe-run-net") {
		t.Errorf("NetworkCheck without the helper: %v, want an error naming it", err)
	}
	// Where this user cannot open /dev/net/tun, asking for a TAP names the
	// fix, once.
	if f, err := openTun(); err == nil {
		f.Close()
	} else {
		_, err := NetworkCheck(Config{NetHelper: helper, NetLink: LinkTap})
		if err == nil || strings.Count(err.Error(), networkFix(LinkTap, os.ErrPermission)) != 1 {
			t.Errorf("NetworkCheck of a TAP this user cannot open: %v, want the fix named once", err)
		}
	}
}

// TestNetworkEndings ends networked runs every way a run ends; the
// cleanups check that no namespace mount, helper or run directory is left.
func TestNetworkEndings(t *testing.T) {
	helper, _ := standInHelper(t)
	rt := newTestRuntimeWith(t, func(cfg *testConfig) { cfg.NetHelper = helper; allowNet(t, cfg, "example.test") })
	limits := sandbox.DefaultLimits
	limits.Timeout = 2 * time.Second
	limits.MemoryBytes = 64 * sandbox.MiB
	for _, tc := range []struct {
		name, code string
		cancel     bool
		want       sandbox.Status
	}{
		{"ok", "print(1)", false, sandbox.StatusOK},
		{"timeout", "import time\ntime.sleep(30)", false, sandbox.StatusTimeout},
		{"cancel", "import time\ntime.sleep(30)", true, sandbox.StatusKilled},
		{"oom", "b = []\nwhile True:\n    b.append(bytearray(16 << 20))", false, sandbox.StatusOOM},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.cancel {
				time.AfterFunc(time.Second, cancel)
			}
			res, err := rt.Run(ctx, sandbox.Job{Language: "python", Code: tc.code, Limits: limits, Network: []string{"example.test"}})
			if err != nil {
				t.Fatal(err)
			}
			wantStatus(t, res, tc.want)
			// The helper outlives the sandbox's end, to hand over its
			// last records.
			if res.Network == nil || res.Network.Failure != "" {
				t.Errorf("network report = %+v, want one without failure", res.Network)
			}
		})
	}
}

// crashEnv makes TestNetworkCrashChild start a networked sandbox in the
// state directory it names, and wait to be killed.
const crashEnv = "SAFE_RUN_TEST_CRASH_STATE"

// TestNetworkCrashChild is the safe-run that TestNetworkReapAfterCrash
// kills; on its own (crashEnv unset) it does nothing.
func TestNetworkCrashChild(t *testing.T) {
	stateDir := os.Getenv(crashEnv)
	if stateDir == "" {
		return
	}
	g, err := New(Config{Runsc: os.Getenv("SAFE_RUN_RUNSC"), Agent: os.Getenv("SAFE_RUN_AGENT"), Rootfs: os.Getenv("SAFE_RUN_TEST_ROOTFS"),
		StateDir: stateDir, NetHelper: os.Getenv("SAFE_RUN_TEST_CRASH_HELPER")})
	if err != nil {
		t.Fatal(err)
	}
	p, err := g.startSandbox(engine.StartSpec{Job: sandbox.Job{Language: "bash", Limits: sandbox.DefaultLimits, Network: []string{"example.test"}}, KeepAlive: true}, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(p.Events()).ReadString('\n'); err != nil {
		t.Fatalf("no Ready event from the agent: %v", err)
	}
	fmt.Println("sandbox running")
	time.Sleep(time.Minute)
}

// TestNetworkReapAfterCrash kills a safe-run holding a networked sandbox
// and checks that the next one removes everything it left: the namespace
// mount, runsc, and (by its parent-death signal) the helper.
func TestNetworkReapAfterCrash(t *testing.T) {
	helper, _ := standInHelper(t)
	rt := newTestRuntimeWith(t, func(cfg *testConfig) { cfg.NetHelper = helper })
	rt.Close()
	stateDir := rt.cfg.StateDir
	exe, _ := os.Executable()
	child := exec.Command(exe, "-test.run=^TestNetworkCrashChild$", "-test.count=1")
	child.Env = append(os.Environ(), crashEnv+"="+stateDir, "SAFE_RUN_TEST_CRASH_HELPER="+helper, "SAFE_RUN_TEST_ROOTFS="+rt.cfg.Rootfs)
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "sandbox running\n" {
		_ = child.Process.Kill()
		_ = child.Wait()
		t.Fatalf("child: %q, %v", line, err)
	}
	_ = child.Process.Kill()
	_ = child.Wait()
	if entries, _ := os.ReadDir(stateDir); len(entries) == 0 {
		t.Fatal("the killed safe-run left no run directory: nothing to reap")
	}
	rt2, err := startStack(rt.cfg)
	if err != nil {
		t.Fatal(err)
	}
	// runsc and the helper die of their parent-death signal; give the
	// host's init a moment to reap them.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if len(processesNaming([]byte(stateDir))) == 0 {
			break
		}
	}
	rt2.Close()
	assertNothingLeft(t, rt2, nil)
}

// BenchmarkNetworkStart runs `pass` without a network and with each link,
// interleaved so that the host's load falls on all alike, and reports
// each one's median run time (p50_ms). The helper is $SAFE_RUN_NET_HELPER,
// else the stand-in.
func BenchmarkNetworkStart(b *testing.B) {
	helper := os.Getenv("SAFE_RUN_NET_HELPER")
	if helper == "" {
		helper, _ = standInHelperB(b)
	}
	kinds := []string{"none", LinkTap, LinkVeth}
	if f, err := openTun(); err != nil {
		kinds = []string{"none", LinkVeth}
	} else {
		f.Close()
	}
	img, err := rootfs.Store{}.Lookup(rootfs.DefaultName)
	if err != nil {
		b.Skipf("needs the default image: %v", err)
	}
	rts := map[string]*testRuntime{}
	for _, k := range kinds {
		link := k
		if k == "none" {
			link = ""
		}
		rt, err := startStack(testConfig{Config: Config{Runsc: os.Getenv("SAFE_RUN_RUNSC"), Agent: os.Getenv("SAFE_RUN_AGENT"),
			Rootfs: img.Root, StateDir: filepath.Join(b.TempDir(), "state"), NetHelper: helper, NetLink: link}})
		if err != nil {
			b.Fatal(err)
		}
		defer rt.Close()
		rts[k] = rt
	}
	times := map[string][]time.Duration{}
	b.ResetTimer()
	for range b.N {
		for _, k := range kinds {
			job := sandbox.Job{Language: "python", Code: "pass"}
			if k != "none" {
				job.Network = []string{"example.test"}
			}
			start := time.Now()
			res, err := rts[k].Run(context.Background(), job)
			if err != nil || res.Status != sandbox.StatusOK {
				b.Fatalf("%s: %v %s %s", k, err, res.Status, res.Message)
			}
			times[k] = append(times[k], time.Since(start))
		}
	}
	b.StopTimer()
	for _, k := range kinds {
		d := times[k]
		slices.Sort(d)
		b.ReportMetric(float64(d[len(d)/2].Microseconds())/1000, k+"_p50_ms")
	}
}

// realHelper is the network helper the integration tests use
// ($SAFE_RUN_NET_HELPER, as make's TEST_ENV sets it).
func realHelper(t *testing.T) string {
	t.Helper()
	path := os.Getenv("SAFE_RUN_NET_HELPER")
	if path == "" {
		if os.Getenv("SAFE_RUN_INTEGRATION") == "1" {
			t.Fatal("SAFE_RUN_NET_HELPER is not set")
		}
		t.Skip("integration test needs the network helper (run `make test`)")
	}
	checkNoHelperLeft(t, path)
	return path
}

// TestNetworkReachesPinnedServer: Python in a networked sandbox reaches a
// server on the host's loopback through a pinned entry, over each link,
// and the helper's decisions come back in the report; the same server's
// address itself, and another name, stay out of reach.
func TestNetworkReachesPinnedServer(t *testing.T) {
	helper := realHelper(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from %s", r.Host)
	}))
	defer srv.Close()
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	code := fmt.Sprintf(`
import socket, urllib.request
print(urllib.request.urlopen("http://srv.test:%[1]d/", timeout=10).read().decode())
for host in ("127.0.0.1", "other.test"):
    try:
        socket.create_connection((host, %[1]d), timeout=5)
        print(host, "reached")
    except OSError as e:
        print(host, "refused:", type(e).__name__)
`, port)
	for _, link := range []string{LinkTap, LinkVeth} {
		t.Run(link, func(t *testing.T) {
			if link == LinkTap {
				f, err := openTun()
				if err != nil {
					t.Skipf("this user cannot open /dev/net/tun (%v): TestNetworkedSandbox checks that a TAP is refused", err)
				}
				f.Close()
			}
			rt := newTestRuntimeWith(t, func(cfg *testConfig) {
				cfg.NetHelper, cfg.NetLink = helper, link
				allowNet(t, cfg, fmt.Sprintf("srv.test=127.0.0.1:%d", port))
			})
			res := mustRun(t, rt, sandbox.Job{Language: "python", Code: code, Network: []string{fmt.Sprintf("srv.test=127.0.0.1:%d", port)}})
			wantStatus(t, res, sandbox.StatusOK)
			want := fmt.Sprintf("hello from srv.test:%d\n127.0.0.1 refused: ", port)
			if !strings.HasPrefix(res.Stdout, want) || !strings.Contains(res.Stdout, "other.test refused: ") {
				t.Errorf("stdout = %q, want it to start %q and other.test refused", res.Stdout, want)
			}
			if res.Network == nil {
				t.Fatalf("no network report; message %q", res.Message)
			}
			var allowed, denied int
			for _, c := range res.Network.Connections {
				switch {
				case c.Decision == egress.Allowed && c.Kind == egress.KindTCP && c.Name == "srv.test":
					allowed++
					if c.Open || c.BytesIn == 0 {
						t.Errorf("final record of the allowed connection: %+v, want closed with bytes", c)
					}
				case c.Decision == egress.Denied:
					denied++
				}
			}
			if allowed != 1 || denied == 0 || res.Network.Failure != "" {
				t.Errorf("report = %+v, want one allowed connection to srv.test and denials", *res.Network)
			}
			if !strings.Contains(res.Message, "network: denied") {
				t.Errorf("message lacks the denials: %q", res.Message)
			}
		})
	}
}

// TestNetworkRealHelperKilled: killing the real helper mid-run leaves the
// sandbox without network, and the run ends with its own status and the
// failure reported.
func TestNetworkRealHelperKilled(t *testing.T) {
	helper := realHelper(t)
	served := make(chan struct{}, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "ok")
		select {
		case served <- struct{}{}:
		default:
		}
	}))
	defer srv.Close()
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	rt := newTestRuntimeWith(t, func(cfg *testConfig) {
		cfg.NetHelper = helper
		allowNet(t, cfg, fmt.Sprintf("srv.test=127.0.0.1:%d", port))
	})
	code := fmt.Sprintf(`
import time, urllib.request
print(urllib.request.urlopen("http://srv.test:%d/", timeout=10).read().decode())
time.sleep(5)
try:
    urllib.request.urlopen("http://srv.test:%d/", timeout=3)
    print("reached after the kill")
except OSError as e:
    print("after the kill:", type(e).__name__)
`, port, port)
	uids := make(chan string, 1)
	go func() {
		defer close(uids)
		// Killed while the program sleeps after its first request.
		select {
		case <-served:
		case <-time.After(time.Minute):
			return
		}
		time.Sleep(500 * time.Millisecond)
		for _, pid := range processesNaming([]byte(helper)) {
			status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
			for _, line := range strings.Split(string(status), "\n") {
				if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
					uids <- strings.Fields(rest)[0]
				}
			}
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}()
	res := mustRun(t, rt, sandbox.Job{Language: "python", Code: code, Network: []string{fmt.Sprintf("srv.test=127.0.0.1:%d", port)}})
	wantStatus(t, res, sandbox.StatusOK)
	if !strings.HasPrefix(res.Stdout, "ok\n") || !strings.Contains(res.Stdout, "after the kill: ") {
		t.Errorf("stdout = %q, want the first request through and the second failing", res.Stdout)
	}
	if res.Network == nil || !strings.Contains(res.Network.Failure, "exited during the run") {
		t.Errorf("report = %+v, want a failure saying the helper died", res.Network)
	}
	// Host root starts the helper as nobody; a user, as itself.
	want := "65534"
	if !HostRoot() {
		want = "0" // root of safe-run's user namespace, the user on the host
	}
	if uid := <-uids; uid != want {
		t.Errorf("the helper ran as uid %q, want %s", uid, want)
	}
}

// TestNetworkHelperBroken: a helper that fails before it is ready fails
// the sandbox's start with the reason, and leaves nothing.
func TestNetworkHelperBroken(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	exits := filepath.Join(dir, "exits")
	if err := os.WriteFile(exits, []byte("#!/bin/sh\necho broken >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	failing := filepath.Join(dir, "fails")
	if err := os.WriteFile(failing, []byte("#!/bin/sh\necho '{\"error\":\"no stack today\"}' >&4\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, helper, want string }{
		{"missing", filepath.Join(dir, "nonexistent"), "start network helper"},
		{"exits", exits, "exited before it was ready (exit status 3)"},
		{"says why", failing, "no stack today"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := newTestRuntimeWith(t, func(cfg *testConfig) { cfg.NetHelper = tc.helper; allowNet(t, cfg, "example.test") })
			res := mustRun(t, rt, sandbox.Job{Language: "python", Code: "print(1)", Network: []string{"example.test"}})
			wantStatus(t, res, sandbox.StatusSandboxError)
			if !strings.Contains(res.Message, tc.want) {
				t.Errorf("message = %q, want it to contain %q", res.Message, tc.want)
			}
		})
	}
}

func TestChooseLink(t *testing.T) {
	auto := LinkVeth
	if f, err := openTun(); err == nil {
		f.Close()
		auto = LinkTap
	}
	for _, tc := range []struct{ in, want, err string }{
		{"", auto, ""},
		{"auto", auto, ""},
		{"tap", LinkTap, ""},
		{"veth", LinkVeth, ""},
		{"wifi", "", `network link "wifi" is not one of auto, tap, veth`},
	} {
		got, err := chooseLink(tc.in)
		if got != tc.want || (err == nil) != (tc.err == "") || err != nil && err.Error() != tc.err {
			t.Errorf("chooseLink(%q) = %q, %v; want %q, %q", tc.in, got, err, tc.want, tc.err)
		}
	}
}

// TestNetworkCA: a networked sandbox trusts the image's CAs and the
// operator's extra ones, through the system bundle and Node's variable;
// curl, which reads the bundle, reaches the pinned server.
func TestNetworkCA(t *testing.T) {
	helper := realHelper(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "curl ok") }))
	defer srv.Close()
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	extra := filepath.Join(t.TempDir(), "extra.pem")
	const marker = "# the operator's test CA"
	if err := os.WriteFile(extra, []byte(marker+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rt := newTestRuntimeWith(t, func(cfg *testConfig) {
		cfg.NetHelper, cfg.NetworkCA = helper, extra
		allowNet(t, cfg, fmt.Sprintf("srv.test=127.0.0.1:%d", port))
	})
	image, err := os.ReadFile(filepath.Join(rt.cfg.Rootfs, bundle.CABundlePath))
	if err != nil {
		t.Fatalf("the default image has no CA bundle: %v", err)
	}
	code := fmt.Sprintf(`echo "$NODE_EXTRA_CA_CERTS"; wc -c < /etc/ssl/certs/ca-certificates.crt; tail -n 1 /etc/ssl/certs/ca-certificates.crt; curl -sS http://srv.test:%d/`, port)
	res := mustRun(t, rt, sandbox.Job{Language: "bash", Code: code, Network: []string{fmt.Sprintf("srv.test=127.0.0.1:%d", port)}})
	wantStatus(t, res, sandbox.StatusOK)
	want := fmt.Sprintf("%s\n%d\n%s\ncurl ok", bundle.CABundlePath, len(image)+1+len(marker)+1, marker)
	if res.Stdout != want {
		t.Errorf("stdout = %q, want %q", res.Stdout, want)
	}
}

func TestOthersCanExec(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	open, closed := filepath.Join(dir, "open"), filepath.Join(dir, "closed")
	if err := os.Mkdir(open, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path string
		mode os.FileMode
		ok   bool
	}{
		{filepath.Join(open, "x"), 0o755, false}, // dir, the temp dir, is 0700
		{closed, 0o700, false},
	} {
		if err := os.WriteFile(tc.path, []byte("#!/bin/sh\n"), tc.mode); err != nil {
			t.Fatal(err)
		}
		if err := othersCanExec(tc.path); (err == nil) != tc.ok {
			t.Errorf("othersCanExec(%s) = %v, want ok %v", tc.path, err, tc.ok)
		}
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := othersCanExec(filepath.Join(open, "x")); err != nil {
		t.Errorf("othersCanExec of a 0755 file below 0755 directories: %v", err)
	}
	if err := othersCanExec(closed); err == nil {
		t.Error("othersCanExec of a 0700 file: ok")
	}
}

// allowNet makes entries the policy's allowlist, so that jobs may ask for
// them.
func allowNet(t *testing.T, cfg *testConfig, entries ...string) {
	t.Helper()
	allow, err := egress.Parse(entries)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Engine.Policy.Network = allow
}

// TestNetworkReadOnlyProcSys runs TestNetworkedSandbox where /proc/sys is
// read-only, as under systemd's ProtectKernelTunables= (the service's unit):
// IPv6 cannot be switched off through sysctl there, so the link must still
// come up without an IPv6 address.
func TestNetworkReadOnlyProcSys(t *testing.T) {
	ns := []string{"--mount"}
	if os.Geteuid() != 0 {
		ns = []string{"--user", "--map-root-user", "--mount"}
	}
	script := `mount -o bind,ro /proc/sys /proc/sys && ! echo 1 2>/dev/null >/proc/sys/net/ipv6/conf/all/disable_ipv6 && exec "$0" "$@"`
	rerunIn(t, append(append([]string{"unshare"}, ns...), "sh", "-c", script), "TestNetworkedSandbox/veth")
}

// TestNetworkUmask runs TestNetworkReachesPinnedServer under the umask of
// the service's unit (0077): the files bound into the sandbox must still be
// readable by its user, or its resolver asks 127.0.0.1 and no name resolves.
func TestNetworkUmask(t *testing.T) {
	rerunIn(t, []string{"sh", "-c", `umask 0077 && exec "$0" "$@"`}, "TestNetworkReachesPinnedServer")
}

// rerunIn runs the test named test ("Test/sub") of this binary again
// through wrapper, a command that sets up a host's restriction and then
// executes its arguments (the test binary's path, then its flags), and
// fails unless it passes there.
func rerunIn(t *testing.T, wrapper []string, test string) {
	if os.Getenv("SAFE_RUN_INTEGRATION") != "1" {
		t.Skip("integration test (SAFE_RUN_INTEGRATION=1)")
	}
	if os.Getenv(rerunEnv) != "" {
		t.Skipf("already a rerun (%s)", os.Getenv(rerunEnv))
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	name, sub, _ := strings.Cut(test, "/")
	run := "^" + name + "$"
	if sub != "" {
		run += "/^" + sub + "$"
	}
	args := append(slices.Clone(wrapper[1:]), exe, "-test.run="+run, "-test.count=1", "-test.v")
	cmd := exec.Command(wrapper[0], args...)
	cmd.Env = append(os.Environ(), rerunEnv+"="+t.Name())
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil || !strings.Contains(string(out), "--- PASS: "+test) {
		t.Fatalf("%s under %s: %v", test, t.Name(), err)
	}
}

// rerunEnv marks a test binary run by rerunIn, with the rerunning test's name.
const rerunEnv = "SAFE_RUN_TEST_RERUN"

// TestNetworkNamespaceThread checks that making a sandbox's network
// namespace ends no OS thread and leaves none in that namespace: a
// parent-death signal follows the thread that forked a child, so a thread
// that ended would kill every runsc and helper it had started (the soak's
// sandbox errors), and one left in the namespace would keep it and its
// links after the sandbox. Several at once, as a busy server makes them.
func TestNetworkNamespaceThread(t *testing.T) {
	kind, err := chooseLink("")
	if err != nil {
		t.Fatal(err)
	}
	before := threadIDs(t)
	type made struct {
		inode uint64 // the namespace's, while it existed
		err   error
	}
	results := make(chan made, 4)
	for range 4 {
		go func() {
			n, err := createNet(t.TempDir(), kind)
			if err != nil {
				results <- made{err: err}
				return
			}
			var st unix.Stat_t
			err = unix.Stat(n.nsPath, &st)
			n.remove()
			results <- made{st.Ino, err}
		}()
	}
	var inodes []uint64
	for range 4 {
		m := <-results
		if m.err != nil {
			t.Fatalf("createNet: %v", m.err)
		}
		inodes = append(inodes, m.inode)
	}
	after := threadIDs(t)
	for _, tid := range before {
		if !slices.Contains(after, tid) {
			t.Errorf("thread %s ended while network namespaces were made (threads before %v, after %v)", tid, before, after)
		}
	}
	for _, tid := range after {
		var st unix.Stat_t
		if err := unix.Stat("/proc/self/task/"+tid+"/ns/net", &st); err != nil {
			continue // it ended since
		}
		if slices.Contains(inodes, st.Ino) {
			t.Errorf("thread %s is still in a sandbox's network namespace (inode %d) after it was removed", tid, st.Ino)
		}
	}
}

// threadIDs lists this process's threads.
func threadIDs(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range ents {
		ids = append(ids, e.Name())
	}
	return ids
}
