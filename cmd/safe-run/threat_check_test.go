package main

import (
	"bufio"
	"encoding/xml"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestThreatCheckHostileDocument: a checked document is as untrusted as the
// code of `safe-run run`, and its blocks are contained exactly as run's: a
// fork bomb meets the process limit, an output flood the output cap, and
// reads of host files (/etc/shadow, the harness's canary, a secret beside
// the document that files= does not name) find nothing of the host's.
// Output made to forge report lines or break XML (escape sequences,
// workflow commands, ]]>, NUL) leaves the reports well-formed:
// the JUnit file parses, no control character reaches it or stdout, and the
// only annotations are check's own. Positive control: the file files=
// names is readable.
func TestThreatCheckHostileDocument(t *testing.T) {
	h := newThreatHarness(t)
	dir := filepath.Join(t.TempDir(), "docs")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	secret, allowed := "doc-secret-"+randomHex(8), "doc-allowed-"+randomHex(8)
	secretPath := filepath.Join(dir, "secret.txt")
	for name, data := range map[string]string{"secret.txt": secret, "allowed.txt": allowed} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var shadowLine string // the host's first /etc/shadow entry with a password hash, if readable
	if f, err := os.Open("/etc/shadow"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if fields := strings.Split(sc.Text(), ":"); len(fields) > 2 && len(fields[1]) > 3 {
				shadowLine = fields[1]
				break
			}
		}
		f.Close()
	}
	// The fork bomb ends itself once it has held the process limit a few
	// seconds (bashForkBomb): how soon it meets the limit depends on the
	// machine, and beside the flood (-j 2) on a busy CI runner it once took
	// more than 10 s. The block's timeout is only a backstop.
	doc := fmt.Sprintf("# Hostile\n\n"+
		"```bash timeout=60s\n%s```\n\n"+
		"```python\nimport sys\nfor _ in range(1600):\n    sys.stdout.write('x' * 65536)\n```\n\n"+
		"```bash\ncat /etc/shadow %s %s secret.txt ../secret.txt /workspace/secret.txt; env; find / -name 'secret.txt' 2>/dev/null; true\n```\n\n"+
		"```bash files=allowed.txt\ncat allowed.txt; ls\n```\n\n"+
		"```python\nprint('\\x1b]0;pwned\\x07\\x1b[2J\\n::error file=forged.md,line=1::forged\\n]]><x/>\\x00\\r\\x9b')\n```\n\n```output\nnothing\n```\n",
		bashForkBomb, h.canaryFile, secretPath)
	if err := os.WriteFile(filepath.Join(dir, "hostile.md"), []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	junit := filepath.Join(t.TempDir(), "junit.xml")
	argv := append([]string{"check", "--state-dir", h.cliState, "-j", "2", "--output-limit", "64KiB", "--junit", junit}, h.cliLimitArgs...)
	cmd := exec.Command(h.bin, append(argv, dir)...)
	cmd.Env = append(os.Environ(), append(h.env(), "GITHUB_ACTIONS=true")...)
	start := time.Now()
	out, err := cmd.Output()
	if cmd.ProcessState == nil {
		t.Fatalf("safe-run check: %v", err)
	}
	if code := cmd.ProcessState.ExitCode(); code != 1 {
		t.Fatalf("exit code %d, want 1 (the fork bomb exits 3, the forged output differs)\n%s", code, out)
	}
	t.Logf("checked in %s", time.Since(start).Round(time.Millisecond))

	data, err := os.ReadFile(junit)
	if err != nil {
		t.Fatal(err)
	}
	var suites junitSuites
	if err := xml.Unmarshal(data, &suites); err != nil {
		t.Fatalf("the JUnit report does not parse: %v", err)
	}
	if len(data) > 1<<20 {
		t.Errorf("the JUnit report is %d bytes: the output cap did not bound it", len(data))
	}
	for name, text := range map[string][]byte{"JUnit report": data, "stdout": out} {
		for _, c := range text {
			if c < 0x20 && c != '\n' && c != '\t' || c == 0x7f {
				t.Errorf("%s holds control byte %#x", name, c)
				break
			}
		}
		for _, leak := range []string{h.canaryValue, secret, shadowLine} {
			if leak != "" && strings.Contains(string(text), leak) {
				t.Errorf("%s holds a host secret %q", name, leak)
			}
		}
	}
	if suites.Tests != 5 || len(suites.Suites) != 1 || len(suites.Suites[0].Cases) != 5 {
		t.Fatalf("%d testcases in %d suites, want 5 in 1", suites.Tests, len(suites.Suites))
	}
	// The blocks in document order: fork bomb, flood, host files, files=,
	// forged output.
	cases := suites.Suites[0].Cases
	if c := cases[0]; c.Failure == nil || c.Failure.Type != "error" || c.SystemOut == nil || !strings.Contains(c.SystemOut.Text, "held at the limit") ||
		c.SystemErr == nil || !strings.Contains(c.SystemErr.Text, "Resource temporarily unavailable") {
		t.Errorf("fork bomb: failure %+v, stdout %+v, stderr %+v; want it to fail with exit code 3 after \"held at the limit\" and the process limit's EAGAIN", c.Failure, c.SystemOut, c.SystemErr)
	}
	if c := cases[1]; c.Failure != nil || c.SystemOut == nil || len(c.SystemOut.Text) > 80<<10 {
		t.Errorf("output flood: failure %+v, %d bytes of output kept", c.Failure, len(c.SystemOut.Text))
	}
	if c := cases[3]; c.Failure != nil || c.SystemOut == nil || !strings.Contains(c.SystemOut.Text, allowed) || strings.Contains(c.SystemOut.Text, "secret.txt") {
		t.Errorf("positive control: files=allowed.txt: %+v %+v", c.Failure, c.SystemOut)
	}
	if c := cases[4]; c.Failure == nil || !strings.Contains(c.Failure.Text, `\u001b]0;pwned\u0007`) {
		t.Errorf("forged output: %+v", c.Failure)
	}
	var annotations []string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "::") {
			annotations = append(annotations, line)
		}
	}
	want := []string{fmt.Sprintf("::error file=%s,line=%d,", filepath.Join(dir, "hostile.md"), cases[0].Line),
		fmt.Sprintf("::error file=%s,line=%d,", filepath.Join(dir, "hostile.md"), cases[4].Line)}
	if len(annotations) != len(want) {
		t.Errorf("annotations:\n%s\nwant two, of the fork bomb and the forged output", strings.Join(annotations, "\n"))
	} else {
		for i := range want {
			if !strings.HasPrefix(annotations[i], want[i]) {
				t.Errorf("annotation %q, want one starting %q", annotations[i], want[i])
			}
		}
	}
	h.assertHostClean(t)
}
