// Package mcp exposes safe-run as a Model Context Protocol server, built on
// github.com/mark3labs/mcp-go. It only translates: tool arguments become a
// sandbox.Job, a sandbox.Result becomes a tool result. It knows nothing of
// gVisor; any sandbox.Runner will do.
package mcp

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/safe-run/safe-run/sandbox"
)

// Config configures the MCP server.
type Config struct {
	// Runner runs the jobs; its Policy is the one the tools describe and
	// check jobs against.
	Runner sandbox.Runner
	// Sessions, if set, offers stateful sessions and their tools.
	Sessions sandbox.Sessions
	// Environment describes the sandbox (see ProbeEnvironment).
	Environment Environment
	// Gate bounds concurrent runs and the calls waiting for one.
	Gate *sandbox.Gate
	// MaxTimeout is the longest timeout_seconds a call may ask for.
	MaxTimeout time.Duration
	// Version is safe-run's version, reported to clients.
	Version string
	// Logger receives diagnostics; nil means slog.Default().
	Logger *slog.Logger
	// Metrics, if set, count runs; serve them with HTTPConfig.Metrics.
	Metrics *Metrics
	// SharedSessionIDs says that other servers validate this one's HTTP
	// session IDs (HTTPConfig.SessionKey): a client's sandbox sessions then
	// end at its DELETE only, not when its protocol session expires here.
	SharedSessionIDs bool
}

// EnvironmentURI is the resource describing the sandbox environment.
const EnvironmentURI = "safe-run://environment"

// NewServer returns the MCP server with safe-run's tools and resources.
func NewServer(cfg Config) *server.MCPServer {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Gate == nil {
		cfg.Gate = sandbox.NewGate(1, 0)
	}
	policy := cfg.Runner.Policy()
	if cfg.MaxTimeout == 0 {
		_, _, hi := policy.Limits()
		cfg.MaxTimeout = hi.Timeout
	}
	h := &handler{cfg: cfg, policy: policy, maxTimeout: cfg.MaxTimeout}
	hooks := &server.Hooks{
		OnBeforeCallTool:        []server.OnBeforeCallToolFunc{stampRequestID},
		OnRequestInitialization: []server.OnRequestInitializationFunc{checkRequestID},
	}
	if cfg.Sessions != nil {
		hooks.AddOnUnregisterSession(h.endClient)
	}
	s := server.NewMCPServer("safe-run", cfg.Version,
		server.WithTitle("safe-run"),
		server.WithDescription("Runs Python, Node and Bash code in isolated gVisor sandboxes"),
		server.WithInstructions(instructions(cfg.Environment)),
		server.WithToolCapabilities(false),
		server.WithResourceCapabilities(false, false),
		server.WithRecovery(),
		server.WithHooks(hooks),
		server.WithToolHandlerMiddleware(callContext),
	)
	s.AddTool(runCodeTool(cfg.Environment, cfg.MaxTimeout), h.runCode)
	if cfg.Sessions != nil {
		h.addSessionTools(s)
	}
	s.AddResource(mcpgo.NewResource(EnvironmentURI, "environment",
		mcpgo.WithResourceDescription("Languages, interpreter versions, installed packages and limits of the sandbox"),
		mcpgo.WithMIMEType("application/json")), h.environment)
	return s
}

type handler struct {
	cfg Config
	// policy is the runner's, read once: a runner's policy is fixed.
	policy     sandbox.Policy
	maxTimeout time.Duration
}

func (h *handler) runCode(ctx context.Context, req mcpgo.CallToolRequest) (*mcpgo.CallToolResult, error) {
	job, sessionID, err := h.parseArgs(req.Params.Arguments)
	if err != nil {
		return h.toolError(err), nil
	}
	checked, _, err := h.policy.Check(job)
	if err != nil {
		return h.toolError(err), nil
	}
	// state says what the call is doing, for progress messages.
	var state atomic.Pointer[func() string]
	setState := func(f func() string) { state.Store(&f) }
	setState(func() string { return "waiting for a free sandbox" })
	stop := make(chan struct{})
	reported := make(chan struct{})
	defer func() { close(stop); <-reported }() // no progress notification may follow the result
	go func() {
		defer close(reported)
		reportProgress(ctx, req, func() string { return (*state.Load())() }, stop)
	}()

	leave, err := h.cfg.Gate.Enter(ctx, func(ahead int) {
		msg := fmt.Sprintf("waiting for a free sandbox: %d call(s) ahead", ahead)
		setState(func() string { return msg })
	})
	if err != nil {
		return h.toolError(err), nil
	}
	defer leave()
	started := time.Now()
	timeout := job.Limits.Timeout
	if timeout == 0 {
		def, _, _ := h.policy.Limits()
		timeout = def.Timeout
	}
	setState(func() string {
		return fmt.Sprintf("running: %ds of at most %s", int(time.Since(started).Seconds()), timeout)
	})

	var res sandbox.Result
	if sessionID != "" {
		var client context.Context
		if client, err = asClient(ctx); err == nil {
			res, err = h.cfg.Sessions.RunInSession(client, sessionID, job)
		}
	} else {
		res, err = h.cfg.Runner.Run(ctx, job)
	}
	h.cfg.Metrics.observeCall(checked.Language, res, err)
	if err != nil {
		return h.toolError(err), nil
	}
	h.cfg.Logger.Info("run_code", "language", job.Language, "status", res.Status, "exit_code", res.ExitCode,
		"duration_ms", res.DurationMS, "sandbox", res.SandboxID)
	res, tooLarge := fitResponse(ctx, res)
	if tooLarge != nil {
		h.cfg.Logger.Warn("run_code result not sent", "sandbox", res.SandboxID, "why", tooLarge.Content[0].(mcpgo.TextContent).Text)
		return tooLarge, nil
	}
	return result(res), nil
}

func (h *handler) environment(ctx context.Context, req mcpgo.ReadResourceRequest) ([]mcpgo.ResourceContents, error) {
	data, err := json.MarshalIndent(h.cfg.Environment, "", "  ")
	if err != nil {
		return nil, err
	}
	return []mcpgo.ResourceContents{mcpgo.TextResourceContents{URI: EnvironmentURI, MIMEType: "application/json", Text: string(data)}}, nil
}
