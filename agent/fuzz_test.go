//go:build linux

package agent

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// secret is the content of the file outside the workspace that no
// operation may reveal or change.
const secret = "SECRET-outside-the-workspace"

// fuzzWorkspace builds base/ws, the workspace, and base/outside, which
// holds the secret. The workspace holds what a hostile program could have
// left there: links out of it (relative and absolute, to the directory and
// to the file), a link loop back into it, and ordinary files. An existing
// workspace is replaced.
func fuzzWorkspace(t testing.TB, base string) (ws string) {
	t.Helper()
	ws = filepath.Join(base, "ws")
	outside := filepath.Join(base, "outside")
	if err := os.RemoveAll(ws); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{ws, outside, filepath.Join(ws, "sub"), filepath.Join(ws, "out")} {
		if err := os.Mkdir(d, 0o755); err != nil && !os.IsExist(err) {
			t.Fatal(err)
		}
	}
	files := map[string]string{filepath.Join(outside, "secret"): secret, filepath.Join(ws, "sub", "f.txt"): "inside", filepath.Join(ws, "out", "result.txt"): "result"}
	for name, content := range files {
		if err := os.WriteFile(name, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	links := map[string]string{
		"up": "../outside", "abs": outside, "leak": filepath.Join(outside, "secret"),
		"sub/loop": "..", "out/leak": "../../outside/secret", "out/dir": "../../outside",
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(ws, name)); err != nil {
			t.Fatal(err)
		}
	}
	return ws
}

// outsideState lists everything below base except the workspace, with the
// content of regular files.
func outsideState(t testing.TB, base, ws string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == ws {
			return fs.SkipDir
		}
		b.WriteString(p + " " + d.Type().String() + "\n")
		if d.Type().IsRegular() {
			data, _ := os.ReadFile(p)
			b.Write(data)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// resolvesInside reports whether name, relative to ws, resolves (through
// any links) to ws itself or below it.
func resolvesInside(ws, name string) bool {
	real, err := filepath.EvalSymlinks(filepath.Join(ws, name))
	if err != nil {
		return false
	}
	wsReal, _ := filepath.EvalSymlinks(ws)
	return real == wsReal || strings.HasPrefix(real, wsReal+"/")
}

// FuzzWorkspacePaths sends the agent's file operations — write, read,
// list, the output directory's creation and collection — a path chosen by
// the fuzzer, in a workspace full of links out of it. Whatever the path,
// nothing outside the workspace is created, changed or revealed, and a
// written file is where its path says, inside the workspace.
func FuzzWorkspacePaths(f *testing.F) {
	// One fixture per fuzzing process, made afresh after each operation
	// that may change the workspace; what lies outside must never change.
	base := f.TempDir()
	ws := fuzzWorkspace(f, base)
	before := outsideState(f, base, ws)
	f.Fuzz(func(t *testing.T, op uint8, name string, data []byte) {
		if op%5 == 0 || op%5 == 3 {
			defer fuzzWorkspace(t, base)
		}
		s := &server{cfg: Config{Workdir: ws}}
		var exit *Exit
		switch op % 5 {
		case 0:
			exit = s.handle(&Request{Op: OpWrite, Files: []File{{Path: name, Data: data}}})
			if exit.Error == "" {
				clean := filepath.Clean(name)
				got, err := os.ReadFile(filepath.Join(ws, clean))
				if !resolvesInside(ws, clean) || err != nil || !bytes.Equal(got, data) {
					t.Fatalf("wrote %q, but %s does not hold the data inside the workspace (%v)", name, clean, err)
				}
			}
		case 1:
			exit = s.handle(&Request{Op: OpRead, Path: name, MaxBytes: 1 << 20})
		case 2:
			exit = s.handle(&Request{Op: OpList, Path: name, MaxFiles: 100})
			for _, file := range exit.Files {
				if !resolvesInside(ws, filepath.Dir(file.Path)) {
					t.Fatalf("listing %q showed %q, outside the workspace", name, file.Path)
				}
			}
		case 3:
			// An entry already there, such as a link the program made, is
			// left alone (and collect will not follow it); a directory
			// made is inside the workspace.
			if err := makeDir(ws, name, nil); err == nil {
				fi, err := os.Lstat(filepath.Join(ws, filepath.Clean(name)))
				if err != nil || fi.IsDir() && !resolvesInside(ws, filepath.Clean(name)) {
					t.Fatalf("created the output directory %q outside the workspace (%v)", name, err)
				}
			}
			exit = &Exit{}
		case 4:
			exit = &Exit{Files: collect(ws, &Collect{Dir: filepath.Clean(name), MaxFiles: 16, MaxFileBytes: 1 << 20, MaxTotalBytes: 1 << 20}, nil)}
		}
		for _, file := range exit.Files {
			if bytes.Contains(file.Data, []byte(secret)) {
				t.Fatalf("op %d on %q returned the secret from outside the workspace as %q", op%5, name, file.Path)
			}
		}
		if after := outsideState(t, base, ws); after != before {
			t.Fatalf("op %d on %q changed what lies outside the workspace:\n%s\nwas\n%s", op%5, name, after, before)
		}
	})
}
