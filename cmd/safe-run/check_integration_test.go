package main

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// checkRun is what one `safe-run check` printed and how it exited.
type checkRun struct {
	code           int
	stdout, stderr string
}

// runCheck runs `safe-run check args...` with a state directory of its
// own and the extra environment env.
func runCheck(t *testing.T, env []string, args ...string) checkRun {
	t.Helper()
	bin := binary(t)
	argv := append([]string{"check", "--state-dir", filepath.Join(t.TempDir(), "state")}, args...)
	cmd := exec.Command(bin, argv...)
	cmd.Env = append(slices.DeleteFunc(os.Environ(), func(s string) bool { return strings.HasPrefix(s, "GITHUB_ACTIONS=") }), env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("safe-run check: %v", err)
	}
	return checkRun{code: cmd.ProcessState.ExitCode(), stdout: out.String(), stderr: errOut.String()}
}

// copyTree copies the directory src to a new temporary directory.
func copyTree(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	err := filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), data, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

// fixtureTree is a copy of testdata/check/tree with a .git directory
// (which git cannot keep in the repository) holding a failing document.
func fixtureTree(t *testing.T) string {
	t.Helper()
	dir := copyTree(t, filepath.Join("testdata", "check", "tree"))
	if err := os.MkdirAll(filepath.Join(dir, ".git"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ".git", "x.md"), []byte("```python\nraise SystemExit(1)\n```\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestCheckIntegrationTree checks the fixture tree against the real
// sandbox: exact counts, the exit code, every JUnit testcase, and the
// GitHub annotations of exactly the failed blocks.
func TestCheckIntegrationTree(t *testing.T) {
	dir := fixtureTree(t)
	junit := filepath.Join(t.TempDir(), "junit.xml")
	r := runCheck(t, []string{"GITHUB_ACTIONS=true", "NO_COLOR="}, "-j", "2", "--memory", "384MiB", "--junit", junit, dir)
	if r.code != 1 {
		t.Fatalf("exit code %d, want 1\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	if !strings.Contains(r.stdout, "\n13 passed, 6 failed, 1 skipped\n") {
		t.Errorf("no final line `13 passed, 6 failed, 1 skipped`:\n%s", r.stdout)
	}
	if strings.Contains(r.stdout, "\x1b[") {
		t.Errorf("colour when stdout is not a terminal:\n%q", r.stdout)
	}
	failed := map[string]string{ // name → what its failure message says
		"fail.md:3": "stdout differs", "fail.md:11": "exit code 3, want 0", "fail.md:15": "should-fail",
		"fail.md:19": "exit code 5, want 4", "special.md:15": "timeout", "special.md:20": "oom",
	}
	var annotated []string
	for _, line := range strings.Split(r.stdout, "\n") {
		if strings.HasPrefix(line, "::error file=") {
			file, rest, _ := strings.Cut(strings.TrimPrefix(line, "::error file="), ",line=")
			lineNo, _, _ := strings.Cut(rest, ",")
			rel, _ := filepath.Rel(dir, file)
			annotated = append(annotated, rel+":"+lineNo)
		}
	}
	slices.Sort(annotated)
	var wantAnnotated []string
	for name := range failed {
		wantAnnotated = append(wantAnnotated, name)
	}
	slices.Sort(wantAnnotated)
	if !slices.Equal(annotated, wantAnnotated) {
		t.Errorf("annotations for %q, want %q\n%s", annotated, wantAnnotated, r.stdout)
	}

	data, err := os.ReadFile(junit)
	if err != nil {
		t.Fatal(err)
	}
	var suites junitSuites
	if err := xml.Unmarshal(data, &suites); err != nil {
		t.Fatalf("JUnit report: %v\n%s", err, data)
	}
	if suites.Tests != 20 || suites.Failures != 6 || suites.Skipped != 1 || suites.Errors != 0 || len(suites.Suites) != 5 {
		t.Errorf("testsuites: %d tests, %d failures, %d skipped, %d errors, %d suites", suites.Tests, suites.Failures, suites.Skipped, suites.Errors, len(suites.Suites))
	}
	var names []string
	for _, s := range suites.Suites {
		for _, c := range s.Cases {
			rel, _ := filepath.Rel(dir, c.Classname)
			name := rel + ":" + strings.TrimPrefix(c.Name, c.Classname+":")
			names = append(names, name)
			if c.Classname != s.Name || !strings.HasPrefix(c.Name, c.Classname+":") {
				t.Errorf("testcase %s in suite %s: classname %s", c.Name, s.Name, c.Classname)
			}
			want, isFailed := failed[name]
			switch {
			case isFailed && (c.Failure == nil || !strings.Contains(c.Failure.Message, want)):
				t.Errorf("%s: failure %+v, want one saying %q", name, c.Failure, want)
			case !isFailed && c.Failure != nil:
				t.Errorf("%s failed: %+v", name, c.Failure)
			}
		}
	}
	if len(names) != 20 || slices.ContainsFunc(names, func(n string) bool {
		return strings.Contains(n, "node_modules") || strings.Contains(n, "vendor") || strings.HasPrefix(n, ".git")
	}) {
		t.Errorf("testcases %q", names)
	}
	for name, check := range map[string]func(c junitCase) bool{
		"fail.md:3": func(c junitCase) bool {
			return c.SystemOut != nil && c.SystemOut.Text == "actual\n" && strings.Contains(c.Failure.Text, "-expected\n+actual")
		},
		"special.md:3":      func(c junitCase) bool { return c.Skipped != nil },
		"guide/files.md:3":  func(c junitCase) bool { return c.SystemOut != nil && c.SystemOut.Text == "beta\nalpha\n" },
		"guide/files.md:12": func(c junitCase) bool { return c.SystemOut != nil && c.SystemOut.Text == "3\n" },
		"guide/session.md:7": func(c junitCase) bool {
			return c.SystemOut != nil && c.SystemOut.Text == "42\n" && c.Failure == nil
		},
		"pass.md:23": func(c junitCase) bool { return c.SystemErr != nil && c.SystemErr.Text == "to stderr\n" },
	} {
		found := false
		for _, s := range suites.Suites {
			for _, c := range s.Cases {
				if rel, _ := filepath.Rel(dir, c.File); rel+":"+strings.TrimPrefix(c.Name, c.Classname+":") == name {
					found = true
					if !check(c) {
						t.Errorf("testcase %s: %+v", name, c)
					}
				}
			}
		}
		if !found {
			t.Errorf("no testcase %s", name)
		}
	}
}

// TestCheckIntegrationJSON: --json prints one object per block and the
// summary; a session's blocks share state and another session does not.
func TestCheckIntegrationJSON(t *testing.T) {
	dir := fixtureTree(t)
	r := runCheck(t, nil, "--json", filepath.Join(dir, "guide", "session.md"))
	if r.code != 0 {
		t.Fatalf("exit code %d, want 0\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	if len(lines) != 5 {
		t.Fatalf("%d lines, want 4 blocks and a summary:\n%s", len(lines), r.stdout)
	}
	wantSession := []string{"calc", "calc", "other", ""}
	for i, line := range lines[:4] {
		var b blockReport
		if err := json.Unmarshal([]byte(line), &b); err != nil || b.Type != "block" || b.Outcome != outcomePassed || b.Session != wantSession[i] {
			t.Errorf("line %d: %s (%v)", i, line, err)
		}
	}
	var s checkSummary
	if err := json.Unmarshal([]byte(lines[4]), &s); err != nil || s.Type != "summary" || s.Passed != 4 || s.ExitCode != 0 {
		t.Errorf("summary %s (%v)", lines[4], err)
	}
}

// TestCheckIntegrationUpdate: --update=all rewrites a wrong expected block
// and adds a missing one, after which the document passes; a document
// with nothing to update stays byte for byte the same.
func TestCheckIntegrationUpdate(t *testing.T) {
	dir := t.TempDir()
	doc := filepath.Join(dir, "doc.md")
	same := filepath.Join(dir, "same.md")
	orig := "# Doc\r\n\r\n```python\r\nprint('new')\r\n```\r\n\r\n```output\r\nold\r\n```\r\n\r\n```bash\r\necho added\r\n```\r\n"
	sameText := "```bash\necho ok\n```\n\n```output\nok\n```\n"
	if err := os.WriteFile(doc, []byte(orig), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(same, []byte(sameText), 0o640); err != nil {
		t.Fatal(err)
	}
	if r := runCheck(t, nil, dir); r.code != 1 {
		t.Fatalf("before the update: exit code %d, want 1\n%s", r.code, r.stdout)
	}
	if r := runCheck(t, nil, "--update=all", dir); r.code != 0 || !strings.Contains(r.stdout, "(2 updated)") {
		t.Fatalf("--update=all: exit code %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	got, _ := os.ReadFile(doc)
	if !strings.Contains(string(got), "```output\r\nnew\r\n```") || !strings.Contains(string(got), "echo added\r\n```\r\n\r\n```output\r\nadded\r\n```") {
		t.Errorf("updated document:\n%q", got)
	}
	if data, _ := os.ReadFile(same); string(data) != sameText {
		t.Errorf("a document with nothing to update changed:\n%q", data)
	}
	if r := runCheck(t, nil, dir); r.code != 0 || !strings.Contains(r.stdout, "3 passed, 0 failed, 0 skipped") {
		t.Errorf("after the update: exit code %d\n%s", r.code, r.stdout)
	}
}

// TestCheckIntegrationDocumentErrors: an unknown attribute, a missing
// files= file and one outside the document's directory are document
// errors with their file:line, exit code 2, and nothing runs.
func TestCheckIntegrationDocumentErrors(t *testing.T) {
	r := runCheck(t, []string{"GITHUB_ACTIONS=true"}, filepath.Join("testdata", "check", "bad"), filepath.Join("testdata", "check", "tree", "pass.md"))
	if r.code != 2 {
		t.Fatalf("exit code %d, want 2\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{"bad/missing.md:3: files=absent.csv", "bad/outside.md:3: files=../tree", "bad/unknown.md:3: unknown attribute \"colour\"", "3 document error(s); nothing ran"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	if n := strings.Count(r.stdout, "::error file=testdata/check/bad/"); n != 3 || strings.Contains(r.stdout, "PASS") {
		t.Errorf("stdout: %d annotations, want 3, and no block run:\n%s", n, r.stdout)
	}
	if r := runCheck(t, nil, "--update=some", "."); r.code != 2 {
		t.Errorf("--update=some: exit code %d, want 2", r.code)
	}
	if r := runCheck(t, nil, "--include", "*.markdown", filepath.Join("testdata", "check", "tree")); r.code != 2 || !strings.Contains(r.stderr, "no Markdown documents") {
		t.Errorf("no documents: exit code %d, want 2\n%s", r.code, r.stderr)
	}
}
