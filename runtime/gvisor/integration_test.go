package gvisor

// Integration tests: real runsc, real default image, real cgroups. They run
// under `make test` (SAFE_RUN_INTEGRATION=1), which builds everything they
// need; a plain `go test` without those parts skips them with a note.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/safe-run/safe-run/bundle"
	"github.com/safe-run/safe-run/rootfs"
	"github.com/safe-run/safe-run/runtime/engine"
	"github.com/safe-run/safe-run/sandbox"
)

func TestMain(m *testing.M) {
	standInHelperMain() // network tests start this binary as a stand-in network helper
	ShimMain()          // the runtime re-executes this test binary as its cgroup shim
	UserNamespaceMain() // run as an ordinary user, the tests run in a user namespace
	os.Exit(m.Run())
}

// testConfig is the configuration of a test's whole stack: the backend's,
// and the engine's over it (whose Backend is filled in).
type testConfig struct {
	Config
	Engine engine.Config
}

// testRuntime is the engine over a real gVisor backend, as cmd/ builds it.
type testRuntime struct {
	*engine.Engine
	g   *Backend
	cfg testConfig
}

// newTestRuntime returns the engine over the real runsc and default image,
// with a state directory of its own that must be empty when the test ends.
func newTestRuntime(t *testing.T, policy sandbox.Policy) *testRuntime {
	t.Helper()
	return newTestRuntimeWith(t, func(cfg *testConfig) { cfg.Engine.Policy = policy })
}

// newTestRuntimeWith is newTestRuntime with a configuration that configure
// completes.
func newTestRuntimeWith(t *testing.T, configure func(*testConfig)) *testRuntime {
	t.Helper()
	integration := os.Getenv("SAFE_RUN_INTEGRATION") == "1"
	missing := func(format string, args ...any) {
		t.Helper()
		if integration {
			t.Fatalf(format, args...)
		}
		t.Skipf("integration test needs runsc, the agent and the default image (run `make test`): "+format, args...)
	}
	runsc, agentPath := os.Getenv("SAFE_RUN_RUNSC"), os.Getenv("SAFE_RUN_AGENT")
	if runsc == "" || agentPath == "" {
		missing("SAFE_RUN_RUNSC and SAFE_RUN_AGENT are not set")
	}
	img, err := rootfs.Store{}.Lookup(rootfs.DefaultName)
	if err != nil {
		missing("%v", err)
	}
	stateDir := filepath.Join(t.TempDir(), "state")
	cfg := testConfig{Config: Config{Runsc: runsc, Agent: agentPath, Rootfs: img.Root, StateDir: stateDir}}
	configure(&cfg)
	rt, err := startStack(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { rt.Close(); assertNothingLeft(t, rt, nil) })
	return rt
}

// startStack builds the backend and the engine over it.
func startStack(cfg testConfig) (*testRuntime, error) {
	g, err := New(cfg.Config)
	if err != nil {
		return nil, err
	}
	cfg.Config = g.cfg // with its defaults
	cfg.Engine.Backend = g
	e, err := engine.New(cfg.Engine)
	if err != nil {
		return nil, err
	}
	return &testRuntime{Engine: e, g: g, cfg: cfg}, nil
}

func mustRun(t *testing.T, rt *testRuntime, job sandbox.Job) sandbox.Result {
	t.Helper()
	res, err := rt.Run(context.Background(), job)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return res
}

func wantStatus(t *testing.T, res sandbox.Result, want sandbox.Status) {
	t.Helper()
	if res.Status != want {
		t.Fatalf("status = %s, want %s\nmessage: %s\nstdout: %.2000s\nstderr: %.2000s", res.Status, want, res.Message, res.Stdout, res.Stderr)
	}
}

// assertNothingLeft checks the host after runs: the state directory is
// empty, and no cgroup, process or mount of any listed sandbox remains.
func assertNothingLeft(t *testing.T, rt *testRuntime, ids []string) {
	t.Helper()
	// Killed sandboxes' processes are reaped by the host's init, which can
	// take seconds; the runtime retries their cgroups' removal until then.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := rt.Wait(ctx); err != nil {
		t.Errorf("runs and cgroup removals not finished within a minute: %v", err)
	}
	entries, err := os.ReadDir(rt.cfg.StateDir)
	if err != nil {
		t.Errorf("read state dir: %v", err)
	}
	for _, e := range entries {
		t.Errorf("left in state dir: %s", e.Name())
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), rt.cfg.StateDir) {
		t.Errorf("a mount below %s is left:\n%s", rt.cfg.StateDir, grepLines(string(mounts), rt.cfg.StateDir))
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		cmdline, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if strings.Contains(string(cmdline), rt.cfg.StateDir) {
			t.Errorf("process left: %s %q", p, strings.ReplaceAll(string(cmdline), "\x00", " "))
		}
	}
	for _, id := range ids {
		for _, parent := range rt.g.cgroups.Parents {
			if _, err := os.Stat(filepath.Join(parent, id)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("cgroup left: %s", filepath.Join(parent, id))
			}
		}
	}
}

func grepLines(text, sub string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestHelloInEachLanguage(t *testing.T) {
	rt := newTestRuntime(t, sandbox.Policy{})
	for _, tc := range []struct{ lang, code string }{
		{"python", "print('hello from python')"},
		{"node", "console.log('hello from node')"},
		{"bash", "echo hello from bash"},
	} {
		t.Run(tc.lang, func(t *testing.T) {
			res := mustRun(t, rt, sandbox.Job{Language: tc.lang, Code: tc.code})
			wantStatus(t, res, sandbox.StatusOK)
			if want := "hello from " + tc.lang + "\n"; res.Stdout != want || res.ExitCode != 0 {
				t.Errorf("stdout = %q, exit %d; want %q, exit 0", res.Stdout, res.ExitCode, want)
			}
			if res.MemoryPeakBytes <= 0 {
				t.Errorf("memory_peak_bytes = %d, want the cgroup's figure", res.MemoryPeakBytes)
			}
			assertNothingLeft(t, rt, []string{res.SandboxID})
		})
	}
}

// TestIsolation runs probes inside the sandbox; each prints "PROBE-OK" only
// when the isolation property holds.
func TestIsolation(t *testing.T) {
	rt := newTestRuntime(t, sandbox.Policy{})
	marker := filepath.Join("/usr", fmt.Sprintf("safe-run-probe-%d", os.Getpid()))
	for _, tc := range []struct{ name, lang, code string }{
		{"runs as uid and gid 65534", "bash", `[ "$(id -u):$(id -g)" = 65534:65534 ] && echo PROBE-OK`},
		{"no capabilities and no new privileges", "bash",
			`grep -q '^CapEff:.0000000000000000$' /proc/self/status && grep -q '^NoNewPrivs:.1$' /proc/self/status && echo PROBE-OK`},
		{"writing to /usr fails", "python", fmt.Sprintf(`
try:
    open(%q, "w").write("x")
except OSError as e:
    print("PROBE-OK", e.strerror)`, marker)},
		{"writing to / and /etc fails", "bash", `! touch /x 2>/dev/null && ! touch /etc/x 2>/dev/null && echo PROBE-OK`},
		// Without root, the image's files may appear to be the program's own.
		{"image files cannot be changed, even their modes", "bash",
			`! chmod 777 /usr/bin/env 2>/dev/null && ! touch -m /usr/bin/env 2>/dev/null && [ "$(stat -c %a /usr/bin/env)" = 755 ] && echo PROBE-OK`},
		{"the workspace is writable and the cwd", "bash", `[ "$PWD" = /workspace ] && echo data > f && [ "$(cat f)" = data ] && echo PROBE-OK`},
		{"only a loopback interface", "python", `
names = [l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:]]
print("PROBE-OK" if names == ["lo"] else names)`},
		{"no outbound connection", "python", `
import socket
try:
    socket.create_connection(("1.1.1.1", 53), timeout=3)
except OSError as e:
    print("PROBE-OK", e)`},
		{"no name resolution", "python", `
import socket
try:
    socket.getaddrinfo("example.com", 80)
except OSError as e:
    print("PROBE-OK", e)`},
		{"gVisor is the kernel", "bash", `grep -qi gvisor /proc/version && echo PROBE-OK`},
		{"seccomp filter is active", "bash", `grep -q '^Seccomp:.2$' /proc/self/status && echo PROBE-OK`},
		{"denied calls fail: unshare and mount", "bash", `! unshare -U true 2>/dev/null && ! mount -t tmpfs none /tmp 2>/dev/null && echo PROBE-OK`},
		{"threads start (clone3 allowed)", "python", `
import threading
t = threading.Thread(target=lambda: None); t.start(); t.join(); print("PROBE-OK")`},
		{"environment is minimal", "python", `
import os
extra = set(os.environ) - {"PATH","HOME","TMPDIR","LANG","PYTHONUNBUFFERED","PYTHONDONTWRITEBYTECODE","MPLBACKEND","MPLCONFIGDIR","PWD","SHLVL","_","LC_CTYPE"}
print("PROBE-OK" if not extra else extra)`},
		{"process limit is RLIMIT_NPROC", "bash", `[ "$(ulimit -u)" = 128 ] && echo PROBE-OK`},
		{"no core dumps", "bash", `[ "$(ulimit -c)" = 0 ] && echo PROBE-OK`},
		{"workspace size is capped", "bash", `head -c 300M /dev/zero > big 2>/dev/null; [ $(stat -c %s big) -le $((256*1024*1024)) ] && echo PROBE-OK`},
		{"the agent is out of the program's reach", "bash",
			`! kill -9 1 2>/dev/null && ! cat /proc/1/environ >/dev/null 2>&1 && ! ls /proc/1/fd >/dev/null 2>&1 && echo PROBE-OK`},
		{"host processes are invisible", "bash", `[ "$(ls -d /proc/[0-9]* | wc -l)" -lt 10 ] && echo PROBE-OK`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := mustRun(t, rt, sandbox.Job{Language: tc.lang, Code: tc.code, Limits: sandbox.Limits{Timeout: 20 * time.Second}})
			if !strings.Contains(res.Stdout, "PROBE-OK") {
				t.Errorf("probe failed: status %s, stdout %q, stderr %q", res.Status, res.Stdout, res.Stderr)
			}
		})
	}
	if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the sandbox created %s on the host", marker)
		os.Remove(marker)
	}
}

func TestEnvironmentHidesServerSecrets(t *testing.T) {
	t.Setenv("SAFE_RUN_TEST_CANARY", "canary-4f1d")
	rt := newTestRuntime(t, sandbox.Policy{})
	// The agent (pid 1) is another user: its environment must be either
	// unreadable or as clean as the program's own.
	res := mustRun(t, rt, sandbox.Job{Language: "bash", Code: `env; tr '\0' '\n' < /proc/1/environ 2>/dev/null || echo agent-environ-denied`})
	wantStatus(t, res, sandbox.StatusOK)
	if strings.Contains(res.Stdout, "canary-4f1d") {
		t.Errorf("the server's environment reached the sandbox:\n%s", res.Stdout)
	}
	if !strings.Contains(res.Stdout, "PATH=") {
		t.Errorf("env output lacks PATH, so the probe did not run:\n%s", res.Stdout)
	}
}

func TestExitStatuses(t *testing.T) {
	rt := newTestRuntime(t, sandbox.Policy{})
	for _, tc := range []struct {
		name, lang, code string
		status           sandbox.Status
		exit             int
		signal           string
	}{
		{"non-zero exit", "python", "import sys; print('x'); sys.exit(3)", sandbox.StatusError, 3, ""},
		{"exception", "python", "raise ValueError('boom')", sandbox.StatusError, 1, ""},
		{"node throw", "node", "throw new Error('boom')", sandbox.StatusError, 1, ""},
		{"killed by a signal", "bash", "kill -SEGV $$", sandbox.StatusKilled, -1, "SIGSEGV"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := mustRun(t, rt, sandbox.Job{Language: tc.lang, Code: tc.code})
			wantStatus(t, res, tc.status)
			if res.ExitCode != tc.exit || res.Signal != tc.signal {
				t.Errorf("exit %d signal %q, want %d %q", res.ExitCode, res.Signal, tc.exit, tc.signal)
			}
		})
	}
}

func TestFilesAndStdin(t *testing.T) {
	rt := newTestRuntime(t, sandbox.Policy{})
	res := mustRun(t, rt, sandbox.Job{
		Language: "python",
		Code: `
import sys, os, helper
print(helper.VALUE, open("data/in.csv").read().strip(), sys.stdin.read().strip())
print(oct(os.stat("tool.sh").st_mode & 0o777), oct(os.stat("data/in.csv").st_mode & 0o777))`,
		Files: []sandbox.File{
			{Path: "helper.py", Data: []byte("VALUE = 'imported'\n")},
			{Path: "data/in.csv", Data: []byte("a,b\n")},
			{Path: "tool.sh", Data: []byte("#!/bin/sh\n"), Executable: true},
		},
		Stdin: []byte("from-stdin\n"),
	})
	wantStatus(t, res, sandbox.StatusOK)
	if want := "imported a,b from-stdin\n0o755 0o644\n"; res.Stdout != want {
		t.Errorf("stdout = %q, want %q", res.Stdout, want)
	}
}

func TestDataScienceStack(t *testing.T) {
	rt := newTestRuntime(t, sandbox.Policy{})
	res := mustRun(t, rt, sandbox.Job{Language: "python", Limits: sandbox.Limits{Timeout: 60 * time.Second}, Code: `
import numpy as np, pandas as pd, matplotlib
import matplotlib.pyplot as plt
df = pd.DataFrame({"x": np.arange(5), "y": np.arange(5) ** 2})
df.plot(x="x", y="y"); plt.savefig("/workspace/plot.png")
import os
print(matplotlib.get_backend(), int(df.y.sum()), os.path.getsize("/workspace/plot.png") > 1000)`})
	wantStatus(t, res, sandbox.StatusOK)
	if want := "agg 30 true\n"; strings.ToLower(res.Stdout) != want {
		t.Errorf("stdout = %q, want %q (stderr %q)", res.Stdout, want, res.Stderr)
	}
}

func TestTimeoutKeepsPartialOutput(t *testing.T) {
	rt := newTestRuntime(t, sandbox.Policy{})
	for _, tc := range []struct{ lang, code string }{
		{"python", "print('started', flush=True)\nwhile True: pass"},
		{"bash", "echo started; while :; do :; done"},
	} {
		t.Run(tc.lang, func(t *testing.T) {
			const timeout = 2 * time.Second
			// The timeout counts from the program's start, so the bound
			// does too: the program has started by the time its first
			// output arrives, not by the time Run was called (the sandbox
			// may take long to boot on a busy host).
			started := &firstWrite{}
			res := mustRun(t, rt, sandbox.Job{Language: tc.lang, Code: tc.code, Limits: sandbox.Limits{Timeout: timeout}, Stdout: started})
			done := time.Now()
			wantStatus(t, res, sandbox.StatusTimeout)
			if !strings.Contains(res.Stdout, "started") {
				t.Errorf("partial output lost: stdout %q", res.Stdout)
			}
			// The bound: the result is back within timeout + 1 s.
			if at, ok := started.at(); !ok {
				t.Errorf("no output was streamed")
			} else if elapsed := done.Sub(at); elapsed > timeout+time.Second {
				t.Errorf("timeout result came %v after the program's first output, want at most %v", elapsed, timeout+time.Second)
			}
			assertNothingLeft(t, rt, []string{res.SandboxID})
		})
	}
}

// TestFileMetadataCountsTowardMemory creates empty files until the run
// ends: gVisor keeps their metadata in its own heap, not in the memory the
// program allocates, and the run must still end out of memory — by the
// cgroup as root, by the memory watch (which adds the sentry's heap)
// without one.
func TestFileMetadataCountsTowardMemory(t *testing.T) {
	rt := newTestRuntime(t, sandbox.Policy{})
	res := mustRun(t, rt, sandbox.Job{Language: "python", Code: `
n = 0
while True:
    n += 1
    open("/tmp/f%d" % n, "w").close()
    if n % 50000 == 0:
        print(n, "files", flush=True)`,
		Limits: sandbox.Limits{MemoryBytes: 64 * sandbox.MiB, Timeout: 120 * time.Second}})
	wantStatus(t, res, sandbox.StatusOOM)
	if limit := int64(64*sandbox.MiB) + bundle.MemoryHeadroom; res.MemoryPeakBytes < limit/2 {
		t.Errorf("memory peak %d MiB, want near the %d MiB the sandbox may use", res.MemoryPeakBytes>>20, limit>>20)
	}
	t.Logf("out of memory after %q; peak %.1f MiB", lastLine([]byte(res.Stdout)), float64(res.MemoryPeakBytes)/(1<<20))
	assertNothingLeft(t, rt, []string{res.SandboxID})
}

// firstWrite is a live output writer that notes when output first came.
type firstWrite struct {
	mu   sync.Mutex
	when time.Time
}

func (w *firstWrite) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.when.IsZero() && len(p) > 0 {
		w.when = time.Now()
	}
	return len(p), nil
}

func (w *firstWrite) at() (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.when, !w.when.IsZero()
}

func TestMemoryLimitIsOOM(t *testing.T) {
	rt := newTestRuntime(t, sandbox.Policy{})
	for _, tc := range []struct{ lang, code string }{
		{"python", "x = bytearray(1 << 30)\nprint('allocated', len(x))"},
		{"node", "const b = []; for (;;) { b.push(Buffer.alloc(64 << 20, 1)); }"},
	} {
		t.Run(tc.lang, func(t *testing.T) {
			res := mustRun(t, rt, sandbox.Job{Language: tc.lang, Code: tc.code,
				Limits: sandbox.Limits{MemoryBytes: 256 * sandbox.MiB, Timeout: 30 * time.Second}})
			wantStatus(t, res, sandbox.StatusOOM)
			if strings.Contains(res.Stdout, "allocated") {
				t.Errorf("the allocation succeeded: %q", res.Stdout)
			}
			assertNothingLeft(t, rt, []string{res.SandboxID})
		})
	}
}

func TestForkBombEndsWithinTimeout(t *testing.T) {
	rt := newTestRuntime(t, sandbox.Policy{})
	for _, tc := range []struct{ lang, code string }{
		{"bash", "f() { f | f & }; f; wait; sleep 60"},
		{"python", "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass"},
	} {
		t.Run(tc.lang, func(t *testing.T) {
			const timeout = 3 * time.Second
			start := time.Now()
			res := mustRun(t, rt, sandbox.Job{Language: tc.lang, Code: tc.code, Limits: sandbox.Limits{Timeout: timeout}})
			elapsed := time.Since(start)
			// Contained either way: the process limit stops the forking, and
			// the copies either sit until the wall timeout or together exceed
			// the memory limit first.
			if res.Status != sandbox.StatusTimeout && res.Status != sandbox.StatusOOM {
				t.Errorf("status = %s (%s), want timeout or oom", res.Status, res.Message)
			}
			if elapsed > timeout+2*time.Second {
				t.Errorf("fork bomb run took %v, want it ended at its %v timeout", elapsed, timeout)
			}
			assertNothingLeft(t, rt, []string{res.SandboxID})
		})
	}
}

func TestOutputIsCapped(t *testing.T) {
	rt := newTestRuntime(t, sandbox.Policy{})
	const total = 100_000_000
	res := mustRun(t, rt, sandbox.Job{Language: "python", Limits: sandbox.Limits{Timeout: 60 * time.Second}, Code: fmt.Sprintf(`
import sys
sys.stdout.write("HEAD")
chunk = "x" * 1_000_000
for _ in range(%d // 1_000_000 - 1): sys.stdout.write(chunk)
sys.stdout.write("x" * (1_000_000 - 8) + "TAIL")
sys.stdout.flush()`, total)})
	wantStatus(t, res, sandbox.StatusOK)
	if !res.StdoutTruncated || res.StdoutBytes != total {
		t.Errorf("truncated %v, bytes %d; want true, %d", res.StdoutTruncated, res.StdoutBytes, total)
	}
	limit := int(sandbox.DefaultLimits.OutputBytes)
	if len(res.Stdout) > limit+200 {
		t.Errorf("kept %d bytes of stdout, over the %d cap", len(res.Stdout), limit)
	}
	if !strings.HasPrefix(res.Stdout, "HEAD") || !strings.HasSuffix(res.Stdout, "TAIL") || !strings.Contains(res.Stdout, "omitted") {
		t.Errorf("want head, omission marker and tail; got %.20q ... %.20q", res.Stdout[:20], res.Stdout[len(res.Stdout)-20:])
	}
}

func TestCancelKillsTheSandbox(t *testing.T) {
	rt := newTestRuntime(t, sandbox.Policy{})
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(1500*time.Millisecond, cancel)
	start := time.Now()
	res, err := rt.Run(ctx, sandbox.Job{Language: "bash", Code: "echo waiting; sleep 60"})
	if err != nil {
		t.Fatal(err)
	}
	wantStatus(t, res, sandbox.StatusKilled)
	if time.Since(start) > 10*time.Second {
		t.Errorf("cancelled run took %v to return", time.Since(start))
	}
	assertNothingLeft(t, rt, []string{res.SandboxID})
}

func TestMissingInterpreterIsSandboxError(t *testing.T) {
	rt := newTestRuntime(t, sandbox.Policy{Languages: []sandbox.Language{
		{Name: "ruby", Filename: "main.rb", Command: []string{"ruby", "main.rb"}},
	}})
	res := mustRun(t, rt, sandbox.Job{Language: "ruby", Code: "puts 1"})
	wantStatus(t, res, sandbox.StatusSandboxError)
	if !strings.Contains(res.Message, "ruby") {
		t.Errorf("message %q does not name the missing interpreter", res.Message)
	}
}

func TestInvalidJobIsInputError(t *testing.T) {
	rt := newTestRuntime(t, sandbox.Policy{})
	_, err := rt.Run(context.Background(), sandbox.Job{Language: "cobol", Code: "x"})
	var in *sandbox.InputError
	if !errors.As(err, &in) || in.Field != "language" {
		t.Fatalf("err = %v, want an InputError on language", err)
	}
}

func TestConcurrentRunsAreSeparate(t *testing.T) {
	rt := newTestRuntime(t, sandbox.Policy{})
	const n = 4
	var wg sync.WaitGroup
	results := make([]sandbox.Result, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], _ = rt.Run(context.Background(), sandbox.Job{Language: "bash",
				Code: fmt.Sprintf("echo %d > mine; sleep 1; ls /workspace; cat mine", i)})
		}()
	}
	wg.Wait()
	var ids []string
	for i, res := range results {
		wantStatus(t, res, sandbox.StatusOK)
		if want := fmt.Sprintf("main.sh\nmine\n%d\n", i); res.Stdout != want {
			t.Errorf("run %d saw %q, want %q", i, res.Stdout, want)
		}
		ids = append(ids, res.SandboxID)
	}
	assertNothingLeft(t, rt, ids)
}

func TestFiftyRunsLeaveNothingBehind(t *testing.T) {
	rt := newTestRuntime(t, sandbox.Policy{})
	var ids []string
	for i := range 50 {
		job := sandbox.Job{Language: "bash", Code: fmt.Sprintf("echo run %d", i)}
		switch i % 5 {
		case 1:
			job.Code = "exit 7"
		case 2:
			job = sandbox.Job{Language: "python", Code: "print(sum(range(10)))"}
		case 3:
			job = sandbox.Job{Language: "bash", Code: "sleep 5 & echo background", Limits: sandbox.Limits{Timeout: 5 * time.Second}}
		case 4:
			job = sandbox.Job{Language: "bash", Code: "while :; do :; done", Limits: sandbox.Limits{Timeout: 100 * time.Millisecond}}
		}
		res := mustRun(t, rt, job)
		if res.Status == sandbox.StatusSandboxError {
			t.Fatalf("run %d: sandbox error: %s", i, res.Message)
		}
		ids = append(ids, res.SandboxID)
	}
	assertNothingLeft(t, rt, ids)
}

func TestOutputFilesComeBackWithoutFollowingLinks(t *testing.T) {
	rt := newTestRuntime(t, sandbox.Policy{})
	res := mustRun(t, rt, sandbox.Job{Language: "python", OutputDir: "out", Limits: sandbox.Limits{Timeout: 60 * time.Second}, Code: `
import os
import matplotlib.pyplot as plt
os.makedirs("out/data", exist_ok=True)
plt.plot([1, 3, 2]); plt.savefig("out/plot.png")
open("out/data/result.csv", "w").write("a,b\n1,2\n")
os.symlink("/etc/shadow", "out/shadow")
os.symlink("/proc/1/root/etc/hostname", "out/hostname")`})
	wantStatus(t, res, sandbox.StatusOK)
	byPath := map[string]sandbox.OutputFile{}
	for _, f := range res.Files {
		byPath[f.Path] = f
	}
	if f := byPath["plot.png"]; !strings.HasPrefix(string(f.Data), "\x89PNG") {
		t.Errorf("plot.png = %d bytes (%q), want a PNG", len(f.Data), f.Skipped)
	}
	if f := byPath["data/result.csv"]; string(f.Data) != "a,b\n1,2\n" {
		t.Errorf("data/result.csv = %q", f.Data)
	}
	for _, link := range []string{"shadow", "hostname"} {
		if f, ok := byPath[link]; !ok || f.Data != nil || !strings.Contains(f.Skipped, "symbolic link") {
			t.Errorf("%s = %+v, want listed as a link that was not followed", link, f)
		}
	}
}
