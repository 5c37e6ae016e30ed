package mcp

import (
	"encoding/json"
	"maps"
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

// The input schema each session tool lists agrees with what its decoder
// accepts: the arguments it declares and requires, nothing else.
func TestSessionToolSchemas(t *testing.T) {
	const id = "session-0123456789abcdef"
	valid := map[string]string{
		"create_session": `{"language": "python", "timeout_seconds": 2}`,
		"close_session":  `{"session_id": "` + id + `"}`,
		"list_sessions":  `{}`,
		"write_file":     `{"session_id": "` + id + `", "path": "a.txt", "content": "aGk=", "encoding": "base64"}`,
		"read_file":      `{"session_id": "` + id + `", "path": "a.txt"}`,
		"list_files":     `{"session_id": "` + id + `"}`,
	}
	for _, tool := range sessionTools(testEnv()) {
		t.Run(tool.name, func(t *testing.T) {
			sch := compileSchema(t, tool.input)
			args := valid[tool.name]
			var raw map[string]any
			if err := json.Unmarshal([]byte(args), &raw); err != nil {
				t.Fatal(err)
			}
			if err := sch.Validate(raw); err != nil {
				t.Errorf("schema refuses %s: %v", args, err)
			}
			if _, _, err := tool.decode(raw); err != nil {
				t.Errorf("decoder refuses %s: %v", args, err)
			}
			// Each required argument left out, and an undeclared one added.
			var schema struct{ Required []string }
			if err := json.Unmarshal(tool.input, &schema); err != nil {
				t.Fatal(err)
			}
			var refused []map[string]any
			for _, name := range schema.Required {
				m := maps.Clone(raw)
				delete(m, name)
				refused = append(refused, m)
			}
			m := maps.Clone(raw)
			m["extra"] = "x"
			refused = append(refused, m)
			for _, m := range refused {
				if sch.Validate(m) == nil {
					t.Errorf("schema accepts %v", m)
				}
				if _, _, err := tool.decode(m); err == nil {
					t.Errorf("decoder accepts %v", m)
				}
			}
		})
	}
}
