package main

import (
	"encoding/json"
	"testing"

	"github.com/safe-run/safe-run/sandbox"
)

// What the behaviour monitor saw of a threat case's run: the suite's CLI
// and server run with the default monitor, so a probe that stops being
// seen is noticed here (docs/monitor.md).

// monitored returns the activity of run r, from the CLI's JSON or the MCP
// tool's structured content; a run without one fails the test.
func monitored(t *testing.T, r *threatRun) *sandbox.Activity {
	t.Helper()
	var a *sandbox.Activity
	switch {
	case r.via == "cli":
		a = r.result.Activity
	case r.mcpOut["activity"] != nil:
		data, err := json.Marshal(r.mcpOut["activity"])
		if err == nil {
			a = new(sandbox.Activity)
			err = json.Unmarshal(data, a)
		}
		if err != nil {
			t.Errorf("%s: the structured activity does not decode: %v", r.via, err)
			return nil
		}
	}
	if a == nil {
		t.Errorf("%s: the result has no activity: the run was not monitored", r.via)
	}
	return a
}

// stormClones is the fewest processes a fork bomb's run must show as
// created: a quiet run shows one (its interpreter). The process limit (and
// in a warm sandbox the memory limit) stops the bomb long before the
// fork-storm rule's 200th process: the bomb's processes never exit.
const stormClones = 10

// assertCloneStorm checks that the monitor saw a fork bomb's clones.
func assertCloneStorm(t *testing.T, r *threatRun) {
	t.Helper()
	a := monitored(t, r)
	if a != nil && a.Clones < stormClones {
		t.Errorf("%s: the monitor saw %d clones of a fork bomb, want at least %d (events %v, lost %q)", r.via, a.Clones, stormClones, a.Events, a.Lost)
	}
}

// assertConnectAttempts checks that the monitor saw a connect attempt to
// each of addrs, each failing (the sandbox has no network).
func assertConnectAttempts(t *testing.T, r *threatRun, addrs ...string) {
	t.Helper()
	a := monitored(t, r)
	if a == nil {
		return
	}
	seen := map[string]string{}
	for _, n := range a.Network {
		if n.Op == "connect" {
			seen[n.Address] = n.Result
		}
	}
	for _, addr := range addrs {
		switch res, ok := seen[addr]; {
		case !ok:
			t.Errorf("%s: the monitor saw no connect attempt to %s; it saw %v", r.via, addr, seen)
		case res == "ok":
			t.Errorf("%s: the monitor saw the connect to %s succeed", r.via, addr)
		}
	}
}
