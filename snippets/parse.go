package snippets

import (
	"bytes"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// aliases are the usual other names of the built-in languages; an alias
// counts only when its target is configured.
var aliases = map[string]string{
	"py": "python", "python3": "python",
	"js": "node", "javascript": "node",
	"sh": "bash", "shell": "bash",
}

// OutputInfo is the first word of an expected-output block's info string.
const OutputInfo = "output"

// line is one line of a document: its text without the line ending, and
// where it is, so that Update can rewrite bytes of the original.
type line struct {
	text  string // without "\n" or "\r\n"
	start int    // offset of its first byte
	end   int    // offset just past its line ending
	crlf  bool   // it ended in "\r\n"
}

// splitLines cuts data into lines; a last line without an ending counts.
func splitLines(data []byte) []line {
	var lines []line
	for off := 0; off < len(data); {
		i := bytes.IndexByte(data[off:], '\n')
		l := line{start: off}
		if i < 0 {
			l.text, l.end = string(data[off:]), len(data)
		} else {
			l.text, l.end = string(data[off:off+i]), off+i+1
			if strings.HasSuffix(l.text, "\r") {
				l.text, l.crlf = l.text[:len(l.text)-1], true
			}
		}
		lines = append(lines, l)
		off = l.end
	}
	return lines
}

// fence is an opening code fence.
type fence struct {
	indent int    // spaces before it (0-3)
	char   byte   // '`' or '~'
	n      int    // its length (3 or more)
	info   string // its info string, trimmed
}

// leadingSpaces counts the spaces a line starts with.
func leadingSpaces(s string) int {
	n := 0
	for n < len(s) && s[n] == ' ' {
		n++
	}
	return n
}

// openingFence reports whether s opens a fenced code block (CommonMark:
// up to 3 spaces, then 3 or more backticks or tildes; a backtick fence's
// info string holds no backtick).
func openingFence(s string) (fence, bool) {
	ind := leadingSpaces(s)
	if ind > 3 || ind >= len(s) || (s[ind] != '`' && s[ind] != '~') {
		return fence{}, false
	}
	c := s[ind]
	n := 0
	for ind+n < len(s) && s[ind+n] == c {
		n++
	}
	if n < 3 {
		return fence{}, false
	}
	info := strings.TrimSpace(s[ind+n:])
	if c == '`' && strings.Contains(info, "`") {
		return fence{}, false
	}
	return fence{indent: ind, char: c, n: n, info: info}, true
}

// closes reports whether s closes the block f opened: up to 3 spaces, at
// least as many of the same character, then only spaces or tabs.
func (f fence) closes(s string) bool {
	ind := leadingSpaces(s)
	if ind > 3 {
		return false
	}
	n := 0
	for ind+n < len(s) && s[ind+n] == f.char {
		n++
	}
	return n >= f.n && strings.Trim(s[ind+n:], " \t") == ""
}

// stripIndent removes up to n leading spaces, as CommonMark does to the
// content lines of a fence indented by n.
func stripIndent(s string, n int) string {
	return s[min(leadingSpaces(s), n):]
}

// Parse returns the blocks of a Markdown document that are tests: the fenced
// code blocks whose info string's first word is one of languages (or an
// alias of one), each with its attributes and the expected-output block
// that follows it. path only names the document in errors. An unterminated
// fence, an unknown attribute or a bad value is an *Error with its line.
func Parse(path string, data []byte, languages []string) ([]Block, error) {
	p := parser{path: path, langs: map[string]string{}}
	for _, l := range languages {
		p.langs[l] = l
	}
	for a, t := range aliases {
		if _, ok := p.langs[t]; ok {
			if _, own := p.langs[a]; !own {
				p.langs[a] = t
			}
		}
	}
	lines := splitLines(data)
	// prev is what the last fenced block was, while only blank lines
	// followed it: an output block attaches to a test block there.
	const (
		prevNone = iota
		prevTest
		prevOther
		prevOutput
	)
	prev, prevLine := prevNone, 0
	for i := 0; i < len(lines); i++ {
		f, ok := openingFence(lines[i].text)
		if !ok {
			if strings.TrimSpace(lines[i].text) != "" {
				prev = prevNone
			}
			continue
		}
		open := i
		var code strings.Builder
		for i++; i < len(lines) && !f.closes(lines[i].text); i++ {
			code.WriteString(stripIndent(lines[i].text, f.indent))
			code.WriteByte('\n')
		}
		if i == len(lines) {
			return nil, p.errorf(open+1, "unterminated code fence %s: close it with a line of at least %d %q", strings.Repeat(string(f.char), f.n), f.n, string(f.char))
		}
		word, rest := f.info, ""
		if k := strings.IndexAny(word, " \t"); k >= 0 {
			word, rest = word[:k], word[k:]
		}
		word = strings.ToLower(word)
		if word == OutputInfo {
			exp, err := p.outputBlock(open+1, strings.TrimSpace(rest), code.String())
			if err != nil {
				return nil, err
			}
			exp.Start, exp.End = lines[open].end, lines[i].start
			switch prev {
			case prevTest:
				p.blocks[len(p.blocks)-1].Expected = exp
				prev = prevOutput
			case prevOther:
				// The output of a block in a language not checked here.
				prev = prevOutput
			case prevOutput:
				return nil, p.errorf(open+1, "a second output block after the block of line %d: a block has one expected output (use \"output stderr\" alone to compare stderr)", prevLine)
			default:
				return nil, p.errorf(open+1, "output block follows no code block: put it right after the block whose output it shows, with only blank lines between")
			}
			continue
		}
		lang, ok := p.langs[word]
		if !ok {
			prev, prevLine = prevOther, open+1
			continue
		}
		attrs, err := p.attributes(open+1, rest)
		if err != nil {
			return nil, err
		}
		p.blocks = append(p.blocks, Block{Line: open + 1, Language: lang, Code: code.String(), Attrs: attrs})
		prev, prevLine = prevTest, open+1
	}
	return p.blocks, nil
}

// parser is the state of one Parse.
type parser struct {
	path   string
	langs  map[string]string // name or alias → configured language
	blocks []Block
}

func (p *parser) errorf(line int, format string, args ...any) error {
	return &Error{Path: p.path, Line: line, Msg: fmt.Sprintf(format, args...)}
}

// outputBlock reads an expected-output block: its info string after
// "output" holds the flags stderr and regex.
func (p *parser) outputBlock(lineNo int, flags, text string) (*Expected, error) {
	exp := &Expected{Line: lineNo, Text: text}
	for _, f := range strings.Fields(flags) {
		switch f {
		case "stderr":
			exp.Stderr = true
		case "regex":
			exp.Regex = true
		default:
			return nil, p.errorf(lineNo, "unknown output flag %q: an output block takes \"stderr\" and \"regex\"", f)
		}
	}
	if exp.Regex {
		for k, l := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
			l = strings.TrimRight(l, " \t\r")
			if l == ellipsis {
				continue
			}
			if _, err := regexp.Compile(l); err != nil {
				return nil, p.errorf(lineNo+1+k, "bad regular expression %q: %v", l, err)
			}
		}
	}
	return exp, nil
}

// sessionName is what a session= name may be made of.
var sessionName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)

// attributes parses the info string after the language word.
func (p *parser) attributes(lineNo int, s string) (Attrs, error) {
	var a Attrs
	toks, err := splitAttrs(s)
	if err != nil {
		return a, p.errorf(lineNo, "%v", err)
	}
	seen := map[string]bool{}
	for _, t := range toks {
		if seen[t.key] {
			return a, p.errorf(lineNo, "attribute %s given twice", t.key)
		}
		seen[t.key] = true
		flag := func() error {
			if t.hasValue {
				return p.errorf(lineNo, "attribute %s takes no value: write %s alone", t.key, t.key)
			}
			return nil
		}
		value := func(what string) error {
			if !t.hasValue || t.value == "" {
				return p.errorf(lineNo, "attribute %s needs a value: %s=%s", t.key, t.key, what)
			}
			return nil
		}
		local := func(f string) error {
			if !filepath.IsLocal(f) {
				return p.errorf(lineNo, "%s=%s: name a file inside the document's directory, by a relative path without ..", t.key, f)
			}
			return nil
		}
		switch t.key {
		case "skip":
			if err := flag(); err != nil {
				return a, err
			}
			a.Skip = true
		case "should-fail":
			if err := flag(); err != nil {
				return a, err
			}
			a.ShouldFail = true
		case "exit":
			if err := value("N"); err != nil {
				return a, err
			}
			n, err := strconv.Atoi(t.value)
			if err != nil || n < 0 || n > 255 {
				return a, p.errorf(lineNo, "exit=%s: an exit code is a number from 0 to 255", t.value)
			}
			a.Exit = &n
		case "timeout":
			if err := value("30s"); err != nil {
				return a, err
			}
			d, err := time.ParseDuration(t.value)
			if err != nil || d <= 0 {
				return a, p.errorf(lineNo, "timeout=%s: a positive duration with a unit, such as 30s or 2m", t.value)
			}
			a.Timeout = d
		case "session":
			if err := value("NAME"); err != nil {
				return a, err
			}
			if !sessionName.MatchString(t.value) {
				return a, p.errorf(lineNo, "session=%s: a session name is letters, digits, '_', '.' and '-'", t.value)
			}
			a.Session = t.value
		case "stdin":
			if err := value("FILE"); err != nil {
				return a, err
			}
			if err := local(t.value); err != nil {
				return a, err
			}
			a.Stdin = t.value
		case "files":
			if err := value("a.csv,b.json"); err != nil {
				return a, err
			}
			for _, f := range strings.Split(t.value, ",") {
				if f == "" {
					return a, p.errorf(lineNo, "files=%s: an empty file name (separate names by single commas)", t.value)
				}
				if err := local(f); err != nil {
					return a, err
				}
				a.Files = append(a.Files, f)
			}
		case "image":
			if err := value("REF"); err != nil {
				return a, err
			}
			a.Image = t.value
		case "network":
			if err := value("pypi,api.example.com:443"); err != nil {
				return a, err
			}
			for _, e := range strings.Split(t.value, ",") {
				if e == "" {
					return a, p.errorf(lineNo, "network=%s: an empty entry (separate entries by single commas)", t.value)
				}
				a.Network = append(a.Network, e)
			}
		default:
			return a, p.errorf(lineNo, "unknown attribute %q: known are skip, should-fail, exit=N, timeout=DURATION, session=NAME, stdin=FILE, files=A,B, image=REF, network=ENTRY,...", t.key)
		}
	}
	if a.ShouldFail && a.Exit != nil && *a.Exit == 0 {
		return a, p.errorf(lineNo, "should-fail and exit=0 contradict each other: keep one")
	}
	return a, nil
}

// attr is one attribute of an info string: a flag or key=value.
type attr struct {
	key, value string
	hasValue   bool
}

// splitAttrs cuts an info string into attributes separated by spaces or
// tabs; a value may be quoted with "..." (backslash escapes " and \) or
// '...' (no escapes) to hold spaces.
func splitAttrs(s string) ([]attr, error) {
	var out []attr
	for {
		s = strings.TrimLeft(s, " \t")
		if s == "" {
			return out, nil
		}
		end := strings.IndexAny(s, " \t=")
		if end < 0 {
			end = len(s)
		}
		a := attr{key: s[:end]}
		if a.key == "" {
			return nil, fmt.Errorf("attribute without a name before '=': write key=value")
		}
		s = s[end:]
		if strings.HasPrefix(s, "=") {
			a.hasValue = true
			s = s[1:]
			switch {
			case strings.HasPrefix(s, `"`):
				var b strings.Builder
				i := 1
				for ; i < len(s) && s[i] != '"'; i++ {
					if s[i] == '\\' && i+1 < len(s) {
						i++
					}
					b.WriteByte(s[i])
				}
				if i == len(s) {
					return nil, fmt.Errorf("attribute %s: unterminated \" quote", a.key)
				}
				a.value, s = b.String(), s[i+1:]
			case strings.HasPrefix(s, "'"):
				i := strings.IndexByte(s[1:], '\'')
				if i < 0 {
					return nil, fmt.Errorf("attribute %s: unterminated ' quote", a.key)
				}
				a.value, s = s[1:1+i], s[2+i:]
			default:
				end := strings.IndexAny(s, " \t")
				if end < 0 {
					end = len(s)
				}
				a.value, s = s[:end], s[end:]
			}
			if s != "" && s[0] != ' ' && s[0] != '\t' {
				return nil, fmt.Errorf("attribute %s: put a space after its quoted value", a.key)
			}
		}
		out = append(out, a)
	}
}
