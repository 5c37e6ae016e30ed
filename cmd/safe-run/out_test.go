package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/safe-run/safe-run/sandbox"
)

// TestWriteOutFiles writes one program-chosen name at a time into a
// directory holding what a user's directory may: files, a link to a file
// outside, a link to a directory outside, a hard link, a FIFO. Outside
// files must never change.
func TestWriteOutFiles(t *testing.T) {
	const payload = "PAYLOAD"
	cases := []struct {
		name      string
		path      string
		overwrite bool
		refused   string // part of the reason; "" means written
		host      string // the host file to read afterwards, relative to DIR
		want      string // its content afterwards
	}{
		{name: "new file", path: "plot.png", host: "plot.png", want: payload},
		{name: "new nested file", path: "a/b/c.txt", host: "a/b/c.txt", want: payload},
		{name: "into an existing directory", path: "sub/new.txt", host: "sub/new.txt", want: payload},
		{name: "dotfile", path: ".envrc", refused: "dot", host: ".envrc", want: "kept"},
		{name: "dotfile with overwrite", path: ".envrc", overwrite: true, refused: "dot", host: ".envrc", want: "kept"},
		{name: "nested dot-directory", path: ".git/config", refused: "dot", host: ".git/config", want: "kept"},
		{name: "dot-directory deeper", path: "a/.github/workflows/ci.yml", refused: "dot", host: "a/.github", want: "<absent>"},
		{name: "existing file", path: "Makefile", refused: "already exists", host: "Makefile", want: "kept"},
		{name: "existing file with overwrite", path: "Makefile", overwrite: true, host: "Makefile", want: payload},
		{name: "existing directory", path: "sub", refused: "already exists", host: "sub/keep", want: "kept"},
		{name: "existing directory with overwrite", path: "sub", overwrite: true, refused: "not a regular file", host: "sub/keep", want: "kept"},
		{name: "link to a file outside", path: "bashrc", refused: "already exists", host: "../outside/bashrc", want: "kept"},
		{name: "link to a file outside with overwrite", path: "bashrc", overwrite: true, refused: "not a regular file", host: "../outside/bashrc", want: "kept"},
		{name: "through a link to a directory outside", path: "linkdir/bashrc", refused: "not a directory", host: "../outside/bashrc", want: "kept"},
		{name: "through a link to a directory outside with overwrite", path: "linkdir/bashrc", overwrite: true, refused: "not a directory", host: "../outside/bashrc", want: "kept"},
		{name: "through a dangling link", path: "dangling/x", refused: "not a directory", host: "../outside/new/x", want: "<absent>"},
		{name: "new name through a dangling link", path: "dangling", refused: "already exists", host: "../outside/new", want: "<absent>"},
		{name: "hard link with overwrite", path: "hard", overwrite: true, host: "../outside/hardtarget", want: "kept"},
		{name: "fifo with overwrite", path: "fifo", overwrite: true, refused: "not a regular file"},
		{name: "under a file", path: "Makefile/x", refused: "not a directory", host: "Makefile", want: "kept"},
		{name: "dot-dot", path: "../outside/bashrc", refused: "plain relative", host: "../outside/bashrc", want: "kept"},
		{name: "absolute", path: "/etc/x", refused: "relative"},
		{name: "empty component", path: "a//b", refused: "plain relative"},
		{name: "escape sequence", path: "x\x1b]0;pwned\x07", refused: "control character"},
		{name: "newline", path: "a\nb", refused: "control character"},
		{name: "right-to-left override", path: "gnp.\u202etxt", refused: "control character"},
		{name: "invalid UTF-8", path: "a\xff", refused: "UTF-8"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			top := t.TempDir()
			dir, outside := filepath.Join(top, "out"), filepath.Join(top, "outside")
			for _, d := range []string{filepath.Join(dir, ".git"), filepath.Join(dir, "sub"), outside} {
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			for _, f := range []string{".envrc", ".git/config", "Makefile", "sub/keep", "../outside/bashrc", "../outside/hardtarget"} {
				if err := os.WriteFile(filepath.Join(dir, f), []byte("kept"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			links := map[string]string{"bashrc": filepath.Join(outside, "bashrc"), "linkdir": outside, "dangling": filepath.Join(outside, "new")}
			for name, target := range links {
				if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.Link(filepath.Join(outside, "hardtarget"), filepath.Join(dir, "hard")); err != nil {
				t.Fatal(err)
			}
			if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644); err != nil {
				t.Fatal(err)
			}

			files := []sandbox.OutputFile{{Path: tc.path, Size: int64(len(payload)), Data: []byte(payload)}}
			refused, err := writeOutFiles(dir, files, outOptions{overwrite: tc.overwrite})
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case tc.refused == "" && len(refused) > 0:
				t.Errorf("refused: %q %v", refused[0].reason, refused[0].err)
			case tc.refused != "" && len(refused) == 0:
				t.Errorf("written; want refused (%s)", tc.refused)
			case tc.refused != "" && (refused[0].err != nil || !strings.Contains(refused[0].reason, tc.refused)):
				t.Errorf("refused with %q (%v), want a reason naming %q", refused[0].reason, refused[0].err, tc.refused)
			}
			if tc.host != "" {
				got := "<absent>"
				if data, err := os.ReadFile(filepath.Join(dir, tc.host)); err == nil {
					got = string(data)
				} else if !os.IsNotExist(err) {
					got = err.Error()
				}
				if got != tc.want {
					t.Errorf("%s holds %q, want %q", tc.host, got, tc.want)
				}
			}
			for name, target := range links {
				if got, err := os.Readlink(filepath.Join(dir, name)); err != nil || got != target {
					t.Errorf("link %s changed: %q %v", name, got, err)
				}
			}
			entries, _ := os.ReadDir(dir)
			for _, e := range entries {
				if strings.HasPrefix(e.Name(), ".safe-run-out-") {
					t.Errorf("temporary file %s left", e.Name())
				}
			}
		})
	}
}

// TestSaveFilesReportsRefusals checks that a refused file is marked in the
// result's files (what --json prints) and the others are still written.
func TestSaveFilesReportsRefusals(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "Makefile"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	files := []sandbox.OutputFile{
		{Path: ".envrc", Data: []byte("x")},
		{Path: "Makefile", Data: []byte("x")},
		{Path: "result.csv", Data: []byte("1,2\n")},
		{Path: "link", Skipped: "symbolic link (not followed)"},
	}
	if err := saveFiles(dir, files, outOptions{}); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{".envrc": "not saved: names beginning with a dot", "Makefile": "not saved: it already exists", "result.csv": "", "link": "symbolic link"}
	for _, f := range files {
		if w := want[f.Path]; w == "" && f.Skipped != "" || !strings.HasPrefix(f.Skipped, w) {
			t.Errorf("%s: skipped %q, want %q…", f.Path, f.Skipped, w)
		}
	}
	if data, err := os.ReadFile(filepath.Join(dir, "result.csv")); err != nil || string(data) != "1,2\n" {
		t.Errorf("result.csv: %q %v", data, err)
	}
}

// TestCheckOutDir refuses, before any run, a DIR in or at the root of a
// version-control checkout.
func TestCheckOutDir(t *testing.T) {
	top := t.TempDir()
	repo, worktree, plain := filepath.Join(top, "repo"), filepath.Join(top, "worktree"), filepath.Join(top, "plain")
	for _, d := range []string{filepath.Join(repo, ".git", "hooks"), filepath.Join(repo, "results"), worktree, plain, filepath.Join(top, "hg", ".hg")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(worktree, ".git"), []byte("gitdir: /elsewhere\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(repo, filepath.Join(top, "repolink")); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		dir      string
		allowVCS bool
		refused  string
	}{
		{dir: plain},
		{dir: filepath.Join(plain, "new", "dir")},
		{dir: filepath.Join(repo, "results")},
		{dir: filepath.Join(repo, "results", "new")},
		{dir: repo, refused: "root of a version-control checkout"},
		{dir: repo + "/.", refused: "root of a version-control checkout"},
		{dir: filepath.Join(top, "repolink"), refused: "root of a version-control checkout"},
		{dir: worktree, refused: "has .git"},
		{dir: filepath.Join(top, "hg"), refused: "has .hg"},
		{dir: repo, allowVCS: true},
		{dir: filepath.Join(repo, ".git"), allowVCS: true, refused: "inside .git"},
		{dir: filepath.Join(repo, ".git", "hooks"), refused: "inside .git"},
		{dir: filepath.Join(top, "repolink", ".git", "new"), allowVCS: true, refused: "inside .git"},
	}
	for _, tc := range cases {
		err := checkOutDir(tc.dir, outOptions{allowVCS: tc.allowVCS})
		switch {
		case tc.refused == "" && err != nil:
			t.Errorf("%s (allow-vcs %v): %v", tc.dir, tc.allowVCS, err)
		case tc.refused != "" && (err == nil || !strings.Contains(err.Error(), tc.refused)):
			t.Errorf("%s (allow-vcs %v): %v, want refused naming %q", tc.dir, tc.allowVCS, err, tc.refused)
		}
	}
	// Relative to the working directory, as `--out .` is given.
	t.Chdir(repo)
	if err := checkOutDir(".", outOptions{}); err == nil {
		t.Errorf("--out . in a checkout was not refused")
	}
}

// endStdout ends a pipe's output for its reader and leaves later writes
// harmless; a regular file is left as it is.
func TestEndStdout(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if _, err := w.WriteString("result\n"); err != nil {
		t.Fatal(err)
	}
	endStdout(w)
	if _, err := w.WriteString("after\n"); err != nil {
		t.Errorf("a write after the end: %v", err)
	}
	// ReadAll returns nil only at EOF, when no write end is left.
	_ = r.SetReadDeadline(time.Now().Add(5 * time.Second))
	data, err := io.ReadAll(r)
	if err != nil || string(data) != "result\n" {
		t.Errorf("the reader got %q, %v; want the result, then EOF", data, err)
	}

	f, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	endStdout(f)
	if _, err := f.WriteString("kept\n"); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(f.Name()); string(data) != "kept\n" {
		t.Errorf("a file given to endStdout holds %q, want what was written to it", data)
	}
}
