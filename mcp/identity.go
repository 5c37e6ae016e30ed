package mcp

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/http"
	"reflect"
	"strings"
	"sync"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/safe-run/safe-run/sandbox"
)

// Who a client is.
//
// A client is the MCP protocol session it speaks in: over stdio the one
// process at the other end of the pipes ("stdio"), over Streamable HTTP the
// session whose Mcp-Session-Id the server issued at initialize (an
// unguessable 128-bit value, see sessionIDs), in process the in-process
// transport's session. Everything a client makes or starts is keyed by it:
// mcp-go keys in-flight requests, and so cancellation, by session ID and
// request ID; progress goes to the session that asked; and safe-run's
// sandbox sessions belong to the protocol session that created them.
//
// The bearer token is no identity: it is one token shared by every client
// of the server, so it says that a client may use the server, not which
// client it is.
//
// Protocol version 2026-07-28 has no protocol session: a request carries
// nothing that tells one client from another, and mcp-go v1.2.1 serves all
// such requests with one empty session ID, so that in-flight requests of
// every client share one cancellation key. The HTTP endpoint therefore
// speaks only the versions with a session (see httpProtocolVersions), and a
// call without one gets no sandbox session.

// clientOwner returns the owner label of the client making the call, or ""
// if the call comes without a protocol session. The label is a hash, so
// that the Mcp-Session-Id, a credential, is kept nowhere else.
func clientOwner(ctx context.Context) string {
	s := server.ClientSessionFromContext(ctx)
	if s == nil || s.SessionID() == "" {
		return ""
	}
	return ownerOf(s.SessionID())
}

func ownerOf(sessionID string) string {
	sum := sha256.Sum256([]byte(sessionID))
	return "client-" + hex.EncodeToString(sum[:16])
}

// errNoClient refuses session tools to a call that has no protocol session.
var errNoClient = errors.New("sessions need an MCP session to belong to, and this call has none " +
	"(protocol version 2026-07-28 has no sessions): connect with the initialize handshake, protocol version " +
	mcpgo.LATEST_LEGACY_PROTOCOL_VERSION + " or older")

// asClient returns ctx acting for the calling client in the session calls.
func asClient(ctx context.Context) (context.Context, error) {
	owner := clientOwner(ctx)
	if owner == "" {
		return nil, errNoClient
	}
	return sandbox.WithOwner(ctx, owner), nil
}

// ownSessions returns the live sessions of owner.
func ownSessions(sessions sandbox.Sessions, owner string) []sandbox.SessionInfo {
	var own []sandbox.SessionInfo
	for _, s := range sessions.ListSessions() {
		if s.Owner == owner {
			own = append(own, s)
		}
	}
	return own
}

// endClient is an OnUnregisterSession hook: when a protocol session ends
// (an HTTP client's DELETE, its idle expiry, the end of stdio), no one can
// reach its sandbox sessions any more, so they end too rather than hold
// their places until they expire.
//
// With Config.SharedSessionIDs the protocol session is every replica's: its
// end here (an idle expiry, a closed notification stream) says nothing of
// the client, which may be talking to another replica now, so only the
// client's own DELETE ends its sandbox sessions; the others end by their
// idle timeout.
func (h *handler) endClient(ctx context.Context, s server.ClientSession) {
	if s == nil || s.SessionID() == "" {
		return
	}
	if h.cfg.SharedSessionIDs && !deletedByClient(ctx) {
		return
	}
	owner := ownerOf(s.SessionID())
	ctx = sandbox.WithOwner(context.WithoutCancel(ctx), owner)
	var wg sync.WaitGroup
	for _, info := range ownSessions(h.cfg.Sessions, owner) {
		wg.Go(func() {
			if err := h.cfg.Sessions.CloseSession(ctx, info.ID); err != nil && !errors.Is(err, sandbox.ErrNoSession) {
				h.cfg.Logger.Error("close the session of a departed client", "session", info.ID, "err", err)
			}
		})
	}
	wg.Wait()
}

// checkRequestID is an OnRequestInitialization hook refusing JSON-RPC ids
// that are not a string or an integer. JSON-RPC 2.0 allows strings,
// numbers and null (null makes a notification), MCP only strings and
// integers; an object or array id would otherwise be accepted and printed
// into cancellation keys and logs.
func checkRequestID(ctx context.Context, id any, message any) error {
	switch v := id.(type) {
	case string:
		return nil
	case float64:
		if v == math.Trunc(v) && math.Abs(v) <= 1<<53 {
			return nil
		}
		return fmt.Errorf("invalid request id %v: request ids are strings or integers of at most 2^53", v)
	}
	return fmt.Errorf("invalid request id of type %s: request ids are strings or integers", jsonType(reflect.TypeOf(id).Kind().String()))
}

// httpProtocolVersions are the protocol versions the HTTP endpoint speaks:
// those with a protocol session. A 2026-07-28 request is answered with this
// list, and mcp-go's client, like any client that negotiates, falls back to
// the initialize handshake.
func httpProtocolVersions() []string {
	var versions []string
	for _, v := range mcpgo.ValidProtocolVersions {
		if !mcpgo.IsModernProtocol(v) {
			versions = append(versions, v)
		}
	}
	return versions
}

// sessionIDs issues and checks the HTTP endpoint's Mcp-Session-Id values:
// 128 random bits each, for the ID is the client's credential.
//
// Without a key, the table of live IDs is this process's: an ended
// session's ID is forgotten, so the table holds live sessions only, and
// another process knows none of them.
//
// With a key (HTTPConfig.SessionKey, shared by every replica), an ID is
// the random bits and an HMAC-SHA256 tag of them under the key, and any
// process holding the key validates it with no table: a client keeps its
// identity, and so its sandbox sessions, from replica to replica and
// across restarts. No process can then know that another has ended an ID,
// so Terminate forgets nothing: an ended ID stays valid (a client's
// DELETE ends its sandbox sessions, see endClient, so a re-used ID finds
// none), and an idle expiry, which only one replica sees, ends nothing.
type sessionIDs struct {
	key []byte // nil: the per-process table

	mu   sync.Mutex
	live map[string]bool
}

const sessionIDPrefix = "mcp-"

// sessionIDRandom is the number of random bytes in a session ID.
const sessionIDRandom = 16

// Generate issues a new session ID.
func (m *sessionIDs) Generate() string {
	b := make([]byte, sessionIDRandom)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	if m.key != nil {
		return sessionIDPrefix + hex.EncodeToString(b) + hex.EncodeToString(m.tag(b))
	}
	id := sessionIDPrefix + hex.EncodeToString(b)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.live == nil {
		m.live = map[string]bool{}
	}
	m.live[id] = true
	return id
}

// tag is the HMAC of a session ID's random part. The label keeps a key
// that is also used elsewhere from signing anything but session IDs.
func (m *sessionIDs) tag(random []byte) []byte {
	mac := hmac.New(sha256.New, m.key)
	mac.Write([]byte("safe-run mcp session id v1\x00"))
	mac.Write(random)
	return mac.Sum(nil)
}

// errUnknownSessionID refuses an ID that was not issued here, or ended.
var errUnknownSessionID = errors.New("unknown or ended session ID")

// Validate accepts only IDs issued (with a key: by any holder of the key)
// and, without a key, not yet ended.
func (m *sessionIDs) Validate(id string) (isTerminated bool, err error) {
	if m.key != nil {
		raw, ok := strings.CutPrefix(id, sessionIDPrefix)
		if !ok || len(raw) != 2*(sessionIDRandom+sha256.Size) {
			return false, errUnknownSessionID
		}
		b, err := hex.DecodeString(raw)
		if err != nil || hex.EncodeToString(b) != raw { // one spelling per ID, one owner per ID
			return false, errUnknownSessionID
		}
		// hmac.Equal compares in constant time.
		if !hmac.Equal(b[sessionIDRandom:], m.tag(b[:sessionIDRandom])) {
			return false, errUnknownSessionID
		}
		return false, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.live[id] {
		return false, errUnknownSessionID
	}
	return false, nil
}

// Terminate ends a session ID; with a key it forgets nothing (see
// sessionIDs).
func (m *sessionIDs) Terminate(id string) (isNotAllowed bool, err error) {
	if m.key != nil {
		return false, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.live, id)
	return false, nil
}

// streamsNeedASession refuses a GET (the notification stream) or DELETE
// that does not name a live session. mcp-go v1.2.1 checks neither: a GET
// without an ID mints one, kept live for good, and a GET with any ID
// registers a protocol session under it.
//
// With a key, it also makes a client's DELETE end the client's sandbox
// sessions on whichever replica receives it: mcp-go runs the
// OnUnregisterSession hooks only for a session this process registered,
// which it does at initialize, so the DELETE is marked (see
// deletedByClient) and, for an ID initialized elsewhere, a stand-in session
// is registered for it to end.
func (m *sessionIDs) streamsNeedASession(s *server.MCPServer, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		legacy := !mcpgo.IsModernProtocol(r.Header.Get(mcpgo.HeaderProtocolVersion)) // modern ones get 405 from mcp-go
		if (r.Method == http.MethodGet || r.Method == http.MethodDelete) && legacy {
			id := r.Header.Get(server.HeaderKeySessionID)
			if id == "" {
				http.Error(w, r.Method+" needs the "+server.HeaderKeySessionID+" header that initialize returned", http.StatusBadRequest)
				return
			}
			if _, err := m.Validate(id); err != nil {
				http.Error(w, "unknown or ended MCP session: initialize again", http.StatusNotFound)
				return
			}
			if r.Method == http.MethodDelete && m.key != nil {
				ctx := context.WithValue(r.Context(), clientDeleted{}, true)
				_ = s.RegisterSession(ctx, standIn(id)) // ErrSessionExists: it was initialized here
				defer s.UnregisterSession(ctx, id)      // if mcp-go did not (a refused DELETE)
				r = r.WithContext(ctx)
			}
		}
		next.ServeHTTP(w, r)
	})
}

// clientDeleted marks the context of a client's own DELETE of its protocol
// session.
type clientDeleted struct{}

// deletedByClient reports whether ctx is that of a client's DELETE.
func deletedByClient(ctx context.Context) bool {
	v, _ := ctx.Value(clientDeleted{}).(bool)
	return v
}

// standIn is a protocol session registered only to be ended: it never
// initializes, so mcp-go sends it nothing.
type standIn string

func (standIn) Initialize()                                           {}
func (standIn) Initialized() bool                                     { return false }
func (standIn) NotificationChannel() chan<- mcpgo.JSONRPCNotification { return nil }
func (s standIn) SessionID() string                                   { return string(s) }
