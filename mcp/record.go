package mcp

import (
	"context"
	"errors"
	"fmt"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/safe-run/safe-run/audit"
	"github.com/safe-run/safe-run/sandbox"
)

// The audit log is kept by an audit.Runner around the Runner and Sessions
// the server is given: it makes every record, and refuses all code once a
// record could not be written. This file hands it what only the MCP layer
// knows of a call, in the call's context, and words its refusals for the
// client.

// requestIDMeta is the _meta key under which the before-call hook hands the
// JSON-RPC request id to the tool handler (mcp-go passes it to hooks only).
// The hook always overwrites it, so a client cannot choose it.
const requestIDMeta = "safe-run/request-id"

// stampRequestID is an OnBeforeCallTool hook.
func stampRequestID(ctx context.Context, id any, req *mcpgo.CallToolRequest) {
	if req.Params.Meta == nil {
		req.Params.Meta = &mcpgo.Meta{}
	}
	if req.Params.Meta.AdditionalFields == nil {
		req.Params.Meta.AdditionalFields = map[string]any{}
	}
	req.Params.Meta.AdditionalFields[requestIDMeta] = fmt.Sprint(id)
}

// callContext is a tool handler middleware putting the request id (from
// stampRequestID) and the client's name and version into the call's
// context, where the audit.Runner finds them.
func callContext(next server.ToolHandlerFunc) server.ToolHandlerFunc {
	return func(ctx context.Context, req mcpgo.CallToolRequest) (*mcpgo.CallToolResult, error) {
		if m := req.Params.Meta; m != nil {
			id, _ := m.AdditionalFields[requestIDMeta].(string)
			ctx = sandbox.WithRequestID(ctx, id)
		}
		if s, ok := server.ClientSessionFromContext(ctx).(server.SessionWithClientInfo); ok {
			info := s.GetClientInfo()
			ctx = sandbox.WithClient(ctx, sandbox.Client{Name: info.Name, Version: info.Version})
		}
		return next(ctx, req)
	}
}

// auditError is the tool error for a call the audit log stopped (an
// *audit.FailedError), with what the operator must do; nil for any other
// error.
func auditError(err error) *mcpgo.CallToolResult {
	var failed *audit.FailedError
	switch {
	case !errors.As(err, &failed):
		return nil
	case failed.Ran:
		return mcpgo.NewToolResultError(fmt.Sprintf("the call ran but its audit record could not be written (%v), so its result is withheld; this server runs no more code until its audit log is fixed and it is restarted", failed.Err))
	}
	return mcpgo.NewToolResultError(fmt.Sprintf("this server runs no code: its audit log could not be written (%v); the operator must fix the log and restart the server", failed.Err))
}

// observeCall counts a run_code call that reached the runner in the
// metrics: by its status, or as "refused" when the runner (or the audit
// log) gave an error instead of a result.
func (m *Metrics) observeCall(language string, res sandbox.Result, err error) {
	status := string(res.Status)
	if err != nil {
		status = "refused"
	}
	m.observeRun(language, status, time.Duration(res.DurationMS)*time.Millisecond, res.Cached)
	if err == nil && !res.Cached {
		m.observeNetwork(res.Network)
		m.observeActivity(res.Activity)
	}
}
