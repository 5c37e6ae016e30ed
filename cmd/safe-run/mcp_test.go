package main

// End-to-end tests of `safe-run serve` through the mcp-go client, over
// stdio and Streamable HTTP, with the real runsc and image (see cli_test.go).

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	mcpgo "github.com/mark3labs/mcp-go/mcp"
)

// testServer is a running `safe-run serve` and a client connected to it.
type testServer struct {
	client   *client.Client
	url      string // of the HTTP server
	stateDir string
	mu       sync.Mutex
	progress []map[string]any
}

// binary returns the safe-run binary under test: SAFE_RUN_BIN, which
// `make test` sets; without it the test is skipped, or fails under
// SAFE_RUN_INTEGRATION=1.
func binary(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("SAFE_RUN_BIN")
	if bin == "" {
		if os.Getenv("SAFE_RUN_INTEGRATION") == "1" {
			t.Fatal("SAFE_RUN_BIN is not set")
		}
		t.Skip("end-to-end test needs the built binary and the default image (run `make test`)")
	}
	return bin
}

// startServer starts safe-run serve over the given transport ("stdio" or
// "http") and returns an initialized client.
func startServer(t *testing.T, transportName string, extraArgs ...string) *testServer {
	t.Helper()
	return startServerEnv(t, transportName, nil, extraArgs...)
}

// startServerEnv is startServer with env added to the server's environment.
func startServerEnv(t *testing.T, transportName string, env []string, extraArgs ...string) *testServer {
	t.Helper()
	return startServerAt(t, transportName, filepath.Join(t.TempDir(), "state"), env, extraArgs...)
}

// startServerAt is startServerEnv with the given state directory.
func startServerAt(t *testing.T, transportName, stateDir string, env []string, extraArgs ...string) *testServer {
	t.Helper()
	bin := binary(t)
	ts := &testServer{stateDir: stateDir}
	// TEST_SERVE_LOG_LEVEL=debug shows the HTTP server's log while testing.
	level := os.Getenv("TEST_SERVE_LOG_LEVEL")
	if level == "" {
		level = "warn"
	}
	args := append([]string{"serve", "--state-dir", ts.stateDir, "--log-level", level}, extraArgs...)
	var c *client.Client
	var err error
	switch transportName {
	case "stdio":
		c, err = client.NewStdioMCPClient(bin, env, args...)
		if err != nil {
			t.Fatalf("start stdio server: %v", err)
		}
	case "http":
		ts.url = startHTTPServe(t, bin, append(args, "--http", "127.0.0.1:0"), env)
		c, err = client.NewStreamableHttpClient(ts.url)
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatalf("start client: %v", err)
	}
	c.OnNotification(func(n mcpgo.JSONRPCNotification) {
		if n.Method == "notifications/progress" {
			ts.mu.Lock()
			ts.progress = append(ts.progress, n.Params.AdditionalFields)
			ts.mu.Unlock()
		}
	})
	initialize(t, ctx, c, "safe-run-test")
	ts.client = c
	return ts
}

// connectHTTP connects an MCP client to the Streamable HTTP server at url
// and initializes it as name. The caller closes it.
func connectHTTP(t *testing.T, url, name string) *client.Client {
	t.Helper()
	c, err := client.NewStreamableHttpClient(url)
	if err != nil {
		t.Fatal(err)
	}
	ready := false
	defer func() {
		if !ready {
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatalf("start client: %v", err)
	}
	initialize(t, ctx, c, name)
	ready = true
	return c
}

// initialize sends the MCP initialize request as the client name.
func initialize(t *testing.T, ctx context.Context, c *client.Client, name string) {
	t.Helper()
	var init mcpgo.InitializeRequest
	init.Params.ClientInfo = mcpgo.Implementation{Name: name, Version: "1"}
	if _, err := c.Initialize(ctx, init); err != nil {
		t.Fatalf("initialize: %v", err)
	}
}

// waitForURL reads the server's stderr until it says where it listens, and
// keeps draining it so the server never blocks on a full pipe.
func waitForURL(t *testing.T, stderr interface{ Read([]byte) (int, error) }) string {
	t.Helper()
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if os.Getenv("TEST_SERVE_LOG_LEVEL") != "" {
				fmt.Fprintln(os.Stderr, "server:", sc.Text())
			}
			if _, url, ok := strings.Cut(sc.Text(), "serving MCP at "); ok {
				found <- url
			}
		}
	}()
	select {
	case url := <-found:
		return url
	case <-time.After(60 * time.Second):
		t.Fatal("the HTTP server did not say where it listens within 60s")
	}
	return ""
}

func (ts *testServer) call(t *testing.T, ctx context.Context, args map[string]any, progressToken any) (*mcpgo.CallToolResult, error) {
	t.Helper()
	req := mcpgo.CallToolRequest{}
	req.Params.Name = "run_code"
	req.Params.Arguments = args
	if progressToken != nil {
		req.Params.Meta = &mcpgo.Meta{ProgressToken: progressToken}
	}
	return ts.client.CallTool(ctx, req)
}

func (ts *testServer) mustCall(t *testing.T, args map[string]any) (*mcpgo.CallToolResult, map[string]any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	res, err := ts.call(t, ctx, args, nil)
	if err != nil {
		t.Fatalf("call run_code: %v", err)
	}
	var structured map[string]any
	data, _ := json.Marshal(res.StructuredContent)
	json.Unmarshal(data, &structured)
	return res, structured
}

func text(res *mcpgo.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(mcpgo.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

var transports = []string{"stdio", "http"}

func TestMCPToolsAndLanguages(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			ts := startServer(t, tr)
			tools, err := ts.client.ListTools(context.Background(), mcpgo.ListToolsRequest{})
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			var tool mcpgo.Tool
			for _, tl := range tools.Tools {
				names = append(names, tl.Name)
				if tl.Name == "run_code" {
					tool = tl
				}
			}
			slices.Sort(names)
			if want := []string{"close_session", "create_session", "list_files", "list_sessions", "read_file", "run_code", "write_file"}; !slices.Equal(names, want) {
				t.Fatalf("tools %v, want %v", names, want)
			}
			a := tool.Annotations
			if a.ReadOnlyHint == nil || *a.ReadOnlyHint || a.OpenWorldHint == nil || *a.OpenWorldHint {
				t.Errorf("annotations %+v: want readOnlyHint false and openWorldHint false", a)
			}
			for _, want := range []string{"Python 3", "numpy", "pandas", "matplotlib", "Node.js", "bash", "no network", "/workspace/out", "Each call starts from scratch"} {
				if !strings.Contains(tool.Description, want) {
					t.Errorf("description lacks %q:\n%s", want, tool.Description)
				}
			}
			if len(tool.RawOutputSchema) == 0 && tool.OutputSchema.Type == "" {
				t.Error("run_code has no output schema")
			}
			for lang, code := range map[string]string{
				"python": "print('hi from python')", "node": "console.log('hi from node')", "bash": "echo hi from bash",
			} {
				res, out := ts.mustCall(t, map[string]any{"language": lang, "code": code})
				if res.IsError || out["status"] != "ok" || out["stdout"] != "hi from "+lang+"\n" {
					t.Errorf("%s: isError %v, structured %v", lang, res.IsError, out)
				}
			}
		})
	}
}

func TestMCPFailuresAndInvalidArguments(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			ts := startServer(t, tr)
			res, out := ts.mustCall(t, map[string]any{"language": "python", "code": "print('before')\nraise ValueError('bad input value')"})
			if !res.IsError || out["status"] != "error" || out["exit_code"] != float64(1) || !strings.Contains(text(res), "ValueError: bad input value") {
				t.Errorf("failing program: isError %v, structured %v, text %q", res.IsError, out, text(res))
			}
			for _, tc := range []struct {
				name string
				args map[string]any
				want string
			}{
				{"unknown language", map[string]any{"language": "ruby", "code": "puts 1"}, `"language": "ruby" is not available; use one of python, node, bash`},
				{"missing code", map[string]any{"language": "python"}, `"code": is empty`},
				{"wrong type", map[string]any{"language": "python", "code": 42}, `"code" must be of type string`},
				{"negative timeout", map[string]any{"language": "bash", "code": "true", "timeout_seconds": -1}, `"timeout_seconds" must be greater than 0`},
				{"unknown argument", map[string]any{"language": "bash", "code": "true", "memory": "1G"}, `unknown argument "memory"`},
				{"escaping file", map[string]any{"language": "bash", "code": "true", "files": []any{map[string]any{"path": "../x", "content": "x"}}}, "leaves the workspace"},
				{"bad base64", map[string]any{"language": "bash", "code": "true", "files": []any{map[string]any{"path": "x", "content": "%%%", "encoding": "base64"}}}, "not valid base64"},
			} {
				res, _ := ts.mustCall(t, tc.args)
				if !res.IsError || !strings.Contains(text(res), tc.want) {
					t.Errorf("%s: isError %v, text %q; want an error containing %q", tc.name, res.IsError, text(res), tc.want)
				}
			}
		})
	}
}

func TestMCPFilesInAndImagesOut(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			ts := startServer(t, tr)
			res, out := ts.mustCall(t, map[string]any{
				"language": "python",
				"files": []any{
					map[string]any{"path": "data/values.csv", "content": "x,y\n1,2\n2,4\n3,9\n"},
					map[string]any{"path": "blob.bin", "content": base64.StdEncoding.EncodeToString([]byte{0, 1, 2}), "encoding": "base64"},
				},
				"code": `
import pandas as pd, matplotlib.pyplot as plt
df = pd.read_csv("data/values.csv")
df.plot(x="x", y="y"); plt.savefig("out/plot.png")
df.describe().to_csv("out/summary.csv")
print(len(open("blob.bin", "rb").read()), int(df.y.sum()))`,
			})
			if res.IsError || out["stdout"] != "3 15\n" {
				t.Fatalf("isError %v, structured %v, text %s", res.IsError, out, text(res))
			}
			var image, csv bool
			for _, c := range res.Content {
				switch c := c.(type) {
				case mcpgo.ImageContent:
					data, _ := base64.StdEncoding.DecodeString(c.Data)
					image = c.MIMEType == "image/png" && strings.HasPrefix(string(data), "\x89PNG")
				case mcpgo.EmbeddedResource:
					if r, ok := c.Resource.(mcpgo.TextResourceContents); ok {
						csv = r.MIMEType == "text/csv" && strings.Contains(r.Text, "mean")
					}
				}
			}
			if !image || !csv {
				t.Errorf("want the plot as PNG image content (%v) and summary.csv as a text resource (%v); content: %s", image, csv, text(res))
			}
		})
	}
}

func TestMCPProgress(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			ts := startServer(t, tr)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			res, err := ts.call(t, ctx, map[string]any{"language": "bash", "code": "sleep 3; echo done"}, "progress-1")
			if err != nil || res.IsError {
				t.Fatalf("call: %v %s", err, text(res))
			}
			ts.mu.Lock()
			defer ts.mu.Unlock()
			if len(ts.progress) < 2 {
				t.Fatalf("got %d progress notifications during a 3s run, want at least 2", len(ts.progress))
			}
			last := -1.0
			for _, p := range ts.progress {
				v, _ := p["progress"].(float64)
				if p["progressToken"] != "progress-1" || v < last {
					t.Errorf("bad progress notification %v (previous progress %v)", p, last)
				}
				last = v
			}
		})
	}
}

// TestMCPCancellationKillsTheSandbox cancels a call and checks the host:
// within a second, no process or state of the sandbox is left.
func TestMCPCancellationKillsTheSandbox(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			// Without a warm pool, the cancelled run's sandbox is the only one.
			ts := startServer(t, tr, "--pool=")
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				_, err := ts.call(t, ctx, map[string]any{"language": "bash", "code": "echo started; sleep 120"}, nil)
				done <- err
			}()
			// Wait until the sandbox is up, then cancel.
			waitUntil(t, 30*time.Second, func() bool { return len(sandboxProcesses(ts.stateDir)) > 0 })
			cancel()
			t.Logf("cancelled at %s", time.Now().Format("15:04:05.000"))
			<-done
			deadline := time.Now().Add(time.Second)
			for time.Now().Before(deadline) && (len(sandboxProcesses(ts.stateDir)) > 0 || len(stateEntries(ts.stateDir)) > 0) {
				time.Sleep(20 * time.Millisecond)
			}
			if procs := sandboxProcesses(ts.stateDir); len(procs) > 0 {
				t.Errorf("1s after cancelling, sandbox processes remain: %v", procs)
			}
			if entries := stateEntries(ts.stateDir); len(entries) > 0 {
				t.Errorf("1s after cancelling, state remains: %v", entries)
			}
		})
	}
}

// TestMCPWarmPool runs code in each language through a server with a warm
// pool: the pool fills (one sandbox per language here, so the state
// directory shows them all), serves the calls, refills, and is gone when
// the server stops.
func TestMCPWarmPool(t *testing.T) {
	ts := startServer(t, "stdio", "--pool", "python=1,node=1,bash=1")
	stateDir := ts.stateDir
	full := func() bool {
		pooled, _ := filepath.Glob(filepath.Join(stateDir, "*", "pooled"))
		return len(pooled) == 3 && len(stateEntries(stateDir)) == 3
	}
	waitUntil(t, 3*time.Minute, full) // a first checkpoint build included
	for _, tc := range []struct{ lang, code, want string }{
		{"python", "import pandas as pd, sys; print(pd.__version__, __name__, sys.argv)", "1.5.3 __main__ ['main.py']\n"},
		{"node", "console.log(require.main === module, 6 * 7)", "true 42\n"},
		{"bash", "echo $((6 * 7))", "42\n"},
	} {
		res, out := ts.mustCall(t, map[string]any{"language": tc.lang, "code": tc.code})
		if res.IsError || out["stdout"] != tc.want {
			t.Errorf("%s: %v", tc.lang, out)
		}
		waitUntil(t, time.Minute, full)
	}
	ts.client.Close()
	waitUntil(t, 30*time.Second, func() bool {
		return len(sandboxProcesses(stateDir)) == 0 && len(stateEntries(stateDir)) == 0
	})
}

func TestMCPConcurrentCalls(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			ts := startServer(t, tr, "--max-concurrent", "4")
			var wg sync.WaitGroup
			errs := make(chan string, 8)
			for i := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					res, out := ts.mustCall(t, map[string]any{"language": "python", "code": fmt.Sprintf("import time; time.sleep(0.5); print(%d * %d)", i, i)})
					if res.IsError || out["stdout"] != fmt.Sprintf("%d\n", i*i) {
						errs <- fmt.Sprintf("call %d: %v", i, out)
					}
				}()
			}
			wg.Wait()
			close(errs)
			for e := range errs {
				t.Error(e)
			}
		})
	}
}

func TestMCPEnvironmentResource(t *testing.T) {
	ts := startServer(t, "stdio")
	req := mcpgo.ReadResourceRequest{}
	req.Params.URI = "safe-run://environment"
	res, err := ts.client.ReadResource(context.Background(), req)
	if err != nil || len(res.Contents) != 1 {
		t.Fatalf("read resource: %v %+v", err, res)
	}
	var env struct {
		Languages []struct {
			Name, Version string
			Packages      map[string]string
		}
		Network   string
		MaxLimits struct {
			TimeoutSeconds float64 `json:"timeout_seconds"`
		} `json:"max_limits"`
	}
	if err := json.Unmarshal([]byte(res.Contents[0].(mcpgo.TextResourceContents).Text), &env); err != nil {
		t.Fatal(err)
	}
	if len(env.Languages) != 3 || env.Network != "none" || env.MaxLimits.TimeoutSeconds != 600 {
		t.Errorf("environment = %+v", env)
	}
	for _, l := range env.Languages {
		if l.Version == "" {
			t.Errorf("%s has no version", l.Name)
		}
		if l.Name == "python" && (l.Packages["numpy"] == "" || l.Packages["pytest"] == "") {
			t.Errorf("python packages lack numpy or pytest: %v", l.Packages)
		}
	}
}

func TestServeRefusesUnsafeHTTP(t *testing.T) {
	r := safeRun(t, "", "serve", "--http", "0.0.0.0:0")
	if r.code != exitUsage || !strings.Contains(r.stderr, "bearer token") {
		t.Errorf("exit %d, stderr %q; want a refusal naming the token", r.code, r.stderr)
	}
}

// sandboxProcesses lists the processes of sandboxes whose state is below
// stateDir: runsc and gVisor's, whose command lines name the run's
// directory (the server's own names only stateDir).
func sandboxProcesses(stateDir string) []string {
	var out []string
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		cmdline, err := os.ReadFile(p)
		if err == nil && strings.Contains(string(cmdline), stateDir+"/safe-run-") {
			out = append(out, p)
		}
	}
	return out
}

func stateEntries(stateDir string) []string {
	entries, _ := os.ReadDir(stateDir)
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

func waitUntil(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("condition not reached within %v", d)
}

func (ts *testServer) tool(t *testing.T, name string, args map[string]any) (*mcpgo.CallToolResult, map[string]any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	req := mcpgo.CallToolRequest{}
	req.Params.Name, req.Params.Arguments = name, args
	res, err := ts.client.CallTool(ctx, req)
	if err != nil {
		t.Fatalf("call %s: %v", name, err)
	}
	var structured map[string]any
	data, _ := json.Marshal(res.StructuredContent)
	json.Unmarshal(data, &structured)
	return res, structured
}

func TestMCPSessions(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			ts := startServer(t, tr, "--max-sessions", "2")
			res, info := ts.tool(t, "create_session", map[string]any{"language": "python"})
			id, _ := info["session_id"].(string)
			if res.IsError || id == "" {
				t.Fatalf("create_session: %s", text(res))
			}
			run := func(code string) (*mcpgo.CallToolResult, map[string]any) {
				return ts.tool(t, "run_code", map[string]any{"language": "python", "session_id": id, "code": code, "timeout_seconds": 60})
			}
			run("x = 41")
			if res, out := run("x + 1"); res.IsError || out["stdout"] != "42\n" {
				t.Errorf("x + 1 in the session: %v %s", out, text(res))
			}
			if res, _ := ts.tool(t, "write_file", map[string]any{"session_id": id, "path": "data/sq.csv", "content": "x,y\n1,1\n2,4\n3,9\n"}); res.IsError {
				t.Fatalf("write_file: %s", text(res))
			}
			run("import pandas as pd")
			res, out := run("import matplotlib.pyplot as plt\ndf = pd.read_csv('data/sq.csv')\ndf.plot(x='x', y='y')\nplt.show()\nint(df.y.sum())")
			var image bool
			for _, c := range res.Content {
				if img, ok := c.(mcpgo.ImageContent); ok && img.MIMEType == "image/png" {
					image = true
				}
			}
			if res.IsError || out["stdout"] != "14\n" || !image {
				t.Errorf("plot in the session: image %v, %v, %s", image, out, text(res))
			}
			if res, _ := ts.tool(t, "list_files", map[string]any{"session_id": id}); !strings.Contains(text(res), "data/sq.csv") || !strings.Contains(text(res), "out/figure-1.png") {
				t.Errorf("list_files: %s", text(res))
			}
			if res, _ := ts.tool(t, "read_file", map[string]any{"session_id": id, "path": "data/sq.csv"}); res.IsError || !strings.Contains(text(res), "3,9") {
				t.Errorf("read_file: %s", text(res))
			}
			if res, _ := ts.tool(t, "read_file", map[string]any{"session_id": id, "path": "../etc/passwd"}); !res.IsError {
				t.Errorf("read_file ../etc/passwd: %s", text(res))
			}
			// The limit of two sessions holds.
			ts.tool(t, "create_session", map[string]any{"language": "bash"})
			if res, _ := ts.tool(t, "create_session", map[string]any{"language": "node"}); !res.IsError || !strings.Contains(text(res), "too many sessions") {
				t.Errorf("third session: %s", text(res))
			}
			if res, _ := ts.tool(t, "close_session", map[string]any{"session_id": id}); res.IsError {
				t.Errorf("close_session: %s", text(res))
			}
			if res, _ := run("x"); !res.IsError || !strings.Contains(text(res), "create_session") {
				t.Errorf("call on a closed session: %s", text(res))
			}
		})
	}
}

// TestMCPSessionEndsWithItsConnection: a session belongs to the MCP
// session that created it; when that ends (the client's DELETE), so does
// the sandbox session, and a new connection finds no such session.
func TestMCPSessionEndsWithItsConnection(t *testing.T) {
	ts := startServer(t, "http", "--pool=") // the session's are the only sandboxes
	_, info := ts.tool(t, "create_session", map[string]any{"language": "bash"})
	id, _ := info["session_id"].(string)
	ts.tool(t, "run_code", map[string]any{"language": "bash", "session_id": id, "code": "cd /tmp; V=kept"})
	if len(sandboxProcesses(ts.stateDir)) == 0 {
		t.Fatal("the session has no sandbox processes")
	}
	url := ts.url
	ts.client.Close()
	waitUntil(t, 30*time.Second, func() bool { return len(sandboxProcesses(ts.stateDir)) == 0 })

	c := connectHTTP(t, url, "second")
	defer c.Close()
	ts.client = c
	if res, _ := ts.tool(t, "run_code", map[string]any{"language": "bash", "session_id": id, "code": "echo $PWD $V"}); !res.IsError || !strings.Contains(text(res), "no such session") {
		t.Errorf("from a new connection: %s", text(res))
	}
}

func TestMCPSessionStateInEachLanguage(t *testing.T) {
	ts := startServer(t, "stdio")
	for _, tc := range []struct {
		lang  string
		cells []string
		last  string
	}{
		{"node", []string{"let n = 41", "const m = await Promise.resolve(n + 1)"}, "m"},
		{"bash", []string{"cd /tmp; N=42; show() { echo $N; }"}, "show"},
		{"python", []string{"x = 42", "while True: pass"}, "x"}, // the loop times out; x survives
	} {
		_, info := ts.tool(t, "create_session", map[string]any{"language": tc.lang, "timeout_seconds": 2})
		id, _ := info["session_id"].(string)
		for _, c := range tc.cells {
			ts.tool(t, "run_code", map[string]any{"language": tc.lang, "session_id": id, "code": c})
		}
		if res, out := ts.tool(t, "run_code", map[string]any{"language": tc.lang, "session_id": id, "code": tc.last}); out["stdout"] != "42\n" {
			t.Errorf("%s: %v %s", tc.lang, out, text(res))
		}
	}
}

func TestMCPSessionLimitsAndExpiry(t *testing.T) {
	// Long enough that none expires while nine start on a loaded host.
	ts := startServer(t, "stdio", "--session-idle", "15s", "--pool=")
	var first string
	for i := range 8 {
		res, info := ts.tool(t, "create_session", map[string]any{"language": "bash"})
		if res.IsError {
			t.Fatalf("session %d: %s", i+1, text(res))
		}
		if i == 0 {
			first, _ = info["session_id"].(string)
		}
	}
	if res, _ := ts.tool(t, "create_session", map[string]any{"language": "bash"}); !res.IsError || !strings.Contains(text(res), "too many sessions") || !strings.Contains(text(res), "8") {
		t.Errorf("ninth session: %s", text(res))
	}
	// Unused, they expire, and their sandboxes go with them.
	waitUntil(t, 60*time.Second, func() bool {
		return len(sandboxProcesses(ts.stateDir)) == 0 && len(stateEntries(ts.stateDir)) == 0
	})
	if res, _ := ts.tool(t, "run_code", map[string]any{"language": "bash", "session_id": first, "code": "true"}); !res.IsError || !strings.Contains(text(res), "create_session") {
		t.Errorf("expired session: %s", text(res))
	}
	if res, _ := ts.tool(t, "list_sessions", map[string]any{}); !strings.Contains(text(res), "no live sessions") {
		t.Errorf("list_sessions after expiry: %s", text(res))
	}
}

// TestMCPResultCache turns the result cache on and checks that an identical
// call is answered from it, marked cached, and that a different call, or a
// call in a session, is not.
func TestMCPResultCache(t *testing.T) {
	ts := startServer(t, "stdio", "--cache-ttl", "1m", "--pool=")
	code := "import random; print(random.random())"
	_, first := ts.mustCall(t, map[string]any{"language": "python", "code": code})
	_, again := ts.mustCall(t, map[string]any{"language": "python", "code": code})
	if first["cached"] != nil || again["cached"] != true || again["stdout"] != first["stdout"] {
		t.Errorf("first %v\nagain %v", first, again)
	}
	_, other := ts.mustCall(t, map[string]any{"language": "python", "code": code, "stdin": "x"})
	if other["cached"] != nil || other["stdout"] == first["stdout"] {
		t.Errorf("a call with other stdin was answered from the cache: %v", other)
	}
	_, info := ts.tool(t, "create_session", map[string]any{"language": "python"})
	id, _ := info["session_id"].(string)
	for range 2 {
		if _, out := ts.mustCall(t, map[string]any{"language": "python", "code": code, "session_id": id}); out["cached"] != nil {
			t.Errorf("a session call was answered from the cache: %v", out)
		}
	}
}
