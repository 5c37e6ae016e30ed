package snippets

import (
	"bytes"
	"regexp"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"
)

// NormalizeOutput is output as Update writes it: LF line endings, and
// ending in exactly one "\n" unless it is empty.
func NormalizeOutput(s string) string {
	s = strings.TrimRight(strings.ReplaceAll(s, "\r\n", "\n"), "\n")
	if s == "" {
		return ""
	}
	return s + "\n"
}

// edit replaces data[start:end] with text.
type edit struct {
	start, end int
	text       string
}

// Update returns data with the expected-output blocks of blocks (as Parse
// returned them for data) holding outputs' texts. An expected block whose
// text already matches (Match, in its own mode) or, in a literal block, is
// the same text is left as it is, ellipses and all; a regex block gets each
// new line quoted as a literal expression.
// With all, a block without an expected block gets a new "output" block
// right after it (only for output that is not empty). A document nothing
// changes in comes back byte for byte; a CRLF document keeps CRLF in what
// is written.
func Update(data []byte, blocks []Block, outputs []Output, all bool) []byte {
	lines := splitLines(data)
	var edits []edit
	done := map[int]bool{}
	for _, o := range outputs {
		if o.Block < 0 || o.Block >= len(blocks) || done[o.Block] {
			continue
		}
		done[o.Block] = true
		b := blocks[o.Block]
		text := NormalizeOutput(o.Text)
		if b.Expected == nil {
			if all && text != "" {
				if e, ok := newOutputBlock(lines, b, text); ok {
					edits = append(edits, e)
				}
			}
			continue
		}
		if e, ok := replaceOutput(lines, b.Expected, text); ok {
			edits = append(edits, e)
		}
	}
	if len(edits) == 0 {
		return data
	}
	sort.Slice(edits, func(i, j int) bool { return edits[i].start < edits[j].start })
	var out bytes.Buffer
	at := 0
	for _, e := range edits {
		if e.start < at {
			continue // overlapping: blocks not from this data
		}
		out.Write(data[at:e.start])
		out.WriteString(e.text)
		at = e.end
	}
	out.Write(data[at:])
	return out.Bytes()
}

// lineAt is the index of the line starting at offset off, or -1.
func lineAt(lines []line, off int) int {
	i := sort.Search(len(lines), func(i int) bool { return lines[i].start >= off })
	if i < len(lines) && lines[i].start == off {
		return i
	}
	return -1
}

// lineEnding is the ending to write new lines of a block with: CRLF when
// its fence line has one.
func lineEnding(l line) string {
	if l.crlf {
		return "\r\n"
	}
	return "\n"
}

// render gives text's lines the indentation and line ending of a block.
func render(text string, indent int, nl string) string {
	if text == "" {
		return ""
	}
	var b strings.Builder
	for _, l := range strings.SplitAfter(strings.TrimSuffix(text, "\n"), "\n") {
		l = strings.TrimSuffix(l, "\n")
		if l != "" {
			b.WriteString(strings.Repeat(" ", indent))
		}
		b.WriteString(l)
		b.WriteString(nl)
	}
	return b.String()
}

// fenceFor is a fence of char long enough that no line of text closes it.
func fenceFor(char byte, atLeast int, text string) string {
	n := max(3, atLeast)
	for _, l := range strings.Split(text, "\n") {
		l = strings.TrimLeft(l, " ")
		k := 0
		for k < len(l) && l[k] == char {
			k++
		}
		n = max(n, k+1)
	}
	return strings.Repeat(string(char), n)
}

// replaceOutput is the edit that puts text into exp, if it needs one.
func replaceOutput(lines []line, exp *Expected, text string) (edit, bool) {
	if Match(exp.Text, text, exp.Regex) {
		return edit{}, false
	}
	// The same text is left alone too, but not in a regex block: there an
	// expression like "$" or "a+" is not a match for its own text.
	if !exp.Regex && slices.Equal(normLines(exp.Text), normLines(text)) {
		return edit{}, false
	}
	// The content runs from the line after the opening fence to the
	// closing fence's line (the same line when it is empty).
	opening, closing := lineAt(lines, exp.Start)-1, lineAt(lines, exp.End)
	if opening < 0 || closing <= opening {
		return edit{}, false // not the offsets of a block of data
	}
	f, ok := openingFence(lines[opening].text)
	if !ok {
		return edit{}, false
	}
	if exp.Regex {
		text = quoteLines(text)
	}
	nl := lineEnding(lines[opening])
	body := render(text, f.indent, nl)
	if fenceFor(f.char, f.n, text) == strings.Repeat(string(f.char), f.n) {
		return edit{exp.Start, exp.End, body}, true
	}
	// A line of text would close the fence: lengthen both fences.
	long := fenceFor(f.char, f.n, text)
	ind := strings.Repeat(" ", f.indent)
	return edit{lines[opening].start, lines[closing].end,
		ind + long + lines[opening].text[f.indent+f.n:] + nl + body + ind + long + closingEnding(lines[closing])}, true
}

// closingEnding keeps a closing fence's line ending, or its lack at the end
// of the document.
func closingEnding(l line) string {
	if l.end == l.start+len(l.text) {
		return ""
	}
	return lineEnding(l)
}

// quoteLines makes every line of text a regular expression matching it
// literally (a line "..." too: it was printed, it is not an ellipsis).
func quoteLines(text string) string {
	var b strings.Builder
	for _, l := range strings.SplitAfter(text, "\n") {
		nl := strings.HasSuffix(l, "\n")
		l = strings.TrimSuffix(l, "\n")
		for l != "" {
			r, n := utf8.DecodeRuneInString(l)
			if r == utf8.RuneError && n == 1 {
				// Matching reads an invalid byte as U+FFFD; an
				// expression may not hold one.
				b.WriteString(`\x{FFFD}`)
			} else {
				b.WriteString(regexp.QuoteMeta(l[:n]))
			}
			l = l[n:]
		}
		if nl {
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// newOutputBlock is the edit that inserts an output block after b.
func newOutputBlock(lines []line, b Block, text string) (edit, bool) {
	opening := b.Line - 1
	if opening < 0 || opening >= len(lines) {
		return edit{}, false
	}
	f, ok := openingFence(lines[opening].text)
	if !ok {
		return edit{}, false
	}
	closing := opening + 1
	for closing < len(lines) && !f.closes(lines[closing].text) {
		closing++
	}
	if closing == len(lines) {
		return edit{}, false
	}
	nl := lineEnding(lines[opening])
	ind := strings.Repeat(" ", f.indent)
	fe := fenceFor(f.char, 3, text)
	var s strings.Builder
	if closingEnding(lines[closing]) == "" {
		s.WriteString(nl) // the block ends the document without a newline
	}
	s.WriteString(nl)
	s.WriteString(ind + fe + OutputInfo + nl)
	s.WriteString(render(text, f.indent, nl))
	s.WriteString(ind + fe + nl)
	at := lines[closing].end
	return edit{at, at, s.String()}, true
}
