package mcp

import (
	"github.com/safe-run/safe-run/audit"
)

// maxEchoBytes caps the text of a tool error, which may quote the
// client's arguments back to it.
const maxEchoBytes = 1024

// maxSessionIDBytes is the longest session_id argument taken: "session-"
// and up to 64 hex digits.
const maxSessionIDBytes = len("session-") + 64

// checkSessionID refuses a session_id that is not of the shape the runtime
// makes — "session-" and lowercase hex digits (hyphens too, as in older
// ids) — before it is looked up, quoted in an error or recorded: an id of
// megabytes must not reach the audit log.
func checkSessionID(id string) error {
	ok := len(id) <= maxSessionIDBytes && len(id) >= len("session-")+8 && id[:len("session-")] == "session-"
	for i := len("session-"); ok && i < len(id); i++ {
		c := id[i]
		ok = '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || c == '-' && i > len("session-")
	}
	if !ok {
		return argError("session_id", `argument "session_id" is not a session id: pass the session_id that create_session returned ("session-" and hex digits)`)
	}
	return nil
}

// boundEcho cuts the text of a tool error to maxEchoBytes.
func boundEcho(text string) string {
	return audit.Cut(text, maxEchoBytes)
}
