package gvisor

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/safe-run/safe-run/egress"
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
	// Registered before the runtime's cleanup, so it runs after it.
	t.Cleanup(func() {
		if pids := processesNaming([]byte(bin)); len(pids) > 0 {
			t.Errorf("network helpers left running: %v", pids)
		}
	})
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
