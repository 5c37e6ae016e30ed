package audit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/safe-run/safe-run/egress"
	"github.com/safe-run/safe-run/sandbox"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func openLog(t *testing.T, opts Options) *Log {
	t.Helper()
	opts.Logger = quiet()
	l, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func runRecord(i int) Record {
	job := sandbox.Job{Language: "python", Code: fmt.Sprintf("print(%d)", i), Limits: sandbox.DefaultLimits}
	res := sandbox.Result{Status: sandbox.StatusOK, DurationMS: 120, StdoutBytes: 2, MemoryPeakBytes: 30 << 20}
	rec := RunRecord(job, res)
	rec.RequestID, rec.ClientName, rec.ClientVersion = fmt.Sprint(i), "test-client", "1.0"
	return rec
}

// writeLog appends n records to a fresh log and returns its path.
func writeLog(t *testing.T, n int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "audit.log")
	l := openLog(t, Options{Path: path})
	for i := range n {
		if err := l.Append(runRecord(i)); err != nil {
			t.Fatal(err)
		}
	}
	return path
}

func readLines(t *testing.T, path string) [][]byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.SplitAfter(data, []byte("\n"))[:bytes.Count(data, []byte("\n"))]
}

func writeLines(t *testing.T, path string, lines [][]byte) {
	t.Helper()
	if err := os.WriteFile(path, bytes.Join(lines, nil), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestAppendAndVerify(t *testing.T) {
	path := writeLog(t, 5)
	sum, err := Verify(path)
	if err != nil {
		t.Fatalf("verify a log as written: %v", err)
	}
	if sum.Records != 5 || sum.LastSeq != 5 || len(sum.Head) != 64 {
		t.Errorf("summary %+v, want 5 records ending at 5 with a SHA-256 head", sum)
	}
	lines := readLines(t, path)
	var first, second Record
	json.Unmarshal(lines[0], &first)
	json.Unmarshal(lines[1], &second)
	if first.Seq != 1 || first.Prev != "" || second.Seq != 2 || second.Prev != hashLine(bytes.TrimSuffix(lines[0], []byte("\n"))) {
		t.Errorf("chain links: first %d %q, second %d %q", first.Seq, first.Prev, second.Seq, second.Prev)
	}
	if first.CodeSHA256 != HashCode("print(0)") || first.Code != "" {
		t.Errorf("code hash %q, code %q: want the hash of print(0) and no code", first.CodeSHA256, first.Code)
	}
	for _, field := range []string{`"time":`, `"event":"run"`, `"request_id":"0"`, `"client_name":"test-client"`, `"client_version":"1.0"`,
		`"language":"python"`, `"limits":{"timeout_ms":30000,"memory_bytes":536870912`, `"status":"ok"`, `"exit_code":0`,
		`"duration_ms":120`, `"memory_peak_bytes":31457280`, `"output_bytes":2`} {
		if !bytes.Contains(lines[0], []byte(field)) {
			t.Errorf("record lacks %s: %s", field, lines[0])
		}
	}
}

func TestIncludeCode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	l := openLog(t, Options{Path: path, IncludeCode: true})
	if err := l.Append(runRecord(7)); err != nil {
		t.Fatal(err)
	}
	var rec Record
	json.Unmarshal(readLines(t, path)[0], &rec)
	if rec.Code != "print(7)" || rec.CodeSHA256 != HashCode("print(7)") {
		t.Errorf("code %q, hash %q", rec.Code, rec.CodeSHA256)
	}
}

// Every kind of tampering is caught, at the first line where the chain no
// longer holds.
func TestVerifyDetectsTampering(t *testing.T) {
	tests := []struct {
		name     string
		tamper   func(lines [][]byte) [][]byte
		wantLine int
		wantMsg  string
	}{
		{"edited line", func(l [][]byte) [][]byte {
			l[2] = bytes.Replace(l[2], []byte(`"status":"ok"`), []byte(`"status":"error"`), 1)
			return l
		}, 4, "previous line was changed"},
		{"edited hash of the previous line", func(l [][]byte) [][]byte {
			l[3] = bytes.Replace(l[3], []byte(`"prev":"`), []byte(`"prev":"0`), 1)
			return l
		}, 4, "does not match"},
		{"dropped line", func(l [][]byte) [][]byte { return append(l[:2], l[3:]...) }, 3, "record 4 where 3 was expected"},
		{"dropped first line", func(l [][]byte) [][]byte { return l[1:] }, 1, "starts at record 2"},
		{"swapped lines", func(l [][]byte) [][]byte { l[1], l[2] = l[2], l[1]; return l }, 2, "record 3 where 2 was expected"},
		{"cut in the last line", func(l [][]byte) [][]byte { l[5] = l[5][:len(l[5])/2]; return l }, 6, "incomplete last line"},
		{"garbage line", func(l [][]byte) [][]byte { l[1] = []byte("hello\n"); return l }, 2, "invalid JSON"},
		{"renumbered after a dropped line", func(l [][]byte) [][]byte {
			l = append(l[:2], l[3:]...)
			l[2] = bytes.Replace(l[2], []byte(`"seq":4`), []byte(`"seq":3`), 1)
			return l
		}, 3, "does not match"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeLog(t, 6)
			writeLines(t, path, tt.tamper(readLines(t, path)))
			_, err := Verify(path)
			var ve *VerifyError
			if !errors.As(err, &ve) {
				t.Fatalf("Verify = %v, want a VerifyError", err)
			}
			if ve.File != path || ve.Line != tt.wantLine || !strings.Contains(ve.Msg, tt.wantMsg) {
				t.Errorf("error %q; want line %d saying %q", err, tt.wantLine, tt.wantMsg)
			}
		})
	}
}

// The chain continues when the log is opened again, as after a restart.
func TestChainContinuesAfterReopen(t *testing.T) {
	path := writeLog(t, 3)
	l := openLog(t, Options{Path: path})
	if seq, _ := l.Head(); seq != 3 {
		t.Fatalf("reopened at record %d, want 3", seq)
	}
	if err := l.Append(runRecord(3)); err != nil {
		t.Fatal(err)
	}
	if sum, err := Verify(path); err != nil || sum.Records != 4 {
		t.Errorf("Verify = %+v, %v; want 4 records", sum, err)
	}
}

// Writers in several processes (here: several Logs) take turns and keep
// one chain.
func TestConcurrentWriters(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	logs := []*Log{openLog(t, Options{Path: path, MaxBytes: 4096}), openLog(t, Options{Path: path, MaxBytes: 4096})}
	var wg sync.WaitGroup
	for w, l := range logs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 25 {
				if err := l.Append(runRecord(w*100 + i)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	sum, err := Verify(path)
	if err != nil || sum.Records != 50 {
		t.Fatalf("Verify = %+v, %v; want 50 records in one chain", sum, err)
	}
	if len(sum.Files) < 3 {
		t.Errorf("files %v: want rotation at 4096 bytes", sum.Files)
	}
}

func TestRotation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	l := openLog(t, Options{Path: path, MaxBytes: 1500})
	for i := range 20 {
		if err := l.Append(runRecord(i)); err != nil {
			t.Fatal(err)
		}
	}
	sum, err := Verify(path)
	if err != nil || sum.Records != 20 {
		t.Fatalf("Verify = %+v, %v", sum, err)
	}
	rotated, _ := Rotated(path)
	if len(rotated) < 2 || rotated[0] != path+".1" {
		t.Fatalf("rotated files %v", rotated)
	}
	for _, f := range append(rotated, path) {
		if fi, _ := os.Stat(f); fi.Size() > 1500 {
			t.Errorf("%s has %d bytes, over the 1500-byte limit", f, fi.Size())
		}
	}
	// The new file's first record links to the last of the rotated one.
	last := readLines(t, rotated[len(rotated)-1])
	var next Record
	json.Unmarshal(readLines(t, path)[0], &next)
	if next.Prev != hashLine(bytes.TrimSuffix(last[len(last)-1], []byte("\n"))) {
		t.Error("the current file does not continue the chain of the last rotated one")
	}

	// A rotated file that goes missing breaks the chain where it was.
	if err := os.Rename(rotated[1], filepath.Join(t.TempDir(), "elsewhere")); err != nil {
		t.Fatal(err)
	}
	_, err = Verify(path)
	var ve *VerifyError
	if !errors.As(err, &ve) || ve.Line != 1 || !strings.Contains(ve.Msg, "dropped or reordered") {
		t.Errorf("Verify without %s = %v; want the first line after the gap named", rotated[1], err)
	}
	// So does the oldest.
	os.Remove(rotated[0])
	if _, err := Verify(path); err == nil || !strings.Contains(err.Error(), "earlier records are missing") {
		t.Errorf("Verify without the oldest file = %v", err)
	}
}

// A rotation by another writer (or before a restart) is picked up: the
// chain goes on from the newest rotated file.
func TestReopenAfterRotation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	l := openLog(t, Options{Path: path})
	l.Append(runRecord(0))
	l.Append(runRecord(1))
	l.Close()
	os.Rename(path, path+".1")
	os.WriteFile(path, nil, 0o600) // an empty current file, as right after a rotation
	l = openLog(t, Options{Path: path})
	if err := l.Append(runRecord(2)); err != nil {
		t.Fatal(err)
	}
	if sum, err := Verify(path); err != nil || sum.Records != 3 {
		t.Errorf("Verify = %+v, %v", sum, err)
	}
}

// A log that ends in a damaged line is not appended to: that would hide
// the damage behind a valid-looking continuation.
func TestOpenRefusesDamagedLog(t *testing.T) {
	path := writeLog(t, 2)
	data, _ := os.ReadFile(path)
	os.WriteFile(path, data[:len(data)-10], 0o600)
	if _, err := Open(Options{Path: path, Logger: quiet()}); err == nil || !strings.Contains(err.Error(), "incomplete line") {
		t.Errorf("Open of a cut log = %v; want a refusal", err)
	}
}

// A failed write is returned, and every later Append fails too: the
// chain's state is unknown after it.
func TestWriteFailure(t *testing.T) {
	if _, err := os.Stat("/dev/full"); err != nil {
		t.Skip("no /dev/full")
	}
	path := filepath.Join(t.TempDir(), "audit.log")
	if err := os.Symlink("/dev/full", path); err != nil {
		t.Fatal(err)
	}
	l := openLog(t, Options{Path: path})
	err := l.Append(runRecord(0))
	if err == nil || !strings.Contains(err.Error(), "no space left") {
		t.Fatalf("Append to a full device = %v; want ENOSPC", err)
	}
	if err2 := l.Append(runRecord(1)); err2 == nil || err2.Error() != err.Error() {
		t.Errorf("second Append = %v; want the first error again", err2)
	}
}

func TestRecordTimeIsUTC(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	l := openLog(t, Options{Path: path})
	rec := runRecord(0)
	rec.Time = time.Date(2026, 11, 29, 12, 0, 0, 0, time.FixedZone("X", 3600))
	l.Append(rec)
	if line := readLines(t, path)[0]; !bytes.Contains(line, []byte(`"time":"2026-11-29T11:00:00Z"`)) {
		t.Errorf("time not in UTC: %s", line)
	}
}

// A run with a network is recorded with what it asked for and its
// connections; the chain covers them (an edited decision is caught), and
// a log whose earlier records have no network report still verifies.
func TestNetworkReportIsChained(t *testing.T) {
	path := writeLog(t, 2) // records without a network, as before it existed
	l := openLog(t, Options{Path: path})
	job := sandbox.Job{Language: "python", Code: "import urllib", Network: []string{"pypi.org"}, Packages: []string{"requests"}}
	res := sandbox.Result{Status: sandbox.StatusOK, Network: &egress.Report{Allowlist: []string{"pypi.org"}, Connections: []egress.Connection{
		{ID: 1, Kind: egress.KindTCP, Name: "pypi.org", Port: 443, Addr: "151.101.0.223:443", Decision: egress.Allowed, BytesOut: 517, BytesIn: 4096},
		{ID: 2, Kind: egress.KindDNS, Name: "evil.test", Decision: egress.Denied, Reason: "not in the allowlist"},
	}}}
	if err := l.Append(RunRecord(job, res)); err != nil {
		t.Fatal(err)
	}
	if err := l.Append(runRecord(3)); err != nil {
		t.Fatal(err)
	}
	l.Close()
	if _, err := Verify(path); err != nil {
		t.Fatalf("verify a log with a network record: %v", err)
	}
	lines := readLines(t, path)
	var got Record
	json.Unmarshal(lines[2], &got)
	if got.Network == nil || len(got.Network.Connections) != 2 || got.Network.Connections[1].Reason != "not in the allowlist" ||
		!slices.Equal(got.NetworkAsked, job.Network) || !slices.Equal(got.Packages, job.Packages) {
		t.Fatalf("record %s: want the network asked for, the packages and both connections", lines[2])
	}
	lines[2] = bytes.Replace(lines[2], []byte(`"decision":"denied"`), []byte(`"decision":"allowed"`), 1)
	writeLines(t, path, lines)
	var ve *VerifyError
	if _, err := Verify(path); !errors.As(err, &ve) || ve.Line != 4 {
		t.Errorf("verify after editing a denial: %v; want the chain broken at line 4", err)
	}
}
