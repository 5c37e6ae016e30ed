package snippets

import (
	"fmt"
	"regexp"
	"strings"
)

// ellipsis, as a line of its own, matches any number of lines; inside a
// line (not in regex mode) it matches any run of characters of that line.
const ellipsis = "..."

// normLines cuts text into lines for comparing: CRLF as LF, trailing spaces,
// tabs and carriage returns of each line dropped, final empty lines dropped.
func normLines(s string) []string {
	s = strings.ReplaceAll(s, "\r\n", "\n")
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimRight(l, " \t\r")
	}
	for len(lines) > 0 && lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	return lines
}

// lineMatcher compares one expected line with lines of output.
type lineMatcher struct {
	want  string
	parts []string       // want cut at each "...", when it has one
	re    *regexp.Regexp // in regex mode, the whole-line expression
}

func newLineMatcher(want string, regex bool) lineMatcher {
	m := lineMatcher{want: want}
	if regex {
		// Parse refuses bad expressions; one that got here anyway is
		// compared as text rather than matching everything.
		m.re, _ = regexp.Compile(`^(?:` + want + `)$`)
	} else if strings.Contains(want, ellipsis) {
		m.parts = strings.Split(want, ellipsis)
	}
	return m
}

func (m lineMatcher) match(got string) bool {
	switch {
	case m.re != nil:
		return m.re.MatchString(got)
	case m.parts == nil:
		return m.want == got
	}
	first, last := m.parts[0], m.parts[len(m.parts)-1]
	if len(first)+len(last) > len(got) || !strings.HasPrefix(got, first) || !strings.HasSuffix(got, last) {
		return false
	}
	mid := got[len(first) : len(got)-len(last)]
	for _, p := range m.parts[1 : len(m.parts)-1] {
		i := strings.Index(mid, p)
		if i < 0 {
			return false
		}
		mid = mid[i+len(p):]
	}
	return true
}

// Match reports whether got is what want says: line by line, ignoring
// trailing whitespace on each line and final newlines, where a line that is
// exactly "..." matches any number of lines (none included) and "..." inside
// a line matches any run of characters within that line. With regex, every
// other expected line is an RE2 expression that must match a whole line.
func Match(want, got string, regex bool) bool {
	w, g := normLines(want), normLines(got)
	// ok[j]: the expected lines so far match the first j lines of got.
	ok := make([]bool, len(g)+1)
	ok[0] = true
	next := make([]bool, len(g)+1)
	for _, wl := range w {
		if wl == ellipsis {
			for j := 1; j <= len(g); j++ {
				ok[j] = ok[j] || ok[j-1]
			}
			continue
		}
		m := newLineMatcher(wl, regex)
		next[0] = false
		any := false
		for j := 1; j <= len(g); j++ {
			next[j] = ok[j-1] && m.match(g[j-1])
			any = any || next[j]
		}
		if !any {
			return false
		}
		ok, next = next, ok
	}
	return ok[len(g)]
}

// diffContext is how many unchanged lines a hunk shows around a change.
const diffContext = 3

// maxLCS bounds the table of the longest common subsequence between the
// lines the two sides share at their start and end; past it, Diff shows
// those middle lines of want removed and of got added rather than using
// memory the size of a flood of output.
const maxLCS = 1 << 22

// Diff returns a unified diff from want (---, the expected output) to got
// (+++, the actual output), of their lines as Match sees them; an expected
// line with "..." inside it counts as equal to a line it matches. It returns
// "" when the two have the same lines.
func Diff(want, got string) string { return diff(want, got, false) }

// DiffRegex is Diff for an expected block of regular expressions: a line
// that matches its expression counts as equal to it.
func DiffRegex(want, got string) string { return diff(want, got, true) }

func diff(want, got string, regex bool) string {
	w, g := normLines(want), normLines(got)
	ops := editScript(w, g, regex)
	changed := false
	for _, o := range ops {
		changed = changed || o.kind != ' '
	}
	if !changed {
		return ""
	}
	var b strings.Builder
	b.WriteString("--- expected\n+++ actual\n")
	for i := 0; i < len(ops); {
		// A hunk: from diffContext lines before a change to diffContext
		// lines after the last change that is no further than
		// 2*diffContext unchanged lines from the one before.
		if ops[i].kind == ' ' {
			i++
			continue
		}
		start := max(0, i-diffContext)
		end := i
		for j := i; j < len(ops); j++ {
			if ops[j].kind != ' ' {
				end = j + 1
			} else if j-end >= 2*diffContext {
				break
			}
		}
		stop := min(len(ops), end+diffContext)
		writeHunk(&b, ops[start:stop])
		i = stop
	}
	return b.String()
}

// op is one line of an edit script: ' ' kept, '-' only in want, '+' only in
// got; a and b are its 1-based line numbers in want and got (the line
// before, for a line the other side lacks).
type op struct {
	kind byte
	text string
	a, b int
}

// editScript is the shortest edit from w to g, by longest common
// subsequence; an expected line equals a line it matches. Lines the two
// share at the start and at the end are kept before the table is built:
// a pair of equal first (or last) lines is always part of some longest
// common subsequence, and the trim keeps a long output that differs from
// its expectation in a few lines within maxLCS.
func editScript(w, g []string, regex bool) []op {
	eq := make([]lineMatcher, len(w))
	for i, l := range w {
		eq[i] = newLineMatcher(l, regex)
	}
	same := func(i, j int) bool { return w[i] != ellipsis && eq[i].match(g[j]) }
	head := 0
	for head < len(w) && head < len(g) && same(head, head) {
		head++
	}
	tail := 0
	for tail < len(w)-head && tail < len(g)-head && same(len(w)-1-tail, len(g)-1-tail) {
		tail++
	}
	ops := make([]op, 0, len(w)+len(g)-head-tail)
	for i := 0; i < head; i++ {
		ops = append(ops, op{' ', g[i], i + 1, i + 1})
	}
	ops = middleScript(ops, w[:len(w)-tail], g[:len(g)-tail], head, same)
	for k := tail; k > 0; k-- {
		i, j := len(w)-k, len(g)-k
		ops = append(ops, op{' ', g[j], i + 1, j + 1})
	}
	return ops
}

// middleScript appends to ops the edit from w[from:] to g[from:], the part
// between the shared head and tail.
func middleScript(ops []op, w, g []string, from int, same func(i, j int) bool) []op {
	n, m := len(w)-from, len(g)-from
	if n*m > maxLCS {
		for i := from; i < len(w); i++ {
			ops = append(ops, op{'-', w[i], i + 1, from})
		}
		for j := from; j < len(g); j++ {
			ops = append(ops, op{'+', g[j], len(w), j + 1})
		}
		return ops
	}
	// lcs[i][j]: the longest common subsequence of w[from+i:] and g[from+j:].
	lcs := make([][]int, n+1)
	for i := range lcs {
		lcs[i] = make([]int, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if same(from+i, from+j) {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	i, j := 0, 0
	for i < n || j < m {
		a, b := from+i, from+j
		switch {
		case i < n && j < m && same(a, b) && lcs[i][j] == lcs[i+1][j+1]+1:
			ops = append(ops, op{' ', g[b], a + 1, b + 1})
			i, j = i+1, j+1
		case j == m || (i < n && lcs[i+1][j] >= lcs[i][j+1]):
			ops = append(ops, op{'-', w[a], a + 1, b})
			i++
		default:
			ops = append(ops, op{'+', g[b], a, b + 1})
			j++
		}
	}
	return ops
}

// writeHunk writes one "@@ -a,n +b,m @@" hunk of ops.
func writeHunk(b *strings.Builder, ops []op) {
	na, nb := 0, 0
	a, bb := -1, -1
	for _, o := range ops {
		if o.kind != '+' {
			na++
			if a < 0 {
				a = o.a
			}
		}
		if o.kind != '-' {
			nb++
			if bb < 0 {
				bb = o.b
			}
		}
	}
	// A side with no lines in the hunk names the line before it.
	if a < 0 {
		a = ops[0].a
	}
	if bb < 0 {
		bb = ops[0].b
	}
	fmt.Fprintf(b, "@@ -%s +%s @@\n", hunkRange(a, na), hunkRange(bb, nb))
	for _, o := range ops {
		b.WriteByte(o.kind)
		b.WriteString(o.text)
		b.WriteByte('\n')
	}
}

// hunkRange is "start,count", or "start" alone for one line, as diff -u.
func hunkRange(start, n int) string {
	if n == 1 {
		return fmt.Sprint(start)
	}
	return fmt.Sprintf("%d,%d", start, n)
}
