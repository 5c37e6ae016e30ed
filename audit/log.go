package audit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Options configure a Log.
type Options struct {
	// Path is the log file. Rotated files are Path.1, Path.2, … (oldest
	// first); Path.lock serialises writers.
	Path string
	// MaxBytes rotates the file before a line would take it past this
	// size; 0 never rotates.
	MaxBytes int64
	// MaxFiles is how many rotated files are kept: after a rotation the
	// oldest beyond it are deleted, and an EventPruned record says where
	// the chain now starts. 0 keeps them all.
	MaxFiles int
	// IncludeCode keeps each run's code in its record; by default only its
	// SHA-256 is kept.
	IncludeCode bool
	// Logger hears of rotations, with the chain's head at that point; nil
	// means slog.Default().
	Logger *slog.Logger
}

// Log appends records to an audit log file, continuing its hash chain. It
// is safe for concurrent use, also by several processes appending to the
// same file (they take turns under an flock and each picks the chain up
// where the last writer left it).
//
// A Log that failed to write stays failed: the file may end in a partial
// line, and the chain's state is no longer known, so every later Append
// returns the first error.
type Log struct {
	opts Options
	log  *slog.Logger

	mu   sync.Mutex
	lock *os.File // Path.lock
	file *os.File // Path, opened for appending
	// The chain as this process last saw it: the file's identity and size,
	// the last record's number and the hash of its line.
	ino  uint64
	size int64
	seq  uint64
	head string
	err  error
}

// Open opens (or creates) the log at opts.Path and reads the head of its
// chain. It fails if the log ends in a damaged line, since appending would
// hide the damage.
func Open(opts Options) (*Log, error) {
	if opts.Path == "" {
		return nil, errors.New("open audit log: no path given")
	}
	l := &Log{opts: opts, log: opts.Logger, ino: ^uint64(0)}
	if l.log == nil {
		l.log = slog.Default()
	}
	if err := os.MkdirAll(filepath.Dir(opts.Path), 0o750); err != nil {
		return nil, fmt.Errorf("open audit log: %w", err)
	}
	lock, err := os.OpenFile(opts.Path+".lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open audit log: %w", err)
	}
	l.lock = lock
	if err := l.locked(l.catchUp); err != nil {
		lock.Close()
		return nil, fmt.Errorf("open audit log %s: %w", opts.Path, err)
	}
	return l, nil
}

// Head returns the number and line hash of the last record of the chain,
// as this process last saw it: with them, an operator can later tell that
// no record was dropped from the end.
func (l *Log) Head() (seq uint64, hash string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.seq, l.head
}

// Close closes the log's files.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var errs []error
	if l.file != nil {
		errs = append(errs, l.file.Close())
		l.file = nil
	}
	if l.lock != nil {
		errs = append(errs, l.lock.Close())
		l.lock = nil
	}
	if l.err == nil {
		l.err = errors.New("the audit log is closed")
	}
	return errors.Join(errs...)
}

// Err returns the error that stopped the log — a failed write, or Close —
// or nil while it takes records.
func (l *Log) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Append writes rec as the next line of the chain and syncs it to disk. It
// sets rec's Seq, Prev and CodeSHA256 (from Code, which it keeps only with
// IncludeCode) and its Time if zero, and cuts its fields to their caps
// (Bounded).
func (l *Log) Append(rec Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return l.err
	}
	if rec.Time.IsZero() {
		rec.Time = time.Now()
	}
	rec.Time = rec.Time.UTC()
	if rec.Code != "" || rec.Event == EventRun {
		rec.CodeSHA256 = HashCode(rec.Code)
	}
	if !l.opts.IncludeCode {
		rec.Code = ""
	}
	rec = Bounded(rec)
	err := l.locked(func() error {
		if err := l.catchUp(); err != nil {
			return err
		}
		if l.opts.MaxBytes > 0 && l.size > 0 && l.size+int64(l.lineSize(rec))+1 > l.opts.MaxBytes {
			if err := l.rotate(); err != nil {
				return fmt.Errorf("rotate: %w", err)
			}
			if pruned, ok := l.prune(rec.Time); ok {
				if err := l.write(pruned); err != nil {
					return err
				}
			}
		}
		return l.write(rec)
	})
	if err != nil {
		l.err = fmt.Errorf("write audit log %s: %w", l.opts.Path, err)
		return l.err
	}
	return nil
}

// lineSize is the length of rec's line as the next of the chain.
func (l *Log) lineSize(rec Record) int {
	rec.Seq, rec.Prev = l.seq+1, l.head
	line, _ := encodeRecord(rec)
	return len(line)
}

// encodeRecord is rec's line, without its newline. <, > and & are kept as
// they are: JSON's HTML escapes would make each 6 bytes.
func encodeRecord(rec Record) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(rec); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// write appends rec as the next line of the chain, holding the lock.
func (l *Log) write(rec Record) error {
	rec.Seq, rec.Prev = l.seq+1, l.head
	line, err := encodeRecord(rec)
	if err != nil {
		return err
	}
	if len(line) > MaxLine { // Bounded makes this impossible; a log must never hold one
		return fmt.Errorf("record %d has %d bytes, over the %d-byte limit", rec.Seq, len(line), MaxLine)
	}
	// One write of the whole line: appends of other processes never
	// interleave with it, and a short write is an error.
	n, err := l.file.Write(append(line, '\n'))
	l.size += int64(n)
	if err != nil {
		return err
	}
	if err := l.file.Sync(); err != nil {
		return err
	}
	l.seq, l.head = rec.Seq, hashLine(line)
	return nil
}

// locked runs f holding the exclusive lock of the log's lock file.
func (l *Log) locked(f func() error) error {
	if l.lock == nil {
		return errors.New("the audit log is closed")
	}
	if err := unix.Flock(int(l.lock.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("lock: %w", err)
	}
	defer unix.Flock(int(l.lock.Fd()), unix.LOCK_UN)
	return f()
}

// catchUp makes the chain state current: if the file is not the one this
// process last wrote, or has grown since (another writer, a restart, a
// rotation), the head is read from the end of the log.
func (l *Log) catchUp() error {
	fi, err := os.Stat(l.opts.Path)
	if errors.Is(err, fs.ErrNotExist) {
		// A fresh chain, or one whose current file was just rotated.
		if l.file != nil {
			l.file.Close()
			l.file = nil
		}
	} else if err != nil {
		return err
	} else if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Ino == l.ino && fi.Size() == l.size && l.file != nil {
		return nil // exactly as this process left it
	}
	f, err := os.OpenFile(l.opts.Path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	fi, err = f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	if l.file != nil {
		l.file.Close()
	}
	l.file, l.size = f, fi.Size()
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		l.ino = st.Ino
	}
	// The head is the last line of the file, or, for an empty file, of the
	// newest rotated one.
	last := l.opts.Path
	if l.size == 0 {
		rotated, err := Rotated(l.opts.Path)
		if err != nil {
			return err
		}
		if len(rotated) == 0 {
			l.seq, l.head = 0, ""
			return nil
		}
		last = rotated[len(rotated)-1]
	}
	l.seq, l.head, err = lastRecord(last)
	return err
}

// rotate renames the current file to the next free Path.N and starts an
// empty one; the chain continues in it.
func (l *Log) rotate() error {
	rotated, err := Rotated(l.opts.Path)
	if err != nil {
		return err
	}
	next := 1
	if len(rotated) > 0 {
		next = rotatedIndex(l.opts.Path, rotated[len(rotated)-1]) + 1
	}
	name := l.opts.Path + "." + strconv.Itoa(next)
	if err := os.Rename(l.opts.Path, name); err != nil {
		return err
	}
	l.log.Info("audit log rotated", "file", name, "last_seq", l.seq, "head", l.head)
	l.file.Close()
	l.file = nil
	f, err := os.OpenFile(l.opts.Path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	l.file, l.size = f, 0
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		l.ino = st.Ino
	}
	return nil
}

// prune deletes the oldest rotated files beyond MaxFiles, oldest first,
// and returns the EventPruned record that says so and where the chain now
// starts. It returns false if it deleted nothing. A file it cannot delete
// stops it: the files kept must stay one unbroken chain.
func (l *Log) prune(now time.Time) (Record, bool) {
	if l.opts.MaxFiles <= 0 {
		return Record{}, false
	}
	rotated, err := Rotated(l.opts.Path)
	if err != nil || len(rotated) <= l.opts.MaxFiles {
		return Record{}, false
	}
	var removed []string
	for _, name := range rotated[:len(rotated)-l.opts.MaxFiles] {
		if err := os.Remove(name); err != nil {
			l.log.Error("audit log: cannot delete an old rotated file; keeping it and the newer ones", "file", name, "err", err)
			break
		}
		removed = append(removed, filepath.Base(name))
	}
	if len(removed) == 0 {
		return Record{}, false
	}
	oldest := rotated[len(removed)]
	rec := Record{Time: now, Event: EventPruned, Status: "ok"}
	first, err := firstRecord(oldest)
	if err != nil {
		// Verify will refuse the start of the chain, as it must.
		rec.Status, rec.Message = "error", fmt.Sprintf("deleted %s, keeping %d rotated files, but cannot read the first record of %s: %v", strings.Join(removed, ", "), l.opts.MaxFiles, filepath.Base(oldest), err)
	} else {
		rec.FirstSeq, rec.FirstPrev = first.Seq, first.Prev
		rec.Message = fmt.Sprintf("deleted %s, keeping %d rotated files; the chain now starts at record %d in %s", strings.Join(removed, ", "), l.opts.MaxFiles, first.Seq, filepath.Base(oldest))
	}
	rec = Bounded(rec)
	l.log.Info("audit log pruned", "deleted", removed, "first_seq", rec.FirstSeq)
	return rec, true
}

// firstRecord reads the first line of the file at path.
func firstRecord(path string) (Record, error) {
	f, err := os.Open(path)
	if err != nil {
		return Record{}, err
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	var line []byte
	for {
		n, err := f.Read(buf)
		if i := bytes.IndexByte(buf[:n], '\n'); i >= 0 {
			line = append(line, buf[:i]...)
			break
		}
		line = append(line, buf[:n]...)
		if len(line) > MaxLine {
			return checkLine(line)
		}
		if err != nil {
			return Record{}, fmt.Errorf("%s has no complete first line", path)
		}
	}
	return checkLine(line)
}

// Rotated lists the rotated files of the log at path, oldest first.
func Rotated(path string) ([]string, error) {
	matches, err := filepath.Glob(globEscape(path) + ".*")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range matches {
		if rotatedIndex(path, m) > 0 {
			out = append(out, m)
		}
	}
	sort.Slice(out, func(i, j int) bool { return rotatedIndex(path, out[i]) < rotatedIndex(path, out[j]) })
	return out, nil
}

// rotatedIndex is N of path.N, or 0 if name is not a rotated file.
func rotatedIndex(path, name string) int {
	suffix, ok := strings.CutPrefix(name, path+".")
	if !ok || suffix == "" || strings.TrimLeft(suffix, "0123456789") != "" || suffix[0] == '0' {
		return 0
	}
	n, err := strconv.Atoi(suffix)
	if err != nil {
		return 0
	}
	return n
}

func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// lastRecord reads the last line of the file at path and returns its
// record's number and the line's hash. It applies checkLine, as Verify does.
func lastRecord(path string) (seq uint64, hash string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, "", err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, "", err
	}
	size := fi.Size()
	if size == 0 {
		return 0, "", fmt.Errorf("%s is empty; a rotated file never is: check the log with `safe-run audit verify`", path)
	}
	n := min(size, MaxLine+2) // the longest line allowed, its newline and the newline before it
	buf := make([]byte, n)
	if _, err := f.ReadAt(buf, size-n); err != nil && !errors.Is(err, io.EOF) {
		return 0, "", err
	}
	if buf[len(buf)-1] != '\n' {
		return 0, "", fmt.Errorf("%s ends with an incomplete line (a write was cut short?); check it with `safe-run audit verify` and move the damaged file aside", path)
	}
	line := buf[:len(buf)-1]
	i := bytes.LastIndexByte(line, '\n')
	if i < 0 && n < size {
		return 0, "", fmt.Errorf("%s: the last line is longer than %d bytes, the limit of a record; check it with `safe-run audit verify` and move the damaged file aside", path, MaxLine)
	}
	line = line[i+1:]
	rec, err := checkLine(line)
	if err != nil {
		return 0, "", fmt.Errorf("%s: the last line is %v; check it with `safe-run audit verify` and move the damaged file aside", path, err)
	}
	return rec.Seq, hashLine(line), nil
}
