package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/safe-run/safe-run/sandbox"
)

func listTools(t *testing.T, c *client.Client) []mcpgo.Tool {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitLimit)
	defer cancel()
	res, err := c.ListTools(ctx, mcpgo.ListToolsRequest{})
	if err != nil {
		t.Fatalf("tools/list: %v", err)
	}
	return res.Tools
}

func TestToolsList(t *testing.T) {
	tests := []struct {
		name       string
		maxTimeout time.Duration
		wantMax    float64
	}{
		{"policy maximum", 0, 3600},
		{"configured maximum", 10 * time.Minute, 600},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := testEnv()
			c := newClient(t, Config{Environment: env, MaxTimeout: tt.maxTimeout})
			tools := listTools(t, c)
			if len(tools) != 1 || tools[0].Name != "run_code" {
				var names []string
				for _, tool := range tools {
					names = append(names, tool.Name)
				}
				t.Fatalf("tools %v, want exactly run_code", names)
			}
			tool := tools[0]

			// Input schema.
			if tool.InputSchema.Type != "object" {
				t.Errorf("input schema type %q, want object", tool.InputSchema.Type)
			}
			if !slices.Equal(tool.InputSchema.Required, []string{"language", "code"}) {
				t.Errorf("input schema requires %v, want [language code]", tool.InputSchema.Required)
			}
			lang, _ := tool.InputSchema.Properties["language"].(map[string]any)
			var enum []string
			for _, v := range lang["enum"].([]any) {
				enum = append(enum, v.(string))
			}
			if !slices.Equal(enum, env.names()) {
				t.Errorf("language enum %v, want %v", enum, env.names())
			}
			var props []string
			for k := range tool.InputSchema.Properties {
				props = append(props, k)
			}
			slices.Sort(props)
			if want := []string{"code", "files", "language", "stdin", "timeout_seconds"}; !slices.Equal(props, want) {
				t.Errorf("input properties %v, want %v", props, want)
			}
			timeout, _ := tool.InputSchema.Properties["timeout_seconds"].(map[string]any)
			if timeout["maximum"] != tt.wantMax {
				t.Errorf("timeout_seconds maximum %v, want %v", timeout["maximum"], tt.wantMax)
			}

			// Annotations: every hint present and false.
			a := tool.Annotations
			for name, hint := range map[string]*bool{
				"readOnlyHint": a.ReadOnlyHint, "destructiveHint": a.DestructiveHint,
				"idempotentHint": a.IdempotentHint, "openWorldHint": a.OpenWorldHint,
			} {
				if hint == nil || *hint {
					t.Errorf("%s = %v, want false", name, hint)
				}
			}

			// Description.
			desc := tool.Description
			wants := []string{"/workspace/out", "no network",
				fmt.Sprintf("defaults to %g", env.DefaultLimits.TimeoutSeconds),
				fmt.Sprintf("at most %g)", tt.wantMax)}
			for _, l := range env.Languages {
				wants = append(wants, l.Name)
			}
			for _, w := range wants {
				if !strings.Contains(desc, w) {
					t.Errorf("description does not mention %q:\n%s", w, desc)
				}
			}
			if !strings.Contains(desc, env.describeLanguages()) {
				t.Errorf("description lacks the languages %q", env.describeLanguages())
			}

			// Output schema: present, valid, and the one the results follow.
			if tool.OutputSchema.Type != "object" {
				t.Fatalf("output schema type %q, want object", tool.OutputSchema.Type)
			}
			data, err := json.Marshal(tool.OutputSchema)
			if err != nil {
				t.Fatal(err)
			}
			compileSchema(t, data)
			var got, want any
			if err := json.Unmarshal(data, &got); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal([]byte(outputSchema), &want); err != nil {
				t.Fatalf("outputSchema is not valid JSON: %v", err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("listed output schema differs from outputSchema:\n%s", data)
			}
		})
	}
}

// The input schema a client sees agrees with what the handler accepts.
func TestInputSchema(t *testing.T) {
	c := newClient(t, Config{})
	data, err := json.Marshal(listTools(t, c)[0].InputSchema)
	if err != nil {
		t.Fatal(err)
	}
	sch := compileSchema(t, data)
	tests := []struct {
		args  string
		valid bool
	}{
		{`{"language": "python", "code": "print(1)"}`, true},
		{`{"language": "bash", "code": "cat", "stdin": "x", "timeout_seconds": 0.5,
		   "files": [{"path": "a.txt", "content": "aGk=", "encoding": "base64"}, {"path": "b.txt", "content": "hi"}]}`, true},
		{`{"language": "python", "code": "1", "timeout_seconds": 3600}`, true},
		{`{"language": "cobol", "code": "1"}`, false},
		{`{"code": "1"}`, false},
		{`{"language": "python"}`, false},
		{`{"language": "python", "code": 42}`, false},
		{`{"language": "python", "code": "1", "timeout_seconds": 0}`, false},
		{`{"language": "python", "code": "1", "timeout_seconds": 3601}`, false},
		{`{"language": "python", "code": "1", "timeout_seconds": "5"}`, false},
		{`{"language": "python", "code": "1", "files": "x"}`, false},
		{`{"language": "python", "code": "1", "files": [{"path": "a"}]}`, false},
		{`{"language": "python", "code": "1", "files": [{"path": "a", "content": "", "encoding": "hex"}]}`, false},
	}
	for _, tt := range tests {
		inst, err := jsonschema.UnmarshalJSON(strings.NewReader(tt.args))
		if err != nil {
			t.Fatal(err)
		}
		if err := sch.Validate(inst); (err == nil) != tt.valid {
			t.Errorf("schema validation of %s: %v, want valid %v", tt.args, err, tt.valid)
		}
	}
}

// progressRecorder collects notifications/progress.
type progressRecorder struct {
	mu      sync.Mutex
	params  []map[string]any
	arrived chan struct{} // signalled after each notification
}

func recordProgress(c *client.Client) *progressRecorder {
	r := &progressRecorder{arrived: make(chan struct{}, 1)}
	c.OnNotification(func(n mcpgo.JSONRPCNotification) {
		if n.Method != "notifications/progress" {
			return
		}
		r.mu.Lock()
		r.params = append(r.params, n.Params.AdditionalFields)
		r.mu.Unlock()
		select {
		case r.arrived <- struct{}{}:
		default:
		}
	})
	return r
}

func (r *progressRecorder) snapshot() []map[string]any {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.params)
}

// waitFor waits until the notifications satisfy cond, failing after
// waitLimit.
func (r *progressRecorder) waitFor(t *testing.T, what string, cond func([]map[string]any) bool) []map[string]any {
	t.Helper()
	deadline := time.After(waitLimit)
	for {
		if got := r.snapshot(); cond(got) {
			return got
		}
		select {
		case <-r.arrived:
		case <-deadline:
			t.Fatalf("no %s within %s; progress notifications: %v", what, waitLimit, r.snapshot())
		}
	}
}

type callResult struct {
	res *mcpgo.CallToolResult
	err error
}

// startCall calls run_code in the background.
func startCall(ctx context.Context, c *client.Client, req mcpgo.CallToolRequest) <-chan callResult {
	done := make(chan callResult, 1)
	go func() {
		res, err := c.CallTool(ctx, req)
		done <- callResult{res, err}
	}()
	return done
}

func TestProgress(t *testing.T) {
	runner := &fakeRunner{result: sandbox.Result{Status: sandbox.StatusOK, Stdout: "done\n"},
		block: make(chan struct{}), started: make(chan struct{}, 1)}
	c := newClient(t, Config{Runner: runner})
	progress := recordProgress(c)

	const token = "progress-token-1"
	req := runCodeRequest(map[string]any{"language": "python", "code": "import time; time.sleep(60)"})
	req.Params.Meta = &mcpgo.Meta{ProgressToken: token}
	done := startCall(t.Context(), c, req)
	receive(t, runner.started, "run")

	// Progress is sent at once and then every second: wait for two, one of
	// which reports the run.
	notes := progress.waitFor(t, "two progress notifications, one while running", func(ps []map[string]any) bool {
		return len(ps) >= 2 && slices.ContainsFunc(ps, func(p map[string]any) bool {
			m, _ := p["message"].(string)
			return strings.HasPrefix(m, "running")
		})
	})
	close(runner.block)
	r := receive(t, done, "result")
	if r.err != nil {
		t.Fatalf("tools/call: %v", r.err)
	}
	if r.res.IsError {
		t.Errorf("IsError = true: %s", firstText(t, r.res))
	}

	last := -1.0
	for i, p := range notes {
		if p["progressToken"] != token {
			t.Errorf("notification %d: progressToken %v, want %q", i, p["progressToken"], token)
		}
		prog, ok := p["progress"].(float64)
		if !ok {
			t.Errorf("notification %d: progress %#v is not a number", i, p["progress"])
		} else if prog < last {
			t.Errorf("notification %d: progress %v after %v", i, prog, last)
		} else {
			last = prog
		}
		if m, _ := p["message"].(string); m == "" {
			t.Errorf("notification %d: no message: %v", i, p)
		}
	}
}

// While a call waits for a sandbox, progress says how many calls are ahead.
func TestProgressWhileWaiting(t *testing.T) {
	runner := &fakeRunner{result: sandbox.Result{Status: sandbox.StatusOK},
		block: make(chan struct{}), started: make(chan struct{}, 2)}
	gate := sandbox.NewGate(1, 1)
	c := newClient(t, Config{Runner: runner, Gate: gate})
	progress := recordProgress(c)
	args := map[string]any{"language": "python", "code": "print(1)"}

	first := startCall(t.Context(), c, runCodeRequest(args))
	receive(t, runner.started, "first run")
	req := runCodeRequest(args)
	req.Params.Meta = &mcpgo.Meta{ProgressToken: 7}
	second := startCall(t.Context(), c, req)
	progress.waitFor(t, "a waiting message", func(ps []map[string]any) bool {
		return slices.ContainsFunc(ps, func(p map[string]any) bool {
			return p["message"] == "waiting for a free sandbox: 0 call(s) ahead"
		})
	})
	for _, p := range progress.snapshot() {
		if p["progressToken"] != 7.0 {
			t.Errorf("progressToken %#v, want 7", p["progressToken"])
		}
	}
	close(runner.block)
	for _, done := range []<-chan callResult{first, second} {
		if r := receive(t, done, "result"); r.err != nil || r.res.IsError {
			t.Errorf("call failed: %v %+v", r.err, r.res)
		}
	}
}

func TestGate(t *testing.T) {
	tests := []struct {
		name string
		gate *sandbox.Gate
	}{
		{"one running none waiting", sandbox.NewGate(1, 0)},
		{"default gate", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			runner := &fakeRunner{result: sandbox.Result{Status: sandbox.StatusOK},
				block: make(chan struct{}), started: make(chan struct{}, 1)}
			c := newClient(t, Config{Runner: runner, Gate: tt.gate})
			args := map[string]any{"language": "python", "code": "print(1)"}

			first := startCall(t.Context(), c, runCodeRequest(args))
			receive(t, runner.started, "first run")
			res := callRunCode(t, c, args)
			if !res.IsError {
				t.Error("second call: IsError = false, want true")
			}
			if got := firstText(t, res); got != sandbox.ErrBusy.Error() {
				t.Errorf("second call: text %q, want %q", got, sandbox.ErrBusy.Error())
			}
			if n := len(runner.Jobs()); n != 1 {
				t.Errorf("runner called %d times, want 1", n)
			}

			close(runner.block)
			if r := receive(t, first, "first result"); r.err != nil || r.res.IsError {
				t.Fatalf("first call failed: %v %+v", r.err, r.res)
			}
			if tt.gate != nil {
				if running, waiting := tt.gate.Load(); running != 0 || waiting != 0 {
					t.Errorf("gate holds %d running, %d waiting after the calls", running, waiting)
				}
			}
			// The slot is free again.
			if res := callRunCode(t, c, args); res.IsError {
				t.Errorf("call after the first finished: %s", firstText(t, res))
			}
		})
	}
}

func TestCancel(t *testing.T) {
	runner := &fakeRunner{block: make(chan struct{}), started: make(chan struct{}, 1), cancelled: make(chan error, 1)}
	gate := sandbox.NewGate(1, 0)
	c := newClient(t, Config{Runner: runner, Gate: gate})

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := startCall(ctx, c, runCodeRequest(map[string]any{"language": "python", "code": "while True: pass"}))
	receive(t, runner.started, "run")
	cancel()
	if err := receive(t, runner.cancelled, "cancellation of the runner's context"); !errors.Is(err, context.Canceled) {
		t.Errorf("runner's ctx.Err() = %v, want context.Canceled", err)
	}
	receive(t, done, "return of the cancelled call")
	if running, waiting := gate.Load(); running != 0 || waiting != 0 {
		t.Errorf("gate holds %d running, %d waiting after the cancelled call", running, waiting)
	}
}

// A call cancelled while it waits for a sandbox leaves the line and never
// runs.
func TestCancelWhileWaiting(t *testing.T) {
	runner := &fakeRunner{result: sandbox.Result{Status: sandbox.StatusOK},
		block: make(chan struct{}), started: make(chan struct{}, 2)}
	gate := sandbox.NewGate(1, 1)
	c := newClient(t, Config{Runner: runner, Gate: gate})
	progress := recordProgress(c)
	args := map[string]any{"language": "python", "code": "print(1)"}

	first := startCall(t.Context(), c, runCodeRequest(args))
	receive(t, runner.started, "first run")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	req := runCodeRequest(args)
	req.Params.Meta = &mcpgo.Meta{ProgressToken: "waiter"}
	second := startCall(ctx, c, req)
	progress.waitFor(t, "the second call waiting", func(ps []map[string]any) bool {
		return slices.ContainsFunc(ps, func(p map[string]any) bool {
			m, _ := p["message"].(string)
			return strings.HasPrefix(m, "waiting")
		})
	})
	cancel()
	receive(t, second, "return of the cancelled call")
	if running, waiting := gate.Load(); running != 1 || waiting != 0 {
		t.Errorf("gate holds %d running, %d waiting; want the first call only", running, waiting)
	}
	close(runner.block)
	if r := receive(t, first, "first result"); r.err != nil || r.res.IsError {
		t.Errorf("first call failed: %v %+v", r.err, r.res)
	}
	if n := len(runner.Jobs()); n != 1 {
		t.Errorf("runner called %d times, want 1: the cancelled call ran", n)
	}
}

func TestEnvironmentResource(t *testing.T) {
	env := testEnv()
	env.Languages = append(env.Languages, LanguageInfo{Name: "ruby"})
	c := newClient(t, Config{Environment: env})
	ctx, cancel := context.WithTimeout(t.Context(), waitLimit)
	defer cancel()

	list, err := c.ListResources(ctx, mcpgo.ListResourcesRequest{})
	if err != nil {
		t.Fatalf("resources/list: %v", err)
	}
	if len(list.Resources) != 1 || list.Resources[0].URI != EnvironmentURI || list.Resources[0].MIMEType != "application/json" {
		t.Errorf("resources %+v, want only %s as application/json", list.Resources, EnvironmentURI)
	}

	var req mcpgo.ReadResourceRequest
	req.Params.URI = EnvironmentURI
	res, err := c.ReadResource(ctx, req)
	if err != nil {
		t.Fatalf("resources/read: %v", err)
	}
	if len(res.Contents) != 1 {
		t.Fatalf("%d contents, want 1", len(res.Contents))
	}
	text, ok := mcpgo.AsTextResourceContents(res.Contents[0])
	if !ok {
		t.Fatalf("contents are %T, want text", res.Contents[0])
	}
	if text.URI != EnvironmentURI || text.MIMEType != "application/json" {
		t.Errorf("contents URI %q, MIME type %q; want %q, application/json", text.URI, text.MIMEType, EnvironmentURI)
	}
	var got Environment
	if err := json.Unmarshal([]byte(text.Text), &got); err != nil {
		t.Fatalf("environment is not JSON: %v\n%s", err, text.Text)
	}
	if !reflect.DeepEqual(got, env) {
		t.Errorf("environment\n%+v\nwant\n%+v", got, env)
	}
}

func TestServerInfo(t *testing.T) {
	srv := NewServer(Config{Runner: &fakeRunner{}, Environment: testEnv(), Version: "1.2.3", Logger: quietLogger()})
	c, err := client.NewInProcessClient(srv)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	var init mcpgo.InitializeRequest
	init.Params.ProtocolVersion = mcpgo.LATEST_PROTOCOL_VERSION
	init.Params.ClientInfo = mcpgo.Implementation{Name: "safe-run-test", Version: "0"}
	res, err := c.Initialize(t.Context(), init)
	if err != nil {
		t.Fatal(err)
	}
	if res.ServerInfo.Name != "safe-run" || res.ServerInfo.Version != "1.2.3" {
		t.Errorf("server info %+v, want safe-run 1.2.3", res.ServerInfo)
	}
	if !strings.Contains(res.Instructions, EnvironmentURI) {
		t.Errorf("instructions do not point to %s: %q", EnvironmentURI, res.Instructions)
	}
	if res.Capabilities.Tools == nil || res.Capabilities.Resources == nil {
		t.Errorf("capabilities %+v lack tools or resources", res.Capabilities)
	}
}
