package gvisor

// Integration test of session ownership, with the real runsc and image.

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/safe-run/safe-run/sandbox"
)

// A session is found only by calls acting for its owner; for any other,
// every operation fails exactly as for an unknown session.
func TestSessionsFoundOnlyByTheirOwner(t *testing.T) {
	rt := newTestRuntime(t, sandbox.Policy{})
	t.Cleanup(rt.CloseSessions)
	owner, other := sandbox.WithOwner(context.Background(), "client-a"), sandbox.WithOwner(context.Background(), "client-b")
	info, err := rt.CreateSession(owner, sandbox.SessionSpec{Language: "bash", Owner: "client-a"})
	if err != nil {
		t.Fatal(err)
	}
	if info.Owner != "client-a" {
		t.Errorf("info.Owner = %q", info.Owner)
	}
	ops := map[string]func(ctx context.Context, id string) error{
		"RunInSession": func(ctx context.Context, id string) error {
			_, err := rt.RunInSession(ctx, id, sandbox.Job{Code: "echo hi > f"})
			return err
		},
		"WriteFiles": func(ctx context.Context, id string) error {
			return rt.WriteFiles(ctx, id, []sandbox.File{{Path: "g", Data: []byte("x")}})
		},
		"ReadFile": func(ctx context.Context, id string) error { _, err := rt.ReadFile(ctx, id, "g"); return err },
		"ListFiles": func(ctx context.Context, id string) error {
			_, err := rt.ListFiles(ctx, id, ".")
			return err
		},
		"CloseSession": func(ctx context.Context, id string) error { return rt.CloseSession(ctx, id) },
	}
	order := []string{"RunInSession", "WriteFiles", "ReadFile", "ListFiles", "CloseSession"}
	for _, name := range order {
		for _, ctx := range []context.Context{other, context.Background()} {
			err := ops[name](ctx, info.ID)
			unknown := ops[name](ctx, "session-unknown")
			if !errors.Is(err, sandbox.ErrNoSession) || err.Error() != strings.ReplaceAll(unknown.Error(), "session-unknown", info.ID) {
				t.Errorf("%s for owner %q: %v; want what an unknown session gets, %v", name, sandbox.OwnerFrom(ctx), err, unknown)
			}
		}
	}
	for _, name := range order { // positive control
		if err := ops[name](owner, info.ID); err != nil {
			t.Errorf("%s for the owner: %v", name, err)
		}
	}
}
