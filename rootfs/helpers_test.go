package rootfs

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testTime is the modification time given to entries that do not set one.
var testTime = time.Date(2021, 3, 4, 5, 6, 7, 0, time.UTC)

// testLimits are generous enough for every test archive.
var testLimits = ExtractLimits{MaxBytes: 1 << 20, MaxEntries: 1000}

// tarEntry is one archive member: a header and, for regular files, a body.
type tarEntry struct {
	hdr  tar.Header
	body string
}

func regEntry(name string, mode int64, body string) tarEntry {
	return tarEntry{hdr: tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: mode}, body: body}
}

func dirEntry(name string, mode int64) tarEntry {
	return tarEntry{hdr: tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: mode}}
}

func symlinkEntry(name, target string) tarEntry {
	return tarEntry{hdr: tar.Header{Name: name, Typeflag: tar.TypeSymlink, Linkname: target, Mode: 0o777}}
}

func hardlinkEntry(name, target string) tarEntry {
	return tarEntry{hdr: tar.Header{Name: name, Typeflag: tar.TypeLink, Linkname: target, Mode: 0o644}}
}

// makeTar builds an uncompressed tar archive from entries. A regular file's
// size defaults to the length of its body, and an entry's modification time
// to testTime.
func makeTar(t testing.TB, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := e.hdr
		if hdr.Typeflag == tar.TypeReg && hdr.Size == 0 {
			hdr.Size = int64(len(e.body))
		}
		if hdr.ModTime.IsZero() {
			hdr.ModTime = testTime
		}
		if err := tw.WriteHeader(&hdr); err != nil {
			t.Fatalf("write header %q: %v", hdr.Name, err)
		}
		if e.body != "" {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatalf("write body %q: %v", hdr.Name, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// gzipBytes compresses b with gzip.
func gzipBytes(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// newDst creates an empty destination directory two levels below a fresh
// temporary directory, so that entries escaping by one or two ".." would
// still land inside the temporary directory, where checkOnlyInside sees
// them. It returns the temporary directory and the destination.
func newDst(t *testing.T) (base, dst string) {
	t.Helper()
	base = t.TempDir()
	dst = filepath.Join(base, "outer", "dst")
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	return base, dst
}

// extractTar extracts data into a fresh destination made by newDst.
func extractTar(t *testing.T, data []byte, limits ExtractLimits) (base, dst string, st ExtractStats, err error) {
	t.Helper()
	base, dst = newDst(t)
	st, err = Extract(bytes.NewReader(data), dst, limits)
	return base, dst, st, err
}

// checkOnlyInside fails the test if anything below base other than the
// directories leading to dst lies outside dst.
func checkOnlyInside(t *testing.T, base, dst string) {
	t.Helper()
	allowed := map[string]bool{base: true, filepath.Dir(dst): true, dst: true}
	err := filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if allowed[p] || strings.HasPrefix(p, dst+string(filepath.Separator)) {
			return nil
		}
		t.Errorf("extraction wrote %s outside the destination %s", p, dst)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// lmode returns the mode of name without following a final symbolic link.
func lmode(t *testing.T, name string) fs.FileMode {
	t.Helper()
	fi, err := os.Lstat(name)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode()
}

// readFile returns the content of name, failing the test on error.
func readFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
