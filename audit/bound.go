package audit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The caps on a record's fields, in bytes as stored. Most fields come from
// the client — ids, its name and version, paths, error messages that quote
// its arguments — and a client must not be able to make one record large:
// a large record fills the disk fast, and one over MaxLine would stop the
// next start-up. Append cuts every field to its cap.
const (
	// MaxIDBytes caps request_id and session_id; a session id safe-run
	// made is far shorter.
	MaxIDBytes = 128
	// MaxNameBytes caps client_name, client_version, language, event and
	// status.
	MaxNameBytes = 128
	// MaxImageBytes caps image, a reference with a name and a digest.
	MaxImageBytes = 512
	// MaxPathBytes caps path; the policy refuses longer workspace paths.
	MaxPathBytes = 1024
	// MaxMessageBytes caps message.
	MaxMessageBytes = 2048
	// MaxCodeBytes caps the code kept with IncludeCode: the policy's
	// default limit on code. Its code_sha256 is always of all of it.
	MaxCodeBytes = 1 << 20
)

// MaxLine bounds a line of the log. Start-up and Verify refuse a longer
// one (checkLine); Append never writes one: with every field at its cap
// a record without code stays under 10 KiB, and with every byte of code
// escaped by JSON (6 bytes for 1) under 6.1 MiB.
const MaxLine = 8 << 20

// cutMark ends a field that was cut to its cap, giving its whole size.
const cutMark = "…[cut: %d bytes in all]"

// Bounded returns rec with every field cut to its cap, and the control,
// format and invalid bytes of the fields that are not code escaped
// (\n, \u001b, \xff; a backslash as \\), so that a name or path in the log
// can neither forge a line nor drive a terminal that shows it. Code is
// only cut. Apply it once, to a record as the caller made it.
func Bounded(rec Record) Record {
	for _, f := range []struct {
		s     *string
		limit int
	}{
		{&rec.Event, MaxNameBytes}, {&rec.RequestID, MaxIDBytes}, {&rec.SessionID, MaxIDBytes},
		{&rec.ClientName, MaxNameBytes}, {&rec.ClientVersion, MaxNameBytes}, {&rec.Language, MaxNameBytes},
		{&rec.Image, MaxImageBytes}, {&rec.Path, MaxPathBytes}, {&rec.Status, MaxNameBytes},
		{&rec.Message, MaxMessageBytes},
	} {
		*f.s = Clean(*f.s, f.limit)
	}
	rec.Code = Cut(rec.Code, MaxCodeBytes)
	return rec
}

// Clean escapes s as Bounded does and cuts the result to at most limit bytes,
// ending it with a mark that gives the original size if it was cut. Its
// work is bounded by limit, not by the length of s.
func Clean(s string, limit int) string {
	var b strings.Builder
	mark := fmt.Sprintf(cutMark, len(s))
	keep := 0 // length of b at the last unit that leaves room for the mark
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		unit := s[i : i+size]
		switch {
		case r == utf8.RuneError && size == 1:
			unit = fmt.Sprintf(`\x%02x`, s[i])
		case r == '\\':
			unit = `\\`
		case r == '\n':
			unit = `\n`
		case r == '\t':
			unit = `\t`
		case r == '\r':
			unit = `\r`
		case unicode.IsControl(r) || unicode.Is(unicode.Cf, r):
			unit = fmt.Sprintf(`\u%04x`, r)
		}
		if b.Len()+len(unit) > limit {
			return b.String()[:keep] + mark
		}
		b.WriteString(unit)
		if b.Len()+len(mark) <= limit {
			keep = b.Len()
		}
		i += size
	}
	return b.String()
}

// Cut cuts s to at most limit bytes at a character boundary, ending it with
// a mark that gives its whole size; s within limit is returned as it is.
func Cut(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	mark := fmt.Sprintf(cutMark, len(s))
	n := limit - len(mark)
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:max(n, 0)] + mark
}

// checkLine is the one rule for a line of the log, without its newline,
// that start-up (for the last line, the one it continues from) and Verify
// (for every line) apply alike: at most MaxLine bytes, one JSON object,
// a record numbered from 1.
func checkLine(line []byte) (Record, error) {
	var rec Record
	if len(line) > MaxLine {
		return rec, fmt.Errorf("a line of %d bytes, over the %d-byte limit of a record (the log was written by another program, or damaged)", len(line), MaxLine)
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	if err := dec.Decode(&rec); err != nil || dec.More() {
		return rec, fmt.Errorf("not an audit record (invalid JSON)")
	}
	if rec.Seq == 0 {
		return rec, fmt.Errorf("not an audit record (no seq)")
	}
	return rec, nil
}
