package mcp_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/mark3labs/mcp-go/client"
	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"github.com/safe-run/safe-run/egress"
	"github.com/safe-run/safe-run/mcp"
	"github.com/safe-run/safe-run/sandbox"
)

// netRunner stands in for the engine of a server started with
// --allow-net pypi: it answers a networked job as the engine does, with the
// network's report and the denials named in the message.
type netRunner struct{ policy sandbox.Policy }

func (r netRunner) Policy() sandbox.Policy { return r.policy }

func (r netRunner) Run(ctx context.Context, job sandbox.Job) (sandbox.Result, error) {
	job, _, err := r.policy.Check(job)
	if err != nil {
		return sandbox.Result{}, err
	}
	return sandbox.Result{Status: sandbox.StatusOK, Stdout: "200\n", DurationMS: 850,
		Message: "network: denied evil.test:443 (not in the allowlist)",
		Network: &egress.Report{Allowlist: job.Network, Connections: []egress.Connection{
			{ID: 1, Kind: egress.KindDNS, Name: "pypi.org", Decision: egress.Allowed},
			{ID: 2, Kind: egress.KindTCP, Name: "pypi.org", Port: 443, Decision: egress.Allowed, BytesOut: 517, BytesIn: 20480},
			{ID: 3, Kind: egress.KindDNS, Name: "evil.test", Decision: egress.Denied, Reason: "not in the allowlist"},
			{ID: 4, Kind: egress.KindTCP, Name: "evil.test", Port: 443, Decision: egress.Denied, Reason: "not in the allowlist"},
		}}}, nil
}

// A call that asks for a network names it with entries or presets of the
// server's list; its result reports what the network saw. A call asking
// for more than the server allows is refused, naming what is allowed.
func ExampleNewServer_network() {
	ctx := context.Background()
	allow, err := egress.Parse([]string{"pypi"})
	if err != nil {
		panic(err)
	}
	runner := netRunner{policy: sandbox.Policy{Network: allow}}
	srv := mcp.NewServer(mcp.Config{Runner: runner, Environment: mcp.ProbeEnvironment(ctx, runner), Version: "example",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
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
	if _, err := c.Initialize(ctx, init); err != nil {
		panic(err)
	}
	call := func(network ...any) {
		var req mcpgo.CallToolRequest
		req.Params.Name = "run_code"
		req.Params.Arguments = map[string]any{"language": "python", "network": network,
			"code": "import urllib.request; print(urllib.request.urlopen('https://pypi.org/simple/').status)"}
		res, err := c.CallTool(ctx, req)
		if err != nil {
			panic(err)
		}
		fmt.Printf("isError %v: %s\n", res.IsError, strings.TrimSpace(res.Content[0].(mcpgo.TextContent).Text))
	}
	call("pypi")
	call("evil.test")

	// Output:
	// isError false: status: ok (exit code 0) in 0.85s
	//
	// stdout:
	// 200
	//
	// network: 1 connection allowed, 1 denied; 1 name not answered
	// network: denied evil.test:443 (not in the allowlist)
	// isError true: Invalid argument "network": network entry "evil.test" is not allowed here; allowed: pypi
}
