package mcp

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/safe-run/safe-run/sandbox"
)

// ownedSessions is a sandbox.Sessions that keeps the contract on owners as
// the runtime does: a call finds only the sessions of the owner its
// context acts for, and another owner's looks unknown.
type ownedSessions struct {
	mu sync.Mutex
	m  map[string]sandbox.SessionInfo
	n  int
}

func (f *ownedSessions) find(ctx context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s, ok := f.m[id]; !ok || s.Owner != sandbox.OwnerFrom(ctx) {
		return fmt.Errorf("session %q: %w", id, sandbox.ErrNoSession)
	}
	return nil
}

func (f *ownedSessions) CreateSession(ctx context.Context, spec sandbox.SessionSpec) (sandbox.SessionInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = map[string]sandbox.SessionInfo{}
	}
	f.n++
	info := sandbox.SessionInfo{ID: fmt.Sprintf("session-%08x", f.n), Owner: spec.Owner, Language: spec.Language}
	f.m[info.ID] = info
	return info, nil
}

func (f *ownedSessions) RunInSession(ctx context.Context, id string, job sandbox.Job) (sandbox.Result, error) {
	return sandbox.Result{Status: sandbox.StatusOK, Stdout: "ran\n"}, f.find(ctx, id)
}

func (f *ownedSessions) WriteFiles(ctx context.Context, id string, files []sandbox.File) error {
	return f.find(ctx, id)
}

func (f *ownedSessions) ReadFile(ctx context.Context, id, path string) (sandbox.OutputFile, error) {
	return sandbox.OutputFile{Path: path, Data: []byte("secret"), Size: 6, Type: "file"}, f.find(ctx, id)
}

func (f *ownedSessions) ListFiles(ctx context.Context, id, dir string) ([]sandbox.OutputFile, error) {
	return []sandbox.OutputFile{{Path: "secret.txt", Type: "file", Size: 6}}, f.find(ctx, id)
}

func (f *ownedSessions) CloseSession(ctx context.Context, id string) error {
	if err := f.find(ctx, id); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.m, id)
	return nil
}

func (f *ownedSessions) ListSessions() []sandbox.SessionInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []sandbox.SessionInfo
	for _, s := range f.m {
		out = append(out, s)
	}
	return out
}

func (f *ownedSessions) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.m)
}

// sessionCalls are the calls naming a session, each with its arguments.
func sessionCalls(id string) []struct {
	tool string
	args map[string]any
} {
	return []struct {
		tool string
		args map[string]any
	}{
		{"run_code", map[string]any{"language": "python", "session_id": id, "code": "print(secret)"}},
		{"write_file", map[string]any{"session_id": id, "path": "a.txt", "content": "x"}},
		{"read_file", map[string]any{"session_id": id, "path": "secret.txt"}},
		{"list_files", map[string]any{"session_id": id}},
		{"close_session", map[string]any{"session_id": id}},
	}
}

// createdSession decodes create_session's structured result.
func createdSession(res *mcpgo.CallToolResult) sandbox.SessionInfo {
	var info sandbox.SessionInfo
	data, _ := json.Marshal(res.StructuredContent)
	_ = json.Unmarshal(data, &info)
	return info
}

func listedSessions(t *testing.T, c *client.Client) []any {
	t.Helper()
	res := callTool(t, c, "list_sessions", map[string]any{})
	out, _ := res.StructuredContent.(map[string]any)
	data, _ := json.Marshal(res.StructuredContent)
	var listed struct{ Sessions []any }
	if err := json.Unmarshal(data, &listed); err != nil || out == nil && res.IsError {
		t.Fatalf("list_sessions: %s", data)
	}
	return listed.Sessions
}

// One client cannot see, use or end another's session: to it, the session
// is exactly as unknown as one that never existed. The owner can do each.
func TestSessionsBelongToTheirClient(t *testing.T) {
	sessions := &ownedSessions{}
	env := testEnv()
	env.Sessions = &SessionLimits{MaxSessions: 8}
	srv := NewServer(Config{Runner: &fakeRunner{}, Sessions: sessions, Environment: env, Logger: quietLogger()})
	connect := func() *client.Client { return startClient(t, transport.NewInProcessTransport(srv)) }
	victim, attacker := connect(), connect()

	res := callTool(t, victim, "create_session", map[string]any{"language": "python"})
	info := createdSession(res)
	if res.IsError || info.ID == "" {
		t.Fatalf("create_session: %s", firstText(t, res))
	}
	if got := listedSessions(t, attacker); len(got) != 0 {
		t.Errorf("another client's list_sessions shows %v", got)
	}
	if got := listedSessions(t, victim); len(got) != 1 {
		t.Errorf("the owner's list_sessions shows %v, want its one session", got)
	}
	unknown := sessionCalls("session-00000999")
	for i, call := range sessionCalls(info.ID) {
		res := callTool(t, attacker, call.tool, call.args)
		want := strings.ReplaceAll(firstText(t, callTool(t, attacker, unknown[i].tool, unknown[i].args)), "session-00000999", info.ID)
		if got := firstText(t, res); !res.IsError || got != want {
			t.Errorf("%s on another client's session: %q; want what an unknown session gets, %q", call.tool, got, want)
		}
	}
	for _, call := range sessionCalls(info.ID) {
		if res := callTool(t, victim, call.tool, call.args); res.IsError {
			t.Errorf("the owner's %s: %s", call.tool, firstText(t, res))
		}
	}

	// The attacker's own session is its own, and owners are not shown.
	callTool(t, attacker, "create_session", map[string]any{"language": "bash"})
	mine := sessions.ListSessions()[0]
	if got := listedSessions(t, attacker); len(got) != 1 {
		t.Errorf("list_sessions of the second client: %v, want its own session", got)
	}
	if data, _ := json.Marshal(listedSessions(t, attacker)); strings.Contains(string(data), mine.Owner) || mine.Owner == "" {
		t.Errorf("list_sessions shows the owner %q: %s", mine.Owner, data)
	}
}

// When a client's protocol session ends, so do its sandbox sessions: no
// one could reach them any more.
func TestDepartedClientsSessionsEnd(t *testing.T) {
	sessions := &ownedSessions{}
	env := testEnv()
	env.Sessions = &SessionLimits{MaxSessions: 8}
	stays := newClient(t, Config{Sessions: sessions, Environment: env})
	leaves := newClient(t, Config{Sessions: sessions, Environment: env})
	callTool(t, stays, "create_session", map[string]any{"language": "python"})
	callTool(t, leaves, "create_session", map[string]any{"language": "python"})
	callTool(t, leaves, "create_session", map[string]any{"language": "bash"})
	leaves.Close()
	if n := sessions.count(); n != 1 {
		t.Errorf("%d sessions live after one client left; want the other client's one", n)
	}
}

// handle sends one raw JSON-RPC message to s, outside any protocol session.
func handle(t *testing.T, s *server.MCPServer, msg string) map[string]any {
	t.Helper()
	var out map[string]any
	data, _ := json.Marshal(s.HandleMessage(t.Context(), json.RawMessage(msg)))
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatalf("response %s: %v", data, err)
	}
	return out
}

// A call without a protocol session (protocol 2026-07-28, or an embedding
// without sessions) has no owner, so it gets no sandbox session.
func TestSessionToolsNeedAProtocolSession(t *testing.T) {
	sessions := &ownedSessions{}
	env := testEnv()
	env.Sessions = &SessionLimits{MaxSessions: 8}
	s := NewServer(Config{Runner: &fakeRunner{}, Sessions: sessions, Environment: env, Logger: quietLogger()})
	for _, call := range append(sessionCalls("session-00000001")[:1], struct {
		tool string
		args map[string]any
	}{"create_session", map[string]any{"language": "python"}}) {
		args, _ := json.Marshal(call.args)
		out := handle(t, s, fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":%q,"arguments":%s}}`, call.tool, args))
		data, _ := json.Marshal(out)
		if !strings.Contains(string(data), `"isError":true`) || !strings.Contains(string(data), "need an MCP session") {
			t.Errorf("%s without a protocol session: %s", call.tool, data)
		}
	}
	if n := sessions.count(); n != 0 {
		t.Errorf("%d sessions were created without an owner", n)
	}
}

func TestRequestIDsMustBeStringsOrIntegers(t *testing.T) {
	s := NewServer(Config{Runner: &fakeRunner{}, Environment: testEnv(), Logger: quietLogger()})
	for _, tc := range []struct {
		id string
		ok bool
	}{
		{`"a"`, true}, {`7`, true}, {`-3`, true}, {`0`, true},
		{`{"a":1}`, false}, {`{}`, false}, {`[1]`, false}, {`true`, false}, {`1.5`, false}, {`1e300`, false},
	} {
		out := handle(t, s, `{"jsonrpc":"2.0","id":`+tc.id+`,"method":"ping"}`)
		errObj, failed := out["error"].(map[string]any)
		if failed == tc.ok {
			t.Errorf("id %s: %v; want accepted %v", tc.id, out, tc.ok)
		}
		if failed && (errObj["code"] != float64(mcpgo.INVALID_REQUEST) || !strings.Contains(fmt.Sprint(errObj["message"]), "request ids are strings or integers")) {
			t.Errorf("id %s: error %v", tc.id, errObj)
		}
	}
}

// post sends one JSON-RPC message to the HTTP endpoint, in the protocol
// session sessionID ("" for none) at protocol version version ("" to send
// no header), and returns the status and body.
func post(t *testing.T, url, sessionID, version, msg string, headers ...string) (int, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(msg))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if sessionID != "" {
		req.Header.Set("Mcp-Session-Id", sessionID)
	}
	if version != "" {
		req.Header.Set(mcpgo.HeaderProtocolVersion, version)
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

const modern = mcpgo.ProtocolVersion20260728

// modernMeta is the _meta of a 2026-07-28 request.
const modernMeta = `"_meta":{"` + mcpgo.MetaKeyProtocolVersion + `":"` + modern + `","` + mcpgo.MetaKeyClientInfo + `":{"name":"attacker","version":"1"},"` + mcpgo.MetaKeyClientCapabilities + `":{}}`

// startClient starts a client on tr and initializes it.
func startClient(t *testing.T, tr transport.Interface, opts ...client.ClientOption) *client.Client {
	t.Helper()
	c := client.NewClient(tr, opts...)
	t.Cleanup(func() { c.Close() })
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	var init mcpgo.InitializeRequest
	init.Params.ClientInfo = mcpgo.Implementation{Name: "t", Version: "0"}
	if _, err := c.Initialize(t.Context(), init); err != nil {
		t.Fatalf("initialize: %v", err)
	}
	return c
}

func httpClient(t *testing.T, url string, opts ...client.ClientOption) *client.Client {
	t.Helper()
	tr, err := transport.NewStreamableHTTP(url)
	if err != nil {
		t.Fatal(err)
	}
	return startClient(t, tr, opts...)
}

// A second HTTP client cannot cancel the first one's call: neither from a
// protocol session of its own nor with a sessionless 2026-07-28
// notification, which mcp-go would otherwise key like every other
// sessionless request. The caller can cancel its own.
func TestHTTPClientsCannotCancelEachOther(t *testing.T) {
	runner := &fakeRunner{result: sandbox.Result{Status: sandbox.StatusOK, Stdout: "victim's result\n"},
		block: make(chan struct{}), started: make(chan struct{}, 2), cancelled: make(chan error, 2)}
	srv := httptest.NewServer(HTTPHandler(NewServer(Config{Runner: runner, Gate: sandbox.NewGate(2, 0), Environment: testEnv(), Logger: quietLogger()}), HTTPConfig{}))
	t.Cleanup(srv.Close)
	url := srv.URL + HTTPPath

	victim := httpClient(t, url) // negotiates as a stock client does
	done := startCall(t.Context(), victim, runCodeRequest(map[string]any{"language": "python", "code": "while True: pass"}))
	receive(t, runner.started, "the victim's run")

	attacker := httpClient(t, url)
	own := attacker.GetTransport().(*transport.StreamableHTTP).GetSessionId()
	for id := range 8 { // the victim's request id is one of the first
		cancel := func(meta string) string {
			return fmt.Sprintf(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":%d%s}}`, id, meta)
		}
		if code, body := post(t, url, "", modern, cancel(","+modernMeta)); code < 400 {
			t.Errorf("sessionless 2026-07-28 notifications/cancelled {requestId: %d}: %d %s; want it refused", id, code, body)
		}
		if code, body := post(t, url, "", "", cancel("")); code != http.StatusNotFound {
			t.Errorf("notifications/cancelled {requestId: %d} without a session: %d %s; want 404", id, code, body)
		}
		post(t, url, own, mcpgo.LATEST_LEGACY_PROTOCOL_VERSION, cancel(""))
	}
	close(runner.block)
	r := receive(t, done, "the victim's result")
	if r.err != nil || r.res.IsError || len(runner.cancelled) != 0 {
		t.Fatalf("the victim's call was cancelled by another client: %v %+v", r.err, r.res)
	}

	// Positive control: the victim cancels its own call.
	runner.block = make(chan struct{})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done = startCall(ctx, victim, runCodeRequest(map[string]any{"language": "python", "code": "while True: pass"}))
	receive(t, runner.started, "the victim's second run")
	cancel()
	receive(t, runner.cancelled, "the victim's own cancellation")
	receive(t, done, "the cancelled call's return")
}

// The HTTP endpoint speaks the protocol versions with a protocol session
// and refuses 2026-07-28, naming the versions it speaks; stdio, with its
// one client, speaks them all.
func TestProtocolVersions(t *testing.T) {
	sessions := &ownedSessions{}
	env := testEnv()
	env.Sessions = &SessionLimits{MaxSessions: 64}
	cfg := Config{Runner: &fakeRunner{result: sandbox.Result{Status: sandbox.StatusOK}}, Sessions: sessions, Environment: env, Logger: quietLogger()}
	srv := httptest.NewServer(HTTPHandler(NewServer(cfg), HTTPConfig{}))
	t.Cleanup(srv.Close)
	url := srv.URL + HTTPPath

	works := func(t *testing.T, c *client.Client, want string) {
		t.Helper()
		if got := c.ProtocolVersion(); got != want {
			t.Errorf("negotiated %q, want %q", got, want)
		}
		if res := callRunCode(t, c, map[string]any{"language": "python", "code": "1"}); res.IsError {
			t.Errorf("run_code: %s", firstText(t, res))
		}
		info := createdSession(callTool(t, c, "create_session", map[string]any{"language": "python"}))
		if res := callTool(t, c, "run_code", map[string]any{"language": "python", "session_id": info.ID, "code": "1"}); res.IsError {
			t.Errorf("run_code in a session: %s", firstText(t, res))
		}
	}
	for _, v := range mcpgo.ValidProtocolVersions {
		t.Run("http/"+v, func(t *testing.T) {
			if v != modern {
				works(t, httpClient(t, url, client.WithProtocolVersion(v)), v)
				return
			}
			msg := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"run_code","arguments":{"language":"python","code":"1"},` + modernMeta + `}}`
			code, body := post(t, url, "", modern, msg, mcpgo.HeaderMethod, "tools/call", mcpgo.HeaderName, "run_code")
			if code != http.StatusBadRequest || !strings.Contains(body, mcpgo.LATEST_LEGACY_PROTOCOL_VERSION) || strings.Contains(body, `"result"`) {
				t.Errorf("a 2026-07-28 tools/call: %d %s; want 400 naming the versions spoken", code, body)
			}
			// A client that negotiates falls back to the handshake.
			works(t, httpClient(t, url), mcpgo.LATEST_LEGACY_PROTOCOL_VERSION)
		})
		t.Run("stdio/"+v, func(t *testing.T) {
			inR, inW := io.Pipe()
			outR, outW := io.Pipe()
			ctx, stop := context.WithCancel(t.Context())
			served := make(chan struct{})
			go func() {
				defer close(served)
				stdio := server.NewStdioServer(NewServer(cfg))
				stdio.SetErrorLogger(nil)
				_ = stdio.Listen(ctx, inR, outW)
			}()
			t.Cleanup(func() { stop(); inW.Close(); outW.Close(); <-served })
			c := startClient(t, transport.NewIO(outR, inW, io.NopCloser(strings.NewReader(""))), client.WithProtocolVersion(v))
			works(t, c, v)
		})
	}
}

// The notification stream (GET) and DELETE need a live session: mcp-go
// would otherwise mint a session for a GET without one, never to forget
// it, and register one under any ID a GET names.
func TestStreamsNeedASession(t *testing.T) {
	srv := httptest.NewServer(HTTPHandler(NewServer(Config{Runner: &fakeRunner{}, Environment: testEnv(), Logger: quietLogger()}), HTTPConfig{}))
	t.Cleanup(srv.Close)
	url := srv.URL + HTTPPath
	c := httpClient(t, url)
	live := c.GetTransport().(*transport.StreamableHTTP).GetSessionId()
	send := func(method, id string) int { return streamRequest(t, method, url, id) }
	made := "mcp-" + strings.Repeat("0", 32)
	for _, tc := range []struct {
		method, id string
		want       int
	}{
		{http.MethodGet, "", http.StatusBadRequest},
		{http.MethodGet, made, http.StatusNotFound},
		{http.MethodDelete, made, http.StatusNotFound},
		{http.MethodGet, live, http.StatusOK},
		{http.MethodDelete, live, http.StatusOK},
		{http.MethodGet, live, http.StatusNotFound}, // ended
	} {
		if got := send(tc.method, tc.id); got != tc.want {
			t.Errorf("%s with session %q: %d, want %d", tc.method, tc.id, got, tc.want)
		}
	}
	if code, body := post(t, url, live, mcpgo.LATEST_LEGACY_PROTOCOL_VERSION, `{"jsonrpc":"2.0","id":9,"method":"ping"}`); code != http.StatusNotFound {
		t.Errorf("ping in a deleted session: %d %s", code, body)
	}
}

// streamRequest sends a GET (opening the notification stream) or DELETE
// naming session id to url, and returns the status; a stream it opened
// ends as it returns.
func streamRequest(t *testing.T, method, url, id string) int {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, method, url, nil)
	req.Header.Set("Accept", "text/event-stream")
	if id != "" {
		req.Header.Set("Mcp-Session-Id", id)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
