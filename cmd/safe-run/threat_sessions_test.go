package main

// Threat case: a session closed while its sandbox starts. One client
// creates sessions; another, on a second HTTP connection, sees them in
// list_sessions and closes them at a random point of their start. Every
// sandbox must belong to a session some path destroys: after each round no
// sandbox may be left beyond the sessions listed, whoever ran the server
// (root, or an ordinary user under scripts/test-rootless.sh).

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	mcpgo "github.com/mark3labs/mcp-go/mcp"
)

// closeWhileBootingRounds is how many rounds the MCP case makes, each with
// two sessions.
const closeWhileBootingRounds = 40

// callTool calls a tool on c and decodes its structured content.
func callTool(c *client.Client, name string, args map[string]any) (*mcpgo.CallToolResult, map[string]any, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	req := mcpgo.CallToolRequest{}
	req.Params.Name, req.Params.Arguments = name, args
	res, err := c.CallTool(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	var structured map[string]any
	data, _ := json.Marshal(res.StructuredContent)
	_ = json.Unmarshal(data, &structured)
	return res, structured, nil
}

// resultText is text(res), or "" without a result.
func resultText(res *mcpgo.CallToolResult) string {
	if res == nil {
		return ""
	}
	return text(res)
}

// listedSessions returns the IDs list_sessions shows on c.
func listedSessions(t *testing.T, c *client.Client) []string {
	t.Helper()
	res, out, err := callTool(c, "list_sessions", map[string]any{})
	if err != nil || res.IsError {
		t.Fatalf("list_sessions: %v %s", err, resultText(res))
	}
	var ids []string
	list, _ := out["sessions"].([]any)
	for _, s := range list {
		if m, ok := s.(map[string]any); ok {
			id, _ := m["session_id"].(string)
			ids = append(ids, id)
		}
	}
	return ids
}

// watchRunIDs records the run directories that appear in stateDir until the
// test ends, so that their cgroups can be checked.
func watchRunIDs(t *testing.T, stateDir string) func() []string {
	var mu sync.Mutex
	seen := map[string]bool{}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			mu.Lock()
			for _, e := range stateEntries(stateDir) {
				seen[e] = true
			}
			mu.Unlock()
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		var ids []string
		for id := range seen {
			ids = append(ids, id)
		}
		return ids
	}
}

func TestThreatSessionClosedWhileBooting(t *testing.T) {
	ts := startServer(t, "http", "--max-sessions", "2", "--pool=")
	creator := ts.client
	closer := connectHTTP(t, ts.url, "closer")
	defer closer.Close()
	seen := watchRunIDs(t, ts.stateDir)
	bash := map[string]any{"language": "bash"}

	// How long a start takes through the server: the closes are spread
	// over it.
	start := time.Now()
	res, info, err := callTool(creator, "create_session", bash)
	if err != nil || res.IsError {
		t.Fatalf("create_session: %v %s", err, resultText(res))
	}
	boot := time.Since(start)
	if res, _, err := callTool(creator, "close_session", map[string]any{"session_id": info["session_id"]}); err != nil || res.IsError {
		t.Fatalf("close_session: %v %s", err, resultText(res))
	}

	var duringBoot, afterBoot int
	for round := range closeWhileBootingRounds {
		created := make(chan string, 2)
		for range 2 { // two calls at once on the creator's connection
			go func() {
				res, _, err := callTool(creator, "create_session", bash)
				switch {
				case err != nil:
					created <- "call error: " + err.Error()
				case res.IsError:
					created <- text(res)
				default:
					created <- ""
				}
			}()
		}
		var ids []string
		for deadline := time.Now().Add(10 * time.Second); len(ids) < 2 && time.Now().Before(deadline); {
			ids = listedSessions(t, closer)
		}
		time.Sleep(time.Duration(rand.Int64N(int64(boot * 3 / 2))))
		var wg sync.WaitGroup
		for _, id := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, _, err := callTool(closer, "close_session", map[string]any{"session_id": id})
				if err != nil || res.IsError && !strings.Contains(text(res), "no such session") {
					t.Errorf("round %d: close_session %s: %v %s", round, id, err, resultText(res))
				}
			}()
		}
		wg.Wait()
		for range 2 {
			switch msg := <-created; {
			case msg == "":
				afterBoot++
			case strings.Contains(msg, "closed while its sandbox started"), strings.Contains(msg, "no such session"):
				duringBoot++
			default:
				t.Errorf("round %d: create_session: %s", round, msg)
			}
		}
		// Both calls have returned and list_sessions shows nothing: no
		// sandbox may be left.
		if listed := listedSessions(t, closer); len(listed) != 0 {
			t.Fatalf("round %d: list_sessions shows %v after every session was closed", round, listed)
		}
		if dirs, procs := stateEntries(ts.stateDir), sandboxProcesses(ts.stateDir); len(dirs) != 0 || len(procs) != 0 {
			t.Fatalf("round %d: list_sessions shows no session, but %d sandboxes live on (run directories %v, %d sandbox processes)",
				round, len(dirs), dirs, len(procs))
		}
	}
	t.Logf("%d sessions closed while they started, %d after (a start takes %s here)", duringBoot, afterBoot, boot.Round(time.Millisecond))
	if duringBoot < closeWhileBootingRounds/5 {
		t.Errorf("only %d of %d closes landed during the start: the case did not test it", duringBoot, 2*closeWhileBootingRounds)
	}
	// The slots are free again, and nothing is left: processes, mounts,
	// cgroups.
	res, info, err = callTool(creator, "create_session", bash)
	if err != nil || res.IsError {
		t.Fatalf("create_session after the rounds: %v %s", err, resultText(res))
	}
	callTool(creator, "close_session", map[string]any{"session_id": info["session_id"]})
	assertNoLeftovers(t, testCgroupParents(t), seen(), ts.stateDir)
}
