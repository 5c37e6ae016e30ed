package snippets

import (
	"bytes"
	"testing"
)

func TestUpdate(t *testing.T) {
	for _, tc := range []struct {
		name    string
		doc     string
		outputs []Output
		all     bool
		want    string
	}{
		{"replaces expected output",
			"```python\nprint(2)\n```\n\n```output\n1\n```\ntail\n",
			[]Output{{0, "2\n"}}, false,
			"```python\nprint(2)\n```\n\n```output\n2\n```\ntail\n"},
		{"normalises to one final newline",
			"```python\nx\n```\n```output\n1\n```\n",
			[]Output{{0, "a\r\nb\n\n\n"}}, false,
			"```python\nx\n```\n```output\na\nb\n```\n"},
		{"fills an empty block",
			"```python\nx\n```\n```output\n```\n",
			[]Output{{0, "hi"}}, false,
			"```python\nx\n```\n```output\nhi\n```\n"},
		{"empties a block",
			"```python\nx\n```\n```output\nold\n```\n",
			[]Output{{0, ""}}, false,
			"```python\nx\n```\n```output\n```\n"},
		{"a block that still matches keeps its ellipsis",
			"```python\nx\n```\n```output\nid ...\n```\n",
			[]Output{{0, "id 42\n"}}, false,
			"```python\nx\n```\n```output\nid ...\n```\n"},
		{"regex block gets literal lines",
			"```python\nx\n```\n```output regex\n[0-9]+\n```\n",
			[]Output{{0, "a.b (c)\n"}}, false,
			"```python\nx\n```\n```output regex\na\\.b \\(c\\)\n```\n"},
		{"regex block whose text is the output but does not match it",
			"```sh\nx\n```\n```output regex\n$\n```\n",
			[]Output{{0, "$\n"}}, false,
			"```sh\nx\n```\n```output regex\n\\$\n```\n"},
		{"keeps the fence's indentation",
			"  ```python\n  x\n  ```\n  ```output\n  1\n  ```\n",
			[]Output{{0, "a\n\nb\n"}}, false,
			"  ```python\n  x\n  ```\n  ```output\n  a\n\n  b\n  ```\n"},
		{"lengthens a fence the output would close",
			"```python\nx\n```\n~~~output\n1\n~~~\n",
			[]Output{{0, "~~~~\n"}}, false,
			"```python\nx\n```\n~~~~~output\n~~~~\n~~~~~\n"},
		{"lengthened fence at the end of a document without a newline",
			"```python\nx\n```\n```output\n1\n```",
			[]Output{{0, "```\n"}}, false,
			"```python\nx\n```\n````output\n```\n````"},
		{"without all, a block without one gets none",
			"```python\nx\n```\n",
			[]Output{{0, "1\n"}}, false,
			"```python\nx\n```\n"},
		{"all creates a block",
			"```python\nx\n```\ntext\n",
			[]Output{{0, "1\n"}}, true,
			"```python\nx\n```\n\n```output\n1\n```\ntext\n"},
		{"all: same fence character, longer than the output's runs",
			"~~~bash\necho\n~~~\n",
			[]Output{{0, "~~~\n~~~~~~\n"}}, true,
			"~~~bash\necho\n~~~\n\n~~~~~~~output\n~~~\n~~~~~~\n~~~~~~~\n"},
		{"all: backticks in the output",
			"```bash\necho\n```\n",
			[]Output{{0, "````\n"}}, true,
			"```bash\necho\n```\n\n`````output\n````\n`````\n"},
		{"all at the end of a document without a newline",
			"```bash\necho\n```",
			[]Output{{0, "1"}}, true,
			"```bash\necho\n```\n\n```output\n1\n```\n"},
		{"all: nothing printed, no block",
			"```bash\ntrue\n```\n",
			[]Output{{0, "\n"}}, true,
			"```bash\ntrue\n```\n"},
		{"all, indented",
			" ```bash\n echo\n ```\n",
			[]Output{{0, "1\n"}}, true,
			" ```bash\n echo\n ```\n\n ```output\n 1\n ```\n"},
		{"CRLF kept",
			"```python\r\nx\r\n```\r\n```output\r\n1\r\n```\r\n```bash\r\ny\r\n```\r\n",
			[]Output{{0, "a\nb\n"}, {1, "c\n"}}, true,
			"```python\r\nx\r\n```\r\n```output\r\na\r\nb\r\n```\r\n```bash\r\ny\r\n```\r\n\r\n```output\r\nc\r\n```\r\n"},
		{"several blocks, out of order, unknown indexes ignored",
			"```bash\na\n```\n```output\n0\n```\n```bash\nb\n```\n```output\n0\n```\n",
			[]Output{{1, "B\n"}, {7, "x\n"}, {-1, "y"}, {0, "A\n"}}, false,
			"```bash\na\n```\n```output\nA\n```\n```bash\nb\n```\n```output\nB\n```\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			blocks, err := Parse("doc.md", []byte(tc.doc), langs)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			got := Update([]byte(tc.doc), blocks, tc.outputs, tc.all)
			if string(got) != tc.want {
				t.Fatalf("Update:\n%q\nwant\n%q", got, tc.want)
			}
			// The round trip: the updated document parses, and each
			// block's expected output now matches what it printed.
			again, err := Parse("doc.md", got, langs)
			if err != nil {
				t.Fatalf("Parse after Update: %v", err)
			}
			if len(again) != len(blocks) {
				t.Fatalf("%d blocks after Update, %d before", len(again), len(blocks))
			}
			for _, o := range tc.outputs {
				if o.Block < 0 || o.Block >= len(again) {
					continue
				}
				e := again[o.Block].Expected
				if e == nil {
					if blocks[o.Block].Expected == nil && (!tc.all || NormalizeOutput(o.Text) == "") {
						continue
					}
					t.Fatalf("block %d has no expected output after Update", o.Block)
				}
				if !Match(e.Text, o.Text, e.Regex) {
					t.Errorf("block %d: after Update, %q does not match %q", o.Block, e.Text, o.Text)
				}
			}
			// Updating again with the same outputs changes nothing.
			if twice := Update(got, again, tc.outputs, tc.all); !bytes.Equal(twice, got) {
				t.Errorf("second Update:\n%q\nwant\n%q", twice, got)
			}
		})
	}
}

// TestUpdateUnchanged checks that a document whose outputs are what it says
// comes back byte for byte, whatever its line endings and layout (its regex
// block's expressions match their own text).
func TestUpdateUnchanged(t *testing.T) {
	for _, doc := range []string{
		"# T\r\n\r\n```python\r\nprint(1)\r\n```\r\n\r\n```output\r\n1   \r\n```\r\nend",
		"  ```bash\n echo a\n\techo b\n  ```\n   ~~~~output\n a\n\tb\n   ~~~~   \n",
		"```bash\necho\n```\n```output regex\nid .*\n...\n```",
		"no blocks at all\r\n",
		"",
	} {
		blocks, err := Parse("doc.md", []byte(doc), langs)
		if err != nil {
			t.Fatalf("Parse(%q): %v", doc, err)
		}
		var outs []Output
		for i, b := range blocks {
			if b.Expected != nil {
				outs = append(outs, Output{i, b.Expected.Text})
			} else {
				outs = append(outs, Output{i, ""})
			}
		}
		if got := Update([]byte(doc), blocks, outs, true); string(got) != doc {
			t.Errorf("Update(%q) = %q, want it unchanged", doc, got)
		}
	}
}
