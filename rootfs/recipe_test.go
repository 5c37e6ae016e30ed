package rootfs

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestDefaultKey checks that the binary's key of the recipe is the one the
// script computes of itself, which `make rootfs` and existing caches use.
func TestDefaultKey(t *testing.T) {
	out, err := exec.Command("bash", "build-rootfs.sh", "--key").Output()
	if err != nil {
		t.Fatalf("build-rootfs.sh --key: %v", err)
	}
	if got, want := DefaultKey(), strings.TrimSpace(string(out)); got != want {
		t.Errorf("DefaultKey() = %q, the script says %q", got, want)
	}
	data, err := os.ReadFile("build-rootfs.sh")
	if err != nil || !bytes.Equal(data, defaultRecipe) {
		t.Errorf("the embedded recipe differs from build-rootfs.sh (%v)", err)
	}
}

// TestBuildDefaultReusesArchive checks the build path without running
// debootstrap: with the recipe's archive already in archives/, BuildDefault
// imports it under the recipe's key, and then finds the image current.
func TestBuildDefaultReusesArchive(t *testing.T) {
	s := newStore(t)
	archive := filepath.Join(s.Dir, "archives", "default-"+DefaultKey()+".tar.gz")
	if err := os.MkdirAll(filepath.Dir(archive), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(archive, gzipBytes(t, makeTar(t, imageEntries...)), 0o644); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	img, built, err := s.BuildDefault(context.Background(), ImportOptions{}, &log)
	if err != nil || !built || img.Key != DefaultKey() {
		t.Fatalf("BuildDefault = %+v, built %v, %v", img, built, err)
	}
	if !strings.Contains(log.String(), "reusing archive") {
		t.Errorf("log %q does not say the archive was reused", log.String())
	}
	if _, built, err := s.BuildDefault(context.Background(), ImportOptions{}, &log); err != nil || built {
		t.Errorf("second BuildDefault: built %v, %v; want it current", built, err)
	}
	// A damaged image is rebuilt, not used.
	if err := os.Remove(filepath.Join(s.Dir, "images", DefaultKey(), "image.json")); err != nil {
		t.Fatal(err)
	}
	if _, built, err := s.BuildDefault(context.Background(), ImportOptions{}, &log); err != nil || !built {
		t.Errorf("BuildDefault over an incomplete image: built %v, %v; want a rebuild", built, err)
	}
	if _, err := s.Lookup(DefaultName); err != nil {
		t.Errorf("Lookup after the rebuild: %v", err)
	}
}

// TestSettleTree checks that a root built in place keeps only what an
// extraction lets through from an archive, counted as Extract counts it.
func TestSettleTree(t *testing.T) {
	root := t.TempDir()
	write := func(name string, mode os.FileMode, data string) {
		t.Helper()
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	write("usr/bin/su", 0o755|os.ModeSetuid, "12345")
	write("usr/bin/wall", 0o755|os.ModeSetgid, "1234")
	write("etc/odd", 0o644|os.ModeSticky, "12")
	write("etc/plain", 0o644, "123")
	if err := os.Link(filepath.Join(root, "etc/plain"), filepath.Join(root, "etc/plain.link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, "tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(root, "tmp"), 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/plain", filepath.Join(root, "etc/abs")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(root, "tmp/fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	xattrs := unix.Setxattr(filepath.Join(root, "etc/plain"), "user.note", []byte("x"), 0) == nil
	if !xattrs {
		t.Log("this file system takes no user.* attributes; the attribute check does not apply")
	}

	stats, err := settleTree(context.Background(), root, ExtractLimits{})
	if err != nil {
		t.Fatal(err)
	}
	// usr usr/bin su wall etc odd plain plain.link abs tmp: 10 entries;
	// the fifo skipped; the two hard-linked names count their bytes once.
	want := ExtractStats{Entries: 10, Bytes: 5 + 4 + 2 + 3, Skipped: 1, Stripped: 3}
	if stats != want {
		t.Errorf("stats %+v, want %+v", stats, want)
	}
	modes := map[string]os.FileMode{"usr/bin/su": 0o755, "usr/bin/wall": 0o755, "etc/odd": 0o644,
		"etc/plain": 0o644, "tmp": 0o777 | os.ModeSticky | os.ModeDir}
	for name, want := range modes {
		fi, err := os.Lstat(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v", name, fi.Mode(), want)
		}
	}
	if _, err := os.Lstat(filepath.Join(root, "tmp/fifo")); !os.IsNotExist(err) {
		t.Errorf("the fifo is still there (%v)", err)
	}
	if n, err := unix.Llistxattr(filepath.Join(root, "etc/plain"), nil); xattrs && (err != nil || n != 0) {
		t.Errorf("etc/plain keeps %d bytes of attribute names (%v)", n, err)
	}

	// Limits hold as they do for an archive.
	if _, err := settleTree(context.Background(), root, ExtractLimits{MaxEntries: 5}); err == nil || !strings.Contains(err.Error(), "more than 5 entries") {
		t.Errorf("MaxEntries 5: %v", err)
	}
	if _, err := settleTree(context.Background(), root, ExtractLimits{MaxBytes: 10}); err == nil || !strings.Contains(err.Error(), "more than 10 bytes") {
		t.Errorf("MaxBytes 10: %v", err)
	}
}

// TestBuildDefaultInPlace checks root's build: the recipe builds in the
// store's staging directory, the tree is settled and installed under the
// recipe's key with no archive written, and a failed build leaves nothing.
func TestBuildDefaultInPlace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the recipe builds in place only as root; other users build an archive (TestBuildDefaultReusesArchive)")
	}
	s := newStore(t)
	saved := recipeScript
	t.Cleanup(func() { recipeScript = saved })
	recipeScript = []byte(`set -e
[ "$1" = --root ] && [ -d "$2" ]
mkdir -p "$2/usr/bin" "$2/etc"
echo hi >"$2/etc/motd"
printf 12345 >"$2/usr/bin/su"
chmod 4755 "$2/usr/bin/su"
mkfifo "$2/etc/fifo"
echo built
`)
	var log bytes.Buffer
	opts := ImportOptions{Mountpoints: Mountpoints{Dirs: []string{"/proc"}}}
	img, built, err := s.BuildDefault(context.Background(), opts, &log)
	if err != nil || !built || img.Key != DefaultKey() {
		t.Fatalf("BuildDefault = %+v, built %v, %v (log %q)", img, built, err, log.String())
	}
	// usr usr/bin usr/bin/su etc etc/motd; the fifo skipped, su's setuid bit stripped.
	if want := (ExtractStats{Entries: 5, Bytes: 8, Skipped: 1, Stripped: 1}); img.Stats != want {
		t.Errorf("stats %+v, want %+v", img.Stats, want)
	}
	if !strings.Contains(log.String(), "built") || !strings.Contains(img.Source, "built in place") {
		t.Errorf("log %q, source %q", log.String(), img.Source)
	}
	found, err := s.Lookup(DefaultName)
	if err != nil || found.Key != DefaultKey() {
		t.Fatalf("Lookup = %+v, %v", found, err)
	}
	for name, want := range map[string]os.FileMode{"usr/bin/su": 0o755, "etc/motd": 0o644, "proc": os.ModeDir | 0o755} {
		fi, err := os.Lstat(filepath.Join(found.Root, name))
		if err != nil || fi.Mode() != want {
			t.Errorf("%s: %v, %v; want mode %v", name, fi, err, want)
		}
	}
	if _, err := os.Lstat(filepath.Join(found.Root, "etc/fifo")); !os.IsNotExist(err) {
		t.Errorf("the fifo is in the image (%v)", err)
	}
	if entries, _ := os.ReadDir(filepath.Join(s.Dir, "archives")); len(entries) != 0 {
		t.Errorf("archives/ holds %d files; an in-place build writes none", len(entries))
	}

	// A recipe that fails leaves no image and nothing in staging/.
	if err := os.Remove(filepath.Join(s.Dir, "images", DefaultKey(), "image.json")); err != nil {
		t.Fatal(err)
	}
	recipeScript = []byte("mkdir -p \"$2/half\"; exit 3\n")
	if _, _, err := s.BuildDefault(context.Background(), opts, &log); err == nil || !strings.Contains(err.Error(), "the recipe failed") {
		t.Errorf("BuildDefault with a failing recipe: %v", err)
	}
	if entries, _ := os.ReadDir(filepath.Join(s.Dir, "staging")); len(entries) != 0 {
		t.Errorf("staging/ keeps %d entries after a failed build", len(entries))
	}
	if _, err := s.Lookup(DefaultName); err == nil {
		t.Error("Lookup found the default image after its rebuild failed")
	}

	// A recipe that leaves a mount in the tree: the tree is refused, the
	// mount detached and the tree removed.
	recipeScript = []byte("mkdir -p \"$2/proc\" && mount -t tmpfs none \"$2/proc\" && echo x >\"$2/proc/x\"\n")
	if _, _, err := s.BuildDefault(context.Background(), opts, &log); err == nil || !strings.Contains(err.Error(), "a file system is mounted there") {
		t.Errorf("BuildDefault with a mount left in the tree: %v", err)
	}
	if entries, _ := os.ReadDir(filepath.Join(s.Dir, "staging")); len(entries) != 0 {
		t.Errorf("staging/ keeps %d entries after a refused build", len(entries))
	}
	if mounts, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mounts), s.Dir) {
		t.Errorf("a mount below the store is left:\n%s", mounts)
	}
}
