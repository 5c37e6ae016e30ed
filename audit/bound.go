package audit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/safe-run/safe-run/egress"
	"github.com/safe-run/safe-run/sandbox"
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
	// MaxNetworkRecords caps the connection records of a run's network
	// report; the rest are counted in its dropped. The sandbox chooses
	// the names it asks for, so the records are the code's to multiply.
	MaxNetworkRecords = 128
	// MaxEntryBytes caps a network entry, a name of a network record
	// (DNS names are at most 253 bytes), its address and its reason.
	MaxEntryBytes = 320
	// MaxNetworkEntries caps network_asked, packages and the report's
	// allowlist, each.
	MaxNetworkEntries = 32
	// MaxActivityProcesses caps the processes of a record's activity, and
	// MaxActivityArgs the argv kept of each; MaxActivityEntries caps each
	// of its other lists and its event kinds. The sandbox chooses every
	// string in it (binaries, arguments, paths, addresses), each cut to
	// MaxEntryBytes.
	MaxActivityProcesses = 32
	MaxActivityArgs      = 8
	MaxActivityEntries   = 64
)

// MaxLine bounds a line of the log. Start-up and Verify refuse a longer
// one (checkLine); Append never writes one: with every field at its cap
// a record without code stays under 10 KiB, and with every byte of code
// escaped by JSON (6 bytes for 1) under 6.1 MiB. A network report adds
// under 1 MiB (MaxNetworkRecords records of three MaxEntryBytes strings,
// and the three lists of MaxNetworkEntries, escaped), an activity under
// 0.6 MiB (MaxActivityProcesses processes of at most MaxActivityArgs+3
// strings, six lists of MaxActivityEntries, each string MaxEntryBytes,
// escaped).
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
	rec.NetworkAsked, rec.Packages = cleanList(rec.NetworkAsked), cleanList(rec.Packages)
	if rec.Network != nil {
		rec.Network = boundedReport(*rec.Network)
	}
	if rec.Activity != nil {
		rec.Activity = boundedActivity(*rec.Activity)
	}
	return rec
}

// boundedActivity is a with every list cut to its cap (its truncated
// flag set) and every string cleaned and cut.
func boundedActivity(a sandbox.Activity) *sandbox.Activity {
	out := a
	out.Processes = capped(a.Processes, &out.ProcessesTruncated, MaxActivityProcesses, func(p sandbox.Process) sandbox.Process {
		p.Binary, p.SHA256, p.Signal = Clean(p.Binary, MaxEntryBytes), Clean(p.SHA256, 64), Clean(p.Signal, 16)
		p.Argv = capped(p.Argv, &p.ArgvTruncated, MaxActivityArgs, cleanEntry)
		return p
	})
	out.Network = capped(a.Network, &out.NetworkTruncated, MaxActivityEntries, func(n sandbox.NetworkAttempt) sandbox.NetworkAttempt {
		n.Op, n.Family, n.Type, n.Result = Clean(n.Op, 16), Clean(n.Family, 16), Clean(n.Type, 16), Clean(n.Result, 32)
		n.Address = Clean(n.Address, MaxEntryBytes)
		n.Egress, n.EgressHost, n.EgressReason = Clean(n.Egress, 16), Clean(n.EgressHost, MaxEntryBytes), Clean(n.EgressReason, MaxEntryBytes)
		return n
	})
	out.FilesWritten = capped(a.FilesWritten, &out.FilesWrittenTruncated, MaxActivityEntries, cleanEntry)
	out.SensitiveReads = capped(a.SensitiveReads, &out.SensitiveReadsTruncated, MaxActivityEntries, cleanEntry)
	out.Signals = capped(a.Signals, &out.SignalsTruncated, MaxActivityEntries, func(sg sandbox.SignalSent) sandbox.SignalSent {
		sg.Signal = Clean(sg.Signal, 16)
		return sg
	})
	out.Rules = capped(a.Rules, &out.RulesTruncated, MaxActivityEntries, func(h sandbox.RuleHit) sandbox.RuleHit {
		h.Rule, h.Action, h.Event = Clean(h.Rule, MaxEntryBytes), Clean(h.Action, 32), Clean(h.Event, MaxEntryBytes)
		return h
	})
	out.Lost = Clean(a.Lost, MaxMessageBytes)
	if a.Events != nil {
		out.Events = make(map[string]int, min(len(a.Events), MaxActivityEntries))
		keys := make([]string, 0, len(a.Events))
		for k := range a.Events {
			keys = append(keys, k)
		}
		slices.Sort(keys) // which kinds the cap keeps does not depend on map order
		for _, k := range keys {
			if len(out.Events) == MaxActivityEntries {
				break
			}
			out.Events[Clean(k, 64)] += a.Events[k]
		}
	}
	return &out
}

func cleanEntry(s string) string { return Clean(s, MaxEntryBytes) }

// capped is list cut to n entries (setting *truncated if it was longer),
// each passed through clean; nil stays nil, so that empty lists stay out
// of the record as they are out of the result.
func capped[T any](list []T, truncated *bool, n int, clean func(T) T) []T {
	if list == nil {
		return nil
	}
	if len(list) > n {
		list, *truncated = list[:n], true
	}
	out := make([]T, len(list))
	for i, e := range list {
		out[i] = clean(e)
	}
	return out
}

// cleanList is list cut to MaxNetworkEntries, each cleaned and cut to
// MaxEntryBytes; a list cut short ends with how long it was.
func cleanList(list []string) []string {
	if list == nil {
		return nil
	}
	out := make([]string, 0, min(len(list), MaxNetworkEntries+1))
	for i, s := range list {
		if i == MaxNetworkEntries {
			out = append(out, fmt.Sprintf("…[cut: %d entries in all]", len(list)))
			break
		}
		out = append(out, Clean(s, MaxEntryBytes))
	}
	return out
}

// boundedReport is r with at most MaxNetworkRecords records, the others
// counted in Dropped, and every string cleaned and cut.
func boundedReport(r egress.Report) *egress.Report {
	out := egress.Report{Allowlist: cleanList(r.Allowlist), Dropped: r.Dropped, Failure: Clean(r.Failure, MaxMessageBytes)}
	if len(r.Connections) > MaxNetworkRecords {
		out.Dropped += len(r.Connections) - MaxNetworkRecords
		r.Connections = r.Connections[:MaxNetworkRecords]
	}
	out.Connections = make([]egress.Connection, len(r.Connections))
	for i, c := range r.Connections {
		c.Kind, c.Decision = Clean(c.Kind, 16), Clean(c.Decision, 16)
		c.Name, c.Addr, c.Reason = Clean(c.Name, MaxEntryBytes), Clean(c.Addr, MaxEntryBytes), Clean(c.Reason, MaxEntryBytes)
		c.Dst = Clean(c.Dst, MaxEntryBytes)
		out.Connections[i] = c
	}
	return &out
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
