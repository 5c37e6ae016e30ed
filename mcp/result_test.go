package mcp

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/safe-run/safe-run/sandbox"
)

// pngData is the start of a 1×1 PNG file: its header, all that deliver reads.
var pngData = []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00\x1f\x15\xc4\x89")

// compileSchema compiles a JSON Schema document.
func compileSchema(t *testing.T, schema []byte) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(schema))
	if err != nil {
		t.Fatalf("schema is not JSON: %v\n%s", err, schema)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("schema.json", doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile("schema.json")
	if err != nil {
		t.Fatalf("schema does not compile: %v\n%s", err, schema)
	}
	return sch
}

// checkStructured checks structured content against outputSchema: every
// required field present, files an array, and the schema validates it.
func checkStructured(t *testing.T, structured any) map[string]any {
	t.Helper()
	data, err := json.Marshal(structured)
	if err != nil {
		t.Fatalf("marshal structured content: %v", err)
	}
	var schema struct {
		Required []string `json:"required"`
	}
	if err := json.Unmarshal([]byte(outputSchema), &schema); err != nil {
		t.Fatalf("outputSchema is not JSON: %v", err)
	}
	var got map[string]any
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatalf("structured content is not a JSON object: %v\n%s", err, data)
	}
	if len(schema.Required) == 0 {
		t.Fatal("outputSchema requires nothing")
	}
	for _, k := range schema.Required {
		if _, ok := got[k]; !ok {
			t.Errorf("structured content lacks required field %q: %s", k, data)
		}
	}
	if files, ok := got["files"].([]any); !ok || files == nil {
		t.Errorf("structured files = %#v, want an array", got["files"])
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if err := compileSchema(t, []byte(outputSchema)).Validate(inst); err != nil {
		t.Errorf("structured content does not match outputSchema: %v\n%s", err, data)
	}
	return got
}

func TestResultStatus(t *testing.T) {
	tests := []struct {
		res     sandbox.Result
		isError bool
	}{
		{sandbox.Result{Status: sandbox.StatusOK, Stdout: "hi\n", DurationMS: 120, SandboxID: "sb1"}, false},
		{sandbox.Result{Status: sandbox.StatusError, ExitCode: 1, Stderr: "Traceback\n"}, true},
		{sandbox.Result{Status: sandbox.StatusTimeout, ExitCode: -1, Message: "the 5s timeout passed"}, true},
		{sandbox.Result{Status: sandbox.StatusOOM, ExitCode: -1, Message: "the 512MiB memory limit was hit", MemoryPeakBytes: 512 << 20}, true},
		{sandbox.Result{Status: sandbox.StatusKilled, ExitCode: -1, Signal: "SIGKILL", Message: "killed by SIGKILL"}, true},
		{sandbox.Result{Status: sandbox.StatusSandboxError, ExitCode: -1, Message: "runsc failed"}, true},
	}
	for _, tt := range tests {
		t.Run(string(tt.res.Status), func(t *testing.T) {
			r := result(tt.res)
			if r.IsError != tt.isError {
				t.Errorf("IsError = %v, want %v", r.IsError, tt.isError)
			}
			if len(r.Content) != 1 {
				t.Errorf("%d content items, want only the text", len(r.Content))
			}
			if text := firstText(t, r); !strings.HasPrefix(text, "status: "+string(tt.res.Status)) {
				t.Errorf("text does not start with the status: %q", text)
			}
			got := checkStructured(t, r.StructuredContent)
			if got["status"] != string(tt.res.Status) {
				t.Errorf("structured status = %v, want %s", got["status"], tt.res.Status)
			}
			if got["exit_code"] != float64(tt.res.ExitCode) {
				t.Errorf("structured exit_code = %v, want %d", got["exit_code"], tt.res.ExitCode)
			}
			if files := got["files"].([]any); len(files) != 0 {
				t.Errorf("structured files = %v, want []", files)
			}
			data, _ := json.Marshal(r.StructuredContent)
			if !bytes.Contains(data, []byte(`"files":[]`)) {
				t.Errorf("files is not an empty array: %s", data)
			}
			if bytes.Contains(data, []byte("sb1")) {
				t.Errorf("structured content carries the sandbox ID, which the schema does not describe: %s", data)
			}
		})
	}
}

func TestResultStructuredFields(t *testing.T) {
	res := sandbox.Result{
		Status: sandbox.StatusKilled, ExitCode: -1, Signal: "SIGSEGV",
		Stdout: "out", Stderr: "err", StdoutTruncated: true, StderrTruncated: true,
		StdoutBytes: 9999, StderrBytes: 8888, DurationMS: 1234, MemoryPeakBytes: 4096,
		Message: "killed by SIGSEGV", SandboxID: "sb",
	}
	got := checkStructured(t, result(res).StructuredContent)
	want := map[string]any{
		"status": "killed", "exit_code": -1.0, "signal": "SIGSEGV", "stdout": "out", "stderr": "err",
		"stdout_truncated": true, "stderr_truncated": true, "duration_ms": 1234.0, "memory_peak_bytes": 4096.0,
		"message": "killed by SIGSEGV", "files": []any{},
	}
	for k, w := range want {
		if fmt.Sprint(got[k]) != fmt.Sprint(w) {
			t.Errorf("structured %s = %v, want %v", k, got[k], w)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("structured content has unexpected field %q", k)
		}
	}
}

func TestResultFiles(t *testing.T) {
	utf8Text := []byte("name,value\nα,1\n")
	binary := []byte{'B', 'I', 'N', 0, 1, 2, 3, 0xff}
	tests := []struct {
		file sandbox.OutputFile
		// Exactly one of image, text and blob is set: the content expected.
		image, text, blob string
		mime              string
	}{
		{file: sandbox.OutputFile{Path: "plot.png", Data: pngData}, image: base64.StdEncoding.EncodeToString(pngData), mime: "image/png"},
		{file: sandbox.OutputFile{Path: "PLOT.PNG", Data: pngData}, image: base64.StdEncoding.EncodeToString(pngData), mime: "image/png"},
		{file: sandbox.OutputFile{Path: "photo.jpg", Data: jpegData}, image: base64.StdEncoding.EncodeToString(jpegData), mime: "image/jpeg"},
		{file: sandbox.OutputFile{Path: "anim.gif", Data: gifData}, image: base64.StdEncoding.EncodeToString(gifData), mime: "image/gif"},
		{file: sandbox.OutputFile{Path: "chart.svg", Data: []byte("<svg/>")}, text: "<svg/>", mime: "text/plain"},
		{file: sandbox.OutputFile{Path: "data.csv", Data: utf8Text}, text: string(utf8Text), mime: "text/csv"},
		{file: sandbox.OutputFile{Path: "sub/dir/data.json", Data: []byte(`{"a":1}`)}, text: `{"a":1}`, mime: "application/json"},
		{file: sandbox.OutputFile{Path: "notes.md", Data: []byte("# hi")}, text: "# hi", mime: "text/markdown"},
		{file: sandbox.OutputFile{Path: "log.txt", Data: []byte("done\n")}, text: "done\n", mime: "text/plain"},
		{file: sandbox.OutputFile{Path: "empty.txt", Data: nil}, text: "", mime: "text/plain"},
		{file: sandbox.OutputFile{Path: "latin1.txt", Data: []byte("caf\xe9")}, blob: base64.StdEncoding.EncodeToString([]byte("caf\xe9")), mime: "text/plain"},
		{file: sandbox.OutputFile{Path: "bad.json", Data: []byte("{\xff}")}, blob: base64.StdEncoding.EncodeToString([]byte("{\xff}")), mime: "application/json"},
		{file: sandbox.OutputFile{Path: "model.bin", Data: binary}, blob: base64.StdEncoding.EncodeToString(binary), mime: "application/octet-stream"},
		{file: sandbox.OutputFile{Path: "data.zzqx", Data: []byte("plain words\n")}, text: "plain words\n", mime: "text/plain"},
		{file: sandbox.OutputFile{Path: "README", Data: []byte("no extension")}, text: "no extension", mime: "text/plain"},
		{file: sandbox.OutputFile{Path: "nul.zzqx", Data: []byte("a\x00b")}, blob: base64.StdEncoding.EncodeToString([]byte("a\x00b")), mime: "application/octet-stream"},
		{file: sandbox.OutputFile{Path: "doc.pdf", Data: []byte("%PDF-1.4\x00\xe2")}, blob: base64.StdEncoding.EncodeToString([]byte("%PDF-1.4\x00\xe2")), mime: "application/octet-stream"},
	}
	for _, tt := range tests {
		t.Run(tt.file.Path, func(t *testing.T) {
			tt.file.Size = int64(len(tt.file.Data))
			r := result(sandbox.Result{Status: sandbox.StatusOK, Files: []sandbox.OutputFile{tt.file}})
			if len(r.Content) != 2 {
				t.Fatalf("%d content items, want the text and the file", len(r.Content))
			}
			c := r.Content[1]
			uri := "sandbox:///workspace/out/" + tt.file.Path
			switch {
			case tt.image != "":
				img, ok := mcpgo.AsImageContent(c)
				if !ok {
					t.Fatalf("content is %T, want an image", c)
				}
				if img.Type != "image" || img.MIMEType != tt.mime || img.Data != tt.image {
					t.Errorf("image {%q, %q, %q}, want {image, %q, %q}", img.Type, img.MIMEType, img.Data, tt.mime, tt.image)
				}
			default:
				res, ok := mcpgo.AsEmbeddedResource(c)
				if !ok {
					t.Fatalf("content is %T, want an embedded resource", c)
				}
				if res.Type != "resource" {
					t.Errorf("resource type %q", res.Type)
				}
				if tt.blob != "" {
					blob, ok := mcpgo.AsBlobResourceContents(res.Resource)
					if !ok {
						t.Fatalf("resource is %T, want a blob", res.Resource)
					}
					if blob.URI != uri || blob.MIMEType != tt.mime || blob.Blob != tt.blob {
						t.Errorf("blob {%q, %q, %q}, want {%q, %q, %q}", blob.URI, blob.MIMEType, blob.Blob, uri, tt.mime, tt.blob)
					}
				} else {
					text, ok := mcpgo.AsTextResourceContents(res.Resource)
					if !ok {
						t.Fatalf("resource is %T, want text", res.Resource)
					}
					if text.URI != uri || text.MIMEType != tt.mime || text.Text != tt.text {
						t.Errorf("text resource {%q, %q, %q}, want {%q, %q, %q}", text.URI, text.MIMEType, text.Text, uri, tt.mime, tt.text)
					}
				}
			}
			got := checkStructured(t, r.StructuredContent)
			files := got["files"].([]any)
			if len(files) != 1 {
				t.Fatalf("structured files = %v, want one", files)
			}
			f := files[0].(map[string]any)
			if f["path"] != tt.file.Path || f["size"] != float64(tt.file.Size) || f["returned"] != true {
				t.Errorf("structured file = %v", f)
			}
			if _, ok := f["skipped"]; ok {
				t.Errorf("returned file has a skipped reason: %v", f)
			}
			// The structured MIME type is the content's.
			if want := tt.mime; f["mime_type"] != want {
				t.Errorf("structured mime_type = %v, want %s", f["mime_type"], want)
			}
		})
	}
}

func TestResultSkippedFiles(t *testing.T) {
	res := sandbox.Result{Status: sandbox.StatusOK, Files: []sandbox.OutputFile{
		{Path: "a.png", Size: int64(len(pngData)), Data: pngData},
		{Path: "huge.png", Size: 9 << 20, Skipped: "over the 8MiB per-file cap"},
		{Path: "link", Size: 11, Skipped: "a symbolic link"},
		{Path: "b.csv", Size: 4, Data: []byte("a,b\n")},
	}}
	r := result(res)
	if len(r.Content) != 3 {
		t.Fatalf("%d content items, want text and the 2 returned files", len(r.Content))
	}
	if _, ok := mcpgo.AsImageContent(r.Content[1]); !ok {
		t.Errorf("content 1 is %T, want the image a.png", r.Content[1])
	}
	if e, ok := mcpgo.AsEmbeddedResource(r.Content[2]); !ok || !strings.HasSuffix(e.Resource.(mcpgo.TextResourceContents).URI, "/b.csv") {
		t.Errorf("content 2 is %#v, want the resource b.csv", r.Content[2])
	}
	got := checkStructured(t, r.StructuredContent)
	files := got["files"].([]any)
	if len(files) != 4 {
		t.Fatalf("structured files = %v, want all 4", files)
	}
	for i, want := range []struct {
		path     string
		returned bool
		skipped  string
	}{
		{"a.png", true, ""},
		{"huge.png", false, "over the 8MiB per-file cap"},
		{"link", false, "a symbolic link"},
		{"b.csv", true, ""},
	} {
		f := files[i].(map[string]any)
		skipped, _ := f["skipped"].(string)
		if f["path"] != want.path || f["returned"] != want.returned || skipped != want.skipped {
			t.Errorf("structured file %d = %v, want path %s, returned %v, skipped %q", i, f, want.path, want.returned, want.skipped)
		}
	}
	assertLines(t, firstText(t, r),
		"files in /workspace/out:\n",
		"  a.png (image/png, "+sandbox.FormatBytes(int64(len(pngData)))+"): returned\n",
		"  huge.png (image/png, 9MiB): not returned: over the 8MiB per-file cap\n",
		"  link (application/octet-stream, 11B): not returned: a symbolic link\n",
		"  b.csv (text/csv, 4B): returned\n")
}

func TestRenderText(t *testing.T) {
	var stderr30 strings.Builder
	for i := 1; i <= 30; i++ {
		fmt.Fprintf(&stderr30, "line %d\n", i)
	}
	tail20 := "...\n"
	for i := 11; i <= 30; i++ {
		tail20 += fmt.Sprintf("line %d\n", i)
	}
	var stderr20 strings.Builder
	for i := 1; i <= 20; i++ {
		fmt.Fprintf(&stderr20, "line %d\n", i)
	}
	tests := []struct {
		name string
		out  runCodeOutput
		want string
	}{
		{
			name: "ok",
			out:  runCodeOutput{Status: sandbox.StatusOK, Stdout: "hello\n", DurationMS: 1234},
			want: "status: ok (exit code 0) in 1.23s\n\nstdout:\nhello\n",
		},
		{
			name: "ok without final newline",
			out:  runCodeOutput{Status: sandbox.StatusOK, Stdout: "hello", DurationMS: 5},
			want: "status: ok (exit code 0) in 0.01s\n\nstdout:\nhello\n",
		},
		{
			name: "ok with stderr kept whole",
			out:  runCodeOutput{Status: sandbox.StatusOK, Stdout: "a\n", Stderr: stderr30.String()},
			want: "status: ok (exit code 0) in 0.00s\n\nstdout:\na\n\nstderr:\n" + stderr30.String(),
		},
		{
			name: "no output",
			out:  runCodeOutput{Status: sandbox.StatusOK},
			want: "status: ok (exit code 0) in 0.00s\n(no output)\n",
		},
		{
			name: "error with the last 20 lines of stderr",
			out:  runCodeOutput{Status: sandbox.StatusError, ExitCode: 3, DurationMS: 2500, Stdout: "partial\n", Stderr: stderr30.String()},
			want: "status: error: the program exited with code 3 after 2.50s\n\nstdout:\npartial\n\nstderr (last lines):\n" + tail20,
		},
		{
			name: "error with 20 lines of stderr",
			out:  runCodeOutput{Status: sandbox.StatusError, ExitCode: 1, Stderr: stderr20.String()},
			want: "status: error: the program exited with code 1 after 0.00s\n\nstderr (last lines):\n" + stderr20.String(),
		},
		{
			name: "error without stderr",
			out:  runCodeOutput{Status: sandbox.StatusError, ExitCode: 2},
			want: "status: error: the program exited with code 2 after 0.00s\n(no output)\n",
		},
		{
			name: "timeout",
			out:  runCodeOutput{Status: sandbox.StatusTimeout, ExitCode: -1, Message: "the 5s timeout passed", Stdout: "tick\n"},
			want: "status: timeout: the 5s timeout passed\n\nstdout:\ntick\n",
		},
		{
			name: "sandbox error",
			out:  runCodeOutput{Status: sandbox.StatusSandboxError, ExitCode: -1, Message: "runsc failed", Stderr: "x"},
			want: "status: sandbox_error: runsc failed\n\nstderr (last lines):\nx\n",
		},
		{
			name: "files",
			out: runCodeOutput{Status: sandbox.StatusOK, Stdout: "saved\n", Files: []outputFile{
				{Path: "plot.png", Size: 2048, MIMEType: "image/png", Returned: true},
				{Path: "big.csv", Size: 20 << 20, MIMEType: "text/csv", Skipped: "over the cap"},
			}},
			want: "status: ok (exit code 0) in 0.00s\n\nstdout:\nsaved\n\nfiles in /workspace/out:\n" +
				"  plot.png (image/png, 2KiB): returned\n  big.csv (text/csv, 20MiB): not returned: over the cap\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := renderText(tt.out); got != tt.want {
				t.Errorf("renderText:\n%s\nwant:\n%s", got, tt.want)
			}
		})
	}
}

func TestLastLines(t *testing.T) {
	tests := []struct {
		s    string
		n    int
		want string
	}{
		{"", 2, ""},
		{"a", 2, "a"},
		{"a\nb\n", 2, "a\nb\n"},
		{"a\nb\nc\n", 2, "...\nb\nc"},
		{"a\nb\nc", 2, "...\nb\nc"},
		{"a\nb\nc\n\n\n", 2, "...\nb\nc"},
	}
	for _, tt := range tests {
		if got := lastLines(tt.s, tt.n); got != tt.want {
			t.Errorf("lastLines(%q, %d) = %q, want %q", tt.s, tt.n, got, tt.want)
		}
	}
}

func TestMimeType(t *testing.T) {
	tests := []struct{ name, want string }{
		{"a.png", "image/png"},
		{"a.PNG", "image/png"},
		{"a.jpg", "image/jpeg"},
		{"a.jpeg", "image/jpeg"},
		{"a.gif", "image/gif"},
		{"a.svg", "image/svg+xml"},
		{"a.csv", "text/csv"},
		{"a.CSV", "text/csv"},
		{"a.md", "text/markdown"},
		{"a.json", "application/json"},
		{"a.txt", "text/plain"},
		{"a.html", "text/html"},
		{"dir.d/file", "application/octet-stream"},
		{"a.zzqx", "application/octet-stream"},
		{"Makefile", "application/octet-stream"},
	}
	for _, tt := range tests {
		if got := mimeType(tt.name); got != tt.want {
			t.Errorf("mimeType(%q) = %q, want %q", tt.name, got, tt.want)
		}
	}
}

// The result survives the trip to a client: the mcp-go client parses every
// content item and the structured content.
func TestRunCodeResultThroughClient(t *testing.T) {
	files := []sandbox.OutputFile{
		{Path: "plot.png", Data: pngData},
		{Path: "data.csv", Data: []byte("a,b\n1,2\n")},
		{Path: "blob.bin", Data: []byte{0, 1, 2}},
		{Path: "big.png", Skipped: "over the cap"},
	}
	for i := range files {
		files[i].Size = int64(len(files[i].Data))
	}
	runner := &fakeRunner{result: sandbox.Result{Status: sandbox.StatusError, ExitCode: 1, Stdout: "out\n", Stderr: "boom\n", Files: files}}
	c := newClient(t, Config{Runner: runner})
	res := callRunCode(t, c, map[string]any{"language": "python", "code": "raise SystemExit(1)"})
	if !res.IsError {
		t.Error("IsError = false for status error")
	}
	text := firstText(t, res)
	for _, w := range []string{"status: error", "code 1", "stdout:\nout\n", "stderr (last lines):\nboom\n", "plot.png"} {
		if !strings.Contains(text, w) {
			t.Errorf("text does not contain %q:\n%s", w, text)
		}
	}
	if len(res.Content) != 4 {
		t.Fatalf("%d content items, want text and 3 files", len(res.Content))
	}
	if img, ok := mcpgo.AsImageContent(res.Content[1]); !ok || img.Data != base64.StdEncoding.EncodeToString(pngData) || img.MIMEType != "image/png" {
		t.Errorf("content 1 = %#v, want the PNG image", res.Content[1])
	}
	if e, ok := mcpgo.AsEmbeddedResource(res.Content[2]); !ok {
		t.Errorf("content 2 = %#v, want a resource", res.Content[2])
	} else if tr, ok := mcpgo.AsTextResourceContents(e.Resource); !ok || tr.Text != "a,b\n1,2\n" || tr.MIMEType != "text/csv" {
		t.Errorf("content 2 resource = %#v, want the CSV text", e.Resource)
	}
	if e, ok := mcpgo.AsEmbeddedResource(res.Content[3]); !ok {
		t.Errorf("content 3 = %#v, want a resource", res.Content[3])
	} else if br, ok := mcpgo.AsBlobResourceContents(e.Resource); !ok || br.Blob != "AAEC" || br.MIMEType != "application/octet-stream" {
		t.Errorf("content 3 resource = %#v, want the binary blob", e.Resource)
	}
	got := checkStructured(t, res.StructuredContent)
	if n := len(got["files"].([]any)); n != 4 {
		t.Errorf("structured content lists %d files, want 4", n)
	}
}

// An empty image file in the output directory (image content with empty
// data) must not cost the caller the whole result.
func TestRunCodeEmptyImageThroughClient(t *testing.T) {
	for _, name := range []string{"empty.png", "empty.svg"} {
		t.Run(name, func(t *testing.T) {
			runner := &fakeRunner{result: sandbox.Result{Status: sandbox.StatusOK, Stdout: "done\n",
				Files: []sandbox.OutputFile{{Path: name, Size: 0, Data: []byte{}}}}}
			c := newClient(t, Config{Runner: runner})
			res := callRunCode(t, c, map[string]any{"language": "python", "code": "open('out/" + name + "', 'w')"})
			if res.IsError {
				t.Errorf("IsError = true: %s", firstText(t, res))
			}
			if text := firstText(t, res); !strings.Contains(text, "stdout:\ndone\n") || !strings.Contains(text, name) {
				t.Errorf("text lacks the output or the file:\n%s", text)
			}
		})
	}
}

// TestResultCached checks that a reused result says so, in the structured
// content and in the text.
func TestResultCached(t *testing.T) {
	r := result(sandbox.Result{Status: sandbox.StatusOK, Stdout: "1\n", Cached: true})
	got := checkStructured(t, r.StructuredContent)
	if got["cached"] != true {
		t.Errorf("structured cached = %v, want true", got["cached"])
	}
	text := r.Content[0].(mcpgo.TextContent).Text
	if !strings.Contains(text, "earlier identical call") {
		t.Errorf("text does not say the result was reused:\n%s", text)
	}
	if got := checkStructured(t, result(sandbox.Result{Status: sandbox.StatusOK}).StructuredContent); got["cached"] != nil {
		t.Errorf("a fresh result has cached = %v", got["cached"])
	}
}

func TestResultActivity(t *testing.T) {
	quiet := &sandbox.Activity{Processes: []sandbox.Process{{PID: 9, Parent: 1, Binary: "/usr/bin/python3.11", Argv: []string{"python3", "main.py"}, Exited: true}},
		Clones: 1, Events: map[string]int{"sentry_exec": 1}}
	loud := &sandbox.Activity{Processes: []sandbox.Process{{PID: 9, Binary: "/usr/bin/python3.11"}, {PID: 10, Parent: 9, Binary: "/usr/bin/sh\x1b[2J"}},
		Clones: 2, Network: []sandbox.NetworkAttempt{{Op: "connect", Family: "inet", Address: "10.0.0.1:3333", Result: "ENETUNREACH"}},
		Rules: []sandbox.RuleHit{{Rule: "miner-pool-port", Action: "kill", Event: "connect 10.0.0.1:3333"}}}
	for _, tc := range []struct {
		name string
		res  sandbox.Result
		line string
	}{
		{"quiet", sandbox.Result{Status: sandbox.StatusOK, Activity: quiet}, "activity: nothing notable"},
		{"notable", sandbox.Result{Status: sandbox.StatusPolicyViolation, ExitCode: -1, Message: `the run was stopped by monitoring rule "miner-pool-port"`, Activity: loud}, `sh\u001b[2J`},
		{"not monitored", sandbox.Result{Status: sandbox.StatusOK}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := result(tc.res)
			got := checkStructured(t, r.StructuredContent)
			text := firstText(t, r)
			switch {
			case tc.line == "" && (got["activity"] != nil || strings.Contains(text, "activity:")):
				t.Errorf("a run without monitoring shows an activity: %v / %q", got["activity"], text)
			case tc.line != "" && got["activity"] == nil:
				t.Error("structured content has no activity")
			case tc.line != "" && !strings.Contains(text, tc.line):
				t.Errorf("text %q lacks %q", text, tc.line)
			case strings.ContainsRune(text, '\x1b'):
				t.Errorf("text carries the sandbox's escape sequence: %q", text)
			}
		})
	}
}
