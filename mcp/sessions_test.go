package mcp

import (
	"strings"
	"testing"
)

// decodeArgs refuses what its argument type does not describe, naming the
// argument; here with the types of list_files and list_sessions.
func TestDecodeArgs(t *testing.T) {
	for _, tc := range []struct {
		name string
		raw  any
		none bool   // decode as listSessionsArgs, which has no arguments
		want string // error fragment; empty for success
	}{
		{"ok", map[string]any{"session_id": "s", "path": "a"}, false, ""},
		{"optional left out", map[string]any{"session_id": "s"}, false, ""},
		{"required missing", map[string]any{"path": "a"}, false, `argument "session_id" is required`},
		{"unknown", map[string]any{"session_id": "s", "paht": "a"}, false, `unknown argument "paht"; the arguments are session_id, path`},
		{"wrong type", map[string]any{"session_id": "s", "path": 7}, false, `argument "path" must be of type string`},
		{"not an object", []any{1}, false, "must be a JSON object"},
		{"null", nil, false, "arguments must be a JSON object with session_id"},
		{"null, no arguments needed", nil, true, ""},
		{"empty, no arguments needed", map[string]any{}, true, ""},
		{"unknown, no arguments taken", map[string]any{"x": 1}, true, `unknown argument "x"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.none {
				_, _, err = decodeArgs[listSessionsArgs](tc.raw)
			} else {
				_, _, err = decodeArgs[listFilesArgs](tc.raw)
			}
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("error %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(errorText(err), tc.want)):
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
