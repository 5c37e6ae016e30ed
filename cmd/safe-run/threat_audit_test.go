package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
)

// hugeClientName is the clientInfo.name of issue 13.2: 4 MB, with a
// terminal escape at its start.
var hugeClientName = "evil\x1b]0;pwned\x07" + strings.Repeat("n", 4<<20)

// rawClient speaks MCP over HTTP by hand, as an attacker would: an
// initialize with the clientInfo it likes, then calls that do not send it
// again (mcp-go's client would, costing seconds a call).
type rawClient struct {
	url, session string
	id           int
}

// dialRaw initializes a session at url as a client named name.
func dialRaw(t *testing.T, url, name string) *rawClient {
	t.Helper()
	c := &rawClient{url: url}
	c.post(t, map[string]any{"method": "initialize", "params": map[string]any{"protocolVersion": mcpgo.LATEST_PROTOCOL_VERSION,
		"capabilities": map[string]any{}, "clientInfo": map[string]any{"name": name, "version": name}}})
	if c.session == "" {
		t.Fatal("initialize: no Mcp-Session-Id")
	}
	c.post(t, map[string]any{"method": "notifications/initialized"})
	return c
}

// post sends msg (an id is added unless it is a notification) and returns
// the JSON-RPC result.
func (c *rawClient) post(t *testing.T, msg map[string]any) map[string]any {
	t.Helper()
	msg["jsonrpc"] = "2.0"
	if !strings.HasPrefix(msg["method"].(string), "notifications/") {
		c.id++
		msg["id"] = c.id
	}
	body, _ := json.Marshal(msg)
	req, _ := http.NewRequest(http.MethodPost, c.url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if c.session != "" {
		req.Header.Set("Mcp-Session-Id", c.session)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", msg["method"], err)
	}
	defer resp.Body.Close()
	if id := resp.Header.Get("Mcp-Session-Id"); id != "" {
		c.session = id
	}
	data, _ := io.ReadAll(resp.Body)
	if msg["id"] == nil {
		return nil
	}
	// A JSON body, or an event stream whose data line is the response.
	for _, line := range strings.Split(string(data), "\n") {
		if d, ok := strings.CutPrefix(line, "data: "); ok {
			data = []byte(d)
		}
	}
	var out struct {
		Result map[string]any `json:"result"`
	}
	if err := json.Unmarshal(data, &out); err != nil || out.Result == nil {
		t.Fatalf("%s: HTTP %d, response %.300q", msg["method"], resp.StatusCode, data)
	}
	return out.Result
}

// call calls a tool and returns whether it is a tool error, and its text.
func (c *rawClient) call(t *testing.T, name string, args map[string]any) (bool, string) {
	t.Helper()
	res := c.post(t, map[string]any{"method": "tools/call", "params": map[string]any{"name": name, "arguments": args}})
	var text string
	if content, _ := res["content"].([]any); len(content) > 0 {
		first, _ := content[0].(map[string]any)
		text, _ = first["text"].(string)
	}
	isError, _ := res["isError"].(bool)
	return isError, text
}

// auditLines reads the audit log at path and checks that no line is over
// limit bytes or holds a raw escape character.
func auditLines(t *testing.T, path string, limit int) [][]byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.Split(bytes.TrimSuffix(data, []byte("\n")), []byte("\n"))
	for i, line := range lines {
		if len(line) > limit {
			t.Errorf("%s:%d has %d bytes; want at most %d", path, i+1, len(line), limit)
		}
	}
	if bytes.ContainsAny(data, "\x1b\x07") {
		t.Errorf("%s holds a raw control character of the client's name", path)
	}
	return lines
}

// Issue 13.2: one read_file with a 9 MiB session_id, and a client whose
// clientInfo.name is 4 MB making many calls, must neither poison the audit
// log (the next start-up refusing it) nor fill the disk; the server, a
// restarted server and `safe-run run` go on appending to the same chain,
// which `audit verify` accepts. Through MCP over HTTP; the CLI's part is
// `run --audit-log` on the attacked log.
func TestThreatAuditLogPoisoning(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.log")
	ts := startServerAt(t, "http", filepath.Join(dir, "state"), nil, "--audit-log", path)

	huge := "session-" + strings.Repeat("a", 9<<20)
	res, _ := ts.tool(t, "read_file", map[string]any{"session_id": huge, "path": "x"})
	if !res.IsError || !strings.Contains(text(res), `"session_id" is not a session id`) || len(text(res)) > 4096 {
		t.Errorf("read_file with a 9 MiB session_id: %d bytes %.200q; want one short refusal", len(text(res)), text(res))
	}
	// A restart on the log as that call left it: `safe-run run` appends
	// to it, and so does a second server.
	if r := safeRun(t, "", "run", "--audit-log", path, "--lang", "bash", "-c", "echo cli"); r.code != 0 || r.stdout != "cli\n" {
		t.Errorf("safe-run run --audit-log after the 9 MiB session_id: exit %d, stdout %q, stderr %.300q", r.code, r.stdout, r.stderr)
	}
	second := startServerAt(t, "stdio", filepath.Join(dir, "state2"), nil, "--audit-log", path)
	if res, out := second.mustCall(t, map[string]any{"language": "bash", "code": "echo restarted"}); res.IsError || out["stdout"] != "restarted\n" {
		t.Fatalf("run on the restarted server: %v %s", out, text(res))
	}

	evil := dialRaw(t, ts.url, hugeClientName)
	const calls = 20
	for range calls {
		isError, text := evil.call(t, "read_file", map[string]any{"session_id": "session-" + randomHex(16), "path": "x"})
		if !isError || !strings.Contains(text, "create_session") {
			t.Fatalf("read_file of an unknown session: %q", text)
		}
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() > 256<<10 {
		t.Errorf("audit log after %d calls of a 4 MB client name: %v, %d bytes; want well under 256 KiB", calls, err, fi.Size())
	}
	// Positive control: the attacked server still runs code, and records
	// it; so does `safe-run run` after it.
	if res, out := ts.mustCall(t, map[string]any{"language": "python", "code": "print(6 * 7)"}); res.IsError || out["stdout"] != "42\n" {
		t.Fatalf("run after the attack: %v %s", out, text(res))
	}
	if r := safeRun(t, "", "run", "--audit-log", path, "--lang", "bash", "-c", "echo cli"); r.code != 0 || r.stdout != "cli\n" {
		t.Errorf("safe-run run --audit-log after the 4 MB client name: exit %d, stdout %q, stderr %.300q", r.code, r.stdout, r.stderr)
	}
	r := safeRun(t, "", "audit", "verify", path)
	if r.code != 0 || !strings.Contains(r.stdout, ": ok: ") {
		t.Fatalf("audit verify: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	t.Logf("audit verify: %s", strings.TrimSpace(r.stdout))

	lines := auditLines(t, path, 8<<10)
	named := 0
	for _, line := range lines {
		if bytes.Contains(line, []byte(`"client_name":"evil\\u001b]0;pwned\\u0007nnn`)) && bytes.Contains(line, []byte("…[cut: ")) {
			named++
		}
	}
	if named != calls {
		t.Errorf("%d records carry the client's name cut and escaped; want %d", named, calls)
	}
	if fi, _ := os.Stat(path); fi != nil {
		t.Logf("%d records, %d bytes", len(lines), fi.Size())
	}
}

// Issue 13.2: rotated files are deleted beyond --audit-max-files, so a
// flood of records cannot fill the disk, and the chain that remains still
// verifies.
func TestThreatAuditLogRetention(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.log")
	ts := startServerAt(t, "http", filepath.Join(dir, "state"), nil,
		"--audit-log", path, "--audit-max-size", "8KiB", "--audit-max-files", "3")
	evil := dialRaw(t, ts.url, hugeClientName)
	for range 60 {
		evil.call(t, "list_files", map[string]any{"session_id": "session-" + randomHex(16)})
	}
	files, _ := filepath.Glob(path + "*")
	var total int64
	rotated := 0
	for _, f := range files {
		if f == path+".lock" {
			continue
		}
		if f != path {
			rotated++
		}
		fi, _ := os.Stat(f)
		total += fi.Size()
	}
	if rotated != 3 || total > 4*8<<10 {
		t.Errorf("%d rotated files, %d bytes in all (%v); want 3 and at most 32 KiB", rotated, total, files)
	}
	r := safeRun(t, "", "audit", "verify", path)
	if r.code != 0 || strings.Contains(r.stdout, "first record 1,") {
		t.Fatalf("audit verify: exit %d, stdout %q, stderr %q; want a chain whose oldest records were deleted", r.code, r.stdout, r.stderr)
	}
	t.Logf("audit verify: %s", strings.TrimSpace(r.stdout))
}
