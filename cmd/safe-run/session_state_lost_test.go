package main

import "testing"

// TestMCPSessionStateLostIsStructured: a session call that runs out of
// memory says state_lost in its structured content, and so does nothing
// that keeps its state.
func TestMCPSessionStateLostIsStructured(t *testing.T) {
	ts := startServer(t, "http", "--memory", "256MiB", "--pool=")
	_, info := ts.tool(t, "create_session", map[string]any{"language": "python"})
	id, _ := info["session_id"].(string)
	for _, tc := range []struct {
		code, status string
		lost         bool
	}{
		{"x = 1", "ok", false},
		{"b = bytearray(1 << 30)", "oom", true},
		{"print(globals().get('x', 'fresh'))", "ok", false},
	} {
		res, out := ts.tool(t, "run_code", map[string]any{"language": "python", "session_id": id, "code": tc.code, "timeout_seconds": 30})
		if lost, _ := out["state_lost"].(bool); out["status"] != tc.status || lost != tc.lost {
			t.Errorf("%q: status %v, state_lost %v; want %s, %v (%s)", tc.code, out["status"], out["state_lost"], tc.status, tc.lost, text(res))
		}
	}
}
