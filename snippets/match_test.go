package snippets

import (
	"strings"
	"testing"
)

func TestMatch(t *testing.T) {
	for _, tc := range []struct {
		name      string
		want, got string
		regex     bool
		ok        bool
	}{
		{"equal", "a\nb\n", "a\nb\n", false, true},
		{"different", "a\nb\n", "a\nc\n", false, false},
		{"final newlines ignored", "a\n", "a", false, true},
		{"several final newlines ignored", "a\n\n\n", "a\n", false, true},
		{"trailing whitespace ignored", "a  \nb\t\n", "a\nb   \n", false, true},
		{"CRLF output", "a\nb\n", "a\r\nb\r\n", false, true},
		{"leading whitespace counts", "  a\n", "a\n", false, false},
		{"blank lines inside count", "a\n\nb\n", "a\nb\n", false, false},
		{"empty wants nothing", "", "", false, true},
		{"empty wants nothing, got something", "", "x\n", false, false},
		{"missing line", "a\nb\n", "a\n", false, false},
		{"extra line", "a\n", "a\nb\n", false, false},
		{"ellipsis line: many lines", "start\n...\nend\n", "start\n1\n2\n3\nend\n", false, true},
		{"ellipsis line: no lines", "start\n...\nend\n", "start\nend\n", false, true},
		{"ellipsis line: still needs the end", "start\n...\nend\n", "start\n1\n", false, false},
		{"ellipsis line at the start", "...\nend\n", "x\ny\nend\n", false, true},
		{"ellipsis line at the end", "a\n...\n", "a\nb\nc\n", false, true},
		{"ellipsis line alone matches nothing too", "...\n", "", false, true},
		{"ellipsis line with trailing spaces", "a\n...  \nb\n", "a\nx\nb\n", false, true},
		{"indented ellipsis is not the line ellipsis", "a\n  ...\nb\n", "a\nx\ny\nb\n", false, false},
		{"two ellipsis lines", "...\nmid\n...\n", "a\nmid\nb\n", false, true},
		{"ellipsis line backtracks", "...\na\nb\n", "a\na\nb\n", false, true},
		{"inline ellipsis", "id: ...\n", "id: 42\n", false, true},
		{"inline ellipsis matches empty", "id: ...!\n", "id: !\n", false, true},
		{"inline ellipsis within one line only", "a...b\n", "a\nb\n", false, false},
		{"inline ellipsis, several", "<object at ...> in ... s\n", "<object at 0x7f> in 0.3 s\n", false, true},
		{"inline ellipsis, order matters", "a...b...c\n", "acb\n", false, false},
		{"inline ellipsis, overlapping prefix and suffix", "ab...ba\n", "aba\n", false, false},
		{"regex", "count: [0-9]+\n", "count: 12\n", true, true},
		{"regex is the whole line", "[0-9]+\n", "count: 12\n", true, false},
		{"regex alternatives anchored as a whole", "a|b\n", "ab\n", true, false},
		{"regex with ellipsis line", "first\n...\nlast .*\n", "first\nx\nlast line\n", true, true},
		{"regex: dots are regex dots", "a.c\n", "abc\n", true, true},
		{"regex: trailing whitespace of output ignored", "a+\n", "aaa  \n", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Match(tc.want, tc.got, tc.regex); got != tc.ok {
				t.Errorf("Match(%q, %q, %v) = %v, want %v", tc.want, tc.got, tc.regex, got, tc.ok)
			}
		})
	}
}

func TestDiff(t *testing.T) {
	for _, tc := range []struct {
		name      string
		want, got string
		diff      string
	}{
		{"same", "a\nb\n", "a\nb  \n\n", ""},
		{"one line changed", "a\nb\nc\n", "a\nx\nc\n",
			"--- expected\n+++ actual\n@@ -1,3 +1,3 @@\n a\n-b\n+x\n c\n"},
		{"line added at the end", "a\n", "a\nb\n",
			"--- expected\n+++ actual\n@@ -1 +1,2 @@\n a\n+b\n"},
		{"nothing expected", "", "out\n",
			"--- expected\n+++ actual\n@@ -0,0 +1 @@\n+out\n"},
		{"nothing printed", "out\n", "",
			"--- expected\n+++ actual\n@@ -1 +0,0 @@\n-out\n"},
		{"two hunks, context of three",
			"1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n11\n12\n", "1\nX\n3\n4\n5\n6\n7\n8\n9\n10\nY\n12\n",
			"--- expected\n+++ actual\n@@ -1,5 +1,5 @@\n 1\n-2\n+X\n 3\n 4\n 5\n@@ -8,5 +8,5 @@\n 8\n 9\n 10\n-11\n+Y\n 12\n"},
		{"changes six lines apart share a hunk",
			"1\n2\n3\n4\n5\n6\n7\n8\n9\n", "X\n2\n3\n4\n5\n6\n7\nY\n9\n",
			"--- expected\n+++ actual\n@@ -1,9 +1,9 @@\n-1\n+X\n 2\n 3\n 4\n 5\n 6\n 7\n-8\n+Y\n 9\n"},
		{"an inline ellipsis line that matches is context", "id: ...\nok\n", "id: 7\nfail\n",
			"--- expected\n+++ actual\n@@ -1,2 +1,2 @@\n id: 7\n-ok\n+fail\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Diff(tc.want, tc.got); got != tc.diff {
				t.Errorf("Diff(%q, %q):\n%s\nwant:\n%s", tc.want, tc.got, got, tc.diff)
			}
		})
	}
}

// TestDiffLarge checks that a flood of output past the LCS bound still
// gives a diff naming every line, without the table.
func TestDiffLarge(t *testing.T) {
	want := strings.Repeat("w\n", 3000)
	got := strings.Repeat("g\n", 3000)
	d := Diff(want, got)
	if !strings.HasPrefix(d, "--- expected\n+++ actual\n@@ -1,3000 +1,3000 @@\n-w\n") ||
		strings.Count(d, "\n-w") != 3000 || strings.Count(d, "\n+g") != 3000 {
		t.Errorf("Diff of 3000 lines: %.200q...", d)
	}
	// Past the table's bound, the lines both sides share at the start and
	// the end still count as equal: a long output against itself has no
	// diff, and one changed line shows as one hunk.
	long := strings.Repeat("same\n", 3000)
	if d := Diff(long, long); d != "" {
		t.Errorf("Diff of 3000 equal lines with themselves: %.200q...", d)
	}
	changed := strings.Repeat("same\n", 1500) + "other\n" + strings.Repeat("same\n", 1499)
	const one = "--- expected\n+++ actual\n@@ -1498,7 +1498,7 @@\n same\n same\n same\n-same\n+other\n same\n same\n same\n"
	if d := Diff(long, changed); d != one {
		t.Errorf("Diff of 3000 lines with line 1501 changed:\n%s\nwant:\n%s", d, one)
	}
}

func TestDiffRegex(t *testing.T) {
	want := "took [0-9.]+s\nresult: ok\n"
	got := "took 0.25s\nresult: failed\n"
	const d = "--- expected\n+++ actual\n@@ -1,2 +1,2 @@\n took 0.25s\n-result: ok\n+result: failed\n"
	if s := DiffRegex(want, got); s != d {
		t.Errorf("DiffRegex:\n%s\nwant:\n%s", s, d)
	}
	if s := DiffRegex("a+\n", "aaa\n"); s != "" {
		t.Errorf("DiffRegex of a match: %q", s)
	}
}
