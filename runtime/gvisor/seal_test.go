package gvisor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/safe-run/safe-run/runtime/engine"
	"github.com/safe-run/safe-run/sandbox"
)

// TestCheckpointSeal checks that a sealed image verifies, and that every
// change to it — a byte of a file, a file added or removed, a link, a
// seal made with another key, no seal at all — is refused, including
// after a check that passed left its shortcut behind.
func TestCheckpointSeal(t *testing.T) {
	key := []byte(strings.Repeat("k", sealKeySize))
	image := func(t *testing.T) string {
		dir := t.TempDir()
		for name, data := range map[string]string{"checkpoint.img": "kernel state", "pages.img": strings.Repeat("p", 1<<16), checkpointDone: "{}"} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if err := sealCheckpoint(dir, key); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	for _, tc := range []struct {
		name   string
		change func(dir string) error
		want   string // substring of the error; "" means it verifies
	}{
		{"unchanged", func(string) error { return nil }, ""},
		{"a byte of the pages changed", func(dir string) error {
			f, err := os.OpenFile(filepath.Join(dir, "pages.img"), os.O_WRONLY, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = f.WriteAt([]byte("q"), 4096)
			return err
		}, "does not match its seal"},
		{"a file added", func(dir string) error { return os.WriteFile(filepath.Join(dir, "extra.img"), nil, 0o600) }, "does not match its seal"},
		{"a file removed", func(dir string) error { return os.Remove(filepath.Join(dir, "checkpoint.img")) }, "does not match its seal"},
		{"a file replaced by a link", func(dir string) error {
			p := filepath.Join(dir, "checkpoint.img")
			if err := os.Rename(p, p+".real"); err != nil {
				return err
			}
			return os.Symlink("checkpoint.img.real", p)
		}, "checkpoint.img"},
		{"sealed with another key", func(dir string) error {
			return sealCheckpoint(dir, []byte(strings.Repeat("x", sealKeySize)))
		}, "does not match its seal"},
		{"no seal", func(dir string) error { return os.Remove(filepath.Join(dir, checkpointSeal)) }, "has no seal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := image(t)
			// A check before the change leaves the shortcut for the files
			// as they were; it must not cover them once they change.
			if err := verifyCheckpoint(dir, key); err != nil {
				t.Fatalf("a fresh image: %v", err)
			}
			if err := tc.change(dir); err != nil {
				t.Fatal(err)
			}
			err := verifyCheckpoint(dir, key)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("verifyCheckpoint = %v, want it to pass", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("verifyCheckpoint = %v, want an error about %q", err, tc.want)
			}
		})
	}
}

// TestSealKey checks that the key is made once, private, and read again;
// and that a key others could read or that has the wrong size is refused.
func TestSealKey(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state", "checkpoint.key")
	k1, err := makeSealKey(path)
	if err != nil {
		t.Fatal(err)
	}
	k2, err := readSealKey(path)
	if err != nil || string(k1) != string(k2) || len(k1) != sealKeySize {
		t.Fatalf("read back %x, %v; want the %d bytes made, %x", k2, err, sealKeySize, k1)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v, %v; want mode 0600", fi.Mode(), err)
	}
	if k3, err := makeSealKey(path); err != nil || string(k3) != string(k1) {
		t.Fatalf("a second safe-run making the key got %x, %v; want the first one's", k3, err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readSealKey(path); err == nil || !strings.Contains(err.Error(), "private") {
		t.Errorf("a key others may read: %v, want it refused", err)
	}
	short := filepath.Join(dir, "short.key")
	if err := os.WriteFile(short, []byte("abc"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readSealKey(short); err == nil || !strings.Contains(err.Error(), "32 bytes") {
		t.Errorf("a 3-byte key: %v, want it refused", err)
	}
}

// TestTamperedCheckpointIsRebuilt edits the pages of a real checkpoint
// image so that numpy reports another version, as an attacker who can
// write the cache would, and checks that the next runtime's pool refuses
// the image instead of restoring it: the run reports the real version,
// and the image is rebuilt.
func TestTamperedCheckpointIsRebuilt(t *testing.T) {
	ckpt := filepath.Join(t.TempDir(), "checkpoints")
	newRT := func() *testRuntime {
		return newTestRuntimeWith(t, func(cfg *testConfig) {
			cfg.Engine.Pool = engine.PoolConfig{Size: map[string]int{"python": 1}}
			cfg.CheckpointDir = ckpt
		})
	}
	version := func(rt *testRuntime) string {
		waitPooled(t, rt, "python")
		res := mustRun(t, rt, sandbox.Job{Language: "python", Code: "import numpy\nprint(numpy.__version__)"})
		wantStatus(t, res, sandbox.StatusOK)
		return strings.TrimSpace(res.Stdout)
	}
	rt := newRT()
	real := version(rt)
	rt.Close()
	pages, _ := filepath.Glob(filepath.Join(ckpt, "python-*", "pages.img"))
	if len(pages) != 1 || real == "" {
		t.Fatalf("checkpoint pages %v, numpy %q: want one image and a version", pages, real)
	}
	data, err := os.ReadFile(pages[0])
	if err != nil {
		t.Fatal(err)
	}
	fake := strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' {
			return '9'
		}
		return r
	}, real)
	if n := strings.Count(string(data), real); n == 0 || fake == real {
		t.Fatalf("numpy's version %q is not in the checkpoint's pages (or cannot be faked): nothing to tamper with", real)
	}
	if err := os.WriteFile(pages[0], []byte(strings.ReplaceAll(string(data), real, fake)), 0o600); err != nil {
		t.Fatal(err)
	}

	rt = newRT()
	if got := version(rt); got != real {
		t.Fatalf("after the checkpoint's pages were edited a run reports numpy %q, want the real %q", got, real)
	}
	waitPooled(t, rt, "python") // the refill after the run restores the rebuilt image
	data, err = os.ReadFile(pages[0])
	if err != nil || strings.Contains(string(data), fake) || !strings.Contains(string(data), real) {
		t.Errorf("the edited image was not rebuilt (%v)", err)
	}
	key, err := sealKey(checkpointKeyPath(rt.cfg.StateDir))
	if err != nil {
		t.Fatal(err)
	}
	if err := verifyCheckpoint(filepath.Dir(pages[0]), key); err != nil {
		t.Errorf("the rebuilt image: %v", err)
	}
}

// BenchmarkVerifyCheckpoint compares a full check of a checkpoint-sized
// image (60 MiB of pages) with the shortcut a check leaves behind.
func BenchmarkVerifyCheckpoint(b *testing.B) {
	dir := b.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "pages.img"), make([]byte, 60<<20), 0o600); err != nil {
		b.Fatal(err)
	}
	key := make([]byte, sealKeySize)
	if err := sealCheckpoint(dir, key); err != nil {
		b.Fatal(err)
	}
	b.Run("full", func(b *testing.B) {
		for b.Loop() {
			os.Remove(filepath.Join(dir, checkpointVerified))
			if err := verifyCheckpoint(dir, key); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("shortcut", func(b *testing.B) {
		for b.Loop() {
			if err := verifyCheckpoint(dir, key); err != nil {
				b.Fatal(err)
			}
		}
	})
}
