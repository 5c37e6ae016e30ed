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

	"github.com/safe-run/safe-run/audit"
	"github.com/safe-run/safe-run/sandbox"
)

// Auditor keeps a record of every run and session event; *audit.Log keeps
// them in a hash-chained file. Append returns once the record is durable;
// an error means it was not kept.
type Auditor interface {
	Append(audit.Record) error
}

// recorder feeds the audit log and the metrics from the tool handlers.
//
// When a record cannot be written the server fails closed: the call that
// produced it gets a tool error instead of its result, and every later call
// that would run code or touch a session is refused until the server is
// restarted with a writable log. An audit log is only worth having if
// nothing runs unrecorded; a server that went on running code unaudited
// would make it worthless exactly when someone is filling the disk.
type recorder struct {
	audit   Auditor
	metrics *Metrics
	log     *slog.Logger
	failed  atomic.Pointer[error]
}

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

// refusal is the tool error for calls made after the audit log failed; nil
// while it works.
func (r *recorder) refusal() *mcpgo.CallToolResult {
	// The log may also have failed outside a call (a session that ended
	// by itself), if it says so.
	if l, ok := r.audit.(interface{ Err() error }); ok && r.failed.Load() == nil {
		if err := l.Err(); err != nil {
			r.failed.CompareAndSwap(nil, &err)
		}
	}
	if err := r.failed.Load(); err != nil {
		return mcpgo.NewToolResultError(fmt.Sprintf("this server runs no code: its audit log could not be written (%v); the operator must fix the log and restart the server", *err))
	}
	return nil
}

// stamp fills in what the MCP layer knows of the call: time, request id,
// client.
func stamp(ctx context.Context, req mcpgo.CallToolRequest, rec *audit.Record) {
	rec.Time = time.Now()
	if m := req.Params.Meta; m != nil {
		rec.RequestID, _ = m.AdditionalFields[requestIDMeta].(string)
	}
	if s, ok := server.ClientSessionFromContext(ctx).(server.SessionWithClientInfo); ok {
		info := s.GetClientInfo()
		rec.ClientName, rec.ClientVersion = info.Name, info.Version
	}
}

// keep writes rec to the audit log and counts it in the metrics. It returns
// nil, or the tool error that must replace the call's result because the
// record was not kept.
func (r *recorder) keep(ctx context.Context, req mcpgo.CallToolRequest, rec audit.Record) *mcpgo.CallToolResult {
	stamp(ctx, req, &rec)
	if rec.Event == audit.EventRun {
		r.metrics.observeRun(rec.Language, rec.Status, time.Duration(rec.DurationMS)*time.Millisecond, rec.Cached)
	}
	if r.audit == nil {
		return nil
	}
	err := r.audit.Append(rec)
	if err == nil {
		return nil
	}
	r.failed.CompareAndSwap(nil, &err)
	// The record goes to the server's log instead, so that it is not lost;
	// as small as it would have been in the audit log.
	code := audit.HashCode(rec.Code)
	rec = audit.Bounded(rec)
	r.log.Error("audit log write failed: refusing all further code until restart",
		"err", err, "event", rec.Event, "request_id", rec.RequestID, "session", rec.SessionID,
		"client", rec.ClientName, "client_version", rec.ClientVersion, "language", rec.Language,
		"code_sha256", code, "status", rec.Status, "duration_ms", rec.DurationMS)
	return mcpgo.NewToolResultError(fmt.Sprintf("the call ran but its audit record could not be written (%v), so its result is withheld; this server runs no more code until its audit log is fixed and it is restarted", err))
}

// runRecord describes a run_code call: its checked job and result, or the
// runner's refusal.
func runRecord(job sandbox.Job, sessionID string, res sandbox.Result, err error) audit.Record {
	if err != nil {
		return audit.Record{Event: audit.EventRun, SessionID: sessionID, Language: job.Language, Image: job.Image, Code: job.Code,
			Limits: audit.LimitsOf(job.Limits), Status: "refused", Message: err.Error()}
	}
	rec := audit.RunRecord(job, res)
	rec.SessionID = sessionID
	return rec
}

// sessionRecord describes a call of a session tool from its arguments and
// result.
func sessionRecord(tool string, args map[string]json.RawMessage, res *mcpgo.CallToolResult, took time.Duration) audit.Record {
	rec := audit.Record{Event: tool, Status: "ok", DurationMS: took.Milliseconds()}
	rec.SessionID, _ = stringArg(args, "session_id")
	rec.Language, _ = stringArg(args, "language")
	rec.Path, _ = stringArg(args, "path")
	if info, ok := res.StructuredContent.(sandbox.SessionInfo); ok {
		rec.SessionID = info.ID
	}
	if res.IsError {
		rec.Status = "error"
		for _, c := range res.Content {
			if t, ok := c.(mcpgo.TextContent); ok {
				rec.Message = t.Text
				break
			}
		}
	}
	return rec
}
