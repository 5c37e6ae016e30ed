package engine

import (
	"regexp"
	"strings"
	"testing"
)

// TestSessionMoves checks every transition of the session lifecycle: the
// allowed ones happen, the others are refused with an error naming both
// states and leave the state as it was.
func TestSessionMoves(t *testing.T) {
	all := []sessionState{sessionBooting, sessionReady, sessionBusy, sessionLost, sessionClosed}
	allowed := map[[2]sessionState]bool{
		{sessionBooting, sessionReady}: true, {sessionBooting, sessionClosed}: true,
		{sessionReady, sessionBusy}: true, {sessionReady, sessionClosed}: true,
		{sessionBusy, sessionReady}: true, {sessionBusy, sessionLost}: true, {sessionBusy, sessionClosed}: true,
		{sessionLost, sessionBusy}: true, {sessionLost, sessionClosed}: true,
	}
	for _, from := range all {
		for _, to := range all {
			t.Run(from.String()+"→"+to.String(), func(t *testing.T) {
				s := &session{id: "session-x", state: from}
				err := s.move(to)
				switch {
				case allowed[[2]sessionState{from, to}]:
					if err != nil || s.state != to {
						t.Errorf("move: %v, state %s; want %s", err, s.state, to)
					}
				case err == nil:
					t.Errorf("move from %s to %s allowed", from, to)
				case s.state != from:
					t.Errorf("a refused move changed the state to %s", s.state)
				case !strings.Contains(err.Error(), "from "+from.String()+" to "+to.String()):
					t.Errorf("error %q does not name both states", err)
				}
			})
		}
	}
}

// TestSessionIDsAreUnguessable: 128 random bits, hex, never repeated.
func TestSessionIDsAreUnguessable(t *testing.T) {
	shape := regexp.MustCompile(`^session-[0-9a-f]{32}$`)
	seen := map[string]bool{}
	for range 1000 {
		id := newSessionID()
		if !shape.MatchString(id) {
			t.Fatalf("session ID %q is not session- and 32 hex digits", id)
		}
		if seen[id] {
			t.Fatalf("session ID %q repeated", id)
		}
		seen[id] = true
	}
}
