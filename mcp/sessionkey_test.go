package mcp

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client/transport"
	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"github.com/safe-run/safe-run/sandbox"
)

// Signed IDs are accepted by every holder of the key and by no one else;
// any change to one is refused. Without a key the IDs are as before:
// random, known to the process that issued them until they end.
func TestSessionIDs(t *testing.T) {
	key := []byte(strings.Repeat("k", 32))
	a, b := &sessionIDs{key: key}, &sessionIDs{key: key}
	other := &sessionIDs{key: []byte(strings.Repeat("o", 32))}
	unkeyed := &sessionIDs{}

	id := a.Generate()
	if id == a.Generate() {
		t.Fatal("two IDs alike")
	}
	flip := func(s string, i int) string {
		c := byte('0')
		if s[i] == '0' {
			c = '1'
		}
		return s[:i] + string(c) + s[i+1:]
	}
	random := len(sessionIDPrefix) + 2*sessionIDRandom
	for _, tc := range []struct {
		name string
		m    *sessionIDs
		id   string
		ok   bool
	}{
		{"issuer", a, id, true},
		{"another holder of the key", b, id, true},
		{"another key", other, id, false},
		{"no key", unkeyed, id, false},
		{"random part changed", b, flip(id, len(sessionIDPrefix)), false},
		{"tag changed", b, flip(id, len(id)-1), false},
		{"tag cut", b, id[:len(id)-2], false},
		{"tag longer", b, id + "00", false},
		{"upper case", b, sessionIDPrefix + strings.ToUpper(id[len(sessionIDPrefix):]), false},
		{"no prefix", b, "xyz-" + id[len(sessionIDPrefix):], false},
		{"random part only", b, id[:random], false},
		{"not hex", b, id[:random] + strings.Repeat("g", 2*32), false},
		{"empty", b, "", false},
		{"unkeyed ID", b, unkeyed.Generate(), false},
	} {
		_, err := tc.m.Validate(tc.id)
		if (err == nil) != tc.ok {
			t.Errorf("%s: Validate(%q) = %v, want ok %v", tc.name, tc.id, err, tc.ok)
		}
	}
	// No replica can tell another that an ID ended: Terminate forgets
	// nothing (the client's DELETE ends its sandbox sessions instead).
	if _, err := a.Terminate(id); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Validate(id); err != nil {
		t.Errorf("a terminated signed ID: %v", err)
	}

	plain := unkeyed.Generate()
	if len(plain) != random || !strings.HasPrefix(plain, sessionIDPrefix) {
		t.Errorf("unkeyed ID %q: want %s and %d hex digits", plain, sessionIDPrefix, 2*sessionIDRandom)
	}
	if _, err := unkeyed.Validate(plain); err != nil {
		t.Errorf("unkeyed ID from its issuer: %v", err)
	}
	if _, err := (&sessionIDs{}).Validate(plain); err == nil {
		t.Error("unkeyed ID accepted by a process that did not issue it")
	}
	_, _ = unkeyed.Terminate(plain)
	if _, err := unkeyed.Validate(plain); err == nil {
		t.Error("unkeyed ID accepted after it ended")
	}
}

// Two servers with one key serve one client: it initializes on A and
// creates a session there, and B serves its calls in that session as the
// same client. A notification stream that B registered and that ends does
// not end the client's sessions (it ends only B's view of the protocol
// session); the client's DELETE, sent to B, does. Without the key B knows
// neither the ID nor the client.
func TestSessionIDsAcrossServers(t *testing.T) {
	key := []byte(strings.Repeat("k", 32))
	sessions := &ownedSessions{}
	env := testEnv()
	env.Sessions = &SessionLimits{MaxSessions: 8}
	start := func(key []byte) string {
		cfg := Config{Runner: &fakeRunner{}, Sessions: sessions, Environment: env, Logger: quietLogger(), SharedSessionIDs: key != nil}
		srv := httptest.NewServer(HTTPHandler(NewServer(cfg), HTTPConfig{SessionKey: key}))
		t.Cleanup(srv.Close)
		return srv.URL + HTTPPath
	}
	onA, onB, unkeyed := start(key), start(key), start(nil)

	c := httpClient(t, onA)
	id := c.GetTransport().(*transport.StreamableHTTP).GetSessionId()
	session := createdSession(callTool(t, c, "create_session", map[string]any{"language": "python"})).ID
	if session == "" {
		t.Fatal("no session created")
	}
	call := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"run_code","arguments":{"language":"python","session_id":"` + session + `","code":"print(1)"}}}`
	version := mcpgo.LATEST_LEGACY_PROTOCOL_VERSION
	code, body := post(t, onB, id, version, call)
	var res struct {
		Result mcpgo.CallToolResult
	}
	_ = json.Unmarshal([]byte(body), &res)
	if code != http.StatusOK || res.Result.IsError || !strings.Contains(body, "ran") {
		t.Fatalf("the call in A's session sent to B: %d %s", code, body)
	}
	if code, body := post(t, unkeyed, id, version, call); code != http.StatusNotFound {
		t.Errorf("the call sent to a server without the key: %d %s", code, body)
	}

	// Ending the stream ends B's registration of the protocol session.
	stream := func(method string) int { return streamRequest(t, method, onB, id) }
	if got := stream(http.MethodGet); got != http.StatusOK {
		t.Fatalf("GET on B: %d", got)
	}
	// B unregisters the stream's protocol session once it sees the stream
	// end, at a moment the test cannot observe: watch for a while whether
	// the session goes (it must not; with no guard in endClient it does).
	post(t, onB, id, version, `{"jsonrpc":"2.0","id":3,"method":"ping"}`)
	for range 20 {
		if n := sessions.count(); n != 1 {
			t.Fatalf("%d sessions after B's notification stream ended; want the client's one", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := stream(http.MethodDelete); got != http.StatusOK {
		t.Fatalf("DELETE on B: %d", got)
	}
	if n := sessions.count(); n != 0 {
		t.Errorf("%d sessions after the client's DELETE on B; want none", n)
	}
}

// With shared IDs, a protocol session that ends on one server for any
// reason but the client's DELETE (its idle expiry there) leaves the
// client's sandbox sessions alone; without, it ends them.
func TestEndClientWithSharedIDs(t *testing.T) {
	for _, shared := range []bool{false, true} {
		sessions := &ownedSessions{}
		h := &handler{cfg: Config{Sessions: sessions, Logger: quietLogger(), SharedSessionIDs: shared}}
		id := "mcp-client"
		ctx := context.Background()
		if _, err := sessions.CreateSession(ctx, sandbox.SessionSpec{Language: "python", Owner: ownerOf(id)}); err != nil {
			t.Fatal(err)
		}
		h.endClient(ctx, standIn(id)) // as mcp-go's idle sweep does
		if want := map[bool]int{false: 0, true: 1}[shared]; sessions.count() != want {
			t.Errorf("shared %v: %d sessions after an idle expiry, want %d", shared, sessions.count(), want)
		}
		h.endClient(context.WithValue(ctx, clientDeleted{}, true), standIn(id))
		if sessions.count() != 0 {
			t.Errorf("shared %v: %d sessions after the client's DELETE, want 0", shared, sessions.count())
		}
	}
}

// The transport's log never holds a session ID, only its owner label.
func TestTransportLogHidesSessionIDs(t *testing.T) {
	var buf strings.Builder
	log := slog.New(sessionsHidden{slog.NewTextHandler(&buf, nil)})
	id := (&sessionIDs{}).Generate()
	log.Info("Sweeping expired session", "session", id)
	log.With("sessionID", id).Warn("failed to terminate session", "err", "x")
	out := buf.String()
	if strings.Contains(out, id) || strings.Count(out, ownerOf(id)) != 2 {
		t.Errorf("log:\n%s\nwant the owner label %s twice and never the ID", out, ownerOf(id))
	}
}
