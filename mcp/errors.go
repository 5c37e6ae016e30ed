package mcp

import (
	"context"
	"errors"
	"fmt"

	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"github.com/safe-run/safe-run/sandbox"
)

// argumentError is an argument a tool's decoding refused. Its Msg names the
// argument and says what is allowed; it is of class sandbox.ErrInvalid.
type argumentError struct{ in sandbox.InputError }

func (e *argumentError) Error() string { return e.in.Error() }
func (e *argumentError) Unwrap() error { return &e.in }

// argError is an argument the tool refuses; the message names it.
func argError(field, format string, args ...any) error {
	return &argumentError{sandbox.InputError{Field: field, Msg: fmt.Sprintf(format, args...)}}
}

// argumentNames maps job fields of sandbox.InputError to tool arguments.
var argumentNames = map[string]string{"timeout": "timeout_seconds"}

// toolError is the tool error for err, for every tool and every source (the
// arguments, the policy, the gate, the runner, the sessions): one line,
// bounded, saying by err's class whose fault it is and what the model can
// do. Only invalid input is called an invalid argument.
func (h *handler) toolError(err error) *mcpgo.CallToolResult {
	if stopped := auditError(err); stopped != nil {
		return stopped // the audit log failed: its own words
	}
	if sandbox.Class(err) == nil {
		h.cfg.Logger.Error("tool call failed with an unclassed error", "err", err)
	}
	return mcpgo.NewToolResultError(boundEcho(errorText(err)))
}

// errorText renders err by its class; see toolError.
func errorText(err error) string {
	var arg *argumentError
	var in *sandbox.InputError
	switch class := sandbox.Class(err); {
	case errors.As(err, &arg):
		return "Invalid arguments: " + arg.in.Msg
	case class == sandbox.ErrInvalid && errors.As(err, &in):
		name := in.Field
		if n, ok := argumentNames[name]; ok {
			name = n
		}
		return fmt.Sprintf("Invalid argument %q: %s", name, in.Msg)
	case class == sandbox.ErrInvalid:
		return "Invalid arguments: " + err.Error()
	case errors.Is(err, sandbox.ErrNoSession):
		return err.Error() + " with create_session"
	case class == sandbox.ErrNotFound:
		return err.Error()
	case errors.Is(err, sandbox.ErrTooManySessions), errors.Is(err, sandbox.ErrBusy):
		return err.Error() // they say what to do already
	case class == sandbox.ErrExhausted:
		return err.Error() + "; try again later or close a session"
	case class == context.Canceled:
		return "the call was cancelled"
	case class == context.DeadlineExceeded:
		return "the call ran out of time: " + err.Error() + "; this is not your code's fault: try again later"
	case class == sandbox.ErrUnavailable:
		return "the sandbox service failed: " + err.Error() + "; this is not your code's fault: try again later, and if it persists, the server's operator must fix it"
	}
	return "internal error: " + err.Error() + "; this is not your code's fault but a fault of the server, which its operator should report"
}
