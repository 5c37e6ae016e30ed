package sandbox

import (
	"context"
	"errors"
)

// Error classes, after containerd's errdefs: every error a backend or the
// engine returns carries one (test with errors.Is), plus the fact in its
// text. The classes say what kind of failure it was, never what to do about
// it: the edges (cmd/, mcp/) map each class to an exit code or a tool error
// and add the hint that fits their audience, such as a flag to set.
var (
	// ErrInvalid is a request the caller can fix: a bad argument, a job
	// the policy refuses. *InputError is of this class.
	ErrInvalid = errors.New("invalid input")
	// ErrNotFound is something named that does not exist for the caller,
	// such as an unknown, closed or foreign session.
	ErrNotFound = errors.New("not found")
	// ErrExhausted is a limit reached: sessions, the waiting line, the
	// pool's memory, disk space. Retrying later may succeed.
	ErrExhausted = errors.New("resource exhausted")
	// ErrUnavailable is the service itself being unusable: runsc, the
	// agent or an image broken or missing, the audit log failing, the
	// server shutting down.
	ErrUnavailable = errors.New("unavailable")
)

// classError gives an error a class while keeping its own text.
type classError struct {
	class error
	err   error
}

func (e *classError) Error() string   { return e.err.Error() }
func (e *classError) Unwrap() []error { return []error{e.err, e.class} }

// WithClass returns err marked as of class (one of the Err* classes above),
// with err's text unchanged; nil stays nil.
func WithClass(err, class error) error {
	if err == nil {
		return nil
	}
	return &classError{class: class, err: err}
}

// Class is the class of err: one of ErrInvalid, ErrNotFound, ErrExhausted,
// ErrUnavailable, context.Canceled or context.DeadlineExceeded; nil for nil
// and for an error that carries none (a bug, to be reported as such).
func Class(err error) error {
	for _, c := range []error{ErrInvalid, ErrNotFound, ErrExhausted, context.Canceled, context.DeadlineExceeded, ErrUnavailable} {
		if errors.Is(err, c) {
			return c
		}
	}
	return nil
}
