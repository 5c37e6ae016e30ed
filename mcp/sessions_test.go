package mcp

import (
	"strings"
	"testing"
)

func TestObjectArgs(t *testing.T) {
	schema := `{"type": "object", "properties": {"session_id": {"type": "string"}, "path": {"type": "string"}}, "required": ["session_id"]}`
	for _, tc := range []struct {
		name string
		raw  any
		want string // error fragment; empty for success
	}{
		{"ok", map[string]any{"session_id": "s", "path": "a"}, ""},
		{"optional left out", map[string]any{"session_id": "s"}, ""},
		{"required missing", map[string]any{"path": "a"}, `argument "session_id" is required`},
		{"unknown", map[string]any{"session_id": "s", "paht": "a"}, `unknown argument "paht"; the arguments are path, session_id`},
		{"not an object", []any{1}, "must be a JSON object"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := objectArgs(tc.raw, schema)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("error %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestSessionToolsAreHonestlyAnnotated(t *testing.T) {
	for _, tool := range sessionTools(Environment{Sessions: &SessionLimits{MaxSessions: 8, IdleTimeoutSeconds: 600, MaxLifetimeSeconds: 3600}}) {
		a := tool.annotations
		if *a.OpenWorldHint {
			t.Errorf("%s claims an open world; the sandbox has no network", tool.name)
		}
		readOnly := tool.name == "list_sessions" || tool.name == "read_file" || tool.name == "list_files"
		if *a.ReadOnlyHint != readOnly {
			t.Errorf("%s readOnlyHint = %v, want %v", tool.name, *a.ReadOnlyHint, readOnly)
		}
		if tool.name == "create_session" && !strings.Contains(tool.description, "10m0s without use") {
			t.Errorf("create_session does not state the idle timeout: %s", tool.description)
		}
	}
}
