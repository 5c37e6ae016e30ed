package mcp

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/safe-run/safe-run/sandbox"
)

// TestResultStateLost: a session call whose interpreter or sandbox was
// restarted says so in the structured content, as the README promises, not
// only in the message; the schema describes the field, and a call that lost
// nothing does not carry it.
func TestResultStateLost(t *testing.T) {
	var schema struct {
		Properties map[string]json.RawMessage `json:"properties"`
	}
	if err := json.Unmarshal([]byte(outputSchema), &schema); err != nil {
		t.Fatal(err)
	}
	if _, ok := schema.Properties["state_lost"]; !ok {
		t.Error("outputSchema does not describe state_lost")
	}
	for _, tc := range []struct {
		name     string
		res      sandbox.Result
		want     bool
		wantText string
	}{
		{"oom in a session", sandbox.Result{Status: sandbox.StatusOOM, ExitCode: -1, StateLost: true,
			Message: "the memory limit was hit; the session's state was lost"}, true, "state was lost"},
		{"ok after a lost sandbox", sandbox.Result{Status: sandbox.StatusOK, StateLost: true}, true, "state was lost before this call"},
		{"ok", sandbox.Result{Status: sandbox.StatusOK}, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := result(tc.res)
			got := checkStructured(t, r.StructuredContent)
			lost, present := got["state_lost"]
			switch {
			case tc.want && lost != true:
				t.Errorf("structured state_lost = %v, want true", lost)
			case !tc.want && present:
				t.Errorf("structured state_lost = %v for a call that lost nothing, want it absent", lost)
			}
			if text := firstText(t, r); tc.wantText != "" && !strings.Contains(text, tc.wantText) {
				t.Errorf("text does not say the state was lost: %q", text)
			}
		})
	}
}
