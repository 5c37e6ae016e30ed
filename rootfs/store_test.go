package rootfs

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// writeArchive writes a gzip-compressed tar archive of entries to a new
// file and returns its path.
func writeArchive(t *testing.T, entries ...tarEntry) string {
	t.Helper()
	return writeFile(t, "image.tar.gz", gzipBytes(t, makeTar(t, entries...)))
}

// writeFile writes data to a new file called name in a fresh temporary
// directory and returns its path.
func writeFile(t *testing.T, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// fileSum returns the hex SHA-256 of the file at p.
func fileSum(t *testing.T, p string) string {
	t.Helper()
	sum := sha256.Sum256([]byte(readFile(t, p)))
	return hex.EncodeToString(sum[:])
}

// newStore returns a store in a directory that does not exist yet.
func newStore(t *testing.T) Store {
	t.Helper()
	return Store{Dir: filepath.Join(t.TempDir(), "cache")}
}

// dirNames returns the names in dir, or nil if it does not exist.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

var imageEntries = []tarEntry{
	dirEntry("etc", 0o755),
	regEntry("etc/os-release", 0o644, "ID=test\n"),
	dirEntry("tmp", 0o1777),
	regEntry("usr/bin/python3", 0o755, "#!python"),
	symlinkEntry("bin", "usr/bin"),
}

func TestStoreImport(t *testing.T) {
	s := newStore(t)
	archive := writeArchive(t, imageEntries...)
	mp := Mountpoints{
		Dirs:  []string{"/proc", "/dev/pts", "tmp", "/workspace"},
		Files: []string{"/.safe-run/agent", "etc/os-release"},
	}
	img, err := s.Import("default", archive, ImportOptions{Key: "recipe-1", Mountpoints: mp})
	if err != nil {
		t.Fatalf("Import: %v", err)
	}
	wantRoot := filepath.Join(s.Dir, "images", "recipe-1", "rootfs")
	if img.Key != "recipe-1" || img.Root != wantRoot {
		t.Errorf("Import = key %q root %q, want key recipe-1 root %s", img.Key, img.Root, wantRoot)
	}
	if !slices.Equal(img.Names, []string{"default"}) {
		t.Errorf("Import: names %q, want [default]", img.Names)
	}
	if want := fileSum(t, archive); img.SourceSHA256 != want {
		t.Errorf("Import: source SHA-256 %s, want %s", img.SourceSHA256, want)
	}
	if img.Source != archive {
		t.Errorf("Import: source %q, want %q", img.Source, archive)
	}
	if img.Created.IsZero() {
		t.Error("Import: creation time not set")
	}
	if want := (ExtractStats{Entries: len(imageEntries), Bytes: int64(len("ID=test\n") + len("#!python"))}); img.Stats != want {
		t.Errorf("Import: stats %+v, want %+v", img.Stats, want)
	}
	if _, err := os.Stat(filepath.Join(s.Dir, "images", "recipe-1", "image.json")); err != nil {
		t.Errorf("image.json: %v", err)
	}
	if got := readFile(t, filepath.Join(s.Dir, "names", "default")); got != "recipe-1" {
		t.Errorf("names/default = %q, want recipe-1", got)
	}
	if names := dirNames(t, filepath.Join(s.Dir, "staging")); len(names) != 0 {
		t.Errorf("staging holds %q after a successful import", names)
	}

	got, err := s.Lookup("default")
	if err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	if got.Key != img.Key || got.Root != img.Root || got.SourceSHA256 != img.SourceSHA256 || got.Source != img.Source ||
		got.Stats != img.Stats || !got.Created.Equal(img.Created) || !slices.Equal(got.Names, []string{"default"}) {
		t.Errorf("Lookup = %+v, want %+v", got, img)
	}
	if fi, err := os.Stat(got.Root); err != nil || !fi.IsDir() {
		t.Fatalf("root %s: %v", got.Root, err)
	}
	if got := readFile(t, filepath.Join(got.Root, "etc/os-release")); got != "ID=test\n" {
		t.Errorf("etc/os-release = %q (a file mountpoint over an existing file must keep it)", got)
	}
	if got := readFile(t, filepath.Join(got.Root, "bin/python3")); got != "#!python" {
		t.Errorf("bin/python3 = %q", got)
	}

	// Mountpoints.
	for _, d := range []string{"proc", "dev/pts", "workspace"} {
		if m := lmode(t, filepath.Join(got.Root, d)); !m.IsDir() {
			t.Errorf("mountpoint %s: mode %v, want a directory", d, m)
		}
	}
	if m := lmode(t, filepath.Join(got.Root, "tmp")); m != fs.ModeDir|fs.ModeSticky|0o777 {
		t.Errorf("tmp: mode %v, want the archive's %v", m, fs.ModeDir|fs.ModeSticky|0o777)
	}
	if m := lmode(t, filepath.Join(got.Root, ".safe-run/agent")); !m.IsRegular() {
		t.Errorf("mountpoint .safe-run/agent: mode %v, want a regular file", m)
	}
}

func TestStoreImportWithoutKey(t *testing.T) {
	tests := []struct {
		name string
		data func(t *testing.T) []byte
	}{
		{"tar.gz", func(t *testing.T) []byte { return gzipBytes(t, makeTar(t, imageEntries...)) }},
		// Zero blocks after the end-of-archive marker, as tar's blocking
		// factor adds, are part of the file and of its hash; there are
		// more of them here than Extract buffers.
		{"padded tar", func(t *testing.T) []byte { return append(makeTar(t, imageEntries...), make([]byte, 3<<20)...) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newStore(t)
			archive := writeFile(t, "image.tar", tt.data(t))
			sum := fileSum(t, archive)
			img, err := s.Import("default", archive, ImportOptions{})
			if err != nil {
				t.Fatalf("Import: %v", err)
			}
			if want := "sha256-" + sum[:32]; img.Key != want {
				t.Errorf("key %q, want %q", img.Key, want)
			}
			if img.SourceSHA256 != sum {
				t.Errorf("source SHA-256 %s, want %s", img.SourceSHA256, sum)
			}
			got, err := s.Lookup("default")
			if err != nil {
				t.Fatalf("Lookup: %v", err)
			}
			if got.Key != img.Key || got.Root != filepath.Join(s.Dir, "images", img.Key, "rootfs") {
				t.Errorf("Lookup = key %q root %q", got.Key, got.Root)
			}
			if got := readFile(t, filepath.Join(got.Root, "etc/os-release")); got != "ID=test\n" {
				t.Errorf("etc/os-release = %q", got)
			}
		})
	}
}

// TestStoreImportSameArchiveTwice imports one archive, without a key,
// under two names and then again under the first.
func TestStoreImportSameArchiveTwice(t *testing.T) {
	s := newStore(t)
	archive := writeArchive(t, imageEntries...)
	first, err := s.Import("a", archive, ImportOptions{})
	if err != nil {
		t.Fatalf("first Import: %v", err)
	}
	for _, name := range []string{"b", "a"} {
		img, err := s.Import(name, archive, ImportOptions{})
		if err != nil {
			t.Errorf("Import %s again: %v", name, err)
			continue
		}
		if img.Key != first.Key || img.Root != first.Root {
			t.Errorf("Import %s again = key %q root %q, want key %q root %q", name, img.Key, img.Root, first.Key, first.Root)
		}
	}
	for _, name := range []string{"a", "b"} {
		if img, err := s.Lookup(name); err != nil || img.Key != first.Key {
			t.Errorf("Lookup(%s) = key %q, %v; want key %q", name, img.Key, err, first.Key)
		}
	}
	if names := dirNames(t, filepath.Join(s.Dir, "images")); !slices.Equal(names, []string{first.Key}) {
		t.Errorf("images %q, want [%s]", names, first.Key)
	}
	if names := dirNames(t, filepath.Join(s.Dir, "staging")); len(names) != 0 {
		t.Errorf("staging holds %q", names)
	}
}

func TestStoreImportSameKey(t *testing.T) {
	s := newStore(t)
	first := writeArchive(t, regEntry("version", 0o644, "1"))
	img1, err := s.Import("a", first, ImportOptions{Key: "k"})
	if err != nil {
		t.Fatalf("Import: %v", err)
	}
	// With the key already complete, Import only points the name at it:
	// it neither reads this other archive nor needs it to exist.
	for _, archive := range []string{
		writeArchive(t, regEntry("version", 0o644, "2")),
		filepath.Join(t.TempDir(), "missing.tar.gz"),
	} {
		img2, err := s.Import("b", archive, ImportOptions{Key: "k"})
		if err != nil {
			t.Fatalf("Import with the same key: %v", err)
		}
		if img2.Key != "k" || img2.Root != img1.Root || img2.SourceSHA256 != img1.SourceSHA256 || !img2.Created.Equal(img1.Created) {
			t.Errorf("Import with the same key = %+v, want the first image %+v", img2, img1)
		}
		if !slices.Contains(img2.Names, "b") {
			t.Errorf("Import with the same key: names %q, want them to include b, as a first import's do", img2.Names)
		}
		if got := readFile(t, filepath.Join(img1.Root, "version")); got != "1" {
			t.Errorf("version = %q, want the first archive's 1", got)
		}
		for _, name := range []string{"a", "b"} {
			if img, err := s.Lookup(name); err != nil || img.Key != "k" {
				t.Errorf("Lookup(%s) = key %q, %v; want k", name, img.Key, err)
			}
		}
	}
}

func TestStoreRepointName(t *testing.T) {
	s := newStore(t)
	if _, err := s.Import("default", writeArchive(t, regEntry("v", 0o644, "1")), ImportOptions{Key: "k1"}); err != nil {
		t.Fatal(err)
	}
	// Without Replace, the name stays where it was.
	second := writeArchive(t, regEntry("v", 0o644, "2"))
	_, err := s.Import("default", second, ImportOptions{Key: "k2"})
	if err == nil || !strings.Contains(err.Error(), "already points to image k1") || !strings.Contains(err.Error(), "--replace") {
		t.Errorf("Import over an existing name = %v, want it refused, naming --replace", err)
	}
	if img, err := s.Lookup("default"); err != nil || img.Key != "k1" {
		t.Errorf("after a refused import, Lookup(default) = key %q, %v; want k1", img.Key, err)
	}
	if names := dirNames(t, filepath.Join(s.Dir, "images")); !slices.Equal(names, []string{"k1"}) {
		t.Errorf("a refused import left images %q", names)
	}
	got, err := s.Import("default", second, ImportOptions{Key: "k2", Replace: true})
	if err != nil || got.NameChange != "replaced" || got.PreviousKey != "k1" {
		t.Fatalf("Import with Replace = %+v, %v; want default replaced from k1", got, err)
	}
	img, err := s.Lookup("default")
	if err != nil {
		t.Fatal(err)
	}
	if img.Key != "k2" || readFile(t, filepath.Join(img.Root, "v")) != "2" {
		t.Errorf("Lookup(default) = key %q, want k2 with v = 2", img.Key)
	}
	// The old image stays, and a re-import of its key repoints the name.
	if _, err := s.Import("default", "/nonexistent", ImportOptions{Key: "k1", Replace: true}); err != nil {
		t.Fatalf("Import of a cached key: %v", err)
	}
	if img, err := s.Lookup("default"); err != nil || img.Key != "k1" {
		t.Errorf("Lookup(default) = key %q, %v; want k1", img.Key, err)
	}
	if names := dirNames(t, filepath.Join(s.Dir, "names")); !slices.Equal(names, []string{"default"}) {
		t.Errorf("names/ holds %q, want only default", names)
	}
}

func TestStoreList(t *testing.T) {
	s := newStore(t)
	if imgs, err := s.List(); err != nil || len(imgs) != 0 {
		t.Fatalf("List of an empty store = %v, %v; want nothing", imgs, err)
	}
	for _, in := range []struct{ name, key string }{{"b", "k2"}, {"a", "k1"}, {"c", "k1"}, {"d", "k3"}} {
		if _, err := s.Import(in.name, writeArchive(t, regEntry("key", 0o644, in.key)), ImportOptions{Key: in.key}); err != nil {
			t.Fatal(err)
		}
	}
	// d moves to k2, leaving k3 without a name.
	if _, err := s.Import("d", "/nonexistent", ImportOptions{Key: "k2", Replace: true}); err != nil {
		t.Fatal(err)
	}
	// An incomplete image is not listed.
	if err := os.MkdirAll(filepath.Join(s.Dir, "images", "k0", "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}

	imgs, err := s.List()
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	want := []struct {
		key   string
		names []string
	}{{"k1", []string{"a", "c"}}, {"k2", []string{"b", "d"}}, {"k3", nil}}
	if len(imgs) != len(want) {
		t.Fatalf("List returned %d images, want %d: %+v", len(imgs), len(want), imgs)
	}
	for i, w := range want {
		img := imgs[i]
		if img.Key != w.key || !slices.Equal(img.Names, w.names) {
			t.Errorf("List[%d] = key %q names %q, want key %q names %q", i, img.Key, img.Names, w.key, w.names)
		}
		if img.Root != filepath.Join(s.Dir, "images", w.key, "rootfs") {
			t.Errorf("List[%d]: root %q", i, img.Root)
		}
		if got := readFile(t, filepath.Join(img.Root, "key")); got != w.key {
			t.Errorf("List[%d]: root holds key %q, want %q", i, got, w.key)
		}
	}
}

func TestStoreLookupNotFound(t *testing.T) {
	s := newStore(t)
	tests := []struct {
		name     string
		contains []string
	}{
		{DefaultName, []string{"make rootfs", s.Dir}},
		{"other", []string{`"other"`, "--name other", s.Dir}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.Lookup(tt.name)
			var nf *NotFoundError
			if !errors.As(err, &nf) {
				t.Fatalf("Lookup(%q) = %v, want a *NotFoundError", tt.name, err)
			}
			if nf.Name != tt.name || nf.Dir != s.Dir {
				t.Errorf("NotFoundError = %+v, want name %q dir %q", nf, tt.name, s.Dir)
			}
			for _, want := range tt.contains {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}
		})
	}
	if err := (&NotFoundError{Name: "other", Dir: "/x"}).Error(); strings.Contains(err, "make rootfs") {
		t.Errorf("error for a name other than default suggests make rootfs: %q", err)
	}
}

// TestStoreLookupDanglingName checks a name that points to a key whose
// image is gone.
func TestStoreLookupDanglingName(t *testing.T) {
	s := newStore(t)
	if _, err := s.Import("x", writeArchive(t, imageEntries...), ImportOptions{Key: "k"}); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(s.Dir, "images", "k")); err != nil {
		t.Fatal(err)
	}
	_, err := s.Lookup("x")
	if err == nil {
		t.Fatal("Lookup succeeded for a name whose image is gone")
	}
	var nf *NotFoundError
	if errors.As(err, &nf) {
		t.Errorf("Lookup = %v; the name exists, so want an error other than NotFoundError", err)
	}
}

// TestStoreLookupInvalidName checks that Lookup reads names only from
// names/, as Import writes them.
func TestStoreLookupInvalidName(t *testing.T) {
	s := newStore(t)
	if _, err := s.Import("x", writeArchive(t, imageEntries...), ImportOptions{Key: "k"}); err != nil {
		t.Fatal(err)
	}
	// A file outside names/ that holds a valid key.
	if err := os.WriteFile(filepath.Join(s.Dir, "outside"), []byte("k"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"../outside", "", "X", "."} {
		if img, err := s.Lookup(name); err == nil {
			t.Errorf("Lookup(%q) = image %q, want an error for an invalid name", name, img.Key)
		}
	}
}

func TestStoreIncompleteImage(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, dir string) // dir is images/k
	}{
		{"no image.json", func(t *testing.T, dir string) {}},
		{"corrupt image.json", func(t *testing.T, dir string) {
			if err := os.WriteFile(filepath.Join(dir, "image.json"), []byte(`{"key": "k", `), 0o644); err != nil {
				t.Fatal(err)
			}
		}},
		{"image.json of another key", func(t *testing.T, dir string) {
			if err := os.WriteFile(filepath.Join(dir, "image.json"), []byte(`{"key": "other"}`), 0o644); err != nil {
				t.Fatal(err)
			}
		}},
		{"image.json without rootfs", func(t *testing.T, dir string) {
			if err := os.WriteFile(filepath.Join(dir, "image.json"), []byte(`{"key": "k"}`), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.RemoveAll(filepath.Join(dir, "rootfs")); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newStore(t)
			dir := filepath.Join(s.Dir, "images", "k")
			if err := os.MkdirAll(filepath.Join(dir, "rootfs", "stale"), 0o755); err != nil {
				t.Fatal(err)
			}
			tt.setup(t, dir)
			if err := os.MkdirAll(filepath.Join(s.Dir, "names"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(s.Dir, "names", "x"), []byte("k"), 0o644); err != nil {
				t.Fatal(err)
			}

			if img, err := s.Lookup("x"); err == nil {
				t.Errorf("Lookup of an incomplete image = %+v, want an error", img)
			}
			if imgs, err := s.List(); err != nil || len(imgs) != 0 {
				t.Errorf("List = %+v, %v; want no images", imgs, err)
			}

			img, err := s.Import("x", writeArchive(t, imageEntries...), ImportOptions{Key: "k"})
			if err != nil {
				t.Fatalf("Import over an incomplete image: %v", err)
			}
			if _, err := os.Lstat(filepath.Join(img.Root, "stale")); err == nil {
				t.Error("the incomplete image's files survived the import")
			}
			if got := readFile(t, filepath.Join(img.Root, "etc/os-release")); got != "ID=test\n" {
				t.Errorf("etc/os-release = %q", got)
			}
			if got, err := s.Lookup("x"); err != nil || got.Key != "k" {
				t.Errorf("Lookup after re-import = %+v, %v", got, err)
			}
			if imgs, err := s.List(); err != nil || len(imgs) != 1 || imgs[0].Key != "k" {
				t.Errorf("List after re-import = %+v, %v; want image k", imgs, err)
			}
		})
	}
}

func TestStoreInvalidNames(t *testing.T) {
	archive := writeArchive(t, imageEntries...)
	bad := []string{"../x", "UPPER", "a/b", ".hidden", "-dash", "a b", "x\n", strings.Repeat("a", 65)}
	// Names may be image references, with '/' and ':', but never a path.
	badNames := []string{"../x", "UPPER", "a//b", "a/../b", "a/./b", "a/", ".hidden", "-dash", "a b", "x\n", "a\\b", strings.Repeat("a", 201), "a" + strings.Repeat(":", 100)}
	for _, name := range append(badNames, "") {
		t.Run("name "+name, func(t *testing.T) {
			s := newStore(t)
			if _, err := s.Import(name, archive, ImportOptions{Key: "k"}); err == nil {
				t.Errorf("Import(%q) succeeded, want an error", name)
			}
			if names := dirNames(t, filepath.Join(s.Dir, "images")); len(names) != 0 {
				t.Errorf("images %q after a rejected import", names)
			}
			if _, err := os.Lstat(filepath.Join(filepath.Dir(s.Dir), "x")); err == nil {
				t.Error("a name was written outside the store")
			}
		})
	}
	for _, key := range bad {
		t.Run("key "+key, func(t *testing.T) {
			s := newStore(t)
			if _, err := s.Import("x", archive, ImportOptions{Key: key}); err == nil {
				t.Errorf("Import with key %q succeeded, want an error", key)
			}
			if names := dirNames(t, filepath.Join(s.Dir, "images")); len(names) != 0 {
				t.Errorf("images %q after a rejected import", names)
			}
			if names := dirNames(t, filepath.Join(s.Dir, "names")); len(names) != 0 {
				t.Errorf("names %q after a rejected import", names)
			}
		})
	}
	// The longest valid name and key.
	s := newStore(t)
	long := strings.Repeat("a", 64)
	if _, err := s.Import(long, archive, ImportOptions{Key: long}); err != nil {
		t.Errorf("Import of a 64-character name and key: %v", err)
	}
}

func TestStoreFailedImport(t *testing.T) {
	tests := []struct {
		name    string
		archive func(t *testing.T) string
		opts    ImportOptions
	}{
		{"symlink escape", func(t *testing.T) string {
			return writeArchive(t, regEntry("ok", 0o644, "ok"), symlinkEntry("link", "../../../.."), regEntry("link/evil", 0o644, "evil"))
		}, ImportOptions{Key: "bad"}},
		{"path traversal", func(t *testing.T) string {
			return writeArchive(t, regEntry("ok", 0o644, "ok"), regEntry("../../../evil", 0o644, "evil"))
		}, ImportOptions{Key: "bad"}},
		{"path traversal without key", func(t *testing.T) string {
			return writeArchive(t, regEntry("ok", 0o644, "ok"), regEntry("../../../evil", 0o644, "evil"))
		}, ImportOptions{}},
		{"over the size limit", func(t *testing.T) string {
			return writeArchive(t, regEntry("big", 0o644, strings.Repeat("x", 1000)))
		}, ImportOptions{Key: "bad", Limits: ExtractLimits{MaxBytes: 999, MaxEntries: 10}}},
		{"read-only directory", func(t *testing.T) string {
			return writeArchive(t, dirEntry("ro", 0o555), regEntry("ro/f", 0o444, "x"), regEntry("../evil", 0o644, "evil"))
		}, ImportOptions{Key: "bad"}},
		{"truncated", func(t *testing.T) string {
			gz := gzipBytes(t, makeTar(t, regEntry("big", 0o644, strings.Repeat("0123456789", 10000))))
			return writeFile(t, "cut.tar.gz", gz[:len(gz)/2])
		}, ImportOptions{Key: "bad"}},
		{"not an archive", func(t *testing.T) string {
			return writeFile(t, "junk", []byte(strings.Repeat("junk", 1000)))
		}, ImportOptions{Key: "bad"}},
		{"missing archive", func(t *testing.T) string {
			return filepath.Join(t.TempDir(), "missing.tar.gz")
		}, ImportOptions{Key: "bad"}},
		{"mountpoint outside", func(t *testing.T) string {
			return writeArchive(t, regEntry("ok", 0o644, "ok"))
		}, ImportOptions{Key: "bad", Mountpoints: Mountpoints{Dirs: []string{"../../../../evil"}}}},
		{"mountpoint through a symlink out", func(t *testing.T) string {
			return writeArchive(t, symlinkEntry("dev", "/dev"))
		}, ImportOptions{Key: "bad", Mountpoints: Mountpoints{Dirs: []string{"/dev/evil"}}}},
		{"file mountpoint through a symlink out", func(t *testing.T) string {
			return writeArchive(t, symlinkEntry("agent", "../../../../evil"))
		}, ImportOptions{Key: "bad", Mountpoints: Mountpoints{Files: []string{"/agent"}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			top := t.TempDir()
			s := Store{Dir: filepath.Join(top, "a", "b", "cache")}
			good := writeArchive(t, regEntry("good", 0o644, "good"))
			if _, err := s.Import("x", good, ImportOptions{Key: "good"}); err != nil {
				t.Fatal(err)
			}

			if img, err := s.Import("x", tt.archive(t), tt.opts); err == nil {
				t.Fatalf("Import succeeded: %+v", img)
			}
			if names := dirNames(t, filepath.Join(s.Dir, "images")); !slices.Equal(names, []string{"good"}) {
				t.Errorf("images %q after a failed import, want only [good]", names)
			}
			if names := dirNames(t, filepath.Join(s.Dir, "staging")); len(names) != 0 {
				t.Errorf("staging holds %q after a failed import", names)
			}
			if img, err := s.Lookup("x"); err != nil || img.Key != "good" {
				t.Errorf("Lookup(x) = key %q, %v; a failed import must leave the name on the old image", img.Key, err)
			}
			for _, p := range []string{filepath.Join(top, "evil"), filepath.Join(top, "a", "evil"), filepath.Join(top, "a", "b", "evil"), "/dev/evil"} {
				if _, err := os.Lstat(p); err == nil {
					t.Errorf("%s was created", p)
				}
			}
		})
	}
}

func TestStoreProgress(t *testing.T) {
	s := newStore(t)
	// A plain archive with padding after its end, larger than Extract's
	// buffer: progress must cover the whole file, not just the entries.
	archive := writeFile(t, "image.tar", append(makeTar(t, regEntry("f", 0o644, strings.Repeat("progress ", 100000))), make([]byte, 3<<20)...))
	fi, err := os.Stat(archive)
	if err != nil {
		t.Fatal(err)
	}
	var calls int
	var last int64
	progress := func(done, total int64) {
		calls++
		if total != fi.Size() {
			t.Errorf("progress total %d, want the archive's size %d", total, fi.Size())
		}
		if done < last || done > total {
			t.Errorf("progress went from %d to %d of %d", last, done, total)
		}
		last = done
	}
	if _, err := s.Import("x", archive, ImportOptions{Key: "k", Progress: progress}); err != nil {
		t.Fatalf("Import: %v", err)
	}
	if calls == 0 {
		t.Fatal("Progress never called")
	}
	if last != fi.Size() {
		t.Errorf("progress ended at %d, want %d", last, fi.Size())
	}
}

func TestStoreConcurrentImports(t *testing.T) {
	s := newStore(t)
	archive := writeArchive(t, imageEntries...)
	names := []string{"a", "b", "c", "d"}
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = s.Import(name, archive, ImportOptions{Key: "k"})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Import %s: %v", names[i], err)
		}
	}
	imgs, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(imgs) != 1 || imgs[0].Key != "k" || !slices.Equal(imgs[0].Names, names) {
		t.Errorf("List = %+v, want image k named %q", imgs, names)
	}
	if names := dirNames(t, filepath.Join(s.Dir, "staging")); len(names) != 0 {
		t.Errorf("staging holds %q", names)
	}
}

// TestStoreImportUmask checks that an image can be read by everyone, as
// sandboxes running as other users need, whatever the importer's umask.
func TestStoreImportUmask(t *testing.T) {
	old := unix.Umask(0o077)
	defer unix.Umask(old)
	s := newStore(t)
	img, err := s.Import("x", writeArchive(t, regEntry("usr/f", 0o644, "x")), ImportOptions{
		Key:         "k",
		Mountpoints: Mountpoints{Dirs: []string{"/proc"}, Files: []string{"/agent"}},
	})
	if err != nil {
		t.Fatalf("Import: %v", err)
	}
	tests := []struct {
		path string
		want fs.FileMode
	}{
		{filepath.Join(s.Dir, "images", "k"), fs.ModeDir | 0o755},
		{img.Root, fs.ModeDir | 0o755},
		{filepath.Join(img.Root, "usr"), fs.ModeDir | 0o755},
		{filepath.Join(img.Root, "proc"), fs.ModeDir | 0o755},
		{filepath.Join(img.Root, "agent"), 0o644},
	}
	for _, tt := range tests {
		if got := lmode(t, tt.path); got != tt.want {
			t.Errorf("%s: mode %v, want %v (umask 077)", tt.path, got, tt.want)
		}
	}
}

func TestDefaultDir(t *testing.T) {
	t.Setenv("SAFE_RUN_CACHE", "/some/cache")
	if got := DefaultDir(); got != "/some/cache" {
		t.Errorf("DefaultDir() = %q, want $SAFE_RUN_CACHE", got)
	}
	if got := (Store{}).Path(); got != "/some/cache" {
		t.Errorf("Store{}.Path() = %q, want $SAFE_RUN_CACHE", got)
	}
	if got := (Store{Dir: "/elsewhere"}).Path(); got != "/elsewhere" {
		t.Errorf("Path() = %q, want /elsewhere", got)
	}
	t.Setenv("SAFE_RUN_CACHE", "")
	got := DefaultDir()
	if os.Geteuid() == 0 {
		if got != "/var/cache/safe-run" {
			t.Errorf("DefaultDir() as root = %q, want /var/cache/safe-run", got)
		}
	} else if filepath.Base(got) == "" || !strings.Contains(got, "safe-run") {
		t.Errorf("DefaultDir() = %q, want a safe-run directory", got)
	}
}
