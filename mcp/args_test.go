package mcp

import (
	"bytes"
	"encoding/base64"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/safe-run/safe-run/sandbox"
)

// Calls run_code with arguments the handler refuses: the call succeeds, the
// tool result is an error naming the argument, and nothing runs.
func TestRunCodeInvalidArguments(t *testing.T) {
	tests := []struct {
		name string
		args any
		cfg  Config
		want []string // substrings of the error text
	}{
		{name: "unknown argument", args: map[string]any{"language": "python", "code": "print(1)", "x": 1},
			want: []string{`Invalid arguments: unknown argument "x"`, "language, code, timeout_seconds, stdin, files"}},
		{name: "misspelt argument", args: map[string]any{"language": "python", "code": "print(1)", "timeout": 5},
			want: []string{`unknown argument "timeout"`}},
		{name: "no arguments", args: nil, want: []string{"Invalid arguments: arguments must be a JSON object"}},
		{name: "code is a number", args: map[string]any{"language": "python", "code": 42},
			want: []string{`argument "code" must be of type string`}},
		{name: "language is an array", args: map[string]any{"language": []string{"python"}, "code": "1"},
			want: []string{`argument "language" must be of type string`}},
		{name: "files is a string", args: map[string]any{"language": "python", "code": "1", "files": "x"},
			want: []string{`argument "files" must be of type array`}},
		{name: "file is a string", args: map[string]any{"language": "python", "code": "1", "files": []any{"x"}},
			want: []string{`argument "files" must be of type object`}},
		{name: "file path is a number", args: map[string]any{"language": "python", "code": "1", "files": []any{map[string]any{"path": 1, "content": ""}}},
			want: []string{`argument "files.path" must be of type string`}},
		{name: "timeout is a string", args: map[string]any{"language": "python", "code": "1", "timeout_seconds": "5"},
			want: []string{`argument "timeout_seconds" must be of type number`}},
		{name: "stdin is a boolean", args: map[string]any{"language": "python", "code": "1", "stdin": true},
			want: []string{`argument "stdin" must be of type string`}},
		{name: "zero timeout", args: map[string]any{"language": "python", "code": "1", "timeout_seconds": 0},
			want: []string{`argument "timeout_seconds" must be greater than 0 and at most 3600`}},
		{name: "negative timeout", args: map[string]any{"language": "python", "code": "1", "timeout_seconds": -1},
			want: []string{`argument "timeout_seconds" must be greater than 0 and at most 3600`}},
		{name: "huge timeout", args: map[string]any{"language": "python", "code": "1", "timeout_seconds": 1e308},
			want: []string{`argument "timeout_seconds" must be greater than 0 and at most 3600`}},
		{name: "timeout just over the maximum", args: map[string]any{"language": "python", "code": "1", "timeout_seconds": 3600.5},
			want: []string{`argument "timeout_seconds" must be greater than 0 and at most 3600`}},
		{name: "timeout over a configured maximum", cfg: Config{MaxTimeout: time.Minute},
			args: map[string]any{"language": "python", "code": "1", "timeout_seconds": 61},
			want: []string{`argument "timeout_seconds" must be greater than 0 and at most 60`}},
		{name: "invalid base64", args: map[string]any{"language": "python", "code": "1",
			"files": []any{map[string]any{"path": "a.bin", "content": "not base64!", "encoding": "base64"}}},
			want: []string{`argument "files"[0]: content of a.bin is not valid base64`}},
		{name: "unknown encoding", args: map[string]any{"language": "python", "code": "1",
			"files": []any{map[string]any{"path": "a.txt", "content": "x"}, map[string]any{"path": "b.txt", "content": "x", "encoding": "hex"}}},
			want: []string{`argument "files"[1]: encoding "hex" of b.txt is not text or base64`}},
		{name: "misspelt file field", args: map[string]any{"language": "python", "code": "1",
			"files": []any{map[string]any{"path": "a.txt", "content": "x", "encodign": "text"}}},
			want: []string{`Invalid arguments: argument "files": unknown field "encodign"; its fields are path, content, encoding`}},
		{name: "code of null", args: map[string]any{"language": "python", "code": nil},
			want: []string{`Invalid argument "code": is empty`}},

		// Errors of the policy name the tool's arguments.
		{name: "unknown language", args: map[string]any{"language": "cobol", "code": "1"},
			want: []string{`Invalid argument "language": "cobol" is not available; use one of python, node, bash`}},
		{name: "no language", args: map[string]any{"code": "1"},
			want: []string{`Invalid argument "language": no language given`}},
		{name: "empty code", args: map[string]any{"language": "python", "code": "  \n"},
			want: []string{`Invalid argument "code": is empty`}},
		{name: "timeout under the policy's minimum", args: map[string]any{"language": "python", "code": "1", "timeout_seconds": 0.001},
			want: []string{`Invalid argument "timeout_seconds": 1ms is out of range`}},
		// 1e-10 s is 0.1ns, which a time.Duration truncates to 0, the
		// value meaning "the default timeout": it must be refused like any
		// other timeout under the policy's minimum, not run for 30s.
		{name: "timeout that rounds to zero", args: map[string]any{"language": "python", "code": "1", "timeout_seconds": 1e-10},
			want: []string{`"timeout_seconds"`}},
		{name: "timeout over the policy's maximum", cfg: Config{MaxTimeout: 2 * time.Hour},
			args: map[string]any{"language": "python", "code": "1", "timeout_seconds": 5000},
			want: []string{`Invalid argument "timeout_seconds": 1h23m20s is out of range`}},
		{name: "absolute file path", args: map[string]any{"language": "python", "code": "1",
			"files": []any{map[string]any{"path": "/etc/passwd", "content": "x"}}},
			want: []string{`Invalid argument "files": file path "/etc/passwd" is absolute`}},
		{name: "file in place of the code", args: map[string]any{"language": "python", "code": "1",
			"files": []any{map[string]any{"path": "main.py", "content": "x"}}},
			want: []string{`Invalid argument "files": "main.py" is where the code is written`}},
		{name: "file in place of the output directory", args: map[string]any{"language": "python", "code": "1",
			"files": []any{map[string]any{"path": "out", "content": "x"}}},
			want: []string{`Invalid argument "files": "out" is the output directory`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			runner := &fakeRunner{result: sandbox.Result{Status: sandbox.StatusOK}}
			cfg := tt.cfg
			cfg.Runner = runner
			c := newClient(t, cfg)
			res := callRunCode(t, c, tt.args)
			text := firstText(t, res)
			if !res.IsError {
				t.Errorf("IsError = false, want true; text %q", text)
			}
			for _, w := range tt.want {
				if !strings.Contains(text, w) {
					t.Errorf("error text %q does not contain %q", text, w)
				}
			}
			if jobs := runner.Jobs(); len(jobs) != 0 {
				t.Errorf("the runner was called %d times with invalid arguments", len(jobs))
			}
		})
	}
}

// A runner error is a tool error: invalid input in the same words as the
// policy's, anything else not called an invalid argument (see
// TestToolErrorsByClass for every class).
func TestRunCodeRunnerError(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"input error", &sandbox.InputError{Field: "timeout", Msg: "too long"}, `Invalid argument "timeout_seconds": too long`},
		{"other error", errFake("backend unusable"), "internal error: backend unusable; this is not your code's fault but a fault of the server, which its operator should report"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newClient(t, Config{Runner: &fakeRunner{err: tt.err}})
			res := callRunCode(t, c, map[string]any{"language": "python", "code": "print(1)"})
			if !res.IsError {
				t.Error("IsError = false, want true")
			}
			if got := firstText(t, res); got != tt.want {
				t.Errorf("text = %q, want %q", got, tt.want)
			}
		})
	}
}

type errFake string

func (e errFake) Error() string { return string(e) }

// The job given to the runner carries the arguments as they were sent.
func TestRunCodeJob(t *testing.T) {
	binary := []byte{0, 1, 2, 0xff, 0xfe, '\n', 0}
	tests := []struct {
		name string
		args map[string]any
		want sandbox.Job
	}{
		{
			name: "minimal",
			args: map[string]any{"language": "python", "code": "print(1)"},
			want: sandbox.Job{Language: "python", Code: "print(1)", Stdin: []byte{}, OutputDir: "out"},
		},
		{
			name: "everything",
			args: map[string]any{
				"language": "node", "code": "console.log(1)", "stdin": "line 1\nline 2\n", "timeout_seconds": 2.5,
				"files": []any{
					map[string]any{"path": "data/in.txt", "content": "héllo\n"},
					map[string]any{"path": "t.txt", "content": "plain", "encoding": "text"},
					map[string]any{"path": "blob.bin", "content": base64.StdEncoding.EncodeToString(binary), "encoding": "base64"},
					map[string]any{"path": "empty.bin", "content": "", "encoding": "base64"},
				},
			},
			want: sandbox.Job{
				Language: "node", Code: "console.log(1)", Stdin: []byte("line 1\nline 2\n"), OutputDir: "out",
				Limits: sandbox.Limits{Timeout: 2500 * time.Millisecond},
				Files: []sandbox.File{
					{Path: "data/in.txt", Data: []byte("héllo\n")},
					{Path: "t.txt", Data: []byte("plain")},
					{Path: "blob.bin", Data: binary},
					{Path: "empty.bin", Data: []byte{}},
				},
			},
		},
		{
			name: "maximum timeout",
			args: map[string]any{"language": "bash", "code": "echo", "timeout_seconds": 3600},
			want: sandbox.Job{Language: "bash", Code: "echo", Stdin: []byte{}, OutputDir: "out", Limits: sandbox.Limits{Timeout: time.Hour}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			runner := &fakeRunner{result: sandbox.Result{Status: sandbox.StatusOK}}
			c := newClient(t, Config{Runner: runner})
			res := callRunCode(t, c, tt.args)
			if res.IsError {
				t.Fatalf("IsError = true: %s", firstText(t, res))
			}
			jobs := runner.Jobs()
			if len(jobs) != 1 {
				t.Fatalf("runner called %d times, want 1", len(jobs))
			}
			job := jobs[0]
			if job.Language != tt.want.Language || job.Code != tt.want.Code || job.OutputDir != tt.want.OutputDir {
				t.Errorf("job language %q, code %q, output dir %q; want %q, %q, %q",
					job.Language, job.Code, job.OutputDir, tt.want.Language, tt.want.Code, tt.want.OutputDir)
			}
			if !bytes.Equal(job.Stdin, tt.want.Stdin) {
				t.Errorf("job stdin %q, want %q", job.Stdin, tt.want.Stdin)
			}
			if job.Limits != tt.want.Limits {
				t.Errorf("job limits %+v, want %+v", job.Limits, tt.want.Limits)
			}
			if len(job.Files) != len(tt.want.Files) {
				t.Fatalf("job has %d files, want %d", len(job.Files), len(tt.want.Files))
			}
			for i, f := range job.Files {
				w := tt.want.Files[i]
				if f.Path != w.Path || !bytes.Equal(f.Data, w.Data) || f.Executable != w.Executable {
					t.Errorf("file %d = {%q, %q, %v}, want {%q, %q, %v}", i, f.Path, f.Data, f.Executable, w.Path, w.Data, w.Executable)
				}
			}
			if job.Stdout != nil || job.Stderr != nil {
				t.Error("job has live output writers; the MCP server has nowhere to send them")
			}
		})
	}
}

// Values JSON cannot carry reach parseArgs only from Go callers; they must
// still be refused.
func TestParseArgsUnencodable(t *testing.T) {
	h := &handler{maxTimeout: time.Hour}
	tests := []struct {
		name string
		raw  any
	}{
		{"NaN timeout", map[string]any{"language": "python", "code": "1", "timeout_seconds": math.NaN()}},
		{"infinite timeout", map[string]any{"language": "python", "code": "1", "timeout_seconds": math.Inf(1)}},
		{"channel", map[string]any{"language": "python", "code": "1", "stdin": make(chan int)}},
		{"not an object", []string{"python", "print(1)"}},
		{"a string", "print(1)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if job, _, err := h.parseArgs(tt.raw); err == nil {
				t.Errorf("parseArgs accepted %v as %+v", tt.raw, job)
			}
		})
	}
}
