//go:build linux

package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFileToolsRefuseLinksOnTheWay: a directory on the way to a path that
// is a symbolic link — to a place inside the workspace or out of it — is
// refused by every file operation, not followed.
func TestFileToolsRefuseLinksOnTheWay(t *testing.T) {
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o600)
	ws := t.TempDir()
	os.Mkdir(filepath.Join(ws, "real"), 0o755)
	os.WriteFile(filepath.Join(ws, "real", "f"), []byte("f"), 0o644)
	os.Symlink("real", filepath.Join(ws, "inside"))
	os.Symlink(outside, filepath.Join(ws, "outside"))
	for _, p := range []string{"inside/f", "outside/secret", "real/../inside/f"} {
		t.Run(p, func(t *testing.T) {
			if exit := readFile(ws, filepath.Clean(p), 1<<20, nil); exit.Error == "" || !strings.Contains(exit.Error, "symbolic link") {
				t.Errorf("readFile: %+v", exit)
			}
			if exit := listFiles(ws, filepath.Dir(filepath.Clean(p)), 100, nil); exit.Error == "" {
				t.Errorf("listFiles %s: %+v", filepath.Dir(p), exit)
			}
			if err := writeFiles(ws, []File{{Path: filepath.Clean(p), Data: []byte("x")}}, nil); err == nil || !strings.Contains(err.Error(), "symbolic link") {
				t.Errorf("writeFiles: %v", err)
			}
			if err := makeDir(ws, filepath.Clean(p), nil); err == nil {
				t.Errorf("makeDir: created below a link")
			}
		})
	}
	if data, _ := os.ReadFile(filepath.Join(outside, "secret")); string(data) != "secret" {
		t.Errorf("the file outside changed: %q", data)
	}
	if data, _ := os.ReadFile(filepath.Join(ws, "real", "f")); string(data) != "f" {
		t.Errorf("the file behind the inner link changed: %q", data)
	}
	// Real directories still work.
	if exit := readFile(ws, "real/f", 1<<20, nil); exit.Error != "" || string(exit.Files[0].Data) != "f" {
		t.Errorf("readFile real/f: %+v", exit)
	}
	if err := writeFiles(ws, []File{{Path: "real/new/g", Data: []byte("g")}}, nil); err != nil {
		t.Errorf("writeFiles real/new/g: %v", err)
	}
}
