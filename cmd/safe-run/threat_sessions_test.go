package main

// Threat case: a session closed while its sandbox starts. A client creates
// sessions and, in concurrent calls, sees them in list_sessions and closes
// them at a random point of their start. (Before sessions belonged to the
// client that made them, a second connection could do the same.) Every
// sandbox must belong to a session some path destroys: after each round no
// sandbox may be left beyond the sessions listed, whoever ran the server
// (root, or an ordinary user under scripts/test-rootless.sh).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
func listedSessions(c *client.Client) ([]string, error) {
	res, out, err := callTool(c, "list_sessions", map[string]any{})
	if err == nil && res.IsError {
		err = errors.New(text(res))
	}
	if err != nil {
		return nil, fmt.Errorf("list_sessions: %w", err)
	}
	var ids []string
	list, _ := out["sessions"].([]any)
	for _, s := range list {
		if m, ok := s.(map[string]any); ok {
			id, _ := m["session_id"].(string)
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// sessionStart measures how long a session takes to start through the
// server, creating and closing one: the race spreads its closes over it.
func sessionStart(c *client.Client) (time.Duration, error) {
	start := time.Now()
	res, info, err := callTool(c, "create_session", map[string]any{"language": "bash"})
	if err == nil && res.IsError {
		err = errors.New(text(res))
	}
	if err != nil {
		return 0, fmt.Errorf("create_session: %w", err)
	}
	boot := time.Since(start)
	if res, _, err := callTool(c, "close_session", map[string]any{"session_id": info["session_id"]}); err != nil || res.IsError {
		return 0, fmt.Errorf("close_session: %v %s", err, resultText(res))
	}
	return boot, nil
}

// raceTally counts how the closes of closeWhileBooting landed, and the
// calls it made that a server's audit log records: every create_session
// and close_session answered, and the end of every session it closed.
type raceTally struct {
	rounds, duringBoot, afterBoot int
	calls, closed                 int
	problems                      []string
}

// auditRecords is how many records the race's calls add to an audit log.
func (r *raceTally) auditRecords() int { return r.calls + r.closed }

// closeWhileBooting makes one round of the race: two create_session calls
// at once on creator; closer finds the sessions in list_sessions and closes
// them at a random point of up to one and a half start times. It returns
// once every call has.
func closeWhileBooting(creator, closer *client.Client, boot time.Duration, tally *raceTally) {
	created := make(chan string, 2)
	for range 2 {
		go func() {
			res, _, err := callTool(creator, "create_session", map[string]any{"language": "bash"})
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
		var err error
		if ids, err = listedSessions(closer); err != nil {
			tally.problems = append(tally.problems, err.Error())
			break
		}
	}
	time.Sleep(time.Duration(rand.Int64N(int64(boot * 3 / 2))))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, _, err := callTool(closer, "close_session", map[string]any{"session_id": id})
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				tally.calls++
				if !res.IsError {
					tally.closed++
				}
			}
			if err != nil || res.IsError && !strings.Contains(text(res), "no such session") {
				tally.problems = append(tally.problems, fmt.Sprintf("close_session %s: %v %s", id, err, resultText(res)))
			}
		}()
	}
	wg.Wait()
	for range 2 {
		msg := <-created
		if !strings.HasPrefix(msg, "call error: ") {
			tally.calls++
		}
		switch {
		case msg == "":
			tally.afterBoot++
		case strings.Contains(msg, "closed while its sandbox started"), strings.Contains(msg, "no such session"):
			tally.duringBoot++
		default:
			tally.problems = append(tally.problems, "create_session: "+msg)
		}
	}
	tally.rounds++
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
	// Concurrent calls over one connection: its sessions are its own, so
	// the calls that list and close them race the calls that create them.
	creator, closer := ts.client, ts.client
	seen := watchRunIDs(t, ts.stateDir)

	boot, err := sessionStart(creator)
	if err != nil {
		t.Fatal(err)
	}
	var tally raceTally
	for round := range closeWhileBootingRounds {
		closeWhileBooting(creator, closer, boot, &tally)
		for _, p := range tally.problems {
			t.Errorf("round %d: %s", round, p)
		}
		tally.problems = nil
		// Every call has returned and list_sessions shows nothing: no
		// sandbox may be left.
		listed, err := listedSessions(closer)
		if err != nil || len(listed) != 0 {
			t.Fatalf("round %d: list_sessions shows %v (%v) after every session was closed", round, listed, err)
		}
		if dirs, procs := stateEntries(ts.stateDir), sandboxProcesses(ts.stateDir); len(dirs) != 0 || len(procs) != 0 {
			t.Fatalf("round %d: list_sessions shows no session, but %d sandboxes live on (run directories %v, %d sandbox processes)",
				round, len(dirs), dirs, len(procs))
		}
	}
	t.Logf("%d sessions closed while they started, %d after (a start takes %s here)", tally.duringBoot, tally.afterBoot, boot.Round(time.Millisecond))
	if tally.duringBoot < closeWhileBootingRounds/5 {
		t.Errorf("only %d of %d closes landed during the start: the case did not test it", tally.duringBoot, 2*closeWhileBootingRounds)
	}
	// The slots are free again, and nothing is left: processes, mounts,
	// cgroups.
	if _, err := sessionStart(creator); err != nil {
		t.Fatalf("a session after the rounds: %v", err)
	}
	assertNoLeftovers(t, testCgroupParents(t), seen(), ts.stateDir)
}
