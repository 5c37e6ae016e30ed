package snippets

import (
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/safe-run/safe-run/sandbox"
)

var langs = []string{"python", "node", "bash"}

func intp(n int) *int { return &n }

// blockSummary is what the table compares of a block.
type blockSummary struct {
	Line     int
	Language string
	Code     string
	Attrs    Attrs
	Expected string // its Text, or "<none>"
	ExpLine  int
	Stderr   bool
	Regex    bool
}

func summarize(bs []Block) []blockSummary {
	var out []blockSummary
	for _, b := range bs {
		s := blockSummary{Line: b.Line, Language: b.Language, Code: b.Code, Attrs: b.Attrs, Expected: "<none>"}
		if e := b.Expected; e != nil {
			s.Expected, s.ExpLine, s.Stderr, s.Regex = e.Text, e.Line, e.Stderr, e.Regex
		}
		out = append(out, s)
	}
	return out
}

func TestParseFences(t *testing.T) {
	for _, tc := range []struct {
		name  string
		doc   string
		langs []string // nil: langs
		want  []blockSummary
	}{
		{"backticks", "text\n\n```python\nprint(1)\n```\n",
			nil, []blockSummary{{Line: 3, Language: "python", Code: "print(1)\n", Expected: "<none>"}}},
		{"tildes", "~~~bash\necho hi\n~~~\n",
			nil, []blockSummary{{Line: 1, Language: "bash", Code: "echo hi\n", Expected: "<none>"}}},
		{"longer fence, shorter fences inside are content", "````python\n```\nx = 1\n```\n````\n",
			nil, []blockSummary{{Line: 1, Language: "python", Code: "```\nx = 1\n```\n", Expected: "<none>"}}},
		{"closing fence longer than opening", "```bash\necho\n`````\n",
			nil, []blockSummary{{Line: 1, Language: "bash", Code: "echo\n", Expected: "<none>"}}},
		{"closing fence of the other character is content", "~~~bash\n```\necho\n~~~\n",
			nil, []blockSummary{{Line: 1, Language: "bash", Code: "```\necho\n", Expected: "<none>"}}},
		{"closing fence with trailing spaces", "```bash\necho\n```  \t\n",
			nil, []blockSummary{{Line: 1, Language: "bash", Code: "echo\n", Expected: "<none>"}}},
		{"a fence with text after it does not close", "```bash\n``` x\n```\n",
			nil, []blockSummary{{Line: 1, Language: "bash", Code: "``` x\n", Expected: "<none>"}}},
		{"indented fence: indentation stripped from content", "  ```bash\n  echo a\n    echo b\n echo c\n  ```\n",
			nil, []blockSummary{{Line: 1, Language: "bash", Code: "echo a\n  echo b\necho c\n", Expected: "<none>"}}},
		{"indented code is ignored", "para\n\n    ```python\n    print(1)\n    ```\n",
			nil, nil},
		{"CRLF", "```python\r\nprint(1)\r\n```\r\n\r\n```output\r\n1\r\n```\r\n",
			nil, []blockSummary{{Line: 1, Language: "python", Code: "print(1)\n", Expected: "1\n", ExpLine: 5}}},
		{"empty block", "```bash\n```\n",
			nil, []blockSummary{{Line: 1, Language: "bash", Code: "", Expected: "<none>"}}},
		{"last line without a newline", "```bash\necho\n```",
			nil, []blockSummary{{Line: 1, Language: "bash", Code: "echo\n", Expected: "<none>"}}},
		{"unconfigured and unnamed blocks ignored", "```ruby\nputs 1\n```\n```\nplain\n```\n```bash\necho\n```\n",
			nil, []blockSummary{{Line: 7, Language: "bash", Code: "echo\n", Expected: "<none>"}}},
		{"aliases", "```py\na\n```\n```python3\nb\n```\n```js\nc\n```\n```javascript\nd\n```\n```sh\ne\n```\n```shell\nf\n```\n",
			nil, []blockSummary{
				{Line: 1, Language: "python", Code: "a\n", Expected: "<none>"},
				{Line: 4, Language: "python", Code: "b\n", Expected: "<none>"},
				{Line: 7, Language: "node", Code: "c\n", Expected: "<none>"},
				{Line: 10, Language: "node", Code: "d\n", Expected: "<none>"},
				{Line: 13, Language: "bash", Code: "e\n", Expected: "<none>"},
				{Line: 16, Language: "bash", Code: "f\n", Expected: "<none>"},
			}},
		{"an alias counts only when its target is configured", "```py\na\n```\n```sh\nb\n```\n",
			[]string{"bash"}, []blockSummary{{Line: 4, Language: "bash", Code: "b\n", Expected: "<none>"}}},
		{"a configured name wins over an alias", "```python3\na\n```\n",
			[]string{"python", "python3"}, []blockSummary{{Line: 1, Language: "python3", Code: "a\n", Expected: "<none>"}}},
		{"an extra configured language", "```ruby\nputs 1\n```\n",
			[]string{"ruby"}, []blockSummary{{Line: 1, Language: "ruby", Code: "puts 1\n", Expected: "<none>"}}},
		{"language word is case-insensitive", "```Python\na\n```\n",
			nil, []blockSummary{{Line: 1, Language: "python", Code: "a\n", Expected: "<none>"}}},
		{"a backtick fence with a backtick in its info string is not a fence", "```python `x`\n```python\na\n```\n",
			nil, []blockSummary{{Line: 2, Language: "python", Code: "a\n", Expected: "<none>"}}},
		{"output right after", "```python\nprint(1)\n```\n```output\n1\n```\n",
			nil, []blockSummary{{Line: 1, Language: "python", Code: "print(1)\n", Expected: "1\n", ExpLine: 4}}},
		{"output after blank lines, stderr and regex", "```python\nx\n```\n\n  \n~~~~output stderr regex\nTrace.*\n~~~~\n",
			nil, []blockSummary{{Line: 1, Language: "python", Code: "x\n", Expected: "Trace.*\n", ExpLine: 6, Stderr: true, Regex: true}}},
		{"empty output block: prints nothing", "```bash\ntrue\n```\n```output\n```\n",
			nil, []blockSummary{{Line: 1, Language: "bash", Code: "true\n", Expected: "", ExpLine: 4}}},
		{"output after text is not attached to the block", "```bash\ntrue\n```\ntext\n\n```bash\necho\n```\n```output\n\n```\n",
			nil, []blockSummary{
				{Line: 1, Language: "bash", Code: "true\n", Expected: "<none>"},
				{Line: 6, Language: "bash", Code: "echo\n", Expected: "\n", ExpLine: 9},
			}},
		{"output of an unconfigured block is ignored with it", "```ruby\nputs 1\n```\n```output\n1\n```\n",
			nil, nil},
		{"attributes", "```python skip should-fail exit=3 timeout=1m30s session=s1 stdin=in.txt files=a.csv,sub/b.json image=python:3.12\n```\n",
			nil, []blockSummary{{Line: 1, Language: "python", Expected: "<none>", Attrs: Attrs{
				Skip: true, ShouldFail: true, Exit: intp(3), Timeout: 90 * time.Second, Session: "s1",
				Stdin: "in.txt", Files: []string{"a.csv", "sub/b.json"}, Image: "python:3.12"}}}},
		{"quoted values and tabs", "```bash\tstdin=\"my file.txt\"\tfiles='a b.csv' image=\"x\\\"y\"\n```\n",
			nil, []blockSummary{{Line: 1, Language: "bash", Expected: "<none>", Attrs: Attrs{
				Stdin: "my file.txt", Files: []string{"a b.csv"}, Image: `x"y`}}}},
		{"network", "```python network=pypi,mirror.test=127.0.0.1:8443\n```\n",
			nil, []blockSummary{{Line: 1, Language: "python", Expected: "<none>", Attrs: Attrs{Network: []string{"pypi", "mirror.test=127.0.0.1:8443"}}}}},
		{"exit=0", "```bash exit=0\n```\n",
			nil, []blockSummary{{Line: 1, Language: "bash", Expected: "<none>", Attrs: Attrs{Exit: intp(0)}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := tc.langs
			if l == nil {
				l = langs
			}
			bs, err := Parse("doc.md", []byte(tc.doc), l)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if got := summarize(bs); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Parse:\n got %+v\nwant %+v", got, tc.want)
			}
			for _, b := range bs {
				if e := b.Expected; e != nil {
					raw := strings.ReplaceAll(tc.doc[e.Start:e.End], "\r\n", "\n")
					if raw != e.Text {
						t.Errorf("doc[Start:End] = %q, Text %q", raw, e.Text)
					}
				}
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		doc  string
		line int
		msg  string // a part of the message
	}{
		{"unterminated fence", "text\n\n```python\nprint(1)\n", 3, "unterminated code fence ```"},
		{"unterminated by a shorter fence", "````bash\necho\n```\n", 1, "at least 4"},
		{"unterminated by the other character", "~~~bash\necho\n```\n", 1, "unterminated"},
		{"unterminated fence of an ignored language", "```ruby\nputs 1\n", 1, "unterminated"},
		{"unknown attribute", "\n```python\n```\n\n```bash verbose\n```\n", 5, `unknown attribute "verbose"`},
		{"unknown attribute with a value", "```bash color=red\n```\n", 1, `unknown attribute "color"`},
		{"empty network entry", "```bash network=pypi,,npm\n```\n", 1, "network=pypi,,npm: an empty entry"},
		{"flag with a value", "```bash skip=yes\n```\n", 1, "skip takes no value"},
		{"value missing", "```bash timeout\n```\n", 1, "timeout needs a value"},
		{"empty value", "```bash session=\n```\n", 1, "session needs a value"},
		{"bad exit", "```bash exit=300\n```\n", 1, "exit=300"},
		{"bad timeout", "```bash timeout=30\n```\n", 1, "timeout=30: a positive duration with a unit"},
		{"negative timeout", "```bash timeout=-1s\n```\n", 1, "timeout=-1s"},
		{"bad session", "```bash session=a/b\n```\n", 1, "session=a/b"},
		{"stdin outside the directory", "```bash stdin=../secret\n```\n", 1, "stdin=../secret: name a file inside the document's directory"},
		{"absolute files", "```bash files=a,/etc/passwd\n```\n", 1, "files=/etc/passwd"},
		{"empty file name", "```bash files=a,,b\n```\n", 1, "empty file name"},
		{"duplicate attribute", "```bash session=a session=b\n```\n", 1, "session given twice"},
		{"unterminated quote", "```bash image=\"x\n```\n", 1, "unterminated \" quote"},
		{"text after a quote", "```bash image=\"x\"y\n```\n", 1, "put a space after"},
		{"no name", "```bash =x\n```\n", 1, "without a name"},
		{"should-fail exit=0", "```bash should-fail exit=0\n```\n", 1, "contradict"},
		{"output first", "# t\n\n```output\n1\n```\n", 3, "output block follows no code block"},
		{"output after text", "```bash\necho\n```\ntext\n```output\n1\n```\n", 5, "follows no code block"},
		{"two output blocks", "```bash\necho\n```\n```output\n1\n```\n```output stderr\n2\n```\n", 7, "a second output block after the block of line 1"},
		{"unknown output flag", "```bash\necho\n```\n```output stdout\n1\n```\n", 4, `unknown output flag "stdout"`},
		{"bad regex", "```bash\necho\n```\n```output regex\nok\n(\n```\n", 6, "bad regular expression"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("docs/a.md", []byte(tc.doc), langs)
			var de *Error
			if !errors.As(err, &de) {
				t.Fatalf("Parse: %v, want an *Error", err)
			}
			if de.Path != "docs/a.md" || de.Line != tc.line || !strings.Contains(de.Msg, tc.msg) {
				t.Errorf("Parse: %v, want docs/a.md:%d: ...%s...", err, tc.line, tc.msg)
			}
			if !errors.Is(err, sandbox.ErrInvalid) || sandbox.Class(err) != sandbox.ErrInvalid {
				t.Errorf("%v is not of class ErrInvalid", err)
			}
			if want := "docs/a.md:" + strconv.Itoa(tc.line) + ": " + de.Msg; err.Error() != want {
				t.Errorf("Error() = %q, want %q", err.Error(), want)
			}
		})
	}
}
