package mcp

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/safe-run/safe-run/sandbox"
)

// checkArgError fails unless err is an *sandbox.InputError whose Field is
// one of fields, or an argument the call sent, and whose message names it.
func checkArgError(t *testing.T, err error, fields []string, sent map[string]any) {
	t.Helper()
	var in *sandbox.InputError
	if !errors.As(err, &in) {
		t.Fatalf("refusal %#v is not an InputError", err)
	}
	_, wasSent := sent[in.Field]
	if !slices.Contains(fields, in.Field) && !wasSent {
		t.Fatalf("refusal names %q, not an argument: %v", in.Field, err)
	}
	if !strings.Contains(in.Msg, in.Field) && !strings.Contains(in.Msg, strconv.Quote(in.Field)) {
		t.Fatalf("refusal message %q does not name its argument %q", in.Msg, in.Field)
	}
}

// insideWorkspace reports whether p, joined to /workspace as the agent
// does, names exactly p strictly below it.
func insideWorkspace(p string) bool {
	joined := filepath.Join("/workspace", p)
	rel, err := filepath.Rel("/workspace", joined)
	return err == nil && strings.HasPrefix(joined, "/workspace/") && rel == p
}

// FuzzRunCodeArgs decodes run_code arguments as a client may send them
// (any JSON value) and checks them against the policy. Decoding never
// panics; every refusal is an InputError naming the argument; an accepted
// call becomes exactly the job it describes: files decoded from their
// encoding, at paths inside the workspace, with a timeout in range.
func FuzzRunCodeArgs(f *testing.F) {
	h := &handler{cfg: Config{Sessions: fakeSessions{}}, maxTimeout: time.Hour}
	argFields := []string{"arguments", "language", "code", "timeout_seconds", "stdin", "files", "session_id", "image"}
	policyFields := []string{"language", "code", "image", "files", "stdin", "output_dir", "timeout", "memory", "processes", "cpus", "output"}
	f.Fuzz(func(t *testing.T, data []byte) {
		var raw any
		if json.Unmarshal(data, &raw) != nil {
			return // not JSON: the protocol layer refuses it before us
		}
		sent, _ := raw.(map[string]any)
		job, sessionID, err := h.parseArgs(raw)
		if err != nil {
			checkArgError(t, err, argFields, sent)
			return
		}
		if sent == nil {
			t.Fatalf("accepted %s, which is not an object", data)
		}
		var args struct {
			Language, Code, Stdin, Image string
			SessionID                    string   `json:"session_id"`
			TimeoutSeconds               *float64 `json:"timeout_seconds"`
			Files                        []inputFile
		}
		if err := json.Unmarshal(data, &args); err != nil {
			t.Fatalf("accepted %s, which does not decode: %v", data, err)
		}
		if job.Language != args.Language || job.Code != args.Code || job.Image != args.Image || string(job.Stdin) != args.Stdin ||
			sessionID != args.SessionID || job.OutputDir != outputDir {
			t.Fatalf("job %+v does not match the arguments %s", job, data)
		}
		if args.TimeoutSeconds != nil && (job.Limits.Timeout <= 0 || job.Limits.Timeout > time.Hour) {
			t.Fatalf("accepted timeout_seconds %v as %v", *args.TimeoutSeconds, job.Limits.Timeout)
		}
		if len(job.Files) != len(args.Files) {
			t.Fatalf("%d files in the job, %d sent", len(job.Files), len(args.Files))
		}
		for i, file := range args.Files {
			want := []byte(file.Content)
			if file.Encoding == "base64" {
				want, err = base64.StdEncoding.DecodeString(file.Content)
				if err != nil {
					t.Fatalf("accepted invalid base64 %q", file.Content)
				}
			} else if !utf8.ValidString(file.Content) || file.Encoding != "" && file.Encoding != "text" {
				t.Fatalf("accepted content %q in encoding %q", file.Content, file.Encoding)
			}
			if job.Files[i].Path != file.Path || !bytes.Equal(job.Files[i].Data, want) {
				t.Fatalf("file %d is %q %q, sent %q %q", i, job.Files[i].Path, job.Files[i].Data, file.Path, want)
			}
		}

		checked, lang, err := sandbox.Policy{Images: []string{"alpine:3"}}.Check(job)
		if err != nil {
			// The policy names job fields; the tool's text names the
			// argument they come from.
			var in *sandbox.InputError
			if !errors.As(err, &in) || !slices.Contains(policyFields, in.Field) {
				t.Fatalf("policy refusal %#v is not an InputError naming a job field", err)
			}
			arg := in.Field
			if name, ok := argumentNames[arg]; ok {
				arg = name
			}
			if text := errorText(err); !strings.HasPrefix(text, `Invalid argument "`+arg+`": `) {
				t.Fatalf("refusal rendered as %q, not naming %q", text, arg)
			}
			return
		}
		for _, file := range checked.Files {
			if !insideWorkspace(file.Path) || file.Path == lang.Filename || file.Path == outputDir {
				t.Fatalf("accepted file path %q", file.Path)
			}
		}
	})
}

// FuzzSessionToolArgs decodes the arguments of each session tool. Every
// refusal is an InputError naming the argument; accepted arguments are
// exactly the ones the tool's schema declares, its required ones present,
// and write_file's content decodes as its encoding says.
func FuzzSessionToolArgs(f *testing.F) {
	tools := sessionTools(testEnv())
	f.Fuzz(func(t *testing.T, which uint8, data []byte) {
		tool := tools[int(which)%len(tools)]
		var raw any
		if json.Unmarshal(data, &raw) != nil {
			return
		}
		sent, _ := raw.(map[string]any)
		var schema struct {
			Properties map[string]any `json:"properties"`
			Required   []string       `json:"required"`
		}
		if err := json.Unmarshal(tool.input, &schema); err != nil {
			t.Fatal(err)
		}
		var declared []string
		for name := range schema.Properties {
			declared = append(declared, name)
		}
		_, args, err := tool.decode(raw)
		if err != nil {
			checkArgError(t, err, append(declared, "arguments"), sent)
			return
		}
		for name := range args {
			if !slices.Contains(declared, name) {
				t.Fatalf("%s accepted undeclared argument %q", tool.name, name)
			}
		}
		for _, name := range schema.Required {
			if _, ok := args[name]; !ok {
				t.Fatalf("%s accepted arguments without %q", tool.name, name)
			}
		}
		if tool.name != "write_file" {
			return
		}
		var a writeFileArgs
		if err := json.Unmarshal(data, &a); err != nil {
			t.Fatalf("write_file accepted %s, which does not decode: %v", data, err)
		}
		file, err := a.file()
		if err != nil {
			checkArgError(t, err, declared, nil)
			return
		}
		want := []byte(a.Content)
		if a.Encoding == "base64" {
			if want, err = base64.StdEncoding.DecodeString(a.Content); err != nil {
				t.Fatalf("write_file accepted invalid base64 %q", a.Content)
			}
		} else if !utf8.ValidString(a.Content) || a.Encoding != "" && a.Encoding != "text" {
			t.Fatalf("write_file accepted content %q in encoding %q", a.Content, a.Encoding)
		}
		if !bytes.Equal(file.Data, want) {
			t.Fatalf("write_file decoded %q as %q", a.Content, file.Data)
		}
	})
}
