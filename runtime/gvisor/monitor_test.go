package gvisor

import (
	"bufio"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/safe-run/safe-run/monitor"
	"github.com/safe-run/safe-run/monitor/monitortest"
	"github.com/safe-run/safe-run/runtime/engine"
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

// TestMonitorRules runs, against the real runsc, for every default rule a
// program that makes it fire and one close to it that must not
// (monitortest.RuleCases), and checks the result's activity: its exact
// summary, and the hit's action and event.
func TestMonitorRules(t *testing.T) {
	rt := newMonitoredRuntime(t, monitor.LevelDefault, nil, nil)
	for _, tc := range monitortest.RuleCases {
		t.Run(tc.Rule, func(t *testing.T) {
			for _, run := range []struct {
				code, summary string
				want          bool
			}{{tc.Fires, tc.FiresSummary, true}, {tc.Quiet, tc.QuietSummary, false}} {
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
				hits := fired(res.Activity, tc.Rule)
				switch {
				case run.want && len(hits) != 1:
					t.Errorf("%q: rule %s fired %d times, want once; rules %+v", run.code, tc.Rule, len(hits), res.Activity.Rules)
				case !run.want && len(hits) > 0:
					t.Errorf("%q: rule %s fired: %+v", run.code, tc.Rule, hits)
				case run.want && !strings.Contains(hits[0].Event, tc.Names):
					t.Errorf("%q: the hit's event %q does not name %q", run.code, hits[0].Event, tc.Names)
				case run.want && hits[0].Action != "record":
					t.Errorf("hit action %q, want record (the default)", hits[0].Action)
				}
				if got := res.Activity.Summary(); got != run.summary {
					t.Errorf("%q: summary %q, want %q", run.code, got, run.summary)
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

// TestMonitorForkStorm checks the fork-storm rule with a kill action
// against real fork bombs: the default count (200) is beyond the process
// limit (128) for a bomb whose processes stay, so the rules file lowers it
// to 30, as an operator would. A bomb is ended with policy_violation
// naming the rule at the 30th process, and leaves nothing behind; a
// program of 29 processes runs to its end with the rule silent.
func TestMonitorForkStorm(t *testing.T) {
	rules, err := monitor.ParseRules([]byte(`[{"name": "fork-storm", "event": "clone", "count": 30, "action": "kill"}]`))
	if err != nil {
		t.Fatal(err)
	}
	rt := newMonitoredRuntime(t, monitor.LevelDefault, rules, nil)
	for _, bomb := range []struct{ name, code string }{
		// Every process forks for ever; the process limit makes forks
		// fail, and the bomb goes on trying.
		{"bomb", "import os, time\nwhile True:\n    try: os.fork()\n    except OSError: time.sleep(0.01)"},
		// One process forks children that stay, then carries on.
		{"spawner", "import os, time\nfor i in range(60):\n    if os.fork() == 0:\n        time.sleep(60)\n        os._exit(0)\ntime.sleep(1)\nprint(\"went on\")"},
	} {
		res, err := rt.Run(context.Background(), sandbox.Job{Language: "python", Code: bomb.code})
		if err != nil {
			t.Fatal(err)
		}
		if res.Status != sandbox.StatusPolicyViolation || !strings.Contains(res.Message, `"fork-storm"`) || strings.Contains(res.Stdout, "went on") {
			t.Errorf("%s: status %s, message %q, stdout %q; want policy_violation naming fork-storm, the program stopped", bomb.name, res.Status, res.Message, res.Stdout)
		}
		hits := fired(res.Activity, "fork-storm")
		if len(hits) != 1 || hits[0].Action != "kill" || !strings.HasSuffix(hits[0].Event, "(event 30)") {
			t.Errorf("%s: fork-storm hits %+v, want one kill at the 30th process", bomb.name, hits)
		}
		if res.Activity != nil && res.Activity.Clones < 30 {
			t.Errorf("%s: the activity shows %d processes created, want at least 30", bomb.name, res.Activity.Clones)
		}
		assertNothingLeft(t, rt, []string{res.SandboxID})
	}

	res, err := rt.Run(context.Background(), sandbox.Job{Language: "python",
		Code: "import os\nfor i in range(28):\n    pid = os.fork()\n    if pid == 0: os._exit(0)\n    os.waitpid(pid, 0)\nprint(\"went on\")"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != sandbox.StatusOK || res.Stdout != "went on\n" || res.Activity == nil || len(res.Activity.Rules) != 0 || res.Activity.Summary() != "29 forks" {
		t.Errorf("29 processes: status %s, stdout %q, activity %+v; want ok, went on, \"29 forks\" and no rule", res.Status, res.Stdout, res.Activity)
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

// TestMonitorFull checks that runsc accepts the full level's session (a
// refused one would leave the stream without container/start, and Lost
// would say so) and that its extra points reach the activity: the signals
// sent and a listen.
func TestMonitorFull(t *testing.T) {
	rt := newMonitoredRuntime(t, monitor.LevelFull, nil, nil)
	code := "import os, signal, socket\nsignal.signal(signal.SIGUSR1, lambda *a: None)\nos.kill(os.getpid(), signal.SIGUSR1)\n" +
		"s = socket.socket()\ns.bind((\"127.0.0.1\", 0))\ns.listen()"
	res, err := rt.Run(context.Background(), sandbox.Job{Language: "python", Code: code})
	if err != nil || res.Status != sandbox.StatusOK {
		t.Fatalf("run: %v %s %s %s", err, res.Status, res.Message, res.Stderr)
	}
	a := res.Activity
	if a == nil || a.Lost != "" {
		t.Fatalf("activity %+v: want one, not lost", a)
	}
	if !slices.ContainsFunc(a.Signals, func(s sandbox.SignalSent) bool { return s.Signal == "SIGUSR1" && s.Target == s.PID }) {
		t.Errorf("signals %+v, want SIGUSR1 sent by the program to itself", a.Signals)
	}
	if !slices.ContainsFunc(a.Network, func(n sandbox.NetworkAttempt) bool { return n.Op == "listen" && n.Result == "ok" }) {
		t.Errorf("network %+v, want a listen", a.Network)
	}
	if got, want := a.Summary(), "3 network attempts, 1 signal sent"; got != want {
		t.Errorf("summary %q, want %q", got, want)
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

// TestMonitorDeepStateDir: where the run directory is too deep for a Unix
// socket, the monitor's socket lives in a directory of its own in TMPDIR.
// The run is monitored all the same, and that directory is removed when
// the run ends and, by the reaper, when the safe-run process that made it
// died without removing it.
func TestMonitorDeepStateDir(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	rt := newMonitoredRuntime(t, monitor.LevelDefault, nil, func(cfg *testConfig) {
		cfg.StateDir = filepath.Join(t.TempDir(), strings.Repeat("deep/", 20), "state")
	})
	sockDirs := func() []string {
		dirs, _ := filepath.Glob(filepath.Join(tmp, monitorSockDirPrefix+"*"))
		return dirs
	}
	res, err := rt.Run(context.Background(), sandbox.Job{Language: "python", Code: "import subprocess\nsubprocess.run(['true'])"})
	if err != nil || res.Status != sandbox.StatusOK {
		t.Fatalf("run: %v %s %s %s", err, res.Status, res.Message, res.Stderr)
	}
	if res.Activity == nil || res.Activity.Clones < 1 {
		t.Errorf("activity %+v, want the child process", res.Activity)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := rt.Wait(ctx); err != nil { // the sandbox is removed after the result
		t.Fatal(err)
	}
	if dirs := sockDirs(); len(dirs) > 0 {
		t.Errorf("left after the run: %v", dirs)
	}

	p, err := rt.g.startSandbox(engine.StartSpec{Job: sandbox.Job{Language: "bash", Limits: sandbox.DefaultLimits}, KeepAlive: true}, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(p.Events()).ReadString('\n'); err != nil {
		t.Fatalf("no Ready event from the agent: %v", err)
	}
	if dirs := sockDirs(); len(dirs) != 1 {
		t.Fatalf("socket directories of a live sandbox: %v, want one", dirs)
	}
	forgetSandbox(rt, p)
	rt2, err := startStack(rt.cfg)
	if err != nil {
		t.Fatal(err)
	}
	<-p.exited
	assertNothingLeft(t, rt2, []string{p.id})
	if dirs := sockDirs(); len(dirs) > 0 {
		t.Errorf("left after the reaper: %v", dirs)
	}
}

// TestRemoveMonitorSockDir: the reaper removes only a directory of this
// user that startMonitor would have made, whatever the run directory's
// link says.
func TestRemoveMonitorSockDir(t *testing.T) {
	tmp := t.TempDir()
	mk := func(name string) string {
		d := filepath.Join(tmp, name)
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		return d
	}
	for _, tc := range []struct {
		name    string
		target  func() string // the link's target; "" for no link
		gone    bool          // the target's directory is not there after
		wantErr bool
	}{
		{"no link: the socket is in the run directory", func() string { return "" }, false, false},
		{"a socket directory of safe-run", func() string { return filepath.Join(mk(monitorSockDirPrefix+"1"), monitorSocket) }, true, false},
		{"already removed", func() string { return filepath.Join(tmp, monitorSockDirPrefix+"gone", monitorSocket) }, true, false},
		{"another directory", func() string { return filepath.Join(mk("precious"), monitorSocket) }, false, true},
		{"another file name", func() string { return filepath.Join(mk(monitorSockDirPrefix+"2"), "data") }, false, true},
		{"not a directory", func() string {
			f := filepath.Join(tmp, monitorSockDirPrefix+"3")
			if err := os.WriteFile(f, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			return filepath.Join(f, monitorSocket)
		}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run := t.TempDir()
			target := tc.target()
			if target != "" {
				if err := os.Symlink(target, filepath.Join(run, monitorSocket)); err != nil {
					t.Fatal(err)
				}
			}
			err := removeMonitorSockDir(run)
			if (err != nil) != tc.wantErr {
				t.Errorf("err = %v, want an error: %v", err, tc.wantErr)
			}
			if target == "" {
				return
			}
			_, statErr := os.Stat(filepath.Dir(target))
			if gone := errors.Is(statErr, os.ErrNotExist); gone != tc.gone {
				t.Errorf("%s gone: %v, want %v", filepath.Dir(target), gone, tc.gone)
			}
		})
	}
}
