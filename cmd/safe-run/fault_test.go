package main

// Faults of the host rather than of the code: a broken runsc, a sandbox
// killed from outside, a server killed and started again, a full state
// directory. Each must end in a clear error or an honest sandbox_error, and
// leave nothing behind. As root, and as an ordinary user with its state in
// $XDG_RUNTIME_DIR, safe-run's default there (scripts/test-rootless.sh).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"golang.org/x/sys/unix"

	"github.com/safe-run/safe-run/runtime/gvisor"
	"github.com/safe-run/safe-run/sandbox"
)

// faultStateDir is a fresh state directory for one fault: below the test's
// temporary directory for root, and for an ordinary user below
// $XDG_RUNTIME_DIR, where its safe-run keeps state unless told otherwise.
func faultStateDir(t *testing.T) string {
	t.Helper()
	if gvisor.HostRoot() {
		return filepath.Join(t.TempDir(), "state")
	}
	xdg := os.Getenv("XDG_RUNTIME_DIR")
	if xdg == "" {
		t.Fatal("XDG_RUNTIME_DIR is not set: an ordinary user's safe-run keeps its state there")
	}
	dir, err := os.MkdirTemp(xdg, "fault-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "state")
}

func TestFaultBrokenRunsc(t *testing.T) {
	binary(t)
	dir := t.TempDir()
	notExecutable := filepath.Join(dir, "runsc-0644")
	os.WriteFile(notExecutable, []byte("not a program"), 0o644)
	garbage := filepath.Join(dir, "runsc-garbage")
	os.WriteFile(garbage, []byte("\x7fELF but not really"), 0o755)
	for _, tc := range []struct {
		name, runsc string
		want        string // in run's error
	}{
		{"missing", filepath.Join(dir, "nonexistent"), "runsc not found at"},
		{"not executable", notExecutable, "is not an executable file"},
		{"a directory", dir, "is not an executable file"},
		{"not a program", garbage, "is not a program"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stateDir := faultStateDir(t)
			r := safeRun(t, "", "run", "--runsc", tc.runsc, "--state-dir", stateDir, "--lang", "bash", "-c", "echo hi")
			lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
			if r.code != exitSandboxError || r.stdout != "" || !strings.Contains(r.stderr, tc.want) || !strings.Contains(r.stderr, "make runsc") || len(lines) != 1 {
				t.Errorf("run: exit %d, stdout %q, stderr %q; want exit 125 and one line containing %q and the fix", r.code, r.stdout, r.stderr, tc.want)
			}
			d := safeRun(t, "", "doctor", "--json", "--runsc", tc.runsc, "--state-dir", stateDir)
			var report struct {
				OK     bool    `json:"ok"`
				Checks []check `json:"checks"`
			}
			if err := json.Unmarshal([]byte(d.stdout), &report); err != nil {
				t.Fatalf("doctor --json: %v\n%s", err, d.stdout)
			}
			var runsc *check
			for i := range report.Checks {
				if report.Checks[i].Name == "runsc" {
					runsc = &report.Checks[i]
				}
			}
			if d.code != 1 || report.OK || runsc == nil || runsc.OK || !strings.Contains(runsc.Fix, "make runsc") {
				t.Errorf("doctor: exit %d, ok %v, runsc check %+v; want a failing runsc check with the fix", d.code, report.OK, runsc)
			}
			assertNoLeftovers(t, testCgroupParents(t), nil, stateDir)
		})
	}
}

// killSandboxProcesses SIGKILLs every process of the sandboxes of stateDir:
// runsc, its gofer and the sandbox itself.
func killSandboxProcesses(t *testing.T, stateDir string) int {
	t.Helper()
	n := 0
	for _, p := range sandboxProcesses(stateDir) {
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if err == nil && syscall.Kill(pid, syscall.SIGKILL) == nil {
			n++
		}
	}
	return n
}

func TestFaultSandboxKilledFromOutside(t *testing.T) {
	bin := binary(t)
	parents := testCgroupParents(t)
	t.Run("cli", func(t *testing.T) {
		stateDir := faultStateDir(t)
		cmd := exec.Command(bin, "run", "--json", "--state-dir", stateDir, "--lang", "bash", "-c", "echo started; sleep 60")
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		id := runCgroupOf(t, stateDir, 30*time.Second)
		time.Sleep(time.Second)
		if n := killSandboxProcesses(t, stateDir); n == 0 {
			t.Fatal("found no sandbox process to kill")
		}
		err := cmd.Wait()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != exitSandboxError {
			t.Errorf("safe-run run: %v, want exit 125", err)
		}
		var res sandbox.Result
		if err := json.Unmarshal(out.Bytes(), &res); err != nil {
			t.Fatalf("no JSON result: %v\n%s%s", err, out.String(), errOut.String())
		}
		if res.Status != sandbox.StatusSandboxError || res.Message == "" {
			t.Errorf("status %s, message %q; want sandbox_error saying what happened", res.Status, res.Message)
		}
		t.Logf("result: %s: %s", res.Status, res.Message)
		assertNoLeftovers(t, parents, []string{id}, stateDir)
	})
	t.Run("mcp", func(t *testing.T) {
		ts := startServerAt(t, "stdio", faultStateDir(t), nil)
		done := make(chan *threatRun, 1)
		go func() {
			done <- mcpRun(t, ts, map[string]any{"language": "python", "code": "import time\nprint('started', flush=True)\ntime.sleep(60)"})
		}()
		id := runCgroupOf(t, ts.stateDir, 30*time.Second)
		time.Sleep(time.Second)
		killSandboxProcesses(t, ts.stateDir)
		r := <-done
		if r.status != sandbox.StatusSandboxError || r.message == "" {
			t.Errorf("status %s, message %q; want sandbox_error", r.status, r.message)
		}
		if !r.mcp.IsError {
			t.Error("a sandbox error is not flagged isError")
		}
		if next := mcpRun(t, ts, map[string]any{"language": "bash", "code": "echo next"}); next.stdout != "next\n" {
			t.Errorf("the server does not serve after the kill: %+v", next)
		}
		assertNoLeftovers(t, parents, []string{id}, ts.stateDir)
	})
}

// TestFaultServerKilledAndRestarted kills the server with SIGKILL while a
// run is in progress, checks that this left state behind (so the reaper has
// work), starts the server again on the same state directory, and checks
// that the start-up removed the dead server's sandboxes, cgroups and
// directories. Without root the process killed is the one that serves, in
// its user namespace: the one the client started would pass a kill of its
// own on as SIGTERM, and the server would clean up.
func TestFaultServerKilledAndRestarted(t *testing.T) {
	bin := binary(t)
	parents := testCgroupParents(t)
	stateDir := faultStateDir(t)
	start := func() (*exec.Cmd, *client.Client, chan struct{}) {
		cmd := exec.Command(bin, "serve", "--http", "127.0.0.1:0", "--state-dir", stateDir, "--log-level", "info")
		stderr, _ := cmd.StderrPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		t.Cleanup(func() { stopServer(t, cmd, exited) })
		url := waitForURL(t, stderr)
		c := connectHTTP(t, url, "fault")
		t.Cleanup(func() { c.Close() })
		return cmd, c, exited
	}
	cmd, c, exited := start()
	t.Cleanup(func() {
		// The restarted server, stopped as an operator would, leaves nothing:
		// not even its warm pool.
		if entries := stateEntries(stateDir); len(entries) > 0 {
			t.Errorf("left in the state directory after the restarted server stopped: %v", entries)
		}
	})
	go func() {
		req := mcpgo.CallToolRequest{}
		req.Params.Name = "run_code"
		req.Params.Arguments = map[string]any{"language": "bash", "code": "echo started; sleep 120"}
		c.CallTool(context.Background(), req) // fails when the server dies
	}()
	id := runCgroupOf(t, stateDir, 30*time.Second)
	// A session too: a long-lived sandbox the dead server leaves.
	sreq := mcpgo.CallToolRequest{}
	sreq.Params.Name, sreq.Params.Arguments = "create_session", map[string]any{"language": "python"}
	if res, err := c.CallTool(context.Background(), sreq); err != nil || res.IsError {
		t.Fatalf("create_session: %v %v", err, res)
	}
	time.Sleep(time.Second)
	serving := serverPid(t, stateDir)
	if gvisor.HostRoot() != (serving == cmd.Process.Pid) {
		t.Fatalf("the serving process is %d, the one started %d: want the same as root, a child of it otherwise", serving, cmd.Process.Pid)
	}
	syscall.Kill(serving, syscall.SIGKILL)
	<-exited
	time.Sleep(time.Second)
	before := leftovers(parents, []string{id}, stateDir)
	t.Logf("left by the killed server: %d items", len(before))
	if len(stateEntries(stateDir)) < 2 {
		t.Fatalf("the killed server left %v in its state directory; want the run's and the session's directories, for the reaper to remove", stateEntries(stateDir))
	}
	stale := stateEntries(stateDir)

	cmd2, c2, exited2 := start()
	// The reaper ran before the server began serving; cgroup removal may
	// still be retried in the background while killed processes are reaped.
	assertNoLeftovers(t, parents, append(stale, id), stateDir)
	req := mcpgo.CallToolRequest{}
	req.Params.Name = "run_code"
	req.Params.Arguments = map[string]any{"language": "bash", "code": "echo after restart"}
	res, err := c2.CallTool(context.Background(), req)
	if err != nil || res.IsError || !strings.Contains(text(res), "after restart") {
		t.Errorf("the restarted server: %v %s", err, text(res))
	}
	stopServer(t, cmd2, exited2)
	assertNoLeftovers(t, parents, append(stale, id), stateDir)
}

// stopServer stops a server with SIGINT, as an operator would, and waits
// for it; a server that does not stop within a minute is killed.
func stopServer(t *testing.T, cmd *exec.Cmd, exited chan struct{}) {
	select {
	case <-exited:
		return
	default:
	}
	cmd.Process.Signal(os.Interrupt)
	select {
	case <-exited:
	case <-time.After(60 * time.Second):
		t.Errorf("the server did not stop within 60s of SIGINT")
		cmd.Process.Kill()
		<-exited
	}
}

// TestFaultStateDirFull puts the state directory on a small tmpfs that is
// full: runs fail with a clear error and leave no partial state; doctor
// says the state directory is not usable. An ordinary user cannot mount a
// tmpfs on the host, so its safe-run gets one in a user and mount namespace
// of the user's own — where it runs anyway — in $XDG_RUNTIME_DIR (itself a
// small tmpfs on desktops).
func TestFaultStateDirFull(t *testing.T) {
	binary(t)
	stateDir := faultStateDir(t)
	mnt := filepath.Dir(stateDir)
	if gvisor.HostRoot() {
		if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m,mode=0700"); err != nil {
			t.Fatalf("mount a tmpfs: %v", err)
		}
		t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
		if err := os.Mkdir(stateDir, 0o700); err != nil {
			t.Fatal(err)
		}
		f, err := os.Create(filepath.Join(mnt, "filler"))
		if err != nil {
			t.Fatal(err)
		}
		for {
			if _, err := f.Write(make([]byte, 4096)); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatal(err)
				}
				break
			}
		}
		f.Close()
	}
	// listing is where, without root, the namespace's shell lists what the
	// run left in the state directory before the tmpfs goes with it.
	listing := filepath.Join(t.TempDir(), "left")
	onFullStateDir := func(args ...string) cliResult {
		if gvisor.HostRoot() {
			return safeRun(t, "", args...)
		}
		script := `set -e
mount -t tmpfs -o size=1m,mode=0700 tmpfs "$MNT"
mkdir "$MNT/state"
if head -c 2M /dev/zero > "$MNT/filler" 2>/dev/null; then echo "the tmpfs did not fill" >&2; exit 99; fi
set +e
"$@"
status=$?
ls -A "$MNT/state" > "$LISTING"
exit $status`
		cmd := hostUserNamespace(context.Background(), append([]string{"/bin/sh", "-c", script, "sh", binary(t)}, args...)...)
		cmd.Env = append(os.Environ(), "MNT="+mnt, "LISTING="+listing)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			t.Fatalf("run in a user namespace: %v", err)
		}
		if cmd.ProcessState.ExitCode() == 99 {
			t.Fatalf("could not fill the state directory's tmpfs: %s", errOut.String())
		}
		if left, err := os.ReadFile(listing); err != nil || len(left) > 0 {
			t.Errorf("left in the full state directory: %q %v", left, err)
		}
		return cliResult{code: cmd.ProcessState.ExitCode(), stdout: out.String(), stderr: errOut.String()}
	}

	r := onFullStateDir("run", "--json", "--state-dir", stateDir, "--lang", "bash", "-c", "echo hi")
	var res sandbox.Result
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatalf("no JSON result (exit %d): %v\n%s%s", r.code, err, r.stdout, r.stderr)
	}
	t.Logf("result: %s: %s", res.Status, res.Message)
	if r.code != exitSandboxError || res.Status != sandbox.StatusSandboxError ||
		!strings.Contains(res.Message, "no space left on device") || !strings.Contains(res.Message, "--state-dir") {
		t.Errorf("exit %d, status %s, message %q; want sandbox_error naming the full state directory and the fix", r.code, res.Status, res.Message)
	}
	var ids []string
	if res.SandboxID != "" {
		ids = append(ids, res.SandboxID)
	}
	assertNoLeftovers(t, testCgroupParents(t), ids, stateDir)

	d := onFullStateDir("doctor", "--json", "--state-dir", stateDir)
	var report struct {
		Checks []check `json:"checks"`
	}
	json.Unmarshal([]byte(d.stdout), &report)
	for _, c := range report.Checks {
		if c.Name == "state" && (c.OK || !strings.Contains(c.Detail, "no space left")) {
			t.Errorf("doctor's state check on a full file system: %+v", c)
		}
	}
	if d.code != 1 {
		t.Errorf("doctor exited %d on a full state directory, want 1", d.code)
	}
}
