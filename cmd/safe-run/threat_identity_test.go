package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	mcpgo "github.com/mark3labs/mcp-go/mcp"
)

// postMCP sends one raw JSON-RPC message to the MCP endpoint at url, in the
// protocol session sessionID ("" for none), with the headers given as
// name, value pairs, and returns the status and body.
func postMCP(t *testing.T, url, sessionID, msg string, headers ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(msg))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if sessionID != "" {
		req.Header.Set("Mcp-Session-Id", sessionID)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", msg, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// serveHTTPWithToken starts safe-run serve over HTTP on a loopback port,
// requiring token, without a warm pool, and returns its URL and state
// directory.
func serveHTTPWithToken(t *testing.T, token string) (url, stateDir string) {
	t.Helper()
	stateDir = filepath.Join(t.TempDir(), "state")
	cmd := exec.Command(binary(t), "serve", "--state-dir", stateDir, "--log-level", "warn", "--http", "127.0.0.1:0",
		"--pool=") // no warm sandboxes: the session's are the only ones

	cmd.Env = append(os.Environ(), "SAFE_RUN_TOKEN="+token)
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		if err := cmd.Wait(); err != nil {
			t.Errorf("safe-run serve: %v", err)
		}
		if left := sandboxProcesses(stateDir); len(left) != 0 {
			t.Errorf("sandbox processes left: %v", left)
		}
	})
	return waitForURL(t, stderr), stateDir
}

// modernMeta is the _meta of a sessionless protocol 2026-07-28 request.
const modernMeta = `"_meta":{"` + mcpgo.MetaKeyProtocolVersion + `":"` + mcpgo.ProtocolVersion20260728 + `","` +
	mcpgo.MetaKeyClientInfo + `":{"name":"attacker","version":"1"},"` + mcpgo.MetaKeyClientCapabilities + `":{}}`

// clientTool calls a tool on c and returns its result and text.
func clientTool(t *testing.T, c *client.Client, name string, args map[string]any) (*mcpgo.CallToolResult, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 120*time.Second)
	defer cancel()
	req := mcpgo.CallToolRequest{}
	req.Params.Name, req.Params.Arguments = name, args
	res, err := c.CallTool(ctx, req)
	if err != nil {
		t.Fatalf("call %s: %v", name, err)
	}
	return res, text(res)
}

// TestThreatSessionTakeover: a second client of an HTTP server, holding
// the same bearer token, tries to take over a first client's session while
// a call of it runs: it lists the sessions, reads, writes and lists files,
// runs code (reading a variable, replacing print), closes the session, and
// cancels the running call with notifications/cancelled for each request
// id the victim may have used: from its own protocol session, without one,
// and as a sessionless 2026-07-28 request. Every attempt must fail as if
// the session did not exist, and the victim's call, state and files must
// come through untouched; the victim can do each of these things itself.
func TestThreatSessionTakeover(t *testing.T) {
	token := "identity-" + randomHex(16)
	url, stateDir := serveHTTPWithToken(t, token)
	auth := []string{"Authorization", "Bearer " + token}
	connect := func(name string) *client.Client {
		c, err := client.NewStreamableHttpClient(url, transport.WithHTTPHeaders(map[string]string{auth[0]: auth[1]}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		defer cancel()
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		initialize(t, ctx, c, name)
		return c
	}
	victim, attacker := connect("victim"), connect("attacker")
	if v := victim.ProtocolVersion(); mcpgo.IsModernProtocol(v) {
		t.Errorf("a stock client settled on protocol %s, which has no protocol session", v)
	}

	secret := "victim-secret-" + randomHex(8)
	res, out := clientTool(t, victim, "create_session", map[string]any{"language": "python"})
	id := res.StructuredContent.(map[string]any)["session_id"].(string)
	if res.IsError || id == "" {
		t.Fatalf("create_session: %s", out)
	}
	if res, out := clientTool(t, victim, "run_code", map[string]any{"language": "python", "session_id": id, "code": fmt.Sprintf("secret = %q", secret)}); res.IsError {
		t.Fatalf("victim's first call: %s", out)
	}
	if res, out := clientTool(t, victim, "write_file", map[string]any{"session_id": id, "path": "secret.txt", "content": secret}); res.IsError {
		t.Fatalf("victim's write_file: %s", out)
	}

	// The victim's long call, in flight while the attacker works.
	type callResult struct {
		res *mcpgo.CallToolResult
		out string
	}
	long := make(chan callResult, 1)
	go func() {
		res, out := clientTool(t, victim, "run_code", map[string]any{"language": "python", "session_id": id, "timeout_seconds": 120,
			"code": "import time\ntime.sleep(15)\nprint('long call done', secret)"})
		long <- callResult{res, out}
	}()

	attackerSession := attacker.GetTransport().(*transport.StreamableHTTP).GetSessionId()
	for reqID := range 16 {
		cancel := func(meta string) string {
			return fmt.Sprintf(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":%d%s}}`, reqID, meta)
		}
		modern := append([]string{mcpgo.HeaderProtocolVersion, mcpgo.ProtocolVersion20260728}, auth...)
		if code, body := postMCP(t, url, "", cancel(","+modernMeta), modern...); code < 400 {
			t.Errorf("sessionless 2026-07-28 notifications/cancelled {requestId: %d}: %d %s; want it refused", reqID, code, body)
		}
		if code, body := postMCP(t, url, "", cancel(""), auth...); code != http.StatusNotFound {
			t.Errorf("notifications/cancelled {requestId: %d} without a session: %d %s; want 404", reqID, code, body)
		}
		postMCP(t, url, attackerSession, cancel(""), append([]string{mcpgo.HeaderProtocolVersion, attacker.ProtocolVersion()}, auth...)...)
	}
	modernList := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_sessions","arguments":{},` + modernMeta + `}}`
	if code, body := postMCP(t, url, "", modernList, append([]string{mcpgo.HeaderProtocolVersion, mcpgo.ProtocolVersion20260728,
		mcpgo.HeaderMethod, "tools/call", mcpgo.HeaderName, "list_sessions"}, auth...)...); code != http.StatusBadRequest || strings.Contains(body, id) {
		t.Errorf("sessionless 2026-07-28 list_sessions: %d %s; want 400", code, body)
	}

	if _, out := clientTool(t, attacker, "list_sessions", map[string]any{}); strings.Contains(out, id) {
		t.Errorf("the attacker's list_sessions shows the victim's session: %s", out)
	}
	attacks := []struct {
		tool string
		args map[string]any
	}{
		{"read_file", map[string]any{"session_id": id, "path": "secret.txt"}},
		{"list_files", map[string]any{"session_id": id}},
		{"write_file", map[string]any{"session_id": id, "path": "secret.txt", "content": "overwritten"}},
		{"run_code", map[string]any{"language": "python", "session_id": id, "code": "print(secret)"}},
		{"run_code", map[string]any{"language": "python", "session_id": id, "code": "print = lambda *a, **k: None"}},
		{"close_session", map[string]any{"session_id": id}},
	}
	for _, a := range attacks {
		res, out := clientTool(t, attacker, a.tool, a.args)
		if !res.IsError || !strings.Contains(out, "no such session") || strings.Contains(out, secret) {
			t.Errorf("the attacker's %s on the victim's session: %s; want no such session", a.tool, out)
		}
	}

	r := <-long
	if r.res.IsError || !strings.Contains(r.out, "long call done "+secret) || strings.Contains(r.out, "state was lost") {
		t.Errorf("the victim's long call, attacked: %s", r.out)
	}
	// Positive controls: the victim's state and files are intact, and the
	// victim can do each thing the attacker could not.
	if _, out := clientTool(t, victim, "list_sessions", map[string]any{}); !strings.Contains(out, id) {
		t.Errorf("the victim's list_sessions: %s", out)
	}
	for _, a := range attacks {
		res, out := clientTool(t, victim, a.tool, a.args)
		if res.IsError {
			t.Errorf("the victim's %s: %s", a.tool, out)
		}
		if a.tool == "read_file" && !strings.Contains(out, secret) {
			t.Errorf("the victim's file after the attack: %s", out)
		}
		if a.tool == "close_session" {
			waitUntil(t, 30*time.Second, func() bool { return len(sandboxProcesses(stateDir)) == 0 })
		}
		if a.tool == "run_code" && strings.Contains(a.args["code"].(string), "print(secret)") && !strings.Contains(out, secret) {
			t.Errorf("the victim's variable after the attack: %s", out)
		}
	}
}
