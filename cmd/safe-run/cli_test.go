package main

// End-to-end tests of the built binary, as CI jobs and users run it. They
// need SAFE_RUN_BIN (set by `make test`, which also builds runsc and the
// default image); without it they are skipped with a note.

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/safe-run/safe-run/sandbox"
)

type cliResult struct {
	code           int
	stdout, stderr string
}

// safeRun runs the safe-run binary with args and optional standard input.
func safeRun(t *testing.T, stdin string, args ...string) cliResult {
	t.Helper()
	cmd := exec.Command(binary(t), args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("run %s: %v", cmd.Path, err)
	}
	return cliResult{code: cmd.ProcessState.ExitCode(), stdout: out.String(), stderr: errOut.String()}
}

func TestRunExitCodes(t *testing.T) {
	for _, tc := range []struct {
		name       string
		args       []string
		code       int
		stdout     string
		stderrPart string
	}{
		{"success", []string{"--lang", "python", "-c", "print('hi')"}, 0, "hi\n", ""},
		{"program's own code", []string{"--lang", "bash", "-c", "echo out; echo err >&2; exit 3"}, 3, "out\n", "err"},
		{"timeout", []string{"--lang", "bash", "--timeout", "1s", "-c", "echo begun; sleep 30"}, exitTimeout, "begun\n", "timeout"},
		{"out of memory", []string{"--lang", "python", "--memory", "128MiB", "-c", "x = bytearray(1 << 30)"}, exitOOM, "", "oom"},
		{"killed by a signal", []string{"--lang", "bash", "-c", "kill -SEGV $$"}, 128 + 11, "", "SIGSEGV"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := safeRun(t, "", append([]string{"run"}, tc.args...)...)
			if r.code != tc.code || r.stdout != tc.stdout || !strings.Contains(r.stderr, tc.stderrPart) {
				t.Errorf("got exit %d, stdout %q, stderr %q; want exit %d, stdout %q, stderr containing %q",
					r.code, r.stdout, r.stderr, tc.code, tc.stdout, tc.stderrPart)
			}
		})
	}
}

func TestRunJSON(t *testing.T) {
	r := safeRun(t, "", "run", "--json", "--lang", "node", "-c", "console.log('a'); console.error('b'); process.exit(4)")
	if r.code != 4 {
		t.Fatalf("exit %d, want 4 (stderr %q)", r.code, r.stderr)
	}
	var fields map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &fields); err != nil {
		t.Fatalf("--json output is not JSON: %v\n%s", err, r.stdout)
	}
	for _, f := range []string{"status", "exit_code", "stdout", "stderr", "stdout_truncated", "stderr_truncated", "duration_ms", "memory_peak_bytes"} {
		if _, ok := fields[f]; !ok {
			t.Errorf("field %q missing from %s", f, r.stdout)
		}
	}
	var res sandbox.Result
	json.Unmarshal([]byte(r.stdout), &res)
	if res.Status != sandbox.StatusError || res.ExitCode != 4 || res.Stdout != "a\n" || res.Stderr != "b\n" {
		t.Errorf("result = %+v", res)
	}
}

func TestRunInputs(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "job.py")
	os.WriteFile(script, []byte("import sys\nprint(open('data.txt').read().strip(), sys.stdin.read().strip())\n"), 0o644)
	data := filepath.Join(dir, "local-name.txt")
	os.WriteFile(data, []byte("from-file\n"), 0o644)
	input := filepath.Join(dir, "input.txt")
	os.WriteFile(input, []byte("from-stdin\n"), 0o644)

	t.Run("FILE with language from its extension, --file and --stdin", func(t *testing.T) {
		r := safeRun(t, "", "run", "--file", data+":data.txt", "--stdin", input, script)
		if r.code != 0 || r.stdout != "from-file from-stdin\n" {
			t.Errorf("exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
		}
	})
	t.Run("code from standard input", func(t *testing.T) {
		r := safeRun(t, "echo piped code", "run", "--lang", "bash", "-")
		if r.code != 0 || r.stdout != "piped code\n" {
			t.Errorf("exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
		}
	})
}

// TestRunBadInput checks that every mistake gets one line naming the problem
// and the fix, exit code 2 (input) or 125 (set-up), and no Go stack trace.
func TestRunBadInput(t *testing.T) {
	big := filepath.Join(t.TempDir(), "big.py")
	os.WriteFile(big, bytes.Repeat([]byte("#"), 2<<20), 0o644)
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"unknown language", []string{"--lang", "cobol", "-c", "x"}, exitUsage, `"cobol" is not available; use one of python, node, bash`},
		{"no language", []string{"-c", "x"}, exitUsage, "--lang"},
		{"empty code", []string{"--lang", "python", "-c", "  \n"}, exitUsage, "code: is empty"},
		{"code over the size limit", []string{"--lang", "python", big}, exitUsage, "over the 1MiB limit"},
		{"no code", []string{"--lang", "python"}, exitUsage, "no code given"},
		{"code twice", []string{"--lang", "python", "-c", "1", big}, exitUsage, "not both"},
		{"missing file", []string{"/nonexistent/x.py"}, exitUsage, "no such file"},
		{"negative timeout", []string{"--lang", "bash", "--timeout", "-1s", "-c", "true"}, exitUsage, "timeout: is negative"},
		{"huge timeout", []string{"--lang", "bash", "--timeout", "100h", "-c", "true"}, exitUsage, "timeout: 100h0m0s is out of range"},
		{"memory below the floor", []string{"--lang", "bash", "--memory", "16MiB", "-c", "true"}, exitUsage, "memory: 16MiB is out of range; use a value from 64MiB"},
		{"memory not a size", []string{"--lang", "bash", "--memory", "lots", "-c", "true"}, exitUsage, `invalid size "lots"`},
		{"unknown flag", []string{"--colour", "-c", "true"}, exitUsage, "flag provided but not defined: -colour"},
		{"missing runsc", []string{"--runsc", "/nonexistent/runsc", "--lang", "bash", "-c", "true"}, exitSandboxError, "runsc not found at /nonexistent/runsc; build it with `make runsc`"},
		{"missing image", []string{"--cache-dir", t.TempDir(), "--lang", "bash", "-c", "true"}, exitSandboxError, "make rootfs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := safeRun(t, "", append([]string{"run"}, tc.args...)...)
			lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
			if r.code != tc.code || len(lines) != 1 || !strings.Contains(r.stderr, tc.want) || !strings.HasPrefix(r.stderr, "safe-run") {
				t.Errorf("exit %d, stderr %q; want exit %d and one line containing %q", r.code, r.stderr, tc.code, tc.want)
			}
			if strings.Contains(r.stderr, "goroutine") || strings.Contains(r.stderr, "panic") {
				t.Errorf("stack trace on stderr: %s", r.stderr)
			}
		})
	}
}

// TestRunAsOrdinaryUser runs the binary as uid 65534 with the default
// image root built, read-only: the whole suite also runs that way in CI.
func TestRunAsOrdinaryUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the suite itself runs as an ordinary user; this test starts one from root")
	}
	u := newOrdinaryUser(t)
	cmd := u.command(u.become(), "run", "--json", "--lang", "python", "-c", "import os; print(os.getuid(), os.getgid())")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var res sandbox.Result
	if jerr := json.Unmarshal(out, &res); err != nil || jerr != nil || res.Status != sandbox.StatusOK || res.Stdout != "65534 65534\n" {
		t.Fatalf("as uid 65534: %v, %v: %s%s", err, jerr, out, stderr.String())
	}
	if entries, _ := os.ReadDir(filepath.Join(u.home, "state")); len(entries) != 0 {
		t.Errorf("left in the state directory: %v", entries)
	}
}

func TestDoctor(t *testing.T) {
	t.Run("healthy host", func(t *testing.T) {
		stateDir := t.TempDir()
		r := safeRun(t, "", "doctor", "--state-dir", stateDir)
		if r.code != 0 || strings.Contains(r.stdout, "FAIL") {
			t.Fatalf("doctor: exit %d\n%s%s", r.code, r.stdout, r.stderr)
		}
		// Its test runs' sandboxes are removed before it exits.
		if entries, err := os.ReadDir(stateDir); err != nil || len(entries) > 0 {
			t.Errorf("doctor left %v in its state directory (%v)", entries, err)
		}
		for _, name := range []string{"user", "runsc", "agent", "image", "cgroups", "platform", "sandbox"} {
			// Without root and without a delegated cgroup, limits hold but
			// are weaker: doctor warns and says how to get the stronger ones.
			warned := name == "cgroups" && os.Geteuid() != 0 &&
				strings.Contains(r.stdout, "WARN  cgroups") && strings.Contains(r.stdout, "Delegate=yes")
			if !strings.Contains(r.stdout, "PASS  "+name) && !warned {
				t.Errorf("no passing %s check in:\n%s", name, r.stdout)
			}
		}
	})
	t.Run("missing runsc", func(t *testing.T) {
		r := safeRun(t, "", "doctor", "--json", "--runsc", "/nonexistent/runsc")
		var report struct {
			OK     bool    `json:"ok"`
			Checks []check `json:"checks"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &report); err != nil {
			t.Fatalf("doctor --json: %v\n%s", err, r.stdout)
		}
		if r.code != 1 || report.OK {
			t.Errorf("exit %d, ok %v; want 1, false", r.code, report.OK)
		}
		for _, c := range report.Checks {
			if c.Name == "runsc" && (c.OK || !strings.Contains(c.Fix, "make runsc")) {
				t.Errorf("runsc check = %+v, want a failure with the fix", c)
			}
		}
	})
}

func TestExitCodeMapping(t *testing.T) {
	for _, tc := range []struct {
		res  sandbox.Result
		want int
	}{
		{sandbox.Result{Status: sandbox.StatusOK}, 0},
		{sandbox.Result{Status: sandbox.StatusError, ExitCode: 42}, 42},
		{sandbox.Result{Status: sandbox.StatusTimeout, ExitCode: -1}, exitTimeout},
		{sandbox.Result{Status: sandbox.StatusOOM, ExitCode: -1}, exitOOM},
		{sandbox.Result{Status: sandbox.StatusSandboxError, ExitCode: -1}, exitSandboxError},
		{sandbox.Result{Status: sandbox.StatusKilled, ExitCode: -1, Signal: "SIGTERM"}, 143},
		{sandbox.Result{Status: sandbox.StatusKilled, ExitCode: -1}, 137},
	} {
		if got := exitCode(tc.res); got != tc.want {
			t.Errorf("exitCode(%s %s) = %d, want %d", tc.res.Status, tc.res.Signal, got, tc.want)
		}
	}
}

func TestLanguageOf(t *testing.T) {
	ruby := sandbox.MergeLanguages(sandbox.DefaultLanguages, []sandbox.Language{
		{Name: "ruby", Filename: "main.rb", Command: []string{"ruby", "main.rb"}},
		{Name: "python3.12", Filename: "main.py", Command: []string{"python3.12", "main.py"}},
		{Name: "plain", Filename: "main", Command: []string{"sh", "main"}},
	})
	for _, tc := range []struct {
		langs      []sandbox.Language
		name, want string
	}{
		{sandbox.DefaultLanguages, "a.py", "python"},
		{sandbox.DefaultLanguages, "dir/b.js", "node"},
		{sandbox.DefaultLanguages, "b.cjs", "node"},
		{sandbox.DefaultLanguages, "c.sh", "bash"},
		{sandbox.DefaultLanguages, "c.bash", "bash"},
		{sandbox.DefaultLanguages, "d.rb", ""},
		{sandbox.DefaultLanguages, "noext", ""},
		{sandbox.DefaultLanguages, "a.PY", ""},
		{ruby, "d.rb", "ruby"},   // a language added by --languages
		{ruby, "a.py", "python"}, // the first of two with .py
		{ruby, "noext", ""},      // no extension matches none, not "main"
		{nil, "a.py", "python"},  // no table: the defaults
	} {
		if got := languageOf(tc.langs, tc.name); got != tc.want {
			t.Errorf("languageOf(%d languages, %q) = %q, want %q", len(tc.langs), tc.name, got, tc.want)
		}
	}
}

// A reader that goes away (`safe-run run … | head -c1`, an MCP client that
// closes its pipes first) must not kill safe-run by SIGPIPE before it has
// removed the sandbox: it ends by itself and leaves its state directory
// empty.
func TestRunSurvivesClosedOutput(t *testing.T) {
	stateDir := t.TempDir()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	r.Close() // every write to w now fails with EPIPE
	cmd := exec.Command(binary(t), "run", "--state-dir", stateDir, "--lang", "python",
		"-c", "import sys\nfor i in range(2000): print('x' * 100)\nprint('done', file=sys.stderr)")
	cmd.Stdout, cmd.Stderr = w, w
	err = cmd.Run()
	w.Close()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("run %s: %v", cmd.Path, err)
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		t.Fatalf("safe-run was killed by %v when its output was closed", ws.Signal())
	}
	entries, err := os.ReadDir(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "safe-run-") {
			t.Errorf("the run's state %s is left in %s", e.Name(), stateDir)
		}
	}
}
