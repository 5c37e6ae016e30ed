package rootfs

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// escapeCanary is where seed archives that climb out through a link to "/"
// or "/tmp" would put a file; it must never appear.
const escapeCanary = "/tmp/safe-run-extract-escape-canary"

// FuzzExtract extracts arbitrary bytes as an archive. Whether it succeeds
// or not, nothing is created outside the destination, nothing inside is a
// device, fifo or socket or has a setuid, setgid or (on a file) sticky bit,
// and the limits hold.
func FuzzExtract(f *testing.F) {
	limits := ExtractLimits{MaxBytes: 4 << 10, MaxEntries: 16}
	// One base per fuzzing process, emptied before each input: fixed names
	// keep the coverage of an input the same from one run to the next.
	base := f.TempDir()
	dst := filepath.Join(base, "outer", "dst")
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.RemoveAll(filepath.Join(base, "outer")); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(dst, 0o755); err != nil {
			t.Fatal(err)
		}
		st, err := Extract(bytes.NewReader(data), dst, limits)
		checkOnlyInside(t, base, dst)
		if _, cerr := os.Lstat(escapeCanary); !errors.Is(cerr, fs.ErrNotExist) {
			os.Remove(escapeCanary)
			t.Fatalf("extraction created %s outside the destination", escapeCanary)
		}
		var bytes int64
		seen := map[uint64]bool{}
		werr := filepath.WalkDir(dst, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			mode := fi.Mode()
			switch {
			case mode&(fs.ModeDevice|fs.ModeCharDevice|fs.ModeNamedPipe|fs.ModeSocket) != 0:
				t.Errorf("extraction made %s, a %v", p, mode.Type())
			case mode&(fs.ModeSetuid|fs.ModeSetgid) != 0:
				t.Errorf("extraction made %s with mode %v", p, mode)
			case mode&fs.ModeSticky != 0 && !mode.IsDir():
				t.Errorf("extraction made %s, not a directory, with the sticky bit", p)
			}
			if ino := fi.Sys().(*syscall.Stat_t).Ino; mode.IsRegular() && !seen[ino] {
				seen[ino] = true // hard links share their bytes
				bytes += fi.Size()
			}
			return nil
		})
		if werr != nil {
			t.Fatal(werr)
		}
		if bytes > limits.MaxBytes {
			t.Errorf("extraction wrote %d bytes, over the %d-byte limit", bytes, limits.MaxBytes)
		}
		if err == nil && (st.Entries+st.Skipped > limits.MaxEntries || st.Bytes < bytes) {
			t.Errorf("stats %+v: over %d entries, or fewer bytes than the %d on disk", st, limits.MaxEntries, bytes)
		}
	})
}
