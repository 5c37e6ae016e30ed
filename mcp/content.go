package mcp

import (
	"bytes"
	"fmt"
	"image"
	_ "image/gif" // registers GIF for image.DecodeConfig
	_ "image/jpeg"
	_ "image/png"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// The content policy: what a file's bytes come back as. A client renders
// what it is given by its type, so only inert types keep theirs: a file
// named .svg or .html is the program's, and the program is untrusted.

// maxImagePixels caps the width×height an image's header may declare for
// it to come back as an image. A client decodes to about 4 bytes a pixel,
// and a 33-byte PNG header can declare 10 gigapixels; 25 megapixels
// (5000×5000, about 100 MB decoded) is far above any plot. Only the
// canvas is checked: the frames of an animated GIF or APNG are not counted.
const maxImagePixels = 25_000_000

// imageFormats are the formats image.DecodeConfig may report that come
// back as images, with their MIME types. Other registered formats do not.
var imageFormats = map[string]string{"png": "image/png", "jpeg": "image/jpeg", "gif": "image/gif"}

// inertTypes keep their MIME type: plain data no client runs.
var inertTypes = []string{"text/plain", "text/csv", "text/tab-separated-values", "text/markdown", "application/json", "application/octet-stream"}

// delivery is how one file's content comes back.
type delivery struct {
	mimeType string // the type the content comes back with
	image    bool   // as image content
	text     bool   // as text (Data is valid UTF-8)
	// withheld says what of the file does not come back as its name
	// suggests, and why; empty when nothing was.
	withheld string
	// skipped says why the content does not come back at all.
	skipped string
}

// deliver decides how the file name with content data comes back.
func deliver(name string, data []byte) delivery {
	named := mimeType(name)
	switch {
	case named == "image/png" || named == "image/jpeg" || named == "image/gif":
		cfg, format, err := image.DecodeConfig(bytes.NewReader(data))
		typ, ok := imageFormats[format]
		switch {
		case err != nil || !ok:
			return asData(data, named, "not returned as an image: its header does not parse as PNG, JPEG or GIF")
		case int64(cfg.Width)*int64(cfg.Height) > maxImagePixels:
			return delivery{mimeType: named, skipped: fmt.Sprintf("the image declares %d×%d pixels, over the %d-megapixel cap for images",
				cfg.Width, cfg.Height, maxImagePixels/1_000_000)}
		}
		return delivery{mimeType: typ, image: true}
	case named == "image/svg+xml":
		return asData(data, named, "not returned as an image: SVG can carry scripts")
	case slices.Contains(inertTypes, named):
		if named == "application/octet-stream" {
			return asData(data, named, "")
		}
		return delivery{mimeType: named, text: utf8.Valid(data)}
	case strings.HasPrefix(named, "image/"):
		return asData(data, named, "not returned as an image: only PNG, JPEG and GIF headers are checked")
	case active(named):
		return asData(data, named, "not returned as "+named+": a client could render it and run its scripts")
	}
	return asData(data, named, "not returned as "+named+": only plain text, CSV, Markdown, JSON and checked images keep their types")
}

// asData returns data as plain text, or as opaque bytes when it is not
// text; why, if given, becomes the withheld note naming the type used.
func asData(data []byte, named, why string) delivery {
	d := delivery{mimeType: "application/octet-stream"}
	if looksLikeText(data) {
		d.mimeType, d.text = "text/plain", true
	}
	if why != "" && d.mimeType != named {
		d.withheld = why + "; it comes back as " + d.mimeType
	}
	return d
}

// active reports types a client may execute or render with scripts.
func active(t string) bool {
	switch t {
	case "text/html", "text/xml", "application/xml", "text/css", "application/pdf", "application/wasm", "application/x-shockwave-flash":
		return true
	}
	return strings.HasSuffix(t, "+xml") || strings.Contains(t, "javascript") || strings.Contains(t, "ecmascript")
}

func looksLikeText(data []byte) bool {
	return utf8.Valid(data) && !slices.Contains(data, 0)
}

// hidden reports characters that a file name must not show as they are:
// controls, format characters (bidi overrides and isolates, zero-width
// characters), line and paragraph separators, private and unassigned
// code points. Each can make a name read as another (invoice\u202egnp.exe
// displays as invoiceexe.png).
func hidden(r rune) bool {
	return !unicode.IsGraphic(r)
}

// EscapeName renders a file name for a client or a terminal: hidden
// characters become \uXXXX (or \UXXXXXXXX), bytes that are not UTF-8 \xNN,
// and a backslash \\. Paths in the workspace never hold a backslash
// (sandbox.CheckPath), so an escaped name reads back unambiguously with
// unescapeName.
func EscapeName(s string) string {
	if !strings.ContainsFunc(s, func(r rune) bool { return hidden(r) || r == '\\' || r == utf8.RuneError }) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\\':
			b.WriteString(`\\`)
		case r > 0xffff && hidden(r):
			fmt.Fprintf(&b, `\U%08x`, r)
		case hidden(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// nameEscapedNote follows a name that EscapeName changed.
const nameEscapedNote = "; the name has invisible or control characters, shown as \\u escapes"

// unescapeName reverses EscapeName for a path the client passes back, so
// that a name listed as invoice\u202egnp.exe can be read as listed. A
// string with any other backslash is returned as it is, for the path
// check to refuse.
func unescapeName(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			b.WriteByte(s[i])
			continue
		}
		if i+1 < len(s) && s[i+1] == '\\' {
			b.WriteByte('\\')
			i++
			continue
		}
		digits := map[byte]int{'x': 2, 'u': 4, 'U': 8}[s[min(i+1, len(s)-1)]]
		if digits == 0 || i+2+digits > len(s) {
			return s
		}
		v, err := strconv.ParseUint(s[i+2:i+2+digits], 16, 32)
		switch {
		case err != nil:
			return s
		case s[i+1] == 'x':
			b.WriteByte(byte(v))
		default:
			b.WriteRune(rune(v))
		}
		i += 1 + digits
	}
	return b.String()
}

// EscapeJSON rewrites encoded JSON so that the characters a file name must
// not show as they are (see hidden) appear as \u escapes. The value is the
// same for any JSON reader; a person reading it sees every character.
func EscapeJSON(data []byte) []byte {
	if !bytes.ContainsFunc(data, func(r rune) bool { return r >= 0x7f && hidden(r) }) {
		return data
	}
	var b bytes.Buffer
	for i := 0; i < len(data); {
		r, n := utf8.DecodeRune(data[i:])
		// Below 0x7f hidden characters appear only as JSON's own escapes
		// or as whitespace between tokens; both stay.
		if r >= 0x7f && hidden(r) && !(r == utf8.RuneError && n == 1) {
			if r1, r2 := utf16.EncodeRune(r); r1 != utf8.RuneError {
				fmt.Fprintf(&b, `\u%04x\u%04x`, r1, r2)
			} else {
				fmt.Fprintf(&b, `\u%04x`, r)
			}
		} else {
			b.Write(data[i : i+n])
		}
		i += n
	}
	return b.Bytes()
}
