package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/safe-run/safe-run/sandbox"
)

func TestClass(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"nil", nil, nil},
		{"plain", errors.New("boom"), nil},
		{"input error", &sandbox.InputError{Field: "code", Msg: "is empty"}, sandbox.ErrInvalid},
		{"wrapped input error", fmt.Errorf("run: %w", &sandbox.InputError{Field: "code", Msg: "x"}), sandbox.ErrInvalid},
		{"unknown session", fmt.Errorf("session %q: %w", "s", sandbox.ErrNoSession), sandbox.ErrNotFound},
		{"session limit", sandbox.ErrTooManySessions, sandbox.ErrExhausted},
		{"busy", sandbox.ErrBusy, sandbox.ErrExhausted},
		{"no sessions for language", sandbox.ErrSessionsUnsupported, sandbox.ErrInvalid},
		{"unavailable", sandbox.WithClass(errors.New("runsc is missing"), sandbox.ErrUnavailable), sandbox.ErrUnavailable},
		{"cancelled", fmt.Errorf("start: %w", context.Canceled), context.Canceled},
		{"deadline", context.DeadlineExceeded, context.DeadlineExceeded},
		// A more specific class wins over unavailable when both are marked.
		{"cancelled while unavailable", sandbox.WithClass(context.Canceled, sandbox.ErrUnavailable), context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := sandbox.Class(tc.err); got != tc.want {
				t.Errorf("Class(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

func TestWithClassKeepsText(t *testing.T) {
	err := sandbox.WithClass(errors.New("runsc not found at /x"), sandbox.ErrUnavailable)
	if err.Error() != "runsc not found at /x" {
		t.Errorf("text = %q", err.Error())
	}
	if sandbox.WithClass(nil, sandbox.ErrInvalid) != nil {
		t.Error("WithClass(nil) is not nil")
	}
}

// The edges decide what a class means to their audience; the error itself
// carries only the fact.
func ExampleClass() {
	err := fmt.Errorf("create session: %w", sandbox.ErrTooManySessions)
	switch sandbox.Class(err) {
	case sandbox.ErrExhausted:
		fmt.Println("retry later:", err)
	case sandbox.ErrInvalid:
		fmt.Println("fix the call:", err)
	}
	// Output: retry later: create session: too many sessions: close one you no longer need, or wait for an idle one to expire
}
