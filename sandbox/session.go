package sandbox

import (
	"context"
	"errors"
	"time"
)

// Sessions keep one sandbox alive across calls, with a persistent
// interpreter: variables, imports and files survive from one call to the
// next. Implementations are safe for concurrent use; calls on one session
// run one at a time.
//
// A session belongs to the client that created it: spec.Owner. Every call
// naming a session acts for the owner in its context (see WithOwner), and a
// session of another owner is reported exactly as an unknown one
// (ErrNoSession), so that its ID, even leaked, is of no use to anyone else.
type Sessions interface {
	// CreateSession starts a session for spec.Language.
	CreateSession(ctx context.Context, spec SessionSpec) (SessionInfo, error)
	// RunInSession runs job.Code in the session's interpreter. The job's
	// language must be the session's; its files are written first.
	RunInSession(ctx context.Context, id string, job Job) (Result, error)
	// WriteFiles writes files into the session's workspace.
	WriteFiles(ctx context.Context, id string, files []File) error
	// ReadFile returns a file of the session's workspace.
	ReadFile(ctx context.Context, id, path string) (OutputFile, error)
	// ListFiles lists the session's workspace below dir ("." for all).
	ListFiles(ctx context.Context, id, dir string) ([]OutputFile, error)
	// CloseSession ends the session and frees everything it held.
	CloseSession(ctx context.Context, id string) error
	// ListSessions describes the live sessions of every owner; callers
	// show a client only those whose Owner it is.
	ListSessions() []SessionInfo
}

// SessionSpec asks for a session.
type SessionSpec struct {
	Language string
	// Owner identifies the client the session belongs to (see WithOwner);
	// it is an opaque label, never a credential.
	Owner string
	// Limits apply to the whole session (memory, processes, CPU, workspace)
	// and, for Timeout and OutputBytes, to each call that sets none.
	Limits Limits
	// Network and Packages are the session's, as Job's: checked by the
	// policy at creation, kept for every call.
	Network  []string
	Packages []string
}

// SessionInfo describes a session.
type SessionInfo struct {
	ID string `json:"session_id"`
	// Owner is the session's SessionSpec.Owner; clients are not shown it.
	Owner    string    `json:"-"`
	Language string    `json:"language"`
	Created  time.Time `json:"created"`
	LastUsed time.Time `json:"last_used"`
	// ExpiresAt is when the session ends unless used again (idle timeout)
	// or at the latest (maximum lifetime).
	ExpiresAt time.Time `json:"expires_at"`
	Calls     int       `json:"calls"`
	// Activity is what the session's sandboxes did over its whole life,
	// given only when it ends (nil when it was not monitored).
	Activity *Activity `json:"activity,omitempty"`
}

// ActivityCloser is the optional capability of Sessions whose sandboxes
// are monitored: closing a session also returns its whole activity.
type ActivityCloser interface {
	// CloseSessionActivity is CloseSession that returns what the
	// session's sandboxes did over its life, nil if they were not
	// monitored.
	CloseSessionActivity(ctx context.Context, id string) (*Activity, error)
}

type ownerKey struct{}

// WithOwner returns ctx acting for owner: the session calls given it reach
// only the sessions whose Owner is owner.
func WithOwner(ctx context.Context, owner string) context.Context {
	return context.WithValue(ctx, ownerKey{}, owner)
}

// OwnerFrom returns the owner ctx acts for; "" if none was set.
func OwnerFrom(ctx context.Context) string {
	owner, _ := ctx.Value(ownerKey{}).(string)
	return owner
}

// ErrNoSession is returned for a session ID that is unknown, closed or
// expired.
var ErrNoSession = WithClass(errors.New("no such session: it may have expired or been closed; create a new session"), ErrNotFound)

// ErrTooManySessions is returned when the session limit is reached.
var ErrTooManySessions = WithClass(errors.New("too many sessions: close one you no longer need, or wait for an idle one to expire"), ErrExhausted)

// ErrSessionsUnsupported is returned for a language without sessions.
var ErrSessionsUnsupported = WithClass(errors.New("this language has no sessions"), ErrInvalid)
