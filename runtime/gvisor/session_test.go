package gvisor

// Integration tests of sessions, with the real runsc and image (see
// integration_test.go for how they are enabled).

import (
	"bufio"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/safe-run/safe-run/runtime/engine"
	"github.com/safe-run/safe-run/sandbox"
)

func newSession(t *testing.T, rt *testRuntime, lang string) string {
	t.Helper()
	info, err := rt.CreateSession(context.Background(), sandbox.SessionSpec{Language: lang})
	if err != nil {
		t.Fatalf("create %s session: %v", lang, err)
	}
	return info.ID
}

func cell(t *testing.T, rt *testRuntime, id, code string, limits ...sandbox.Limits) sandbox.Result {
	t.Helper()
	job := sandbox.Job{Code: code, OutputDir: "out"}
	if len(limits) > 0 {
		job.Limits = limits[0]
	}
	res, err := rt.RunInSession(context.Background(), id, job)
	if err != nil {
		t.Fatalf("run %q: %v", code, err)
	}
	return res
}

func TestSessionsKeepState(t *testing.T) {
	rt := newTestRuntime(t, sandbox.Policy{})
	t.Cleanup(rt.CloseSessions)
	for _, tc := range []struct {
		lang  string
		cells []string
		want  []string
	}{
		{"python", []string{"x = 41", "x + 1", "import pandas as pd", "pd.DataFrame({'a': [x, 1]}).a.sum()"}, []string{"", "42\n", "", "np.int64(42)\n"}},
		{"node", []string{"let n = 20", "const m = await new Promise(r => setTimeout(() => r(n * 2), 10))", "m + 2"}, []string{"", "", "42\n"}},
		{"bash", []string{"cd /tmp && N=41 && inc() { echo $((N + 1)); }", "pwd; inc"}, []string{"", "/tmp\n42\n"}},
	} {
		t.Run(tc.lang, func(t *testing.T) {
			id := newSession(t, rt, tc.lang)
			for i, c := range tc.cells {
				res := cell(t, rt, id, c, sandbox.Limits{Timeout: 60 * time.Second})
				want := tc.want[i]
				if tc.lang == "python" && i == 3 && res.Stdout == "42\n" {
					want = "42\n" // numpy older than 2 prints a plain 42
				}
				if res.Status != sandbox.StatusOK || res.Stdout != want || res.StateLost {
					t.Errorf("cell %d %q: %s %q (stderr %q, state lost %v), want ok %q", i, c, res.Status, res.Stdout, res.Stderr, res.StateLost, want)
				}
			}
			if err := rt.CloseSession(context.Background(), id); err != nil {
				t.Errorf("close: %v", err)
			}
		})
	}
}

func TestSessionErrorsAndTimeoutsKeepState(t *testing.T) {
	rt := newTestRuntime(t, sandbox.Policy{})
	t.Cleanup(rt.CloseSessions)
	id := newSession(t, rt, "python")
	cell(t, rt, id, "x = 5")
	if res := cell(t, rt, id, "raise ValueError('boom')"); res.Status != sandbox.StatusError || !strings.Contains(res.Stderr, "ValueError: boom") || res.StateLost {
		t.Errorf("exception: %s %q lost %v", res.Status, res.Stderr, res.StateLost)
	}
	res := cell(t, rt, id, "while True: pass", sandbox.Limits{Timeout: time.Second})
	if res.Status != sandbox.StatusTimeout || res.StateLost {
		t.Errorf("busy loop: %s (%s), state lost %v; want timeout with state kept", res.Status, res.Message, res.StateLost)
	}
	if res := cell(t, rt, id, "x"); res.Stdout != "5\n" {
		t.Errorf("after the timeout x = %q (%s)", res.Stdout, res.Message)
	}
}

func TestSessionFilesAndFigures(t *testing.T) {
	rt := newTestRuntime(t, sandbox.Policy{})
	t.Cleanup(rt.CloseSessions)
	id := newSession(t, rt, "python")
	ctx := context.Background()
	if err := rt.WriteFiles(ctx, id, []sandbox.File{{Path: "data/points.csv", Data: []byte("x,y\n1,1\n2,4\n3,9\n")}}); err != nil {
		t.Fatal(err)
	}
	cell(t, rt, id, "import pandas as pd\ndf = pd.read_csv('data/points.csv')", sandbox.Limits{Timeout: 60 * time.Second})
	res := cell(t, rt, id, "import matplotlib.pyplot as plt\ndf.plot(x='x', y='y')\nplt.show()\nprint(int(df.y.sum()))", sandbox.Limits{Timeout: 60 * time.Second})
	if res.Status != sandbox.StatusOK || res.Stdout != "14\n" {
		t.Fatalf("plot cell: %s %q %q", res.Status, res.Stdout, res.Stderr)
	}
	if len(res.Files) != 1 || !strings.HasPrefix(string(res.Files[0].Data), "\x89PNG") {
		t.Fatalf("want the open figure back as one PNG, got %+v", res.Files)
	}
	// Files already returned do not come back unless they change.
	if res := cell(t, rt, id, "print(1)"); len(res.Files) != 0 {
		t.Errorf("unchanged files returned again: %+v", res.Files)
	}
	f, err := rt.ReadFile(ctx, id, "data/points.csv")
	if err != nil || !strings.HasPrefix(string(f.Data), "x,y") {
		t.Errorf("read: %v %q", err, f.Data)
	}
	cell(t, rt, id, "import os; os.symlink('/etc/shadow', 'shadow')")
	if _, err := rt.ReadFile(ctx, id, "shadow"); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("reading a link: %v, want a refusal", err)
	}
	if _, err := rt.ReadFile(ctx, id, "../etc/passwd"); err == nil {
		t.Error("reading ../etc/passwd succeeded")
	}
	list, err := rt.ListFiles(ctx, id, ".")
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]string{}
	for _, f := range list {
		kinds[f.Path] = f.Type
	}
	if kinds["data/points.csv"] != "file" || kinds["out/figure-1.png"] != "file" || kinds["shadow"] != "symlink" {
		t.Errorf("list: %v", kinds)
	}
}

func TestSessionsAreSeparate(t *testing.T) {
	rt := newTestRuntime(t, sandbox.Policy{})
	t.Cleanup(rt.CloseSessions)
	a, b := newSession(t, rt, "bash"), newSession(t, rt, "bash")
	cell(t, rt, a, "echo secret > mine; sleep 300 &")
	res := cell(t, rt, b, "ls /workspace; ls -d /proc/[0-9]* | wc -l; cat /proc/*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -c 'sleep [3]00' || true")
	if strings.Contains(res.Stdout, "mine") || !strings.HasSuffix(res.Stdout, "0\n") {
		t.Errorf("session b sees session a: %q", res.Stdout)
	}
	// Positive control: the same probe in session a finds its own sleep.
	if res := cell(t, rt, a, "cat /proc/*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -c 'sleep [3]00' || true"); res.Stdout != "1\n" {
		t.Errorf("the probe does not see session a's own process: %q", res.Stdout)
	}
}

func TestSessionLimitAndExpiry(t *testing.T) {
	if testing.Short() {
		t.Skip("starts nine sandboxes")
	}
	// Long enough that none expires while nine start on a loaded host.
	var endMu sync.Mutex
	ends := map[string]string{}
	rt := newTestRuntimeWith(t, func(cfg *testConfig) {
		cfg.Engine.Sessions = engine.SessionConfig{MaxSessions: 8, IdleTimeout: 15 * time.Second, MaxLifetime: time.Hour,
			OnEnd: func(info sandbox.SessionInfo, reason string) {
				endMu.Lock()
				ends[info.ID] = reason
				endMu.Unlock()
			}}
	})
	t.Cleanup(rt.CloseSessions)
	var ids []string
	for range 8 {
		ids = append(ids, newSession(t, rt, "bash"))
	}
	_, err := rt.CreateSession(context.Background(), sandbox.SessionSpec{Language: "bash"})
	if !errors.Is(err, sandbox.ErrTooManySessions) || !strings.Contains(err.Error(), "8") {
		t.Errorf("ninth session: %v, want ErrTooManySessions naming the limit", err)
	}
	// Idle sessions expire, and take their sandboxes with them.
	deadline := time.Now().Add(60 * time.Second)
	for len(rt.ListSessions()) > 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if n := len(rt.ListSessions()); n > 0 {
		t.Fatalf("%d sessions still live 60s after their 15s idle timeout", n)
	}
	// A session leaves the list as it starts closing; its end is reported
	// once its sandbox is gone.
	for ended := 0; ended < len(ids) && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		endMu.Lock()
		ended = len(ends)
		endMu.Unlock()
	}
	endMu.Lock()
	for _, id := range ids {
		if ends[id] != "idle timeout" {
			t.Errorf("session %s ended with %q reported, want \"idle timeout\"", id, ends[id])
		}
	}
	endMu.Unlock()
	if _, err := rt.RunInSession(context.Background(), ids[0], sandbox.Job{Code: "true"}); !errors.Is(err, sandbox.ErrNoSession) || !strings.Contains(err.Error(), "create a new session") {
		t.Errorf("expired session: %v, want ErrNoSession telling to create one", err)
	}
	assertNothingLeft(t, rt, nil)
}

func TestSessionSurvivesOOMWithFreshSandbox(t *testing.T) {
	rt := newTestRuntime(t, sandbox.Policy{})
	t.Cleanup(rt.CloseSessions)
	info, err := rt.CreateSession(context.Background(), sandbox.SessionSpec{Language: "python", Limits: sandbox.Limits{MemoryBytes: 256 * sandbox.MiB}})
	if err != nil {
		t.Fatal(err)
	}
	cell(t, rt, info.ID, "x = 1")
	res := cell(t, rt, info.ID, "b = bytearray(1 << 30)", sandbox.Limits{Timeout: 30 * time.Second})
	if res.Status != sandbox.StatusOOM || !res.StateLost {
		t.Fatalf("allocation: %s (%s), state lost %v; want oom with the state lost", res.Status, res.Message, res.StateLost)
	}
	if res := cell(t, rt, info.ID, "print(globals().get('x', 'fresh'))"); res.Status != sandbox.StatusOK || res.Stdout != "fresh\n" {
		t.Errorf("next call: %s %q, want a fresh interpreter", res.Status, res.Stdout)
	}
}

func TestCloseSessionLeavesNothing(t *testing.T) {
	rt := newTestRuntime(t, sandbox.Policy{})
	id := newSession(t, rt, "python")
	cell(t, rt, id, "import threading, time\nthreading.Thread(target=time.sleep, args=(600,), daemon=True).start()")
	if err := rt.CloseSession(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	assertNothingLeft(t, rt, nil)
	if err := rt.CloseSession(context.Background(), id); !errors.Is(err, sandbox.ErrNoSession) {
		t.Errorf("closing twice: %v", err)
	}
}

// TestReapStale leaves a run directory as a killed server would, and checks
// that a new Runtime removes it.
func TestReapStale(t *testing.T) {
	rt := newTestRuntime(t, sandbox.Policy{})
	p, err := rt.g.startSandbox(engine.StartSpec{Job: sandbox.Job{Language: "bash", Limits: sandbox.DefaultLimits}, KeepAlive: true}, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(p.Events()).ReadString('\n'); err != nil {
		t.Fatalf("no Ready event from the agent: %v", err)
	}
	forgetSandbox(rt, p)
	if _, err := os.Stat(filepath.Join(rt.cfg.StateDir, p.id)); err != nil {
		t.Fatal(err)
	}
	rt2, err := startStack(rt.cfg)
	if err != nil {
		t.Fatal(err)
	}
	<-p.exited // the reaper killed runsc
	assertNothingLeft(t, rt2, []string{p.id})
}

// forgetSandbox forgets p without cleaning up, as a SIGKILLed server
// would: the lock and the bookkeeping go with the process, runsc and the
// sandbox stay, for the next server's reaper.
func forgetSandbox(rt *testRuntime, p *sandboxProc) {
	p.lock.Close()
	rt.g.live.Done()
	rt.g.liveN.Add(-1)
}

// TestBackgroundSandboxCPU: a refill's sandbox starts at the lowest CPU
// weight, reports the CPU its cgroup used (what the pool judges its
// progress by), and gets a run's weight when raised.
func TestBackgroundSandboxCPU(t *testing.T) {
	rt := newTestRuntime(t, sandbox.Policy{})
	p, err := rt.g.startSandbox(engine.StartSpec{Job: sandbox.Job{Language: "bash", Limits: sandbox.DefaultLimits}, KeepAlive: true, Background: true}, "")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Destroy()
	if _, err := bufio.NewReader(p.Events()).ReadString('\n'); err != nil {
		t.Fatalf("no Ready event from the agent: %v", err)
	}
	used, err := p.CPUUsed()
	if len(p.cg.paths) == 0 {
		// Runs get no cgroup here (rootless on cgroup v1): no meter, and
		// the pool judges refills by their duration instead.
		if err == nil {
			t.Fatalf("CPUUsed without a cgroup = %v, want an error", used)
		}
		return
	}
	if err != nil || used <= 0 {
		t.Fatalf("CPUUsed after the agent started = %v, %v; want some CPU", used, err)
	}
	shares := func() string {
		if dir, ok := p.cg.paths[""]; ok {
			data, _ := os.ReadFile(filepath.Join(dir, "cpu.weight"))
			return strings.TrimSpace(string(data))
		}
		data, _ := os.ReadFile(filepath.Join(p.cg.paths["cpu"], "cpu.shares"))
		return strings.TrimSpace(string(data))
	}
	if got := shares(); got != cpuSharesBackground && got != cpuWeightBackground {
		t.Errorf("a background sandbox's CPU weight is %q", got)
	}
	p.Foreground()
	if got := shares(); got != cpuSharesDefault && got != cpuWeightDefault {
		t.Errorf("a raised sandbox's CPU weight is %q", got)
	}
	if err := p.Destroy(); err != nil {
		t.Fatal(err)
	}
	assertNothingLeft(t, rt, nil)
}
