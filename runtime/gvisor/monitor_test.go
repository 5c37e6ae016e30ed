package gvisor

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/safe-run/safe-run/monitor"
	"github.com/safe-run/safe-run/sandbox"
)

// newMonitoredRuntime is a test runtime whose sandboxes are monitored at
// level with rules (nil: the default rules).
func newMonitoredRuntime(t *testing.T, level monitor.Level, rules []monitor.Rule, configure func(*testConfig)) *testRuntime {
	t.Helper()
	return newTestRuntimeWith(t, func(cfg *testConfig) {
		cfg.Monitor = monitor.Options{Level: level, Rules: rules}
		if configure != nil {
			configure(cfg)
		}
	})
}

// fired returns the hits of rule in a.
func fired(a *sandbox.Activity, rule string) []sandbox.RuleHit {
	var hits []sandbox.RuleHit
	if a == nil {
		return nil
	}
	for _, h := range a.Rules {
		if h.Rule == rule {
			hits = append(hits, h)
		}
	}
	return hits
}

// ruleCases are, for each default rule, a Python program that makes it
// fire, with a word its hit's event must name, and one close to it that
// must not.
var ruleCases = []struct {
	rule, fires, names, quiet string
}{
	{"shell-from-python",
		`import subprocess; subprocess.run(["sh", "-c", "true"], check=True)`, "dash",
		`import subprocess; subprocess.run(["/bin/true"], check=True)`},
	{"exec-not-in-image",
		`import shutil, os, subprocess; shutil.copy("/bin/true", "/workspace/t"); os.chmod("/workspace/t", 0o755); subprocess.run(["/workspace/t"], check=True)`, "/workspace/t",
		`import shutil, subprocess; shutil.copy("/bin/true", "/workspace/t"); subprocess.run(["/bin/true"], check=True)`},
	{"exec-written-file",
		`import shutil, os, subprocess; shutil.copy("/bin/true", "/workspace/t"); os.chmod("/workspace/t", 0o755); subprocess.run(["/workspace/t"], check=True)`, "/workspace/t",
		`import subprocess; subprocess.run(["/bin/true"], check=True)`},
	{"miner-name",
		`import subprocess; subprocess.run(["xmrig", "--version"], executable="/bin/true", check=True)`, "execve",
		`import subprocess; subprocess.run(["truly", "--version"], executable="/bin/true", check=True)`},
	{"miner-pool-port",
		"import socket\ns = socket.socket()\ntry: s.connect((\"10.9.9.9\", 3333))\nexcept OSError: pass", "3333",
		"import socket\ns = socket.socket()\ntry: s.connect((\"10.9.9.9\", 80))\nexcept OSError: pass"},
	{"connect-storm",
		"import socket\nfor i in range(25):\n    s = socket.socket()\n    try: s.connect((\"10.9.9.9\", 80))\n    except OSError: pass\n    s.close()", "connect",
		"import socket\nfor i in range(5):\n    s = socket.socket()\n    try: s.connect((\"10.9.9.9\", 80))\n    except OSError: pass\n    s.close()"},
	{"fork-storm",
		"import os\nfor i in range(210):\n    pid = os.fork()\n    if pid == 0: os._exit(0)\n    os.waitpid(pid, 0)", "",
		"import os\nfor i in range(20):\n    pid = os.fork()\n    if pid == 0: os._exit(0)\n    os.waitpid(pid, 0)"},
	{"sensitive-read",
		`print(len(open("/proc/self/environ").read()))`, "/proc/self/environ",
		`print(len(open("/proc/self/status").read()))`},
}

// TestMonitorRules runs, against the real runsc, for every default rule a
// program that makes it fire and one that must not, and checks what the
// result's activity says.
func TestMonitorRules(t *testing.T) {
	rt := newMonitoredRuntime(t, monitor.LevelDefault, nil, nil)
	for _, tc := range ruleCases {
		t.Run(tc.rule, func(t *testing.T) {
			for _, run := range []struct {
				code string
				want bool
			}{{tc.fires, true}, {tc.quiet, false}} {
				res, err := rt.Run(context.Background(), sandbox.Job{Language: "python", Code: run.code})
				if err != nil {
					t.Fatal(err)
				}
				if res.Status != sandbox.StatusOK {
					t.Fatalf("%q: status %s (%s), stderr %s", run.code, res.Status, res.Message, res.Stderr)
				}
				if res.Activity == nil {
					t.Fatalf("%q: no activity in the result of a monitored run", run.code)
				}
				hits := fired(res.Activity, tc.rule)
				switch {
				case run.want && len(hits) == 0:
					t.Errorf("%q: rule %s did not fire; activity: %s, rules %+v", run.code, tc.rule, res.Activity.Summary(), res.Activity.Rules)
				case !run.want && len(hits) > 0:
					t.Errorf("%q: rule %s fired: %+v", run.code, tc.rule, hits)
				case run.want && !strings.Contains(hits[0].Event, tc.names):
					t.Errorf("%q: the hit's event %q does not name %q", run.code, hits[0].Event, tc.names)
				case run.want && hits[0].Action != "record":
					t.Errorf("hit action %q, want record (the default)", hits[0].Action)
				}
				if run.want && !strings.Contains(res.Activity.Summary(), "rule "+tc.rule+" (record)") {
					t.Errorf("summary %q does not name the rule", res.Activity.Summary())
				}
			}
		})
	}
}

// TestMonitorActivity checks the activity of a run that starts a shell,
// tries a connection and writes outside /workspace, and that of a run
// doing nothing of note.
func TestMonitorActivity(t *testing.T) {
	rt := newMonitoredRuntime(t, monitor.LevelDefault, nil, nil)
	code := "import subprocess, socket\nsubprocess.run([\"sh\", \"-c\", \"true\"])\n" +
		"s = socket.socket()\ntry: s.connect((\"10.9.9.9\", 8080))\nexcept OSError: pass\n" +
		"open(\"/dev/shm/x\", \"w\").write(\"x\")"
	res, err := rt.Run(context.Background(), sandbox.Job{Language: "python", Code: code})
	if err != nil || res.Status != sandbox.StatusOK {
		t.Fatalf("run: %v %s %s %s", err, res.Status, res.Message, res.Stderr)
	}
	a := res.Activity
	if a == nil {
		t.Fatal("no activity")
	}
	var bins []string
	for _, p := range a.Processes {
		bins = append(bins, filepath.Base(p.Binary))
	}
	if len(bins) != 2 || !strings.HasPrefix(bins[0], "python3") || bins[1] != "dash" {
		t.Errorf("processes %v, want python3 then dash", bins)
	}
	if len(a.Processes) == 2 && (a.Processes[1].Parent != a.Processes[0].PID || !a.Processes[1].Exited || len(a.Processes[1].SHA256) != 64) {
		t.Errorf("the shell %+v is not python's child, ended, with its hash", a.Processes[1])
	}
	var connect *sandbox.NetworkAttempt
	for i, n := range a.Network {
		if n.Op == "connect" {
			connect = &a.Network[i]
		}
	}
	if connect == nil || connect.Address != "10.9.9.9:8080" || connect.Family != "inet" || connect.Result != "ENETUNREACH" {
		t.Errorf("connect attempt %+v, want inet 10.9.9.9:8080 ENETUNREACH (the sandbox has no network); network %+v", connect, a.Network)
	}
	if !contains(a.FilesWritten, "/dev/shm/x") {
		t.Errorf("files written %v, want /dev/shm/x", a.FilesWritten)
	}
	if !a.Notable() || !strings.Contains(a.Summary(), "dash") {
		t.Errorf("summary %q of a notable run does not name the shell", a.Summary())
	}

	res, err = rt.Run(context.Background(), sandbox.Job{Language: "python", Code: "print(1)"})
	if err != nil || res.Status != sandbox.StatusOK {
		t.Fatalf("run: %v %s %s", err, res.Status, res.Message)
	}
	if res.Activity == nil || res.Activity.Notable() {
		t.Errorf("print(1): activity %+v, want nothing notable", res.Activity)
	} else if got := res.Activity.Summary(); got != "nothing notable" {
		t.Errorf("print(1): summary %q", got)
	}
}

func contains(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}

// TestMonitorKill checks that a kill rule ends the run at once with status
// policy_violation naming the rule, that the program did not go on, and
// that nothing of the sandbox is left; the same program without the rule
// runs to its end.
func TestMonitorKill(t *testing.T) {
	rules, err := monitor.ParseRules([]byte(`[{"name": "shell-from-python", "action": "kill"}]`))
	if err != nil {
		t.Fatal(err)
	}
	rt := newMonitoredRuntime(t, monitor.LevelDefault, rules, nil)
	code := "import subprocess, time\nsubprocess.run([\"sh\", \"-c\", \"true\"])\ntime.sleep(0.5)\nprint(\"went on\")"
	res, err := rt.Run(context.Background(), sandbox.Job{Language: "python", Code: code})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != sandbox.StatusPolicyViolation {
		t.Fatalf("status %s (%s), want policy_violation", res.Status, res.Message)
	}
	if !strings.Contains(res.Message, `"shell-from-python"`) || strings.Contains(res.Stdout, "went on") {
		t.Errorf("message %q does not name the rule, or the program went on: stdout %q", res.Message, res.Stdout)
	}
	if hits := fired(res.Activity, "shell-from-python"); len(hits) != 1 || hits[0].Action != "kill" {
		t.Errorf("activity rules %+v, want one kill hit", res.Activity.Rules)
	}
	assertNothingLeft(t, rt, []string{res.SandboxID})

	res, err = rt.Run(context.Background(), sandbox.Job{Language: "python", Code: "print(\"went on\")"})
	if err != nil || res.Status != sandbox.StatusOK || res.Stdout != "went on\n" {
		t.Errorf("a run the rule does not match: %v %s %q", err, res.Status, res.Stdout)
	}
}

// TestMonitorPooled checks that a run in a sandbox restored from the warm
// pool's checkpoint is monitored too (the session is passed again on
// restore), and that the warm-up is not the run's activity. (Rules on the
// parent's name cannot match here yet: the warm interpreter started before
// the checkpoint, so the restored sandbox's monitor never saw its execve.)
func TestMonitorPooled(t *testing.T) {
	ckpt := filepath.Join(t.TempDir(), "checkpoints")
	rt := newMonitoredRuntime(t, monitor.LevelDefault, nil, func(cfg *testConfig) {
		cfg.Engine.Pool.Size = map[string]int{"python": 1}
		cfg.CheckpointDir = ckpt
	})
	waitPooled(t, rt, "python")
	first, err := rt.Run(context.Background(), sandbox.Job{Language: "python", Code: "print(1)"})
	if err != nil || first.Status != sandbox.StatusOK {
		t.Fatalf("first pooled run: %v %s %s", err, first.Status, first.Message)
	}
	id := waitPooled(t, rt, "python")
	if !restored(rt, id) {
		t.Fatalf("the refill %s was not restored from the checkpoint", id)
	}
	res, err := rt.Run(context.Background(), sandbox.Job{Language: "python", Code: `import subprocess; subprocess.run(["sh", "-c", "true"])`})
	if err != nil || res.Status != sandbox.StatusOK {
		t.Fatalf("restored run: %v %s %s", err, res.Status, res.Message)
	}
	if res.SandboxID != id {
		t.Fatalf("the run used %s, not the restored %s", res.SandboxID, id)
	}
	if res.Activity == nil {
		t.Fatal("the restored run has no activity: the session was not passed on restore")
	}
	var shell *sandbox.Process
	for i, p := range res.Activity.Processes {
		if filepath.Base(p.Binary) == "dash" {
			shell = &res.Activity.Processes[i]
		}
	}
	if shell == nil || !shell.Exited || shell.Parent == 0 {
		t.Errorf("restored run: the shell is not in the activity, ended, with its parent: %+v", res.Activity.Processes)
	}
	if res.Activity.Lost != "" {
		t.Errorf("restored run: monitoring lost: %s", res.Activity.Lost)
	}
	if res.Activity.Events["container_start"] != 0 {
		t.Errorf("the restored run's activity holds the warm-up's container start: %v", res.Activity.Events)
	}
	// The warm python started before the checkpoint, so its execve is not
	// in the stream; the rule knows it by the shell's caller's name.
	if !slices.ContainsFunc(res.Activity.Rules, func(h sandbox.RuleHit) bool { return h.Rule == "shell-from-python" }) {
		t.Errorf("restored run: shell-from-python did not fire: %+v", res.Activity.Rules)
	}
}

// TestMonitorOff checks that a backend with the monitor off gives no
// activity.
func TestMonitorOff(t *testing.T) {
	rt := newMonitoredRuntime(t, monitor.LevelOff, nil, nil)
	res, err := rt.Run(context.Background(), sandbox.Job{Language: "python", Code: `import subprocess; subprocess.run(["sh", "-c", "true"])`})
	if err != nil || res.Status != sandbox.StatusOK {
		t.Fatalf("run: %v %s %s", err, res.Status, res.Message)
	}
	if res.Activity != nil {
		t.Errorf("activity %+v with the monitor off", res.Activity)
	}
}

// TestMonitorSession checks a session's monitoring: each call reports its
// own activity, a deny-future-calls rule makes the session refuse the
// calls after it, and closing the session returns its whole tree.
func TestMonitorSession(t *testing.T) {
	rules, err := monitor.ParseRules([]byte(`[{"name": "shell-from-python", "action": "deny-future-calls"}]`))
	if err != nil {
		t.Fatal(err)
	}
	rt := newMonitoredRuntime(t, monitor.LevelDefault, rules, nil)
	t.Cleanup(rt.CloseSessions)
	id := newSession(t, rt, "python")

	quiet := cell(t, rt, id, "x = 1\nprint(x)")
	if quiet.Status != sandbox.StatusOK || quiet.Activity == nil || quiet.Activity.Notable() {
		t.Errorf("a quiet call: status %s, activity %+v, want ok and nothing notable", quiet.Status, quiet.Activity)
	}
	shell := cell(t, rt, id, `import subprocess; subprocess.run(["sh", "-c", "true"])`)
	if shell.Status != sandbox.StatusOK || len(fired(shell.Activity, "shell-from-python")) != 1 {
		t.Fatalf("the shell's call: status %s, activity %+v, want ok and the rule once", shell.Status, shell.Activity)
	}
	if !strings.Contains(shell.Message, "refuses further calls") {
		t.Errorf("the call that fired the rule says %q, not that the session refuses further calls", shell.Message)
	}
	if len(quiet.Activity.Rules) != 0 {
		t.Errorf("the quiet call's activity holds the later call's rules: %+v", quiet.Activity.Rules)
	}
	_, err = rt.RunInSession(context.Background(), id, sandbox.Job{Code: "print(x)"})
	if err == nil || !strings.Contains(err.Error(), `"shell-from-python"`) || !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("a call after the rule fired: %v, want a refusal naming the rule", err)
	}
	tree, err := rt.CloseSessionActivity(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if tree == nil || len(fired(tree, "shell-from-python")) != 1 {
		t.Fatalf("the session's tree %+v lacks the rule's hit", tree)
	}
	var shells int
	for _, p := range tree.Processes {
		if filepath.Base(p.Binary) == "dash" {
			shells++
		}
	}
	if shells != 1 {
		t.Errorf("the session's tree has %d shells, want 1: %+v", shells, tree.Processes)
	}
}
