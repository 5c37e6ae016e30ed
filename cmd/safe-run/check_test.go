package main

import (
	"encoding/json"
	"encoding/xml"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/safe-run/safe-run/sandbox"
	"github.com/safe-run/safe-run/snippets"
)

// writeTree creates files (path → content) below a new directory.
func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, content := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestCheckFindDocuments(t *testing.T) {
	root := writeTree(t, map[string]string{
		"README.md": "", "docs/a.md": "", "docs/b.markdown": "", "docs/deep/c.MD": "", "docs/notes.txt": "",
		".git/x.md": "", "node_modules/p/README.md": "", "vendor/v.md": "", "third_party/t.md": "", "docs/vendor/v.md": "",
		"docs/drafts/d.md": "",
	})
	for _, tc := range []struct {
		name             string
		paths            []string
		include, exclude []string
		want             []string
	}{
		{name: "all", paths: []string{"."}, want: []string{"README.md", "docs/a.md", "docs/b.markdown", "docs/deep/c.MD", "docs/drafts/d.md"}},
		{name: "a directory", paths: []string{"docs"}, want: []string{"docs/a.md", "docs/b.markdown", "docs/deep/c.MD", "docs/drafts/d.md"}},
		{name: "a file of any name, once", paths: []string{"docs/notes.txt", "docs/a.md", "docs"},
			want: []string{"docs/notes.txt", "docs/a.md", "docs/b.markdown", "docs/deep/c.MD", "docs/drafts/d.md"}},
		{name: "exclude a directory", paths: []string{"."}, exclude: []string{"docs/drafts"},
			want: []string{"README.md", "docs/a.md", "docs/b.markdown", "docs/deep/c.MD"}},
		{name: "exclude by base name", paths: []string{"."}, exclude: []string{"*.markdown", "README.md"},
			want: []string{"docs/a.md", "docs/deep/c.MD", "docs/drafts/d.md"}},
		{name: "include relative to the root", paths: []string{"docs"}, include: []string{"deep/*"}, want: []string{"docs/deep/c.MD"}},
		{name: "include **", paths: []string{"."}, include: []string{"**/c.MD", "docs/a.md"}, want: []string{"docs/a.md", "docs/deep/c.MD"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Chdir(root)
			got, err := findDocuments(tc.paths, tc.include, tc.exclude)
			if err != nil {
				t.Fatal(err)
			}
			for i := range got {
				got[i] = filepath.ToSlash(filepath.Clean(got[i]))
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("found %q, want %q", got, tc.want)
			}
		})
	}
	if _, err := findDocuments([]string{filepath.Join(root, "absent")}, nil, nil); err == nil {
		t.Error("a missing PATH was accepted")
	}
}

func TestCheckReadDocumentFile(t *testing.T) {
	root := writeTree(t, map[string]string{"doc/data.csv": "a,b\n", "doc/sub/x.txt": "x", "secret": "s"})
	if err := os.Symlink(filepath.Join(root, "secret"), filepath.Join(root, "doc", "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/shadow", filepath.Join(root, "doc", "shadow")); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "doc")
	for name, ok := range map[string]bool{"data.csv": true, "sub/x.txt": true, "../secret": false, "/etc/passwd": false,
		"link": false, "shadow": false, "absent": false, "sub": false} {
		_, _, err := readDocumentFile(dir, name)
		if (err == nil) != ok {
			t.Errorf("readDocumentFile(%q): %v, want ok=%v", name, err, ok)
		}
	}
}

func TestCheckMergeEnv(t *testing.T) {
	got := mergeEnv(checkEnv, []string{"TZ=Europe/Paris", "FOO=bar=baz"})
	want := []string{"TZ=Europe/Paris", "LC_ALL=C.UTF-8", "PYTHONHASHSEED=0", "FOO=bar=baz"}
	if !slices.Equal(got, want) {
		t.Errorf("mergeEnv = %q, want %q", got, want)
	}
	var e envFlag
	for _, bad := range []string{"NOVALUE", "=x", "A=\x00"} {
		if e.Set(bad) == nil {
			t.Errorf("--env %q accepted", bad)
		}
	}
}

func TestCheckJudge(t *testing.T) {
	exit3 := 3
	out := func(text string) *snippets.Expected { return &snippets.Expected{Line: 9, Text: text} }
	for _, tc := range []struct {
		name    string
		block   snippets.Block
		res     sandbox.Result
		update  bool
		outcome string
		updated bool
		diff    bool
	}{
		{"exit 0", snippets.Block{}, sandbox.Result{Status: sandbox.StatusOK}, false, outcomePassed, false, false},
		{"exit 1", snippets.Block{}, sandbox.Result{Status: sandbox.StatusError, ExitCode: 1}, false, outcomeFailed, false, false},
		{"should-fail fails", snippets.Block{Attrs: snippets.Attrs{ShouldFail: true}}, sandbox.Result{Status: sandbox.StatusError, ExitCode: 2}, false, outcomePassed, false, false},
		{"should-fail exits 0", snippets.Block{Attrs: snippets.Attrs{ShouldFail: true}}, sandbox.Result{Status: sandbox.StatusOK}, false, outcomeFailed, false, false},
		{"should-fail times out", snippets.Block{Attrs: snippets.Attrs{ShouldFail: true}}, sandbox.Result{Status: sandbox.StatusTimeout, ExitCode: -1}, false, outcomeFailed, false, false},
		{"exit=3", snippets.Block{Attrs: snippets.Attrs{Exit: &exit3}}, sandbox.Result{Status: sandbox.StatusError, ExitCode: 3}, false, outcomePassed, false, false},
		{"exit=3 gets 1", snippets.Block{Attrs: snippets.Attrs{Exit: &exit3}}, sandbox.Result{Status: sandbox.StatusError, ExitCode: 1}, false, outcomeFailed, false, false},
		{"oom", snippets.Block{}, sandbox.Result{Status: sandbox.StatusOOM, ExitCode: -1}, false, outcomeFailed, false, false},
		{"sandbox error", snippets.Block{}, sandbox.Result{Status: sandbox.StatusSandboxError, ExitCode: -1}, false, outcomeError, false, false},
		{"output matches", snippets.Block{Expected: out("a\n...\n")}, sandbox.Result{Status: sandbox.StatusOK, Stdout: "a\nb\nc\n"}, false, outcomePassed, false, false},
		{"output differs", snippets.Block{Expected: out("a\n")}, sandbox.Result{Status: sandbox.StatusOK, Stdout: "b\n"}, false, outcomeFailed, false, true},
		{"output differs, updated", snippets.Block{Expected: out("a\n")}, sandbox.Result{Status: sandbox.StatusOK, Stdout: "b\n"}, true, outcomePassed, true, false},
		{"stderr compared", snippets.Block{Expected: &snippets.Expected{Text: "e\n", Stderr: true}}, sandbox.Result{Status: sandbox.StatusOK, Stdout: "o\n", Stderr: "e\n"}, false, outcomePassed, false, false},
		{"exit before output: not updated", snippets.Block{Expected: out("a\n")}, sandbox.Result{Status: sandbox.StatusError, ExitCode: 1, Stdout: "b\n"}, true, outcomeFailed, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r blockReport
			judge(&r, tc.block, tc.res, tc.update)
			if r.Outcome != tc.outcome || r.Updated != tc.updated || (r.Diff != "") != tc.diff {
				t.Errorf("outcome %s (updated %v, diff %q, message %q), want %s (updated %v, diff %v)", r.Outcome, r.Updated, r.Diff, r.Message, tc.outcome, tc.updated, tc.diff)
			}
			if r.Outcome == outcomeFailed && r.Message == "" {
				t.Error("a failure without a message")
			}
		})
	}
}

func TestCheckExitCode(t *testing.T) {
	for _, tc := range []struct {
		outcomes []string
		want     int
	}{
		{nil, 0},
		{[]string{outcomePassed, outcomeSkipped}, 0},
		{[]string{outcomePassed, outcomeFailed}, 1},
		{[]string{outcomeFailed, outcomeError, outcomePassed}, exitSandboxError},
	} {
		var reports []blockReport
		for _, o := range tc.outcomes {
			reports = append(reports, blockReport{Outcome: o})
		}
		if got := summarize(reports, time.Second).ExitCode; got != tc.want {
			t.Errorf("outcomes %q: exit code %d, want %d", tc.outcomes, got, tc.want)
		}
	}
}

// sampleReports are a pass, a failure with a diff and hostile output, a
// skip and a block the sandbox could not run.
var sampleReports = []blockReport{
	{File: "docs/a.md", Line: 3, Language: "python", Outcome: outcomePassed, Status: "ok", DurationMS: 120, Stdout: "45\n"},
	{File: "docs/a.md", Line: 10, Language: "python", Outcome: outcomeFailed, Status: "ok", DurationMS: 250,
		Message: "stdout differs from the expected output (line 14)", Diff: "--- expected\n+++ actual\n@@ -1 +1 @@\n-a\n+b\x1b[2J\n",
		Stdout: "b\x1b[2J\x00]]>\n::error::forged\n", Stderr: "warn\x07\r\n"},
	{File: "docs/b,c:d.md", Line: 1, Language: "bash", Outcome: outcomeSkipped, Message: "marked skip"},
	{File: "docs/b,c:d.md", Line: 5, Language: "bash", Outcome: outcomeError, Status: "sandbox_error", Message: "runsc failed\n100%"},
}

// TestCheckJUnit parses the JUnit report back and checks it field by field:
// counts per suite and overall, one testcase per block named file:line
// with its file as classname, the failure's message and diff, the output,
// and no control character left to make it ill-formed.
func TestCheckJUnit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "junit.xml")
	sum := summarize(sampleReports, 2*time.Second)
	if err := writeJUnit(path, sampleReports, sum); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var got junitSuites
	if err := xml.Unmarshal(data, &got); err != nil {
		t.Fatalf("the JUnit report does not parse: %v\n%s", err, data)
	}
	if got.Tests != 4 || got.Failures != 1 || got.Errors != 1 || got.Skipped != 1 || got.Time != "2.000" {
		t.Errorf("testsuites: tests %d failures %d errors %d skipped %d time %s", got.Tests, got.Failures, got.Errors, got.Skipped, got.Time)
	}
	if len(got.Suites) != 2 {
		t.Fatalf("%d testsuites, want 2", len(got.Suites))
	}
	a, b := got.Suites[0], got.Suites[1]
	if a.Name != "docs/a.md" || a.Tests != 2 || a.Failures != 1 || a.Time != "0.370" || b.Name != "docs/b,c:d.md" || b.Skipped != 1 || b.Errors != 1 {
		t.Errorf("testsuites %+v %+v", a, b)
	}
	pass, failed, skipped, errored := a.Cases[0], a.Cases[1], b.Cases[0], b.Cases[1]
	if pass.Name != "docs/a.md:3" || pass.Classname != "docs/a.md" || pass.Time != "0.120" || pass.Failure != nil || pass.SystemOut == nil || pass.SystemOut.Text != "45\n" {
		t.Errorf("passing testcase %+v", pass)
	}
	if failed.Failure == nil || failed.Failure.Message != "stdout differs from the expected output (line 14)" ||
		failed.Failure.Text != "--- expected\n+++ actual\n@@ -1 +1 @@\n-a\n+b\\u001b[2J\n" {
		t.Errorf("failure %+v", failed.Failure)
	}
	if failed.SystemOut == nil || failed.SystemOut.Text != "b\\u001b[2J\\u0000]]>\n::error::forged\n" || failed.SystemErr == nil || failed.SystemErr.Text != "warn\\u0007\\u000d\n" {
		t.Errorf("failed output %+v %+v", failed.SystemOut, failed.SystemErr)
	}
	if skipped.Skipped == nil || skipped.Failure != nil || skipped.Name != "docs/b,c:d.md:1" {
		t.Errorf("skipped testcase %+v", skipped)
	}
	if errored.Error == nil || errored.Error.Message != "runsc failed\n100%" || errored.Failure != nil {
		t.Errorf("errored testcase %+v", errored.Error)
	}
	for _, c := range data {
		if c < 0x20 && c != '\n' && c != '\t' {
			t.Errorf("the report holds control byte %#x", c)
		}
	}
}

// TestCheckAnnotations: one ::error per failed or errored block, with its
// file and line, and nothing of the output able to end the command early
// or start another.
func TestCheckAnnotations(t *testing.T) {
	got := githubAnnotations(sampleReports)
	lines := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
	want := []string{
		"::error file=docs/a.md,line=10,title=safe-run check%3A python block failed::stdout differs from the expected output (line 14)%0A--- expected%0A+++ actual%0A@@ -1 +1 @@%0A-a%0A+b\\u001b[2J",
		"::error file=docs/b%2Cc%3Ad.md,line=5,title=safe-run check%3A bash block error::runsc failed%0A100%25",
	}
	if !slices.Equal(lines, want) {
		t.Errorf("annotations\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	de := documentAnnotations([]error{&snippets.Error{Path: "x.md", Line: 4, Msg: "unknown attribute \"a\"\n::error::x"}})
	if de != "::error file=x.md,line=4,title=safe-run check: document error::unknown attribute \"a\"%0A::error::x\n" {
		t.Errorf("document annotation %q", de)
	}
}

// TestCheckJSONReport: one object per block and a summary, each a line.
func TestCheckJSONReport(t *testing.T) {
	var b strings.Builder
	sum := summarize(sampleReports, time.Second)
	if err := writeJSONReport(&b, sampleReports, sum); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 5 {
		t.Fatalf("%d lines, want 5:\n%s", len(lines), b.String())
	}
	var r blockReport
	if err := json.Unmarshal([]byte(lines[1]), &r); err != nil || r.Type != "block" || r.File != "docs/a.md" || r.Line != 10 ||
		r.Outcome != outcomeFailed || r.Stdout != sampleReports[1].Stdout || r.Diff == "" {
		t.Errorf("block line %s: %+v %v", lines[1], r, err)
	}
	var s checkSummary
	if err := json.Unmarshal([]byte(lines[4]), &s); err != nil || s != (checkSummary{Type: "summary", Passed: 1, Failed: 1, Skipped: 1, Errors: 1, DurationMS: 1000, ExitCode: exitSandboxError}) {
		t.Errorf("summary line %s: %+v %v", lines[4], s, err)
	}
}

// TestCheckHumanReport: file:line, outcome, the diff, and the final line;
// colour only when asked; output escaped.
func TestCheckHumanReport(t *testing.T) {
	for _, colour := range []bool{false, true} {
		var b strings.Builder
		h := humanReport{w: &b, colour: colour}
		for _, r := range sampleReports {
			h.block(r)
		}
		got := b.String()
		for _, want := range []string{"docs/a.md:3 (python, 0.12s)", "docs/a.md:10 (python, 0.25s): stdout differs", "-a", "b\\u001b[2J", "100%\n", "docs/b,c:d.md:1: marked skip"} {
			if !strings.Contains(got, want) {
				t.Errorf("colour %v: report lacks %q:\n%s", colour, want, got)
			}
		}
		if hasEsc := strings.Contains(got, "\x1b"); hasEsc != colour {
			t.Errorf("colour %v: escape sequences present: %v\n%q", colour, hasEsc, got)
		}
	}
	if got := summarize(sampleReports[:3], 0).line(); got != "1 passed, 1 failed, 1 skipped" {
		t.Errorf("final line %q", got)
	}
}

func TestCheckPlanUnits(t *testing.T) {
	doc := checkDoc{blocks: []snippets.Block{{}, {Attrs: snippets.Attrs{Session: "s"}}, {Attrs: snippets.Attrs{Skip: true}},
		{Attrs: snippets.Attrs{Session: "t"}}, {Attrs: snippets.Attrs{Session: "s"}}, {}}}
	units, total := planUnits([]checkDoc{doc, doc})
	if total != 12 || len(units) != 8 {
		t.Fatalf("%d units of %d blocks, want 8 of 12", len(units), total)
	}
	if !slices.Equal(units[1].blocks, []int{1, 4}) || units[1].session != "s" || units[5].doc != 1 || !slices.Equal(units[5].blocks, []int{1, 4}) {
		t.Errorf("units %+v", units)
	}
	pool := checkPool([]checkDoc{{blocks: []snippets.Block{{Language: "python"}, {Language: "python"}, {Language: "python"}, {Language: "bash"},
		{Language: "node", Attrs: snippets.Attrs{Session: "s"}}}, jobs: make([]sandbox.Job, 5)}}, 2, checkEnv, map[string][]string{"python": {"numpy"}})
	if len(pool.Size) != 2 || pool.Size["python"] != 2 || pool.Size["bash"] != 1 || !slices.Equal(pool.Env, checkEnv) ||
		!slices.Equal(pool.Preload["python"], []string{"numpy"}) || pool.Preload["bash"] != nil || pool.Refills != 2 || pool.AwaitRefill == 0 {
		t.Errorf("pool %+v", pool)
	}
}

// TestCheckBlockJob: attributes become the job, within the policy; what
// the policy refuses is a document error at the block's line.
func TestCheckBlockJob(t *testing.T) {
	dir := writeTree(t, map[string]string{"doc.md": "", "in.txt": "input"})
	doc := filepath.Join(dir, "doc.md")
	c := checkConfig{env: checkEnv, limits: sandbox.Limits{MemoryBytes: 256 * sandbox.MiB}}
	policy := sandbox.Policy{Images: []string{"allowed:1"}}
	for _, tc := range []struct {
		name  string
		attrs snippets.Attrs
		err   string // part of the document error; "" for none
	}{
		{name: "plain"},
		{name: "allowed image", attrs: snippets.Attrs{Image: "allowed:1"}},
		{name: "other image", attrs: snippets.Attrs{Image: "other:1"}, err: "doc.md:7: image"},
		{name: "image in a session", attrs: snippets.Attrs{Image: "allowed:1", Session: "s"}, err: "session"},
		{name: "timeout", attrs: snippets.Attrs{Timeout: 5 * time.Second}},
		{name: "timeout above the maximum", attrs: snippets.Attrs{Timeout: 24 * time.Hour}, err: "doc.md:7: timeout"},
		{name: "stdin", attrs: snippets.Attrs{Stdin: "in.txt", Files: []string{"in.txt"}}},
		{name: "missing stdin", attrs: snippets.Attrs{Stdin: "absent.txt"}, err: "doc.md:7: stdin=absent.txt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			job, err := blockJob(doc, snippets.Block{Line: 7, Language: "python", Code: "print(1)\n", Attrs: tc.attrs}, policy, c)
			switch {
			case tc.err == "" && err != nil:
				t.Fatalf("document error: %v", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err) || sandbox.Class(err) != sandbox.ErrInvalid):
				t.Fatalf("error %v, want a document error with %q", err, tc.err)
			case err != nil:
				return
			}
			if !slices.Equal(job.Env, checkEnv) || job.Limits.MemoryBytes != 256*sandbox.MiB || job.Limits.Timeout != tc.attrs.Timeout || job.Image != tc.attrs.Image {
				t.Errorf("job %+v", job)
			}
			if tc.attrs.Stdin != "" && (string(job.Stdin) != "input" || len(job.Files) != 1 || job.Files[0].Path != "in.txt") {
				t.Errorf("stdin %q, files %+v", job.Stdin, job.Files)
			}
		})
	}
}

// TestCheckPrinterOrder: results finishing out of order print in document
// order.
func TestCheckPrinterOrder(t *testing.T) {
	var b strings.Builder
	reports := []blockReport{{File: "a.md", Line: 1, Outcome: outcomePassed}, {File: "a.md", Line: 5, Outcome: outcomeFailed}, {File: "b.md", Line: 2, Outcome: outcomeSkipped}}
	p := &checkPrinter{human: &humanReport{w: &b}, total: 3, reports: reports, finished: make([]bool, 3), all: make(chan struct{})}
	for _, i := range []int{2, 1} {
		p.done(i)
	}
	if b.Len() != 0 {
		t.Errorf("printed before the first block finished: %q", b.String())
	}
	p.done(0)
	p.wait()
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "a.md:1") || !strings.Contains(lines[1], "a.md:5") || !strings.Contains(lines[2], "b.md:2") {
		t.Errorf("printed\n%s", b.String())
	}
}
