package mcp

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"github.com/safe-run/safe-run/sandbox"
)

// waitLimit bounds every wait of these tests; reaching it is a failure, not
// a measurement.
const waitLimit = 10 * time.Second

// fakeRunner is a sandbox.Runner that records the jobs it is given and
// returns a canned result. With block set, Run waits until block is closed
// or its context ends.
type fakeRunner struct {
	result sandbox.Result
	err    error
	// respond, if set, computes the result instead of result and err.
	respond func(sandbox.Job) (sandbox.Result, error)
	// block, if non-nil, makes Run wait until it is closed or ctx is done.
	block chan struct{}
	// started, if non-nil, receives a value when Run has recorded its job.
	started chan struct{}
	// cancelled, if non-nil, receives ctx.Err() when Run stopped waiting
	// because its context ended.
	cancelled chan error

	// policy is what Policy returns.
	policy sandbox.Policy

	mu   sync.Mutex
	jobs []sandbox.Job
}

func (r *fakeRunner) Policy() sandbox.Policy { return r.policy }

func (r *fakeRunner) Run(ctx context.Context, job sandbox.Job) (sandbox.Result, error) {
	r.mu.Lock()
	r.jobs = append(r.jobs, job)
	r.mu.Unlock()
	if r.started != nil {
		select {
		case r.started <- struct{}{}:
		case <-ctx.Done():
		}
	}
	if r.block != nil {
		select {
		case <-r.block:
		case <-ctx.Done():
			if r.cancelled != nil {
				r.cancelled <- ctx.Err()
			}
			return sandbox.Result{Status: sandbox.StatusKilled, ExitCode: -1, Message: "cancelled"}, nil
		}
	}
	if r.respond != nil {
		return r.respond(job)
	}
	return r.result, r.err
}

// Jobs returns a copy of the jobs Run was given.
func (r *fakeRunner) Jobs() []sandbox.Job {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]sandbox.Job(nil), r.jobs...)
}

// testEnv is the environment the server tests describe.
func testEnv() Environment {
	def, _, hi := sandbox.Policy{}.Limits()
	return Environment{
		Languages: []LanguageInfo{
			{Name: "python", Version: "3.11.2", Packages: map[string]string{"numpy": "1.24.2", "pandas": "1.5.3", "attrs": "22.2.0"}},
			{Name: "node", Version: "18.19.0"},
			{Name: "bash", Version: "5.2.15"},
		},
		Network: "none", Workdir: "/workspace", OutputDir: "/workspace/out",
		DefaultLimits: limitsInfo(def), MaxLimits: limitsInfo(hi), OutputFiles: sandbox.Policy{}.OutputFileLimits(),
	}
}

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// newClient serves cfg with NewServer and returns an initialized in-process
// client. Missing Runner, Environment and Logger get test defaults.
func newClient(t *testing.T, cfg Config) *client.Client {
	t.Helper()
	if cfg.Runner == nil {
		cfg.Runner = &fakeRunner{result: sandbox.Result{Status: sandbox.StatusOK}}
	}
	if cfg.Environment.Languages == nil {
		cfg.Environment = testEnv()
	}
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	c, err := client.NewInProcessClient(NewServer(cfg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.Start(t.Context()); err != nil {
		t.Fatalf("start client: %v", err)
	}
	init := mcpgo.InitializeRequest{}
	init.Params.ProtocolVersion = mcpgo.LATEST_PROTOCOL_VERSION
	init.Params.ClientInfo = mcpgo.Implementation{Name: "safe-run-test", Version: "0"}
	if _, err := c.Initialize(t.Context(), init); err != nil {
		t.Fatalf("initialize: %v", err)
	}
	return c
}

func runCodeRequest(args any) mcpgo.CallToolRequest {
	var req mcpgo.CallToolRequest
	req.Params.Name = "run_code"
	req.Params.Arguments = args
	return req
}

// callRunCode calls run_code with args and fails the test if the call
// itself (not the tool) fails.
func callRunCode(t *testing.T, c *client.Client, args any) *mcpgo.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitLimit)
	defer cancel()
	res, err := c.CallTool(ctx, runCodeRequest(args))
	if err != nil {
		t.Fatalf("tools/call run_code: %v", err)
	}
	return res
}

// firstText returns the text of the result's first content item, which
// run_code always makes its text rendering or error message.
func firstText(t *testing.T, res *mcpgo.CallToolResult) string {
	t.Helper()
	if len(res.Content) == 0 {
		t.Fatal("result has no content")
	}
	tc, ok := mcpgo.AsTextContent(res.Content[0])
	if !ok {
		t.Fatalf("first content is %T, want text", res.Content[0])
	}
	return tc.Text
}

// receive waits for a value from ch, failing the test after waitLimit.
func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitLimit):
		t.Fatalf("no %s within %s", what, waitLimit)
		var zero T
		return zero
	}
}
