package gvisor

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

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
	// Registered before the runtime's cleanup, so it runs after it.
	t.Cleanup(func() {
		if pids := processesNaming([]byte(mark)); len(pids) > 0 {
			t.Errorf("network helpers left running: %v", pids)
		}
	})
	return path, mark
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
			rt := newTestRuntimeWith(t, func(cfg *testConfig) { cfg.NetHelper, cfg.NetLink = helper, link })
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
			for _, want := range []string{"nameserver 198.18.0.1", "'eth0'", "connect "} {
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
	rt := newTestRuntimeWith(t, func(cfg *testConfig) { cfg.NetHelper = helper })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for ctx.Err() == nil {
			for _, pid := range processesNaming([]byte(mark)) {
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
}

// TestNetworkEndings ends networked runs every way a run ends; the
// cleanups check that no namespace mount, helper or run directory is left.
func TestNetworkEndings(t *testing.T) {
	helper, _ := standInHelper(t)
	rt := newTestRuntimeWith(t, func(cfg *testConfig) { cfg.NetHelper = helper })
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
			if res.Network == nil {
				t.Errorf("no network report")
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
// each one's median run time (p50_ms).
func BenchmarkNetworkStart(b *testing.B) {
	helper, _ := standInHelperB(b)
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
