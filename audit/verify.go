package audit

import (
	"bufio"
	"bytes"
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
	// Records is the number of records; FirstSeq the number of the first
	// (1, unless older files were deleted under Options.MaxFiles), LastSeq
	// the number of the last.
	Records  uint64
	FirstSeq uint64
	LastSeq  uint64
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
// first, then path itself. Each line must pass the rule start-up applies to
// the last line (checkLine: a record of at most MaxLine bytes), and be
// numbered one more than the line before it and carry that line's hash; the
// first record must be number 1, or the one the last EventPruned record
// names as the oldest kept. A rotated file must not be empty. It returns a
// *VerifyError naming the first line where that fails, so an edited,
// dropped, reordered or cut line is found.
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
	var v verifier
	for i, name := range files {
		if err := v.file(name, i < len(files)-1, &sum); err != nil {
			return sum, err
		}
	}
	if err := v.start(); err != nil {
		return sum, err
	}
	if sum.Records == 0 {
		return sum, &VerifyError{File: path, Line: 1, Msg: "the log holds no records"}
	}
	return sum, nil
}

// verifier carries what Verify learns across the files of a chain.
type verifier struct {
	// first is the chain's first record if it is not number 1, where it
	// is, and the error to report unless an EventPruned record accounts
	// for it.
	first    *Record
	firstErr *VerifyError
	// pruned is the last EventPruned record seen.
	pruned *Record
}

// start returns the error of a chain that starts after record 1 without
// the last EventPruned record naming that start.
func (v *verifier) start() error {
	if v.first == nil {
		return nil
	}
	if p := v.pruned; p != nil && p.FirstSeq == v.first.Seq && p.FirstPrev == v.first.Prev {
		return nil
	}
	return v.firstErr
}

// breaks is err, or the earlier error of an unaccounted start.
func (v *verifier) breaks(err *VerifyError) error {
	if v.start() != nil {
		return v.firstErr
	}
	return err
}

func (v *verifier) file(name string, rotated bool, sum *Summary) error {
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 64<<10)
	for n := 1; ; n++ {
		line, err := readLine(r)
		bad := func(format string, args ...any) error {
			return v.breaks(&VerifyError{name, n, fmt.Sprintf(format, args...)})
		}
		if errors.Is(err, io.EOF) {
			switch {
			case len(line) > 0:
				return bad("incomplete last line: the file was cut")
			case n == 1 && rotated:
				return bad("a rotated file is empty: it was truncated")
			}
			return nil
		}
		if err != nil {
			return err
		}
		rec, err := checkLine(line)
		if err != nil {
			return bad("%v", err)
		}
		want := sum.LastSeq + 1
		switch {
		case rec.Seq != want && sum.Records == 0:
			// Allowed if the chain's last EventPruned record names it.
			v.first = &rec
			v.firstErr = &VerifyError{name, n, fmt.Sprintf("the chain starts at record %d, not 1: earlier records are missing", rec.Seq)}
		case rec.Seq != want:
			return bad("record %d where %d was expected: records were dropped or reordered", rec.Seq, want)
		case rec.Prev != sum.Head:
			return bad("the hash of the previous line does not match: the previous line was changed, or lines were dropped or reordered")
		}
		if rec.Event == EventPruned {
			v.pruned = &rec
		}
		if sum.Records == 0 {
			sum.FirstSeq = rec.Seq
		}
		sum.Records++
		sum.LastSeq, sum.Head = rec.Seq, hashLine(line)
	}
}

// readLine reads a line without its newline, keeping no more than one
// byte over MaxLine of it in memory (checkLine refuses it then).
func readLine(r *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, err := r.ReadSlice('\n')
		if len(line) <= MaxLine {
			line = append(line, chunk[:min(len(chunk), MaxLine+2-len(line))]...)
		}
		switch {
		case err == nil:
			return bytes.TrimSuffix(line, []byte("\n")), nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			return line, err
		}
	}
}
