package audit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/safe-run/safe-run/egress"
)

func TestClean(t *testing.T) {
	tests := []struct {
		in    string
		limit int
		want  string
	}{
		{"claude-code", 128, "claude-code"},
		{"", 128, ""},
		{"a\x1b[2Jb", 128, `a\u001b[2Jb`},
		{"line\nforged", 128, `line\nforged`},
		{`back\slash`, 128, `back\\slash`},
		{"bidi\u202eevil", 128, `bidi\u202eevil`},
		{"bad\xffutf8", 128, `bad\xffutf8`},
		{"héllo wörld", 128, "héllo wörld"},
		{strings.Repeat("x", 200), 64, strings.Repeat("x", 64-len("…[cut: 200 bytes in all]")) + "…[cut: 200 bytes in all]"},
		{strings.Repeat("é", 100), 64, strings.Repeat("é", 19) + "…[cut: 200 bytes in all]"},
		{strings.Repeat("\x1b", 100), 64, strings.Repeat(`\u001b`, 6) + "…[cut: 100 bytes in all]"},
	}
	for _, tt := range tests {
		got := Clean(tt.in, tt.limit)
		if got != tt.want {
			t.Errorf("Clean(%.30q, %d) = %q, want %q", tt.in, tt.limit, got, tt.want)
		}
		if len(got) > tt.limit || !utf8.ValidString(got) {
			t.Errorf("Clean(%.30q, %d) = %d bytes, valid UTF-8 %v", tt.in, tt.limit, len(got), utf8.ValidString(got))
		}
	}
}

// One record carrying the attack of issue 13.2 — a 9 MiB session id that
// the error message quotes again, a 4 MB client name, a 9 MiB path — is
// written small, and the log stays one that start-up and Verify accept.
func TestHugeFieldsAreCut(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	l := openLog(t, Options{Path: path})
	id := "session-" + strings.Repeat("a", 9<<20)
	rec := Record{Event: "read_file", Status: "error", SessionID: id, RequestID: strings.Repeat("1", 1<<20),
		ClientName: strings.Repeat("n", 4<<20), ClientVersion: strings.Repeat("v", 4<<20), Language: strings.Repeat("l", 1<<20),
		Image: strings.Repeat("i", 1<<20), Path: strings.Repeat("p", 9<<20), Message: fmt.Sprintf("session %q: no such session", id)}
	if err := l.Append(rec); err != nil {
		t.Fatal(err)
	}
	if err := l.Append(runRecord(1)); err != nil {
		t.Fatal(err)
	}
	l.Close()
	lines := readLines(t, path)
	if len(lines[0]) > 8<<10 {
		t.Errorf("the record has %d bytes; want at most 8 KiB", len(lines[0]))
	}
	var got Record
	json.Unmarshal(lines[0], &got)
	for name, f := range map[string]string{"session_id": got.SessionID, "request_id": got.RequestID, "client_name": got.ClientName,
		"client_version": got.ClientVersion, "language": got.Language, "image": got.Image, "path": got.Path, "message": got.Message} {
		if !strings.Contains(f, "…[cut: ") {
			t.Errorf("%s %.60q… lacks the cut mark", name, f)
		}
	}
	if !strings.HasPrefix(got.Message, `session "session-aaaa`) {
		t.Errorf("message %.60q: want the start of the original", got.Message)
	}
	if _, err := Open(Options{Path: path, Logger: quiet()}); err != nil {
		t.Errorf("start-up on the log: %v", err)
	}
	if _, err := Verify(path); err != nil {
		t.Errorf("verify: %v", err)
	}
}

// Code kept with IncludeCode is cut at MaxCodeBytes; its hash is of all of
// it, and even code that JSON escapes byte for byte stays under MaxLine.
func TestIncludeCodeIsBounded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	l := openLog(t, Options{Path: path, IncludeCode: true})
	code := strings.Repeat("\x01", 3<<20)
	rec := runRecord(0)
	rec.Code = code
	if err := l.Append(rec); err != nil {
		t.Fatal(err)
	}
	line := readLines(t, path)[0]
	var got Record
	json.Unmarshal(line, &got)
	if got.CodeSHA256 != HashCode(code) || !strings.HasSuffix(got.Code, "…[cut: 3145728 bytes in all]") || len(got.Code) > MaxCodeBytes {
		t.Errorf("code of %d bytes, hash %s", len(got.Code), got.CodeSHA256)
	}
	if len(line) > MaxLine {
		t.Errorf("line of %d bytes, over MaxLine", len(line))
	}
}

// recordLine is a line that continues the chain after head with a record
// of exactly size bytes.
func recordLine(t *testing.T, seq uint64, head string, size int) []byte {
	t.Helper()
	rec := Record{Seq: seq, Prev: head, Event: "run", Status: "ok"}
	base, _ := json.Marshal(rec)
	rec.Message = strings.Repeat("m", size-len(base)-len(`,"message":""`))
	line, _ := json.Marshal(rec)
	if len(line) != size {
		t.Fatalf("made a line of %d bytes, want %d", len(line), size)
	}
	return append(line, '\n')
}

// Start-up and Verify apply one rule to a line: a file start-up refuses is
// one Verify refuses, and one Verify refuses for its last line start-up
// refuses too. (Start-up reads only the last line; damage further up is
// for Verify alone to find.)
func TestStartUpAndVerifyAgree(t *testing.T) {
	tests := []struct {
		name   string
		damage func(t *testing.T, path string)
		ok     bool
	}{
		{"as written", func(t *testing.T, path string) {}, true},
		{"last line of MaxLine bytes", func(t *testing.T, path string) {
			seq, head := headOf(t, path)
			appendBytes(t, path, recordLine(t, seq+1, head, MaxLine))
		}, true},
		{"last line of MaxLine+1 bytes", func(t *testing.T, path string) {
			seq, head := headOf(t, path)
			appendBytes(t, path, recordLine(t, seq+1, head, MaxLine+1))
		}, false},
		{"last line of 18 MiB (issue 13.2)", func(t *testing.T, path string) {
			seq, head := headOf(t, path)
			appendBytes(t, path, recordLine(t, seq+1, head, 18<<20))
		}, false},
		{"only line of MaxLine+1 bytes", func(t *testing.T, path string) {
			os.WriteFile(path, recordLine(t, 1, "", MaxLine+1), 0o600)
		}, false},
		{"last line not JSON", func(t *testing.T, path string) { appendBytes(t, path, []byte("hello\n")) }, false},
		{"last line without seq", func(t *testing.T, path string) { appendBytes(t, path, []byte("{}\n")) }, false},
		{"last line with trailing data", func(t *testing.T, path string) {
			seq, head := headOf(t, path)
			line := recordLine(t, seq+1, head, 200)
			appendBytes(t, path, append(line[:len(line)-1], []byte(" {}\n")...))
		}, false},
		{"last line cut", func(t *testing.T, path string) {
			data, _ := os.ReadFile(path)
			os.WriteFile(path, data[:len(data)-5], 0o600)
		}, false},
		{"empty file after a rotated one", func(t *testing.T, path string) {
			os.Rename(path, path+".1")
			os.WriteFile(path, nil, 0o600)
		}, true},
		{"empty rotated file", func(t *testing.T, path string) {
			os.Rename(path, path+".1")
			os.WriteFile(path+".2", nil, 0o600)
			os.WriteFile(path, nil, 0o600)
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeLog(t, 3)
			tt.damage(t, path)
			l, openErr := Open(Options{Path: path, Logger: quiet()})
			if openErr == nil {
				l.Close()
			}
			_, verifyErr := Verify(path)
			var ve *VerifyError
			if verifyErr != nil && !errors.As(verifyErr, &ve) {
				t.Fatalf("Verify = %v; want a VerifyError or nil", verifyErr)
			}
			if (openErr == nil) != tt.ok || (verifyErr == nil) != tt.ok {
				t.Errorf("start-up: %v; verify: %v; want both to accept: %v", openErr, verifyErr, tt.ok)
			}
		})
	}
}

func headOf(t *testing.T, path string) (uint64, string) {
	t.Helper()
	seq, head, err := lastRecord(path)
	if err != nil {
		t.Fatal(err)
	}
	return seq, head
}

func appendBytes(t *testing.T, path string, data []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
}

// With MaxFiles the oldest rotated files are deleted; the chain says where
// it now starts, and Verify accepts that start and no other.
func TestRetention(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	l := openLog(t, Options{Path: path, MaxBytes: 1500, MaxFiles: 2})
	for i := range 40 {
		if err := l.Append(runRecord(i)); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	rotated, _ := Rotated(path)
	if len(rotated) != 2 {
		t.Fatalf("rotated files %v; want the newest 2", rotated)
	}
	sum, err := Verify(path)
	if err != nil || sum.FirstSeq <= 1 || sum.LastSeq <= 40 {
		t.Fatalf("Verify = %+v, %v; want a chain from a later record on", sum, err)
	}
	var pruned Record
	for _, line := range readLines(t, path) {
		var rec Record
		json.Unmarshal(line, &rec)
		if rec.Event == EventPruned {
			pruned = rec
		}
	}
	if pruned.FirstSeq != sum.FirstSeq || !strings.Contains(pruned.Message, "deleted ") {
		t.Errorf("pruned record %+v; want one naming record %d", pruned, sum.FirstSeq)
	}
	// The chain continues across a restart.
	l = openLog(t, Options{Path: path, MaxBytes: 1500, MaxFiles: 2})
	if err := l.Append(runRecord(99)); err != nil {
		t.Fatal(err)
	}
	l.Close()
	if _, err := Verify(path); err != nil {
		t.Fatalf("Verify after a restart: %v", err)
	}

	// Deleting one more file by hand is found.
	rotated, _ = Rotated(path)
	os.Remove(rotated[0])
	if _, err := Verify(path); err == nil || !strings.Contains(err.Error(), "earlier records are missing") {
		t.Errorf("Verify without %s = %v", rotated[0], err)
	}
}

// Every line Append writes, of any record, start-up and Verify accept; a
// record without code or network stays under 10 KiB whatever its fields
// hold, and one with a network report under 1 MiB.
func TestAppendedLinesPassCheckLine(t *testing.T) {
	for _, ch := range []string{"<", `"`, `\`, "\x01", "\xff", "\u202e"} {
		path := filepath.Join(t.TempDir(), "audit.log")
		l := openLog(t, Options{Path: path, IncludeCode: true})
		var worst Record
		for _, s := range []*string{&worst.Event, &worst.RequestID, &worst.SessionID, &worst.ClientName, &worst.ClientVersion,
			&worst.Language, &worst.Image, &worst.Path, &worst.Status, &worst.Message} {
			*s = strings.Repeat(ch, 1<<20)
		}
		if err := l.Append(worst); err != nil {
			t.Fatal(err)
		}
		worst.Code = strings.Repeat(ch, 2*MaxCodeBytes)
		if err := l.Append(worst); err != nil {
			t.Fatal(err)
		}
		// The network report's strings come from the sandbox (the names it
		// asks for) and its records are the code's to multiply.
		huge := strings.Repeat(ch, 1<<20)
		many := make([]string, 1000)
		for i := range many {
			many[i] = huge
		}
		worst.NetworkAsked, worst.Packages = many, many
		worst.Network = &egress.Report{Allowlist: many, Failure: huge}
		for i := range 5000 {
			worst.Network.Connections = append(worst.Network.Connections, egress.Connection{ID: uint64(i), Kind: huge, Name: huge,
				Addr: huge, Decision: huge, Reason: huge, BytesOut: 1 << 40, BytesIn: 1 << 40})
		}
		if err := l.Append(worst); err != nil {
			t.Fatal(err)
		}
		worst.Code = ""
		if err := l.Append(worst); err != nil {
			t.Fatal(err)
		}
		lines := readLines(t, path)
		for i, limit := range []int{10 << 10, MaxLine, MaxLine, 1 << 20} {
			line := bytes.TrimSuffix(lines[i], []byte("\n"))
			if _, err := checkLine(line); err != nil || len(line) > limit {
				t.Errorf("fields of %q, record %d: %d bytes, %v; want at most %d", ch, i, len(line), err, limit)
			}
		}
		var got Record
		json.Unmarshal(lines[3], &got)
		if n := got.Network; n == nil || len(n.Connections) != MaxNetworkRecords || n.Dropped != 5000-MaxNetworkRecords || len(got.NetworkAsked) != MaxNetworkEntries+1 {
			t.Errorf("fields of %q: network report not cut to its caps: %d records, %d dropped, %d entries asked", ch, len(n.Connections), n.Dropped, len(got.NetworkAsked))
		}
	}
}
