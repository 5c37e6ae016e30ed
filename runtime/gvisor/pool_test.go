package gvisor

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/safe-run/safe-run/runtime/engine"
	"github.com/safe-run/safe-run/sandbox"
)

// newPoolRuntime returns a test Runtime with a pool of one sandbox for each
// of langs, restored from checkpoints in a directory of the test's own.
func newPoolRuntime(t *testing.T, langs ...string) *testRuntime {
	t.Helper()
	sizes := map[string]int{}
	for _, l := range langs {
		sizes[l] = 1
	}
	ckpt := filepath.Join(t.TempDir(), "checkpoints")
	return newTestRuntimeWith(t, func(cfg *testConfig) {
		cfg.Engine.Pool = engine.PoolConfig{Size: sizes}
		cfg.CheckpointDir = ckpt
	})
}

// waitPooled waits until lang's pool holds a ready sandbox and returns its
// ID, which the next run of lang must report.
func waitPooled(t *testing.T, rt *testRuntime, lang string) string {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute) // a first checkpoint build included, on a loaded host
	for time.Now().Before(deadline) {
		if id := pooledSandbox(rt, lang); id != "" {
			return id
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("the %s pool did not fill within 3 minutes", lang)
	return ""
}

// pooledSandbox returns the ID of a sandbox waiting in lang's pool, by the
// marker its run directory holds, or "".
func pooledSandbox(rt *testRuntime, lang string) string {
	markers, _ := filepath.Glob(filepath.Join(rt.cfg.StateDir, "*", pooledMarker))
	for _, m := range markers {
		if l, err := os.ReadFile(m); err == nil && strings.TrimSpace(string(l)) == lang {
			return filepath.Base(filepath.Dir(m))
		}
	}
	return ""
}

// restored says whether the sandbox id was restored from a checkpoint: its
// runsc was started with `restore`.
func restored(rt *testRuntime, id string) bool {
	for _, pid := range processesNaming([]byte(filepath.Join(rt.cfg.StateDir, id) + "/")) {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if bytes.Contains(cmdline, []byte("\x00restore\x00")) {
			return true
		}
	}
	return false
}

// TestPoolRefillsFromCheckpoint checks that the pool refills after each
// run, that refills after the first are restored from the checkpoint
// image, and that restored sandboxes do not share random numbers.
func TestPoolRefillsFromCheckpoint(t *testing.T) {
	rt := newPoolRuntime(t, "python")
	code := "import random, numpy as np, tempfile, os\nprint(random.random(), np.random.rand(), os.path.basename(tempfile.mktemp()))"
	seen := map[string]bool{}
	for i := range 3 {
		id := waitPooled(t, rt, "python")
		if i > 0 && !restored(rt, id) {
			t.Errorf("refill %d was a cold start, not a restore", i)
		}
		res := mustRun(t, rt, sandbox.Job{Language: "python", Code: code})
		wantStatus(t, res, sandbox.StatusOK)
		if seen[res.Stdout] {
			t.Errorf("run %d repeated the random numbers of an earlier one: %s", i, res.Stdout)
		}
		seen[res.Stdout] = true
	}
	images, _ := filepath.Glob(filepath.Join(rt.cfg.CheckpointDir, "python-*", checkpointDone))
	if len(images) != 1 {
		t.Errorf("checkpoint images: %v, want exactly one complete", images)
	}
	waitPooled(t, rt, "python") // refilled after the last run too
}

// TestPoolRestoredRunEndsByName checks that a run in a sandbox restored
// from the checkpoint ends when the warm driver names its end, not at the
// exit of its process: the agent reads the name through /proc/PID/comm,
// opened before the checkpoint, and the pidfd made at the driver's fork
// watches it; both must work in the restored sandbox. The program names
// itself as the driver does at its end, closes its stdio and sleeps past
// the job's timeout, which would end the run if the name went unread.
func TestPoolRestoredRunEndsByName(t *testing.T) {
	rt := newPoolRuntime(t, "python")
	job := sandbox.Job{Language: "python", Limits: sandbox.Limits{Timeout: 20 * time.Second}, Code: `import ctypes, os, time
print("named", flush=True)
ctypes.CDLL(None).prctl(15, b"srexit:7", 0, 0, 0)
os.closerange(0, 3)
time.sleep(60)
`}
	for i := range 2 {
		id := waitPooled(t, rt, "python")
		if i > 0 && !restored(rt, id) {
			t.Fatalf("refill %d was a cold start, not a restore", i)
		}
		res := mustRun(t, rt, job)
		if res.SandboxID != id || res.ExitCode != 7 || res.Stdout != "named\n" || res.Status == sandbox.StatusTimeout {
			t.Errorf("run %d in %s (pooled %s): status %s, exit code %d, stdout %q; want code 7 from the name, with the output",
				i, res.SandboxID, id, res.Status, res.ExitCode, res.Stdout)
		}
	}
}

// TestPoolSameResults runs the same jobs with the pool off and on and
// compares what matters of the results.
func TestPoolSameResults(t *testing.T) {
	jobs := []sandbox.Job{
		{Language: "python", Code: "import sys\nprint('out'); print('err', file=sys.stderr); sys.exit(3)"},
		{Language: "python", Code: "import sys\nprint(__name__, sys.argv, sys.stdin.read())", Stdin: []byte("in")},
		{Language: "python", Code: "def f():\n    raise ValueError('boom')\nf()"},
		{Language: "python", Code: "import data\nprint(data.X)", Files: []sandbox.File{{Path: "data.py", Data: []byte("X = 42")}}},
		{Language: "python", Code: "open('out/a.txt', 'w').write('file')", OutputDir: "out"},
		{Language: "python", Code: "print('started', flush=True)\nwhile True: pass", Limits: sandbox.Limits{Timeout: time.Second}},
		{Language: "python", Code: "import os\nos.kill(os.getpid(), 9)"},
		{Language: "python", Code: "b = bytearray(1 << 30)\nb[::4096] = b'x' * (len(b) // 4096)"},
		{Language: "node", Code: "console.log(require.main === module, process.argv.length); process.exit(5)"},
		{Language: "bash", Code: "echo $0 $BASH_VERSION >/dev/null; echo hi; exit 7"},
	}
	run := func(rt *testRuntime, wait bool) []sandbox.Result {
		var out []sandbox.Result
		for _, job := range jobs {
			if wait {
				waitPooled(t, rt, job.Language)
			}
			out = append(out, mustRun(t, rt, job))
		}
		return out
	}
	cold := run(newTestRuntime(t, sandbox.Policy{}), false)
	warm := run(newPoolRuntime(t, "python", "node", "bash"), true)
	for i := range jobs {
		c, w := cold[i], warm[i]
		// Tracebacks name the same file and line either way.
		if c.Status != w.Status || c.ExitCode != w.ExitCode || c.Signal != w.Signal || c.Stdout != w.Stdout || c.Stderr != w.Stderr ||
			len(c.Files) != len(w.Files) || (len(c.Files) > 0 && string(c.Files[0].Data) != string(w.Files[0].Data)) {
			t.Errorf("job %d (%s %q) differs:\ncold: %s %d %q stdout %q stderr %q files %v\nwarm: %s %d %q stdout %q stderr %q files %v",
				i, jobs[i].Language, jobs[i].Code,
				c.Status, c.ExitCode, c.Signal, c.Stdout, c.Stderr, c.Files,
				w.Status, w.ExitCode, w.Signal, w.Stdout, w.Stderr, w.Files)
		}
	}
}

// TestPoolOnlyForItsLimits checks that a job with limits the pooled
// sandboxes were not built with starts cold, leaving the pool alone.
func TestPoolOnlyForItsLimits(t *testing.T) {
	rt := newPoolRuntime(t, "bash")
	pooled := waitPooled(t, rt, "bash")
	res := mustRun(t, rt, sandbox.Job{Language: "bash", Code: "echo hi", Limits: sandbox.Limits{MemoryBytes: 256 * sandbox.MiB}})
	wantStatus(t, res, sandbox.StatusOK)
	if res.SandboxID == pooled {
		t.Fatal("a job with its own memory limit ran in a pooled sandbox built with another")
	}
	res = mustRun(t, rt, sandbox.Job{Language: "bash", Code: "echo hi", Limits: sandbox.Limits{Timeout: 5 * time.Second, OutputBytes: 4096}})
	if res.SandboxID != pooled {
		t.Fatal("a job that differs only in timeout and output cap did not use the pooled sandbox")
	}
	if _, err := os.Stat(rt.cfg.StateDir); err != nil {
		t.Fatal(err)
	}
}

// TestPoolOnlyForItsImage checks that a job naming an image of its own
// starts cold in that image, leaving the pool's sandbox, of the language's
// image, alone.
func TestPoolOnlyForItsImage(t *testing.T) {
	rt := newTestRuntimeWith(t, func(cfg *testConfig) {
		cfg.Engine.Pool = engine.PoolConfig{Size: map[string]int{"bash": 1}}
		cfg.Engine.Policy.Images = []string{"other"}
		rootfs := cfg.Rootfs
		cfg.Images = func(ref string) (Image, error) {
			return Image{Rootfs: rootfs, Env: []string{"GREETING=from-" + ref}}, nil
		}
	})
	pooled := waitPooled(t, rt, "bash")
	res := mustRun(t, rt, sandbox.Job{Language: "bash", Code: `echo "$GREETING"`, Image: "other"})
	wantStatus(t, res, sandbox.StatusOK)
	if res.SandboxID == pooled || res.Stdout != "from-other\n" {
		t.Fatalf("a job naming its own image ran in %s (pooled %s) with output %q", res.SandboxID, pooled, res.Stdout)
	}
	res = mustRun(t, rt, sandbox.Job{Language: "bash", Code: `echo "$GREETING"`})
	wantStatus(t, res, sandbox.StatusOK)
	if res.SandboxID != pooled || res.Stdout != "\n" {
		t.Fatalf("a job of the language's image ran in %s (pooled %s) with output %q", res.SandboxID, pooled, res.Stdout)
	}
}
