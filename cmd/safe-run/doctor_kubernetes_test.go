package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/safe-run/safe-run/runtime/kubernetes/kubetest"
)

// TestDoctorKubernetes runs `safe-run doctor --backend kubernetes` against
// a real API server with agent-sandbox's CRDs and no RuntimeClass: the
// report passes what holds, fails the RuntimeClass and the missing image,
// each with its fix, and exits 1.
func TestDoctorKubernetes(t *testing.T) {
	binary(t) // safeRun runs it; skips without it
	c := kubetest.Start(t)
	ns := c.Namespace(t)
	args := []string{"doctor", "--backend", "kubernetes", "--kubeconfig", c.Kubeconfig, "--namespace", ns, "--runtime-class", "no-such-class"}
	r := safeRun(t, "", append(args, "--json")...)
	var report struct {
		OK     bool    `json:"ok"`
		Checks []check `json:"checks"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &report); err != nil {
		t.Fatalf("doctor --json: %v\n%s%s", err, r.stdout, r.stderr)
	}
	want := map[string]bool{"cluster": true, "crds": true, "runtimeclass": false, "rbac": true, "image": false}
	for _, ch := range report.Checks {
		ok, listed := want[ch.Name]
		if !listed {
			t.Errorf("unexpected check %+v", ch)
			continue
		}
		delete(want, ch.Name)
		if ch.OK != ok || !ok && ch.Fix == "" {
			t.Errorf("check %s: %+v, want ok %v (and a fix when not)", ch.Name, ch, ok)
		}
	}
	if len(want) > 0 {
		t.Errorf("checks missing from the report: %v", want)
	}
	if report.OK || r.code != 1 {
		t.Errorf("ok %v, exit %d; want false and 1", report.OK, r.code)
	}
	text := safeRun(t, "", append(args, "--image", "registry.invalid/sandbox:1")...)
	if !strings.Contains(text.stdout, "FAIL  runtimeclass") || !strings.Contains(text.stdout, "fix: create it") ||
		!strings.Contains(text.stdout, "PASS  image") {
		t.Errorf("text report:\n%s%s", text.stdout, text.stderr)
	}
}
