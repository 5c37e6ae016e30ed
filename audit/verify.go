package audit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// Summary describes a verified chain.
type Summary struct {
	// Files are the files verified, oldest first.
	Files []string
	// Records is the number of records; LastSeq the number of the last.
	Records uint64
	LastSeq uint64
	// Head is the hash of the last line: compare it with the head the
	// server logged to tell that no record was dropped from the end.
	Head string
}

// VerifyError names the first line at which the chain breaks.
type VerifyError struct {
	File string
	Line int // 1-based
	Msg  string
}

func (e *VerifyError) Error() string { return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg) }

// Verify checks the chain of the log at path: its rotated files, oldest
// first, then path itself. Each line must be a record numbered one more
// than the line before it and carrying that line's hash; the first record
// must be number 1. It returns a *VerifyError naming the first line where
// that fails, so an edited, dropped, reordered or cut line is found.
//
// A chain cannot tell that records were dropped from its very end, or that
// its last line was edited: compare Summary.Head with the head the server
// logs for that.
func Verify(path string) (Summary, error) {
	var sum Summary
	files, err := Rotated(path)
	if err != nil {
		return sum, err
	}
	if _, err := os.Stat(path); err == nil {
		files = append(files, path)
	} else if !errors.Is(err, fs.ErrNotExist) || len(files) == 0 {
		return sum, err
	}
	sum.Files = files
	for _, name := range files {
		if err := verifyFile(name, &sum); err != nil {
			return sum, err
		}
	}
	if sum.Records == 0 {
		return sum, &VerifyError{File: path, Line: 1, Msg: "the log holds no records"}
	}
	return sum, nil
}

func verifyFile(name string, sum *Summary) error {
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 64<<10)
	for n := 1; ; n++ {
		line, err := r.ReadBytes('\n')
		if errors.Is(err, io.EOF) {
			if len(line) > 0 {
				return &VerifyError{name, n, "incomplete last line: the file was cut"}
			}
			return nil
		}
		if err != nil {
			return err
		}
		line = line[:len(line)-1]
		bad := func(format string, args ...any) error {
			return &VerifyError{name, n, fmt.Sprintf(format, args...)}
		}
		var rec Record
		dec := json.NewDecoder(bytes.NewReader(line))
		if err := dec.Decode(&rec); err != nil || dec.More() {
			return bad("not an audit record (invalid JSON)")
		}
		want := sum.LastSeq + 1
		switch {
		case rec.Seq != want && sum.Records == 0:
			return bad("the chain starts at record %d, not 1: earlier records are missing", rec.Seq)
		case rec.Seq != want:
			return bad("record %d where %d was expected: records were dropped or reordered", rec.Seq, want)
		case rec.Prev != sum.Head:
			return bad("the hash of the previous line does not match: the previous line was changed, or lines were dropped or reordered")
		}
		sum.Records++
		sum.LastSeq, sum.Head = rec.Seq, hashLine(line)
	}
}
