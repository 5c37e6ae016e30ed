package rootfs

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
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
