package rootfs

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestExtract(t *testing.T) {
	pycTime := time.Unix(1700000000, 0)
	nsTime := time.Unix(1700000001, 123456789)
	entries := []tarEntry{
		dirEntry("etc", 0o755),
		regEntry("etc/hosts", 0o644, "127.0.0.1 localhost\n"),
		regEntry("etc/shadow", 0o600, "root:*:1::::::\n"),
		dirEntry("usr/bin", 0o755), // parent usr is not listed
		regEntry("usr/bin/tool", 0o755, "#!/bin/sh\necho tool\n"),
		regEntry("usr/bin/open", 0o777, "open to all"),
		{hdr: tar.Header{Name: "usr/lib/mod.pyc", Typeflag: tar.TypeReg, Mode: 0o644, ModTime: pycTime}, body: "bytecode"},
		{hdr: tar.Header{Name: "usr/lib/ns.pyc", Typeflag: tar.TypeReg, Mode: 0o644, ModTime: nsTime, Format: tar.FormatPAX}, body: "more bytecode"},
		regEntry("empty", 0o644, ""),
		dirEntry("tmp", 0o1777),
		dirEntry("shared", 0o777),
		dirEntry("private", 0o700),
		symlinkEntry("bin", "usr/bin"),
		symlinkEntry("etc/localtime", "/usr/share/zoneinfo/UTC"),
		symlinkEntry("etc/up", "../../.."),
		hardlinkEntry("usr/bin/tool2", "usr/bin/tool"),
		hardlinkEntry("usr/bin/tool3", "/usr/bin/tool"),
	}
	var wantBytes int64
	for _, e := range entries {
		wantBytes += int64(len(e.body))
	}

	files := []struct {
		name    string
		mode    fs.FileMode
		body    string
		modTime time.Time
	}{
		{"etc/hosts", 0o644, "127.0.0.1 localhost\n", testTime},
		{"etc/shadow", 0o600, "root:*:1::::::\n", testTime},
		{"usr/bin/tool", 0o755, "#!/bin/sh\necho tool\n", testTime},
		{"usr/bin/open", 0o777, "open to all", testTime},
		{"usr/lib/mod.pyc", 0o644, "bytecode", pycTime},
		{"usr/lib/ns.pyc", 0o644, "more bytecode", nsTime},
		{"empty", 0o644, "", testTime},
		{"usr/bin/tool2", 0o755, "#!/bin/sh\necho tool\n", testTime},
		{"usr/bin/tool3", 0o755, "#!/bin/sh\necho tool\n", testTime},
	}
	dirs := []struct {
		name string
		mode fs.FileMode
	}{
		{".", 0o755}, // untouched: the archive has no "./" entry
		{"etc", 0o755},
		{"usr", 0o755},
		{"usr/bin", 0o755},
		{"tmp", 0o777 | fs.ModeSticky},
		{"shared", 0o777},
		{"private", 0o700},
	}
	symlinks := []struct{ name, target string }{
		{"bin", "usr/bin"},
		{"etc/localtime", "/usr/share/zoneinfo/UTC"},
		{"etc/up", "../../.."},
	}

	for _, compress := range []bool{false, true} {
		name := "tar"
		data := makeTar(t, entries...)
		if compress {
			name = "tar.gz"
			data = gzipBytes(t, data)
		}
		t.Run(name, func(t *testing.T) {
			base, dst, st, err := extractTar(t, data, testLimits)
			if err != nil {
				t.Fatalf("Extract: %v", err)
			}
			want := ExtractStats{Entries: len(entries), Bytes: wantBytes}
			if st != want {
				t.Errorf("stats = %+v, want %+v", st, want)
			}
			for _, f := range files {
				p := filepath.Join(dst, f.name)
				fi, err := os.Lstat(p)
				if err != nil {
					t.Errorf("%s: %v", f.name, err)
					continue
				}
				if fi.Mode() != f.mode {
					t.Errorf("%s: mode %v, want %v", f.name, fi.Mode(), f.mode)
				}
				if got := readFile(t, p); got != f.body {
					t.Errorf("%s: content %q, want %q", f.name, got, f.body)
				}
				if !fi.ModTime().Equal(f.modTime) {
					t.Errorf("%s: mtime %v, want %v", f.name, fi.ModTime(), f.modTime)
				}
			}
			for _, d := range dirs {
				if got := lmode(t, filepath.Join(dst, d.name)); got != fs.ModeDir|d.mode {
					t.Errorf("%s: mode %v, want %v", d.name, got, fs.ModeDir|d.mode)
				}
			}
			for _, l := range symlinks {
				p := filepath.Join(dst, l.name)
				if m := lmode(t, p); m.Type() != fs.ModeSymlink {
					t.Errorf("%s: mode %v, want a symbolic link", l.name, m)
					continue
				}
				if got, err := os.Readlink(p); err != nil || got != l.target {
					t.Errorf("%s: link target %q (%v), want %q", l.name, got, err, l.target)
				}
			}
			tool, err := os.Stat(filepath.Join(dst, "usr/bin/tool"))
			if err != nil {
				t.Fatal(err)
			}
			for _, link := range []string{"usr/bin/tool2", "usr/bin/tool3"} {
				fi, err := os.Stat(filepath.Join(dst, link))
				if err != nil {
					t.Fatal(err)
				}
				if !os.SameFile(tool, fi) {
					t.Errorf("%s is not a hard link to usr/bin/tool", link)
				}
			}
			checkOnlyInside(t, base, dst)
		})
	}
}

// TestExtractModesIgnoreUmask checks that modes come from the archive
// exactly, whatever the process's umask.
func TestExtractModesIgnoreUmask(t *testing.T) {
	old := unix.Umask(0o077)
	defer unix.Umask(old)

	data := makeTar(t,
		dirEntry("d", 0o755),
		dirEntry("tmp", 0o1777),
		regEntry("d/exe", 0o755, "x"),
		regEntry("d/conf", 0o644, "x"),
		regEntry("d/secret", 0o600, "x"),
		regEntry("d/all", 0o666, "x"),
		regEntry("implicit/parent/file", 0o644, "x"),
	)
	_, dst, _, err := extractTar(t, data, testLimits)
	if err != nil {
		t.Fatalf("Extract: %v", err)
	}
	tests := []struct {
		name string
		want fs.FileMode
	}{
		{"d", fs.ModeDir | 0o755},
		{"tmp", fs.ModeDir | fs.ModeSticky | 0o777},
		{"d/exe", 0o755},
		{"d/conf", 0o644},
		{"d/secret", 0o600},
		{"d/all", 0o666},
		{"implicit/parent/file", 0o644},
		// Directories the archive does not list are created 0755 (see
		// extractor.prepare), or sandboxes running as other users could
		// not reach what is below them.
		{"implicit", fs.ModeDir | 0o755},
		{"implicit/parent", fs.ModeDir | 0o755},
	}
	for _, tt := range tests {
		if got := lmode(t, filepath.Join(dst, tt.name)); got != tt.want {
			t.Errorf("%s: mode %v, want %v (umask 077)", tt.name, got, tt.want)
		}
	}
}

func TestExtractRootEntry(t *testing.T) {
	for _, name := range []string{"./", "/", "."} {
		t.Run(name, func(t *testing.T) {
			base, dst := newDst(t)
			if err := os.Chmod(dst, 0o700); err != nil {
				t.Fatal(err)
			}
			data := makeTar(t, dirEntry(name, 0o755), regEntry("./f", 0o644, "x"))
			if _, err := Extract(bytes.NewReader(data), dst, testLimits); err != nil {
				t.Fatalf("Extract: %v", err)
			}
			if got := lmode(t, dst); got != fs.ModeDir|0o755 {
				t.Errorf("root mode %v, want %v", got, fs.ModeDir|0o755)
			}
			if got := readFile(t, filepath.Join(dst, "f")); got != "x" {
				t.Errorf("f = %q, want %q", got, "x")
			}
			checkOnlyInside(t, base, dst)
		})
	}
}

func TestExtractOwnership(t *testing.T) {
	const uid, gid = 1234, 5678
	withOwner := func(e tarEntry) tarEntry {
		e.hdr.Uid, e.hdr.Gid = uid, gid
		return e
	}
	data := makeTar(t,
		withOwner(dirEntry("d", 0o755)),
		withOwner(regEntry("d/f", 0o755, "x")),
		withOwner(symlinkEntry("d/l", "f")),
		regEntry("mine", 0o644, "x"), // uid and gid 0
	)
	_, dst, _, err := extractTar(t, data, testLimits)
	if err != nil {
		t.Fatalf("Extract: %v", err)
	}
	owner := func(name string) (int, int) {
		fi, err := os.Lstat(filepath.Join(dst, name))
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		return int(st.Uid), int(st.Gid)
	}
	if os.Geteuid() == 0 {
		for _, name := range []string{"d", "d/f", "d/l"} {
			if u, g := owner(name); u != uid || g != gid {
				t.Errorf("%s: owner %d:%d, want %d:%d", name, u, g, uid, gid)
			}
		}
		if u, g := owner("mine"); u != 0 || g != 0 {
			t.Errorf("mine: owner %d:%d, want 0:0", u, g)
		}
		// Changing the owner must not have cost the file its mode.
		if got := lmode(t, filepath.Join(dst, "d/f")); got != 0o755 {
			t.Errorf("d/f: mode %v after chown, want %v", got, fs.FileMode(0o755))
		}
	} else {
		for _, name := range []string{"d", "d/f", "d/l", "mine"} {
			if u, _ := owner(name); u != os.Geteuid() {
				t.Errorf("%s: owner %d, want the extracting user %d", name, u, os.Geteuid())
			}
		}
	}
}

// TestExtractReadOnlyDirectory checks that a directory without write
// permission can still be filled by the entries that follow it.
func TestExtractReadOnlyDirectory(t *testing.T) {
	data := makeTar(t,
		dirEntry("ro", 0o555),
		regEntry("ro/f", 0o444, "x"),
		dirEntry("ro/sub", 0o555),
	)
	_, dst := newDst(t)
	// Let the temporary directory be removed when not running as root.
	t.Cleanup(func() { os.Chmod(filepath.Join(dst, "ro"), 0o755) })
	if _, err := Extract(bytes.NewReader(data), dst, testLimits); err != nil {
		t.Fatalf("Extract: %v", err)
	}
	if got := readFile(t, filepath.Join(dst, "ro/f")); got != "x" {
		t.Errorf("ro/f = %q, want %q", got, "x")
	}
	for name, want := range map[string]fs.FileMode{"ro": fs.ModeDir | 0o555, "ro/sub": fs.ModeDir | 0o555, "ro/f": 0o444} {
		if got := lmode(t, filepath.Join(dst, name)); got != want {
			t.Errorf("%s: mode %v, want %v", name, got, want)
		}
	}
}

func TestExtractGzipDetection(t *testing.T) {
	plain := makeTar(t, regEntry("f", 0o644, "content"))
	tests := []struct {
		name    string
		data    []byte
		wantErr bool
	}{
		{"plain", plain, false},
		{"gzip", gzipBytes(t, plain), false},
		{"gzip magic then garbage", append([]byte{0x1f, 0x8b}, bytes.Repeat([]byte{0xff}, 100)...), true},
		{"gzip of garbage", gzipBytes(t, bytes.Repeat([]byte("not a tar archive "), 100)), true},
		{"not an archive", bytes.Repeat([]byte("not a tar archive "), 100), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, dst, _, err := extractTar(t, tt.data, testLimits)
			if tt.wantErr {
				if err == nil {
					t.Fatal("Extract succeeded, want an error")
				}
				return
			}
			if err != nil {
				t.Fatalf("Extract: %v", err)
			}
			if got := readFile(t, filepath.Join(dst, "f")); got != "content" {
				t.Errorf("f = %q, want %q", got, "content")
			}
		})
	}
}

func TestExtractPathTraversal(t *testing.T) {
	tests := []struct {
		name  string
		entry tarEntry
	}{
		{"file ../evil", regEntry("../evil", 0o644, "evil")},
		{"file a/../../evil", regEntry("a/../../evil", 0o644, "evil")},
		{"file ./../../evil", regEntry("./../../evil", 0o644, "evil")},
		{"file /../evil", regEntry("/../evil", 0o644, "evil")},
		{"dir ../evil", dirEntry("../evil", 0o755)},
		{"dir a/../../evil", dirEntry("a/../../evil", 0o755)},
		{"symlink ../evil", symlinkEntry("../evil", "/")},
		{"symlink a/../../evil", symlinkEntry("a/../../evil", "/")},
		{"hard link ../evil", hardlinkEntry("../evil", "f")},
		{"hard link to ../f", hardlinkEntry("evil", "../f")},
		{"hard link to a/../../f", hardlinkEntry("evil", "a/../../f")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base, dst := newDst(t)
			// Files one and two levels up, which a hard link might reach.
			for _, dir := range []string{base, filepath.Dir(dst)} {
				if err := os.WriteFile(filepath.Join(dir, "f"), []byte("host"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			data := makeTar(t, regEntry("f", 0o644, "inside"), tt.entry)
			_, err := Extract(bytes.NewReader(data), dst, testLimits)
			if !errors.Is(err, ErrUnsafePath) {
				t.Errorf("Extract: %v, want an error wrapping ErrUnsafePath", err)
			}
			os.Remove(filepath.Join(base, "f"))
			os.Remove(filepath.Join(filepath.Dir(dst), "f"))
			checkOnlyInside(t, base, dst)
			if _, err := os.Lstat(filepath.Join(dst, "evil")); err == nil {
				t.Errorf("evil was created in the destination")
			}
		})
	}
}

func TestExtractAbsoluteNames(t *testing.T) {
	data := makeTar(t,
		regEntry("/etc/x", 0o644, "x"),
		regEntry("//etc//y", 0o644, "y"),
		dirEntry("/abs/dir", 0o755),
		symlinkEntry("/abs/link", "/etc/x"),
		hardlinkEntry("/abs/hard", "/etc/x"),
		regEntry("./rel/./z", 0o644, "z"),
	)
	base, dst, _, err := extractTar(t, data, testLimits)
	if err != nil {
		t.Fatalf("Extract: %v", err)
	}
	for name, want := range map[string]string{"etc/x": "x", "etc/y": "y", "rel/z": "z", "abs/hard": "x"} {
		if got := readFile(t, filepath.Join(dst, name)); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	if got := lmode(t, filepath.Join(dst, "abs/dir")); !got.IsDir() {
		t.Errorf("abs/dir: mode %v, want a directory", got)
	}
	if got, err := os.Readlink(filepath.Join(dst, "abs/link")); err != nil || got != "/etc/x" {
		t.Errorf("abs/link -> %q (%v), want /etc/x", got, err)
	}
	x, err := os.Stat(filepath.Join(dst, "etc/x"))
	if err != nil {
		t.Fatal(err)
	}
	hard, err := os.Stat(filepath.Join(dst, "abs/hard"))
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(x, hard) {
		t.Error("abs/hard is not a hard link to etc/x in the destination")
	}
	checkOnlyInside(t, base, dst)
}

func TestExtractSymlinkEscape(t *testing.T) {
	tests := []struct {
		name    string
		entries func(base string) []tarEntry
	}{
		{"link to / then file below", func(string) []tarEntry {
			return []tarEntry{symlinkEntry("link", "/"), regEntry("link/evil", 0o644, "evil")}
		}},
		{"link to ../.. then file below", func(string) []tarEntry {
			return []tarEntry{symlinkEntry("link", "../.."), regEntry("link/evil", 0o644, "evil")}
		}},
		{"link to .. then directory below", func(string) []tarEntry {
			return []tarEntry{symlinkEntry("link", ".."), dirEntry("link/evil", 0o755)}
		}},
		{"link to host dir then file below", func(base string) []tarEntry {
			return []tarEntry{symlinkEntry("link", base), regEntry("link/evil", 0o644, "evil")}
		}},
		{"link to host dir then deep file below", func(base string) []tarEntry {
			return []tarEntry{symlinkEntry("link", base), regEntry("link/a/b/evil", 0o644, "evil")}
		}},
		{"link to host dir then symlink below", func(base string) []tarEntry {
			return []tarEntry{symlinkEntry("link", base), symlinkEntry("link/evil", "/")}
		}},
		{"link to host dir then hard link below", func(base string) []tarEntry {
			return []tarEntry{regEntry("f", 0o644, "f"), symlinkEntry("link", base), hardlinkEntry("link/evil", "f")}
		}},
		{"nested link to ../../.. then file below", func(string) []tarEntry {
			return []tarEntry{dirEntry("a/b", 0o755), symlinkEntry("a/b/up", "../../.."), regEntry("a/b/up/evil", 0o644, "evil")}
		}},
		{"chain of links out then file below", func(string) []tarEntry {
			return []tarEntry{symlinkEntry("one", "two"), symlinkEntry("two", "../.."), regEntry("one/evil", 0o644, "evil")}
		}},
		{"directory replaced by link then file below", func(base string) []tarEntry {
			return []tarEntry{dirEntry("d", 0o755), symlinkEntry("d", base), regEntry("d/evil", 0o644, "evil")}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base, dst := newDst(t)
			data := makeTar(t, tt.entries(base)...)
			if _, err := Extract(bytes.NewReader(data), dst, testLimits); err == nil {
				t.Error("Extract succeeded, want an error")
			}
			checkOnlyInside(t, base, dst)
		})
	}
}

// TestExtractHostPasswd checks that a link to the host's /etc does not let
// an archive write the host's /etc/passwd.
func TestExtractHostPasswd(t *testing.T) {
	const passwd = "/etc/passwd"
	before, err := os.ReadFile(passwd)
	if err != nil {
		t.Skipf("no %s to compare: %v", passwd, err)
	}
	fiBefore, err := os.Lstat(passwd)
	if err != nil {
		t.Fatal(err)
	}
	data := makeTar(t,
		symlinkEntry("etc", "/etc"),
		regEntry("etc/passwd", 0o644, "evil::0:0::/:/bin/sh\n"),
	)
	base, dst, _, err := extractTar(t, data, testLimits)
	if err == nil {
		t.Error("Extract succeeded, want an error")
	}
	after, rerr := os.ReadFile(passwd)
	if rerr != nil {
		t.Fatalf("host %s after extraction: %v", passwd, rerr)
	}
	fiAfter, err := os.Lstat(passwd)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before, after) {
		t.Errorf("host %s changed", passwd)
	}
	if !fiAfter.ModTime().Equal(fiBefore.ModTime()) || !os.SameFile(fiBefore, fiAfter) || fiAfter.Mode() != fiBefore.Mode() {
		t.Errorf("host %s replaced or touched: %v %v, was %v %v", passwd, fiAfter.Mode(), fiAfter.ModTime(), fiBefore.Mode(), fiBefore.ModTime())
	}
	checkOnlyInside(t, base, dst)
}

func TestExtractHardLinkRejected(t *testing.T) {
	tests := []struct {
		name    string
		entries []tarEntry
		unsafe  bool // the error wraps ErrUnsafePath
	}{
		{"target outside", []tarEntry{hardlinkEntry("h", "../../etc/passwd")}, true},
		{"target missing", []tarEntry{hardlinkEntry("h", "missing")}, false},
		{"absolute target missing in the archive", []tarEntry{hardlinkEntry("h", "/etc/passwd")}, false},
		{"target a symlink", []tarEntry{regEntry("f", 0o644, "x"), symlinkEntry("s", "f"), hardlinkEntry("h", "s")}, false},
		{"target a symlink out", []tarEntry{symlinkEntry("s", "/etc/passwd"), hardlinkEntry("h", "s")}, false},
		{"target through a symlink out", []tarEntry{symlinkEntry("etc", "/etc"), hardlinkEntry("h", "etc/passwd")}, false},
		{"target a directory", []tarEntry{dirEntry("d", 0o755), hardlinkEntry("h", "d")}, false},
		{"target itself", []tarEntry{hardlinkEntry("h", "h")}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base, dst, _, err := extractTar(t, makeTar(t, tt.entries...), testLimits)
			if err == nil {
				t.Fatal("Extract succeeded, want an error")
			}
			if tt.unsafe && !errors.Is(err, ErrUnsafePath) {
				t.Errorf("Extract: %v, want an error wrapping ErrUnsafePath", err)
			}
			if _, err := os.Lstat(filepath.Join(dst, "h")); err == nil {
				t.Error("the hard link h was created")
			}
			checkOnlyInside(t, base, dst)
		})
	}
}

func TestExtractSpecialFilesSkipped(t *testing.T) {
	data := makeTar(t,
		tarEntry{hdr: tar.Header{Name: "dev/null", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3}},
		tarEntry{hdr: tar.Header{Name: "dev/sda", Typeflag: tar.TypeBlock, Mode: 0o660, Devmajor: 8, Devminor: 0}},
		tarEntry{hdr: tar.Header{Name: "run/fifo", Typeflag: tar.TypeFifo, Mode: 0o644}},
		regEntry("f", 0o644, "x"),
	)
	_, dst, st, err := extractTar(t, data, testLimits)
	if err != nil {
		t.Fatalf("Extract: %v", err)
	}
	if want := (ExtractStats{Entries: 1, Bytes: 1, Skipped: 3}); st != want {
		t.Errorf("stats = %+v, want %+v", st, want)
	}
	for _, name := range []string{"dev/null", "dev/sda", "run/fifo"} {
		if fi, err := os.Lstat(filepath.Join(dst, name)); err == nil {
			t.Errorf("%s was created with mode %v", name, fi.Mode())
		}
	}
}

func TestExtractStripsSpecialBits(t *testing.T) {
	tests := []struct {
		name     string
		entry    tarEntry
		want     fs.FileMode
		stripped int
	}{
		{"setuid file", regEntry("f", 0o4755, "x"), 0o755, 1},
		{"setgid file", regEntry("f", 0o2755, "x"), 0o755, 1},
		{"setuid and setgid file", regEntry("f", 0o6711, "x"), 0o711, 1},
		{"sticky file", regEntry("f", 0o1755, "x"), 0o755, 1},
		{"plain file", regEntry("f", 0o755, "x"), 0o755, 0},
		{"setgid directory", dirEntry("f", 0o2775), fs.ModeDir | 0o775, 1},
		{"sticky directory", dirEntry("f", 0o1777), fs.ModeDir | fs.ModeSticky | 0o777, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, dst, st, err := extractTar(t, makeTar(t, tt.entry), testLimits)
			if err != nil {
				t.Fatalf("Extract: %v", err)
			}
			if got := lmode(t, filepath.Join(dst, "f")); got != tt.want {
				t.Errorf("mode %v, want %v", got, tt.want)
			}
			if st.Stripped != tt.stripped {
				t.Errorf("Stripped = %d, want %d", st.Stripped, tt.stripped)
			}
		})
	}
}

func TestExtractNoXattrs(t *testing.T) {
	// A v2 file capability granting CAP_NET_RAW, effective.
	capability := string([]byte{0x01, 0x00, 0x00, 0x02, 0x00, 0x20, 0x00, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	pax := map[string]string{
		"SCHILY.xattr.security.capability": capability,
		"SCHILY.xattr.user.test":           "value",
		"SCHILY.xattr.trusted.test":        "value",
	}
	data := makeTar(t,
		tarEntry{hdr: tar.Header{Name: "d", Typeflag: tar.TypeDir, Mode: 0o755, PAXRecords: pax, Format: tar.FormatPAX}},
		tarEntry{hdr: tar.Header{Name: "d/ping", Typeflag: tar.TypeReg, Mode: 0o755, PAXRecords: pax, Format: tar.FormatPAX}, body: "ELF"},
	)
	// The archive really carries the attributes.
	hdrs := 0
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.PAXRecords["SCHILY.xattr.security.capability"] != capability {
			t.Fatalf("test archive: %s lacks its capability record", hdr.Name)
		}
		hdrs++
	}
	if hdrs != 2 {
		t.Fatalf("test archive has %d entries, want 2", hdrs)
	}

	_, dst, _, err := extractTar(t, data, testLimits)
	if err != nil {
		t.Fatalf("Extract: %v", err)
	}
	for _, name := range []string{"d", "d/ping"} {
		p := filepath.Join(dst, name)
		buf := make([]byte, 1024)
		for _, attr := range []string{"security.capability", "user.test", "trusted.test"} {
			if n, err := unix.Lgetxattr(p, attr, buf); err == nil {
				t.Errorf("%s has extended attribute %s = %q", name, attr, buf[:n])
			}
		}
		if n, err := unix.Llistxattr(p, buf); err == nil && n > 0 {
			for _, attr := range strings.Split(strings.TrimRight(string(buf[:n]), "\x00"), "\x00") {
				if strings.HasPrefix(attr, "security.capability") || strings.HasPrefix(attr, "user.") || strings.HasPrefix(attr, "trusted.") {
					t.Errorf("%s has extended attribute %s", name, attr)
				}
			}
		}
	}
	// The check above means something only if the file system could hold
	// a capability: as root, set one on a file next to the extracted one.
	if os.Geteuid() == 0 {
		control := filepath.Join(dst, "control")
		if err := os.WriteFile(control, nil, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Setxattr(control, "security.capability", []byte(capability), 0); err != nil {
			t.Logf("file system cannot hold capabilities (%v); the check above is vacuous", err)
		}
	}
}

func TestExtractLimits(t *testing.T) {
	tests := []struct {
		name    string
		entries []tarEntry
		limits  ExtractLimits
		wantErr bool
	}{
		{"bytes at the limit", []tarEntry{regEntry("a", 0o644, strings.Repeat("a", 60)), regEntry("b", 0o644, strings.Repeat("b", 40))}, ExtractLimits{MaxBytes: 100, MaxEntries: 10}, false},
		{"bytes over the limit", []tarEntry{regEntry("a", 0o644, strings.Repeat("a", 60)), regEntry("b", 0o644, strings.Repeat("b", 41))}, ExtractLimits{MaxBytes: 100, MaxEntries: 10}, true},
		{"one file over the limit", []tarEntry{regEntry("a", 0o644, strings.Repeat("a", 101))}, ExtractLimits{MaxBytes: 100, MaxEntries: 10}, true},
		{"entries at the limit", []tarEntry{dirEntry("d", 0o755), regEntry("d/a", 0o644, "a"), symlinkEntry("l", "d")}, ExtractLimits{MaxBytes: 100, MaxEntries: 3}, false},
		{"entries over the limit", []tarEntry{dirEntry("d", 0o755), regEntry("d/a", 0o644, "a"), symlinkEntry("l", "d"), regEntry("b", 0o644, "b")}, ExtractLimits{MaxBytes: 100, MaxEntries: 3}, true},
		{"skipped entries count", []tarEntry{
			{hdr: tar.Header{Name: "p1", Typeflag: tar.TypeFifo, Mode: 0o644}},
			{hdr: tar.Header{Name: "p2", Typeflag: tar.TypeFifo, Mode: 0o644}},
			regEntry("a", 0o644, "a"),
		}, ExtractLimits{MaxBytes: 100, MaxEntries: 2}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, st, err := extractTar(t, makeTar(t, tt.entries...), tt.limits)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("Extract succeeded with stats %+v, want an error", st)
				}
				if st.Bytes > tt.limits.MaxBytes || st.Entries+st.Skipped > tt.limits.MaxEntries {
					t.Errorf("stats %+v exceed limits %+v", st, tt.limits)
				}
				return
			}
			if err != nil {
				t.Fatalf("Extract: %v", err)
			}
		})
	}
}

func TestExtractReplaces(t *testing.T) {
	tests := []struct {
		name    string
		entries []tarEntry
		check   func(t *testing.T, dst string)
	}{
		{"file over file", []tarEntry{regEntry("a", 0o644, "old"), regEntry("a", 0o600, "new")}, func(t *testing.T, dst string) {
			if got := readFile(t, filepath.Join(dst, "a")); got != "new" {
				t.Errorf("a = %q, want %q", got, "new")
			}
			if got := lmode(t, filepath.Join(dst, "a")); got != 0o600 {
				t.Errorf("a: mode %v, want %v", got, fs.FileMode(0o600))
			}
		}},
		{"file over symlink", []tarEntry{regEntry("target", 0o644, "target"), symlinkEntry("a", "target"), regEntry("a", 0o644, "new")}, func(t *testing.T, dst string) {
			if got := lmode(t, filepath.Join(dst, "a")); !got.IsRegular() {
				t.Errorf("a: mode %v, want a regular file", got)
			}
			if got := readFile(t, filepath.Join(dst, "a")); got != "new" {
				t.Errorf("a = %q, want %q", got, "new")
			}
			if got := readFile(t, filepath.Join(dst, "target")); got != "target" {
				t.Errorf("the old link's target was written: %q", got)
			}
		}},
		{"file over dangling symlink out", []tarEntry{symlinkEntry("a", "/etc/safe-run-test-missing"), regEntry("a", 0o644, "new")}, func(t *testing.T, dst string) {
			if got := readFile(t, filepath.Join(dst, "a")); got != "new" {
				t.Errorf("a = %q, want %q", got, "new")
			}
			if _, err := os.Lstat("/etc/safe-run-test-missing"); err == nil {
				t.Error("the old link was followed out of the destination")
			}
		}},
		{"symlink over file", []tarEntry{regEntry("a", 0o644, "old"), symlinkEntry("a", "elsewhere")}, func(t *testing.T, dst string) {
			if got, err := os.Readlink(filepath.Join(dst, "a")); err != nil || got != "elsewhere" {
				t.Errorf("a -> %q (%v), want elsewhere", got, err)
			}
		}},
		{"symlink over symlink", []tarEntry{symlinkEntry("a", "one"), symlinkEntry("a", "two")}, func(t *testing.T, dst string) {
			if got, err := os.Readlink(filepath.Join(dst, "a")); err != nil || got != "two" {
				t.Errorf("a -> %q (%v), want two", got, err)
			}
		}},
		{"hard link over file", []tarEntry{regEntry("f", 0o644, "f"), regEntry("a", 0o644, "old"), hardlinkEntry("a", "f")}, func(t *testing.T, dst string) {
			if got := readFile(t, filepath.Join(dst, "a")); got != "f" {
				t.Errorf("a = %q, want %q", got, "f")
			}
		}},
		{"dir over dir keeps contents", []tarEntry{dirEntry("d", 0o755), regEntry("d/child", 0o644, "child"), dirEntry("d", 0o700)}, func(t *testing.T, dst string) {
			if got := readFile(t, filepath.Join(dst, "d/child")); got != "child" {
				t.Errorf("d/child = %q, want %q", got, "child")
			}
			if got := lmode(t, filepath.Join(dst, "d")); got != fs.ModeDir|0o700 {
				t.Errorf("d: mode %v, want %v", got, fs.ModeDir|0o700)
			}
		}},
		{"dir over implicit dir", []tarEntry{regEntry("d/child", 0o644, "child"), dirEntry("d", 0o750)}, func(t *testing.T, dst string) {
			if got := readFile(t, filepath.Join(dst, "d/child")); got != "child" {
				t.Errorf("d/child = %q, want %q", got, "child")
			}
			if got := lmode(t, filepath.Join(dst, "d")); got != fs.ModeDir|0o750 {
				t.Errorf("d: mode %v, want %v", got, fs.ModeDir|0o750)
			}
		}},
		{"dir over file", []tarEntry{regEntry("d", 0o644, "file"), dirEntry("d", 0o755)}, func(t *testing.T, dst string) {
			if got := lmode(t, filepath.Join(dst, "d")); got != fs.ModeDir|0o755 {
				t.Errorf("d: mode %v, want %v", got, fs.ModeDir|0o755)
			}
		}},
		{"dir over symlink out", []tarEntry{symlinkEntry("d", "/"), dirEntry("d", 0o755), regEntry("d/f", 0o644, "x")}, func(t *testing.T, dst string) {
			if got := lmode(t, filepath.Join(dst, "d")); got != fs.ModeDir|0o755 {
				t.Errorf("d: mode %v, want %v", got, fs.ModeDir|0o755)
			}
			if got := readFile(t, filepath.Join(dst, "d/f")); got != "x" {
				t.Errorf("d/f = %q, want %q", got, "x")
			}
		}},
		{"file over dir", []tarEntry{dirEntry("d", 0o755), regEntry("d/child", 0o644, "child"), regEntry("d", 0o644, "file")}, func(t *testing.T, dst string) {
			if got := readFile(t, filepath.Join(dst, "d")); got != "file" {
				t.Errorf("d = %q, want %q", got, "file")
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base, dst, _, err := extractTar(t, makeTar(t, tt.entries...), testLimits)
			if err != nil {
				t.Fatalf("Extract: %v", err)
			}
			tt.check(t, dst)
			checkOnlyInside(t, base, dst)
		})
	}
}

func TestExtractTruncated(t *testing.T) {
	body := strings.Repeat("0123456789abcdef", 4096) // 64 KiB
	full := makeTar(t, regEntry("first", 0o644, "first"), regEntry("big", 0o644, body), regEntry("last", 0o644, "last"))
	// The header of "big" starts at 1024: "first" takes a header block and
	// a data block.
	tests := []struct {
		name string
		data []byte
	}{
		{"tar cut in a file", full[:1024+512+len(body)/2]},
		{"tar cut in a header", full[:1024+100]},
		{"gzip cut in a file", func() []byte { gz := gzipBytes(t, full); return gz[:len(gz)/2] }()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, dst, _, err := extractTar(t, tt.data, testLimits)
			if err == nil {
				t.Fatal("Extract succeeded, want an error")
			}
			if _, err := os.Lstat(filepath.Join(dst, "last")); err == nil {
				t.Error("the entry after the cut was written")
			}
		})
	}
	// The uncut archive extracts, so the errors above come from the cuts.
	if _, _, _, err := extractTar(t, full, testLimits); err != nil {
		t.Fatalf("Extract of the whole archive: %v", err)
	}
}

// TestExtractGzipIntegrity checks that the gzip trailer (CRC-32 and
// length) is verified, even though the tar stream inside ends before it.
func TestExtractGzipIntegrity(t *testing.T) {
	full := makeTar(t, regEntry("f", 0o644, strings.Repeat("data", 1000)))
	gz := gzipBytes(t, full)
	badCRC := bytes.Clone(gz)
	badCRC[len(badCRC)-8] ^= 0xff // first byte of the CRC-32
	badSize := bytes.Clone(gz)
	badSize[len(badSize)-4] ^= 0xff // first byte of the uncompressed size
	tests := []struct {
		name string
		data []byte
	}{
		{"bad CRC-32", badCRC},
		{"bad size", badSize},
		{"trailer cut off", gz[:len(gz)-8]},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, _, _, err := extractTar(t, tt.data, testLimits); err == nil {
				t.Error("Extract succeeded, want an error")
			}
		})
	}
	if _, _, _, err := extractTar(t, gz, testLimits); err != nil {
		t.Fatalf("Extract of the intact archive: %v", err)
	}
}

func TestExtractUnsupportedType(t *testing.T) {
	data := makeTar(t, tarEntry{hdr: tar.Header{Name: "odd", Typeflag: 'Z', Mode: 0o644}})
	if _, _, _, err := extractTar(t, data, testLimits); err == nil {
		t.Error("Extract succeeded on an entry of unknown type, want an error")
	}
}

func TestExtractBadDestination(t *testing.T) {
	data := makeTar(t, regEntry("f", 0o644, "x"))
	missing := filepath.Join(t.TempDir(), "missing")
	if _, err := Extract(bytes.NewReader(data), missing, testLimits); err == nil {
		t.Error("Extract into a missing directory succeeded, want an error")
	}
	if _, err := os.Lstat(missing); err == nil {
		t.Error("Extract created the missing destination")
	}
}

func TestCleanName(t *testing.T) {
	tests := []struct {
		in, want string
		unsafe   bool
	}{
		{"a", "a", false},
		{"./a/b", "a/b", false},
		{"/etc/x", "etc/x", false},
		{"//etc//x/", "etc/x", false},
		{"a/./b", "a/b", false},
		{"", ".", false},
		{".", ".", false},
		{"./", ".", false},
		{"/", ".", false},
		{"..", "", true},
		{"../a", "", true},
		{"a/..", "", true},
		{"a/../../b", "", true},
		{"/../a", "", true},
		{"a/b/../../../c", "", true},
	}
	for _, tt := range tests {
		got, err := cleanName(tt.in)
		if tt.unsafe {
			if !errors.Is(err, ErrUnsafePath) {
				t.Errorf("cleanName(%q) = %q, %v; want ErrUnsafePath", tt.in, got, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("cleanName(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}
