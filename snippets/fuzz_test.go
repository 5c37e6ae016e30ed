package snippets

import (
	"bytes"
	"slices"
	"testing"
)

// FuzzParse checks that Parse never panics, that Update with every block's
// own expected text is the identity (for a regex block, when its
// expressions match that text: "$" does not, and Update must then rewrite
// it), and that Update with any output gives a document that parses to the
// same blocks, the updated one matching it.
func FuzzParse(f *testing.F) {
	f.Add([]byte("```python\nprint(1)\n```\n\n```output\n1\n```\n"), "2\n")
	f.Add([]byte("~~~~bash session=a\r\n```\r\necho\r\n~~~~\r\n"), "```\r\n")
	f.Fuzz(func(t *testing.T, data []byte, out string) {
		if !Match(out, out, false) {
			t.Fatalf("%q does not match itself", out)
		}
		if !slices.Contains(normLines(out), ellipsis) && Diff(out, out) != "" {
			t.Fatalf("Diff of %q with itself: %q", out, Diff(out, out))
		}
		_ = Diff(string(data), out)
		blocks, err := Parse("fuzz.md", data, langs)
		if err != nil {
			if _, ok := err.(*Error); !ok {
				t.Fatalf("Parse: %v is not an *Error", err)
			}
			return
		}
		var own []Output
		for i, b := range blocks {
			if b.Code != "" && b.Code[len(b.Code)-1] != '\n' {
				t.Fatalf("block %d: code %q does not end in a newline", i, b.Code)
			}
			if e := b.Expected; e != nil {
				if e.Start < 0 || e.Start > e.End || e.End > len(data) {
					t.Fatalf("block %d: offsets %d..%d of %d bytes", i, e.Start, e.End, len(data))
				}
				if Match(e.Text, e.Text, e.Regex) {
					own = append(own, Output{i, e.Text})
				}
			}
		}
		if got := Update(data, blocks, own, false); !bytes.Equal(got, data) {
			t.Fatalf("Update with the blocks' own text:\n%q\nwant\n%q", got, data)
		}
		for i := range blocks {
			got := Update(data, blocks, []Output{{i, out}}, true)
			again, err := Parse("fuzz.md", got, langs)
			if err != nil {
				t.Fatalf("Parse after Update of block %d with %q: %v\n%q", i, out, err, got)
			}
			if len(again) != len(blocks) {
				t.Fatalf("Update of block %d with %q: %d blocks, %d before\n%q", i, out, len(again), len(blocks), got)
			}
			e := again[i].Expected
			if e == nil {
				if blocks[i].Expected == nil && NormalizeOutput(out) == "" {
					continue
				}
				t.Fatalf("Update of block %d with %q: no expected block\n%q", i, out, got)
			}
			if !Match(e.Text, out, e.Regex) {
				t.Fatalf("Update of block %d with %q: expected %q does not match it\n%q", i, out, e.Text, got)
			}
		}
	})
}
