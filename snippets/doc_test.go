package snippets

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestDocExamples parses the examples of docs/check.md's "Document format"
// (its ````markdown blocks), so that the documentation shows what Parse and
// Match do.
func TestDocExamples(t *testing.T) {
	doc, err := os.ReadFile("../docs/check.md")
	if err != nil {
		t.Fatal(err)
	}
	examples, err := Parse("docs/check.md", doc, []string{"markdown"})
	if err != nil {
		t.Fatalf("Parse docs/check.md: %v", err)
	}
	var parsed [][]Block
	for _, ex := range examples {
		bs, err := Parse("example.md", []byte(ex.Code), langs)
		if err != nil {
			t.Fatalf("example of line %d: %v", ex.Line, err)
		}
		parsed = append(parsed, bs)
	}
	if len(parsed) != 3 {
		t.Fatalf("%d examples in docs/check.md, want 3", len(parsed))
	}
	// Attributes: two blocks of one session, the second with output.
	a := parsed[0]
	if len(a) != 2 || a[0].Attrs.Session != "demo" || a[0].Attrs.Timeout.String() != "10s" ||
		a[1].Attrs.Stdin != "data/some input.txt" || len(a[1].Attrs.Files) != 1 ||
		a[0].Expected != nil || a[1].Expected == nil || !Match(a[1].Expected.Text, "['a', 'b']\n", false) {
		t.Errorf("attributes example: %+v", a)
	}
	// Expected output: stderr regex, then stdout.
	e := parsed[1]
	if len(e) != 2 || *e[0].Attrs.Exit != 2 || !e[0].Expected.Stderr || !e[0].Expected.Regex ||
		!Match(e[0].Expected.Text, "ls: cannot access '/nonexistent': No such file or directory\n", true) ||
		e[1].Expected.Stderr || !Match(e[1].Expected.Text, "3 files\n", false) {
		t.Errorf("expected-output example: %+v", e)
	}
	// Matching: ellipses.
	var out strings.Builder
	out.WriteString("Python 3.11.2\n")
	for i := range 100 {
		out.WriteString(strconv.Itoa(i) + "\n")
	}
	out.WriteString("done\n")
	m := parsed[2]
	if len(m) != 1 || !Match(m[0].Expected.Text, out.String(), false) ||
		Match(m[0].Expected.Text, "Python 2.7\n0\ndone\n", false) {
		t.Errorf("matching example: %+v", m)
	}
}
