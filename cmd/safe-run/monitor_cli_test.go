package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/safe-run/safe-run/audit"
	"github.com/safe-run/safe-run/monitor/monitortest"
	"github.com/safe-run/safe-run/sandbox"
)

// TestMonitorCLI runs `safe-run run` with the monitor: a kill rule ends a
// run with policy_violation (exit 123) and leaves nothing behind, --json
// carries the activity, the audit record holds it under the chain, and a
// quiet run shows nothing notable.
func TestMonitorCLI(t *testing.T) {
	binary(t)
	dir := t.TempDir()
	state, logPath, rules := filepath.Join(dir, "state"), filepath.Join(dir, "audit.log"), filepath.Join(dir, "rules.json")
	if err := os.WriteFile(rules, []byte(`[{"name": "shell-from-python", "action": "kill"}]`), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"run", "--json", "--state-dir", state, "--audit-log", logPath, "--monitor-rules", rules, "--lang", "python"}

	r := safeRun(t, "", append(base, "-c", "import subprocess, time\nsubprocess.run([\"sh\", \"-c\", \"true\"])\ntime.sleep(0.5)\nprint(\"went on\")")...)
	var res sandbox.Result
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatalf("exit %d, no JSON result: %v\n%s", r.code, err, r.stderr)
	}
	if r.code != exitPolicy || res.Status != sandbox.StatusPolicyViolation || !strings.Contains(res.Message, `"shell-from-python"`) || strings.Contains(res.Stdout, "went on") {
		t.Errorf("kill rule: exit %d, status %s, message %q, stdout %q; want exit %d, policy_violation naming the rule, the program stopped", r.code, res.Status, res.Message, res.Stdout, exitPolicy)
	}
	if res.Activity == nil || len(res.Activity.Rules) == 0 {
		t.Errorf("--json carries no rule hits: %+v", res.Activity)
	}
	if entries, _ := os.ReadDir(state); len(entries) != 0 {
		t.Errorf("left in the state directory after the kill: %v", entries)
	}

	r = safeRun(t, "", append(base, "-c", "print(1)")...)
	var quiet sandbox.Result
	if err := json.Unmarshal([]byte(r.stdout), &quiet); err != nil || r.code != 0 {
		t.Fatalf("quiet run: exit %d, %v\n%s", r.code, err, r.stderr)
	}
	if quiet.Activity == nil || quiet.Activity.Notable() {
		t.Errorf("print(1): activity %+v, want nothing notable", quiet.Activity)
	}

	data, recs := verifiedRunRecords(t, logPath)
	if len(recs) != 2 {
		t.Fatalf("%d run records, want 2", len(recs))
	}
	if k := recs[0]; k.Status != string(sandbox.StatusPolicyViolation) || k.Activity == nil || !hasRule(k.Activity, "shell-from-python", "kill") {
		t.Errorf("the killed run's audit record: status %s, activity %+v", k.Status, k.Activity)
	}
	if q := recs[1]; q.Activity == nil || q.Activity.Notable() {
		t.Errorf("the quiet run's audit record: activity %+v", q.Activity)
	}

	// Tampering with the recorded activity breaks the chain.
	tampered := bytes.Replace(data, []byte(`"shell-from-python"`), []byte(`"shell-from-pythoN"`), 1)
	if err := os.WriteFile(logPath, tampered, 0o600); err != nil {
		t.Fatal(err)
	}
	if v := safeRun(t, "", "audit", "verify", logPath); v.code == 0 {
		t.Error("audit verify accepts a log whose recorded activity was changed")
	}
}

// TestMonitorRulesAudit runs, through `safe-run run` with an audit log,
// for every default rule the program that makes it fire and its near miss
// (monitortest.RuleCases), and checks the exact summary of the activity in
// --json, that the rule fired once or not at all, and that each run's
// audit record carries the same activity under a chain that verifies.
// One firing run is repeated without --json: stderr has the summary line.
func TestMonitorRulesAudit(t *testing.T) {
	binary(t)
	dir := t.TempDir()
	state, logPath := filepath.Join(dir, "state"), filepath.Join(dir, "audit.log")
	type want struct {
		rule, summary string
		fires         bool
		activity      *sandbox.Activity
	}
	var runs []want
	for _, tc := range monitortest.RuleCases {
		for _, run := range []struct {
			code, summary string
			fires         bool
		}{{tc.Fires, tc.FiresSummary, true}, {tc.Quiet, tc.QuietSummary, false}} {
			r := safeRun(t, "", "run", "--json", "--state-dir", state, "--audit-log", logPath, "--lang", "python", "-c", run.code)
			var res sandbox.Result
			if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || r.code != 0 || res.Activity == nil {
				t.Fatalf("%s %q: exit %d, %v, activity %v\n%s", tc.Rule, run.code, r.code, err, res.Activity, r.stderr)
			}
			if got := res.Activity.Summary(); got != run.summary {
				t.Errorf("%s %q: summary %q, want %q", tc.Rule, run.code, got, run.summary)
			}
			if got := hasRule(res.Activity, tc.Rule, "record"); got != run.fires {
				t.Errorf("%s %q: fired %v, want %v; rules %+v", tc.Rule, run.code, got, run.fires, res.Activity.Rules)
			}
			runs = append(runs, want{tc.Rule, run.summary, run.fires, res.Activity})
		}
	}
	_, recs := verifiedRunRecords(t, logPath)
	if len(recs) != len(runs) {
		t.Fatalf("%d run records, want %d", len(recs), len(runs))
	}
	for i, w := range runs {
		a := recs[i].Activity
		switch {
		case a == nil:
			t.Errorf("%s (fires %v): the audit record has no activity", w.rule, w.fires)
		case a.Summary() != w.summary:
			t.Errorf("%s (fires %v): the audit record's summary %q, want %q", w.rule, w.fires, a.Summary(), w.summary)
		case hasRule(a, w.rule, "record") != w.fires || !reflect.DeepEqual(a.Rules, w.activity.Rules):
			t.Errorf("%s (fires %v): the audit record's rules %+v, the result's %+v", w.rule, w.fires, a.Rules, w.activity.Rules)
		case a.Clones != w.activity.Clones || len(a.Processes) != len(w.activity.Processes) || len(a.Network) != len(w.activity.Network):
			t.Errorf("%s (fires %v): the audit record's activity %+v differs from the result's %+v", w.rule, w.fires, a, w.activity)
		}
	}

	tc := monitortest.RuleCases[slices.IndexFunc(monitortest.RuleCases, func(c monitortest.RuleCase) bool { return c.Rule == "shell-from-python" })]
	r := safeRun(t, "", "run", "--state-dir", state, "--lang", "python", "-c", tc.Fires)
	if line := "safe-run: activity: " + tc.FiresSummary; r.code != 0 || !strings.Contains(r.stderr, line) {
		t.Errorf("text output: exit %d, stderr %q; want the line %q", r.code, r.stderr, line)
	}
	if entries, _ := os.ReadDir(state); len(entries) != 0 {
		t.Errorf("left in the state directory: %v", entries)
	}
}

// verifiedRunRecords checks the audit log's chain with `audit verify` and
// returns the log and its run records, in order.
func verifiedRunRecords(t *testing.T, logPath string) ([]byte, []audit.Record) {
	t.Helper()
	if v := safeRun(t, "", "audit", "verify", logPath); v.code != 0 {
		t.Fatalf("audit verify: exit %d: %s", v.code, v.stderr)
	}
	data, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	var recs []audit.Record
	for _, line := range bytes.Split(bytes.TrimSpace(data), []byte("\n")) {
		var rec audit.Record
		if err := json.Unmarshal(line, &rec); err != nil {
			t.Fatalf("audit line %q: %v", line, err)
		}
		if rec.Event == audit.EventRun {
			recs = append(recs, rec)
		}
	}
	return data, recs
}

func hasRule(a *sandbox.Activity, rule, action string) bool {
	for _, h := range a.Rules {
		if h.Rule == rule && h.Action == action {
			return true
		}
	}
	return false
}

// TestMonitorFlags checks that a bad --monitor or rules file is refused
// with one line naming it, before anything runs.
func TestMonitorFlags(t *testing.T) {
	binary(t)
	dir := t.TempDir()
	bad := filepath.Join(dir, "rules.json")
	if err := os.WriteFile(bad, []byte(`[{"name": "x", "event": "exec", "colour": "red"}]`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--monitor", "loud"}, "--monitor"},
		{[]string{"--monitor-rules", bad}, "--monitor-rules"},
		{[]string{"--monitor-rules", filepath.Join(dir, "missing.json")}, "--monitor-rules"},
		{[]string{"--monitor", "off", "--monitor-rules", bad}, "--monitor=off"},
	} {
		r := safeRun(t, "", append(append([]string{"run"}, tc.args...), "--lang", "python", "-c", "print(1)")...)
		if r.code != exitUsage || !strings.Contains(r.stderr, tc.want) || strings.Count(strings.TrimSpace(r.stderr), "\n") > 0 {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and one line naming %s", tc.args, r.code, r.stderr, exitUsage, tc.want)
		}
	}
}
