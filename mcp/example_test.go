package mcp_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/mark3labs/mcp-go/client"
	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"github.com/safe-run/safe-run/mcp"
	"github.com/safe-run/safe-run/sandbox"
)

// echoRunner is a sandbox.Runner that runs nothing: it answers every job
// with what a real sandbox would print for a one-line greeting program.
type echoRunner struct{}

func (echoRunner) Run(ctx context.Context, job sandbox.Job) (sandbox.Result, error) {
	return sandbox.Result{Status: sandbox.StatusOK, Stdout: "hello from " + job.Language + "\n", DurationMS: 120}, nil
}

// Policy is the zero policy: the default languages and limits.
func (echoRunner) Policy() sandbox.Policy { return sandbox.Policy{} }

// A server over any sandbox.Runner, reached by mcp-go's in-process client
// as a model's client would reach it over stdio or HTTP: the handshake, the
// tool list, a run, and a call the server refuses.
func ExampleNewServer() {
	ctx := context.Background()
	runner := echoRunner{}
	srv := mcp.NewServer(mcp.Config{
		Runner:      runner,
		Environment: mcp.ProbeEnvironment(ctx, runner), // languages and limits from the runner's policy
		Version:     "example",
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
	})

	c, err := client.NewInProcessClient(srv)
	if err != nil {
		panic(err)
	}
	defer c.Close()
	if err := c.Start(ctx); err != nil {
		panic(err)
	}
	var init mcpgo.InitializeRequest
	init.Params.ProtocolVersion = mcpgo.LATEST_PROTOCOL_VERSION
	init.Params.ClientInfo = mcpgo.Implementation{Name: "example-client", Version: "1"}
	hello, err := c.Initialize(ctx, init)
	if err != nil {
		panic(err)
	}
	fmt.Println("server:", hello.ServerInfo.Name, hello.ServerInfo.Version)

	tools, err := c.ListTools(ctx, mcpgo.ListToolsRequest{})
	if err != nil {
		panic(err)
	}
	for _, tool := range tools.Tools {
		fmt.Println("tool:", tool.Name, "requires", tool.InputSchema.Required)
	}

	call := func(args map[string]any) {
		var req mcpgo.CallToolRequest
		req.Params.Name, req.Params.Arguments = "run_code", args
		res, err := c.CallTool(ctx, req)
		if err != nil {
			panic(err)
		}
		text := res.Content[0].(mcpgo.TextContent).Text
		fmt.Printf("isError %v: %s\n", res.IsError, strings.TrimSpace(text))
	}
	call(map[string]any{"language": "python", "code": "print('hello from python')"})
	call(map[string]any{"language": "cobol", "code": "DISPLAY 'hello'"})

	// Output:
	// server: safe-run example
	// tool: run_code requires [language code]
	// isError false: status: ok (exit code 0) in 0.12s
	//
	// stdout:
	// hello from python
	// isError true: Invalid argument "language": "cobol" is not available; use one of python, node, bash
}
