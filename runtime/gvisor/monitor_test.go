package gvisor

import (
	"context"
	"path/filepath"
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
// restore), and that the warm-up is not the run's activity.
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
	if len(fired(res.Activity, "shell-from-python")) != 1 {
		t.Errorf("restored run: rule shell-from-python did not fire once; activity %+v", res.Activity)
	}
	if res.Activity != nil && res.Activity.Events["container_start"] != 0 {
		t.Errorf("the restored run's activity holds the warm-up's container start: %v", res.Activity.Events)
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
