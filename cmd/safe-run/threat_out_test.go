package main

// Threat cases of `safe-run run --out DIR`: the program chooses the names
// and contents of the files written on the host. A name that makes the
// host run something (.git/config's core.fsmonitor runs on the next
// `git status`; .envrc under direnv; a replaced Makefile or CI workflow)
// must not be written, nor a file written through a link already in DIR.
// CLI only: the MCP tools return files to the client, writing nothing on
// the host.

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/safe-run/safe-run/sandbox"
)

// outProbe writes, from the sandbox, every file that would make the host
// run hostCmd, plus notes.txt (a link to the canary in DIR) and result.txt,
// the program's ordinary output.
func outProbe(hostCmd string) string {
	return `set -e
mkdir -p out/.git out/.github/workflows
printf '[core]\n\tfsmonitor = ` + hostCmd + `\n' > out/.git/config
echo '` + hostCmd + `' > out/.envrc
printf 'all:\n\t` + hostCmd + `\n' > out/Makefile
printf 'on: push\njobs: {x: {runs-on: self-hosted, steps: [{run: "` + hostCmd + `"}]}}\n' > out/.github/workflows/ci.yml
echo overwritten > out/notes.txt
echo result > out/result.txt
echo PROBE-RAN`
}

// outFiles is what --out DIR holds: every regular file and link below it,
// with its content or link target.
func outFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	got := map[string]string{}
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if fi.Mode()&os.ModeSymlink != 0 {
			target, _ := os.Readlink(p)
			got[rel] = "-> " + target
			return nil
		}
		data, err := os.ReadFile(p)
		got[rel] = string(data)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// gitStatusRuns reports whether `git status` in repo runs the fsmonitor
// command that creates marker.
func gitStatusRuns(t *testing.T, repo, marker string) bool {
	t.Helper()
	cmd := exec.Command("git", "-C", repo, "status", "--short")
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null")
	out, err := cmd.CombinedOutput()
	t.Logf("git status: %v %s", err, out)
	_, serr := os.Lstat(marker)
	return serr == nil
}

func newGitRepo(t *testing.T, dir string) {
	t.Helper()
	for _, args := range [][]string{{"init", "-q", dir}, {"-C", dir, "config", "user.email", "t@example.invalid"}} {
		if out, err := exec.Command("git", args...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "Makefile"), []byte("all:\n\t@echo original\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestThreatOutDir(t *testing.T) {
	h := newThreatHarness(t)
	const makefile, envrc = "all:\n\t@echo original\n", "original\n"

	// A directory of the user's with files of its own and a link to the
	// canary: nothing there is replaced, written through, or dot-named.
	prepare := func(t *testing.T) (dir, marker string) {
		dir = filepath.Join(t.TempDir(), "project")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, data := range map[string]string{"Makefile": makefile, ".envrc": envrc} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Symlink(h.canaryFile, filepath.Join(dir, "notes.txt")); err != nil {
			t.Fatal(err)
		}
		return dir, filepath.Join(filepath.Dir(dir), "RAN")
	}
	for _, tc := range []struct {
		name      string
		args      []string
		makefile  string            // Makefile afterwards
		notSaved  map[string]string // path in files → part of its reason
		overwrite bool
	}{
		{name: "default", makefile: makefile, notSaved: map[string]string{
			".git/config": "dot", ".envrc": "dot", ".github/workflows/ci.yml": "dot", "Makefile": "already exists", "notes.txt": "already exists"}},
		{name: "--out-overwrite", args: []string{"--out-overwrite"}, overwrite: true, notSaved: map[string]string{
			".git/config": "dot", ".envrc": "dot", ".github/workflows/ci.yml": "dot", "notes.txt": "not a regular file"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, marker := prepare(t)
			hostCmd := "touch " + marker
			r := h.runCLI(t, "bash", outProbe(hostCmd), 30*time.Second, append([]string{"--out", dir}, tc.args...)...)
			if r.status != sandbox.StatusOK || !strings.Contains(r.stdout, "PROBE-RAN") {
				t.Fatalf("status %s exit %d (%s): %s", r.status, r.exitCode, r.message, r.stderr)
			}
			want := map[string]string{"Makefile": makefile, ".envrc": envrc, "notes.txt": "-> " + h.canaryFile, "result.txt": "result\n"}
			if tc.overwrite {
				// The positive control: the flag does replace a file.
				want["Makefile"] = "all:\n\t" + hostCmd + "\n"
			}
			got := outFiles(t, dir)
			for name, w := range want {
				if got[name] != w {
					t.Errorf("%s on the host holds %q, want %q", name, got[name], w)
				}
			}
			for name := range got {
				if _, ok := want[name]; !ok {
					t.Errorf("--out wrote %s on the host: %q", name, got[name])
				}
			}
			for _, f := range r.result.Files {
				w, refused := tc.notSaved[f.Path]
				switch {
				case refused && (!strings.HasPrefix(f.Skipped, "not saved: ") || !strings.Contains(f.Skipped, w)):
					t.Errorf("files: %s skipped %q, want not saved naming %q", f.Path, f.Skipped, w)
				case !refused && f.Skipped != "":
					t.Errorf("files: %s skipped %q, want it saved", f.Path, f.Skipped)
				case refused && !strings.Contains(r.all, "out/"+f.Path+" not saved in "+dir):
					t.Errorf("stderr does not say out/%s was not saved: %s", f.Path, r.all)
				}
			}
			if _, err := os.Lstat(marker); err == nil {
				t.Errorf("a host command ran")
			}
			h.assertHostClean(t)
		})
	}

	// `--out .` in a git checkout: the program's .git/config would make the
	// next `git status` run its command.
	t.Run("checkout root", func(t *testing.T) {
		top := t.TempDir()
		repo, marker := filepath.Join(top, "repo"), filepath.Join(top, "RAN")
		newGitRepo(t, repo)
		config := fileHash(t, filepath.Join(repo, ".git", "config"))
		hostCmd := "touch " + marker

		cmd := exec.Command(h.bin, "run", "--json", "--state-dir", h.cliState, "--lang", "bash", "--out", ".", "-c", outProbe(hostCmd))
		cmd.Dir, cmd.Env = repo, append(os.Environ(), h.env()...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		_ = cmd.Run()
		if code := cmd.ProcessState.ExitCode(); code != exitUsage || !strings.Contains(stderr.String(), "root of a version-control checkout") ||
			!strings.Contains(stderr.String(), "--out-allow-vcs") || strings.Contains(stdout.String(), "PROBE-RAN") {
			t.Errorf("--out . in a checkout: exit %d, want %d before running, with the reason and the flag:\nstdout %s\nstderr %s", code, exitUsage, stdout.String(), stderr.String())
		}
		// Told that the checkout is meant: files are written, but no dot
		// name and no existing file.
		r := h.runCLI(t, "bash", outProbe(hostCmd), 30*time.Second, "--out", repo, "--out-allow-vcs")
		if r.status != sandbox.StatusOK || !strings.Contains(r.stdout, "PROBE-RAN") {
			t.Fatalf("with --out-allow-vcs: status %s (%s): %s", r.status, r.message, r.stderr)
		}
		if got := fileHash(t, filepath.Join(repo, ".git", "config")); got != config {
			t.Errorf(".git/config changed")
		}
		if data, _ := os.ReadFile(filepath.Join(repo, "Makefile")); string(data) != makefile {
			t.Errorf("Makefile holds %q", data)
		}
		if data, _ := os.ReadFile(filepath.Join(repo, "result.txt")); string(data) != "result\n" {
			t.Errorf("result.txt holds %q, want the program's output", data)
		}
		if gitStatusRuns(t, repo, marker) {
			t.Errorf("git status in the checkout ran the program's command")
		}
		h.assertHostClean(t)

		// The positive control: the same config, put there on the host,
		// does make git status run the command.
		control := filepath.Join(top, "control")
		newGitRepo(t, control)
		if err := os.WriteFile(filepath.Join(control, ".git", "config"), []byte("[core]\n\tfsmonitor = "+hostCmd+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if !gitStatusRuns(t, control, marker) {
			t.Errorf("with the program's .git/config in place, git status runs nothing: the probe cannot detect a breach")
		}
	})
}
