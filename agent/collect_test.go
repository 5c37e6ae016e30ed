package agent

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestCollect(t *testing.T) {
	work := t.TempDir()
	out := filepath.Join(work, "out")
	secret := filepath.Join(t.TempDir(), "secret")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(secret, []byte("host secret"), 0o600))
	must(os.MkdirAll(filepath.Join(out, "sub"), 0o755))
	must(os.WriteFile(filepath.Join(out, "a.txt"), []byte("alpha"), 0o644))
	must(os.WriteFile(filepath.Join(out, "sub", "b.txt"), []byte("beta"), 0o644))
	must(os.WriteFile(filepath.Join(out, "big.bin"), make([]byte, 100), 0o644))
	must(os.Symlink(secret, filepath.Join(out, "link")))
	must(os.Symlink(filepath.Dir(secret), filepath.Join(out, "dirlink")))
	must(syscall.Mkfifo(filepath.Join(out, "fifo"), 0o644))

	got := collect(work, &Collect{Dir: "out", MaxFiles: 10, MaxFileBytes: 50, MaxTotalBytes: 1000}, nil)
	want := map[string]string{ // path → data, or "skip:" + reason fragment
		"a.txt":     "alpha",
		"big.bin":   "skip:per-file limit",
		"dirlink":   "skip:symbolic link",
		"fifo":      "skip:not a regular file",
		"link":      "skip:symbolic link",
		"sub/b.txt": "beta",
	}
	if len(got) != len(want) {
		t.Fatalf("collected %d files, want %d: %+v", len(got), len(want), got)
	}
	for _, f := range got {
		w, ok := want[f.Path]
		switch {
		case !ok:
			t.Errorf("unexpected file %q", f.Path)
		case strings.HasPrefix(w, "skip:"):
			if f.Data != nil || !strings.Contains(f.Skipped, strings.TrimPrefix(w, "skip:")) {
				t.Errorf("%s: data %q, skipped %q; want no data, skipped for %q", f.Path, f.Data, f.Skipped, w)
			}
		case string(f.Data) != w || f.Skipped != "" || f.Size != int64(len(w)):
			t.Errorf("%s: data %q size %d skipped %q; want %q", f.Path, f.Data, f.Size, f.Skipped, w)
		}
		if strings.Contains(string(f.Data), "host secret") {
			t.Errorf("%s: a link was followed to a file outside the workspace", f.Path)
		}
	}
}

func TestCollectBounds(t *testing.T) {
	work := t.TempDir()
	out := filepath.Join(work, "out")
	os.MkdirAll(out, 0o755)
	for _, name := range []string{"1", "2", "3", "4"} {
		os.WriteFile(filepath.Join(out, name), []byte("0123456789"), 0o644)
	}
	t.Run("file count", func(t *testing.T) {
		if got := collect(work, &Collect{Dir: "out", MaxFiles: 2, MaxFileBytes: 100, MaxTotalBytes: 100}, nil); len(got) != 2 {
			t.Errorf("collected %d files, want 2", len(got))
		}
	})
	t.Run("total bytes", func(t *testing.T) {
		got := collect(work, &Collect{Dir: "out", MaxFiles: 10, MaxFileBytes: 100, MaxTotalBytes: 25}, nil)
		var data, skipped int
		for _, f := range got {
			if f.Data != nil {
				data++
			} else if strings.Contains(f.Skipped, "total") {
				skipped++
			}
		}
		if data != 2 || skipped != 2 {
			t.Errorf("%d returned and %d skipped for the total; want 2 and 2: %+v", data, skipped, got)
		}
	})
	t.Run("missing or linked directory", func(t *testing.T) {
		if got := collect(work, &Collect{Dir: "nothing", MaxFiles: 10, MaxFileBytes: 100, MaxTotalBytes: 100}, nil); got != nil {
			t.Errorf("collected %+v from a missing directory", got)
		}
		os.Symlink(out, filepath.Join(work, "linked"))
		if got := collect(work, &Collect{Dir: "linked", MaxFiles: 10, MaxFileBytes: 100, MaxTotalBytes: 100}, nil); got != nil {
			t.Errorf("followed a linked output directory: %+v", got)
		}
	})
}
