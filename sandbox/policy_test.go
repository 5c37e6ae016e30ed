package sandbox_test

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/safe-run/safe-run/sandbox"
)

// pythonJob returns a valid job for the default policy.
func pythonJob() sandbox.Job {
	return sandbox.Job{Language: "python", Code: "print('hello')\n"}
}

// wantInputError fails the test unless err is an *InputError for field whose
// message contains every one of msgs.
func wantInputError(t *testing.T, err error, field string, msgs ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want an *InputError for %q", field)
	}
	var ie *sandbox.InputError
	if !errors.As(err, &ie) {
		t.Fatalf("got error %v (%T), want an *InputError", err, err)
	}
	if ie.Field != field {
		t.Errorf("InputError.Field = %q, want %q (error: %v)", ie.Field, field, err)
	}
	for _, m := range msgs {
		if !strings.Contains(ie.Msg, m) {
			t.Errorf("InputError.Msg = %q, want it to contain %q", ie.Msg, m)
		}
	}
}

func TestInputErrorError(t *testing.T) {
	err := error(&sandbox.InputError{Field: "memory", Msg: "is too large"})
	if got, want := err.Error(), "memory: is too large"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

func TestPolicyLanguages(t *testing.T) {
	var p sandbox.Policy
	if got, want := p.LanguageNames(), []string{"python", "node", "bash"}; !slices.Equal(got, want) {
		t.Errorf("LanguageNames() = %q, want %q", got, want)
	}
	for _, tt := range []struct{ name, filename string }{
		{"python", "main.py"},
		{"node", "main.js"},
		{"bash", "main.sh"},
	} {
		lang, ok := p.Language(tt.name)
		if !ok {
			t.Errorf("Language(%q) not found", tt.name)
			continue
		}
		if lang.Name != tt.name || lang.Filename != tt.filename || len(lang.Command) == 0 {
			t.Errorf("Language(%q) = %+v, want name %q, filename %q and a command", tt.name, lang, tt.name, tt.filename)
		}
	}
	if lang, ok := p.Language("ruby"); ok {
		t.Errorf("Language(%q) = %+v, true; want not found", "ruby", lang)
	}
}

func TestPolicyCheckLanguage(t *testing.T) {
	tests := []struct {
		name     string
		language string
		msgs     []string
	}{
		{"empty", "", []string{"no language given", "python, node, bash"}},
		{"unknown", "ruby", []string{`"ruby" is not available`, "python, node, bash"}},
		{"names are case sensitive", "Python", []string{`"Python" is not available`}},
		{"no trimming", " python", []string{"not available"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			job := pythonJob()
			job.Language = tt.language
			_, _, err := sandbox.Policy{}.Check(job)
			wantInputError(t, err, "language", tt.msgs...)
		})
	}

	for _, name := range []string{"python", "node", "bash"} {
		t.Run("accepts "+name, func(t *testing.T) {
			job := pythonJob()
			job.Language = name
			_, lang, err := sandbox.Policy{}.Check(job)
			if err != nil {
				t.Fatalf("Check: %v", err)
			}
			if lang.Name != name {
				t.Errorf("Check returned language %q, want %q", lang.Name, name)
			}
		})
	}
}

func TestPolicyCheckCode(t *testing.T) {
	tests := []struct {
		name string
		code string
		msg  string // "" means the code is accepted
	}{
		{"empty", "", "is empty"},
		{"only whitespace", " \n\t\r\n ", "is empty"},
		{"over the limit", strings.Repeat("x", sandbox.DefaultMaxCodeBytes+1), "over the 1MiB limit"},
		{"NUL byte", "print(1)\x00", "NUL byte"},
		{"lone NUL byte", "\x00", "NUL byte"},
		{"invalid UTF-8", "print('\xff')", "UTF-8"},
		{"truncated UTF-8 sequence", "print('\xe2\x9c')", "UTF-8"},
		{"at the limit", strings.Repeat("x", sandbox.DefaultMaxCodeBytes), ""},
		{"non-ASCII text", "print('héllo ✓ 世界')", ""},
		{"one character", "x", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			job := pythonJob()
			job.Code = tt.code
			got, _, err := sandbox.Policy{}.Check(job)
			if tt.msg == "" {
				if err != nil {
					t.Fatalf("Check: %v", err)
				}
				if got.Code != tt.code {
					t.Errorf("Check changed the code")
				}
				return
			}
			wantInputError(t, err, "code", tt.msg)
		})
	}
}

func TestPolicyCheckDefaults(t *testing.T) {
	t.Run("zero limits take every default", func(t *testing.T) {
		in := pythonJob()
		in.Stdin = []byte("input")
		in.Files = []sandbox.File{{Path: "data.txt", Data: []byte("data"), Executable: true}}
		got, lang, err := sandbox.Policy{}.Check(in)
		if err != nil {
			t.Fatalf("Check: %v", err)
		}
		if got.Limits != sandbox.DefaultLimits {
			t.Errorf("Limits = %+v, want DefaultLimits %+v", got.Limits, sandbox.DefaultLimits)
		}
		if got.Limits.Timeout != 30*time.Second {
			t.Errorf("Timeout = %v, want 30s", got.Limits.Timeout)
		}
		if got.Limits.MemoryBytes != 512*mib {
			t.Errorf("MemoryBytes = %d, want 512MiB", got.Limits.MemoryBytes)
		}
		if got.Limits.OutputBytes != mib {
			t.Errorf("OutputBytes = %d, want 1MiB", got.Limits.OutputBytes)
		}
		if got.Code != in.Code || string(got.Stdin) != "input" || len(got.Files) != 1 || got.Files[0].Path != "data.txt" || !got.Files[0].Executable {
			t.Errorf("Check changed the job's content: got %+v", got)
		}
		if lang.Filename != "main.py" {
			t.Errorf("language file = %q, want main.py", lang.Filename)
		}
	})

	t.Run("given limits are kept", func(t *testing.T) {
		in := pythonJob()
		in.Limits = sandbox.Limits{Timeout: 5 * time.Second, CPUs: 2, OpenFiles: 100}
		got, _, err := sandbox.Policy{}.Check(in)
		if err != nil {
			t.Fatalf("Check: %v", err)
		}
		want := sandbox.DefaultLimits
		want.Timeout, want.CPUs, want.OpenFiles = 5*time.Second, 2, 100
		if got.Limits != want {
			t.Errorf("Limits = %+v, want %+v", got.Limits, want)
		}
	})

	t.Run("policy defaults override the package defaults", func(t *testing.T) {
		p := sandbox.Policy{Default: sandbox.Limits{Timeout: 5 * time.Second, MemoryBytes: 128 * mib}}
		got, _, err := p.Check(pythonJob())
		if err != nil {
			t.Fatalf("Check: %v", err)
		}
		want := sandbox.DefaultLimits
		want.Timeout, want.MemoryBytes = 5*time.Second, 128*mib
		if got.Limits != want {
			t.Errorf("Limits = %+v, want %+v", got.Limits, want)
		}
	})
}

func TestPolicyCheckLimits(t *testing.T) {
	tests := []struct {
		name   string
		limits sandbox.Limits
		field  string
		msgs   []string
	}{
		{"timeout below", sandbox.Limits{Timeout: time.Millisecond}, "timeout", []string{"1ms is out of range", "from 10ms to 1h0m0s"}},
		{"timeout above", sandbox.Limits{Timeout: 2 * time.Hour}, "timeout", []string{"2h0m0s is out of range"}},
		{"timeout negative", sandbox.Limits{Timeout: -time.Second}, "timeout", []string{"-1s"}},
		{"memory below", sandbox.Limits{MemoryBytes: mib}, "memory", []string{"1MiB is out of range", "from 64MiB to 16GiB"}},
		{"memory above", sandbox.Limits{MemoryBytes: 32 * gib}, "memory", []string{"32GiB is out of range"}},
		{"memory negative", sandbox.Limits{MemoryBytes: -1}, "memory", []string{"-1B"}},
		{"processes below", sandbox.Limits{Processes: 1}, "processes", []string{"1 is out of range", "from 8 to 4096"}},
		{"processes above", sandbox.Limits{Processes: 5000}, "processes", []string{"5000 is out of range"}},
		{"cpus below", sandbox.Limits{CPUs: 0.01}, "cpus", []string{"0.01 is out of range", "from 0.05 to 64"}},
		{"cpus above", sandbox.Limits{CPUs: 65}, "cpus", []string{"65 is out of range"}},
		{"cpus NaN", sandbox.Limits{CPUs: math.NaN()}, "cpus", []string{"NaN"}},
		{"cpus +Inf", sandbox.Limits{CPUs: math.Inf(1)}, "cpus", nil},
		{"cpus -Inf", sandbox.Limits{CPUs: math.Inf(-1)}, "cpus", nil},
		{"output below", sandbox.Limits{OutputBytes: 512}, "output", []string{"512B is out of range", "from 1KiB to 64MiB"}},
		{"output above", sandbox.Limits{OutputBytes: 128 * mib}, "output", []string{"128MiB"}},
		{"workspace below", sandbox.Limits{WorkspaceBytes: kib}, "workspace", []string{"from 1MiB to 8GiB"}},
		{"workspace above", sandbox.Limits{WorkspaceBytes: 9 * gib}, "workspace", []string{"9GiB"}},
		{"tmp below", sandbox.Limits{TmpBytes: kib}, "tmp", []string{"from 1MiB to 8GiB"}},
		{"tmp above", sandbox.Limits{TmpBytes: 9 * gib}, "tmp", []string{"9GiB"}},
		{"file size below", sandbox.Limits{FileSizeBytes: kib}, "file_size", []string{"from 1MiB to 8GiB"}},
		{"file size above", sandbox.Limits{FileSizeBytes: 9 * gib}, "file_size", []string{"9GiB"}},
		{"open files below", sandbox.Limits{OpenFiles: 63}, "open_files", []string{"from 64 to 65536"}},
		{"open files above", sandbox.Limits{OpenFiles: 65537}, "open_files", []string{"65537"}},
		{"first bad field is named", sandbox.Limits{Timeout: 2 * time.Hour, MemoryBytes: 32 * gib}, "timeout", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			job := pythonJob()
			job.Limits = tt.limits
			_, _, err := sandbox.Policy{}.Check(job)
			wantInputError(t, err, tt.field, tt.msgs...)
		})
	}

	t.Run("whole message", func(t *testing.T) {
		job := pythonJob()
		job.Limits.MemoryBytes = 32 * gib
		_, _, err := sandbox.Policy{}.Check(job)
		want := "memory: 32GiB is out of range; use a value from 64MiB to 16GiB"
		if err == nil || err.Error() != want {
			t.Errorf("Check error = %v, want %q", err, want)
		}
	})

	for _, tt := range []struct {
		name   string
		limits sandbox.Limits
	}{
		{"minimum limits", sandbox.MinLimits},
		{"maximum limits", sandbox.MaxLimits},
	} {
		t.Run("accepts "+tt.name, func(t *testing.T) {
			job := pythonJob()
			job.Limits = tt.limits
			got, _, err := sandbox.Policy{}.Check(job)
			if err != nil {
				t.Fatalf("Check: %v", err)
			}
			if got.Limits != tt.limits {
				t.Errorf("Limits = %+v, want %+v", got.Limits, tt.limits)
			}
		})
	}
}

func TestPolicyCheckCustomPolicy(t *testing.T) {
	p := sandbox.Policy{
		Languages:     []sandbox.Language{{Name: "ruby", Filename: "main.rb", Command: []string{"ruby", "main.rb"}}},
		Default:       sandbox.Limits{Timeout: 5 * time.Second},
		Min:           sandbox.Limits{MemoryBytes: 128 * mib},
		Max:           sandbox.Limits{Timeout: 10 * time.Second},
		MaxCodeBytes:  16,
		MaxFiles:      2,
		MaxFilesBytes: 100,
	}
	rubyJob := func() sandbox.Job { return sandbox.Job{Language: "ruby", Code: "puts 1"} }

	t.Run("limits", func(t *testing.T) {
		def, lo, hi := p.Limits()
		if def.Timeout != 5*time.Second || def.MemoryBytes != sandbox.DefaultLimits.MemoryBytes {
			t.Errorf("default limits = %+v, want timeout 5s and the package's default memory", def)
		}
		if lo.MemoryBytes != 128*mib || lo.Timeout != sandbox.MinLimits.Timeout {
			t.Errorf("minimum limits = %+v, want memory 128MiB and the package's minimum timeout", lo)
		}
		if hi.Timeout != 10*time.Second || hi.MemoryBytes != sandbox.MaxLimits.MemoryBytes {
			t.Errorf("maximum limits = %+v, want timeout 10s and the package's maximum memory", hi)
		}
	})

	t.Run("language names", func(t *testing.T) {
		if got := p.LanguageNames(); !slices.Equal(got, []string{"ruby"}) {
			t.Errorf("LanguageNames() = %q, want [ruby]", got)
		}
	})

	t.Run("valid job", func(t *testing.T) {
		got, lang, err := p.Check(rubyJob())
		if err != nil {
			t.Fatalf("Check: %v", err)
		}
		if lang.Filename != "main.rb" {
			t.Errorf("language file = %q, want main.rb", lang.Filename)
		}
		if got.Limits.Timeout != 5*time.Second {
			t.Errorf("Timeout = %v, want the policy default 5s", got.Limits.Timeout)
		}
	})

	tests := []struct {
		name  string
		edit  func(*sandbox.Job)
		field string // "" means the job is accepted
		msgs  []string
	}{
		{"default language is unavailable", func(j *sandbox.Job) { j.Language = "python" }, "language", []string{`"python" is not available; use one of ruby`}},
		{"timeout at policy maximum", func(j *sandbox.Job) { j.Limits.Timeout = 10 * time.Second }, "", nil},
		{"timeout over policy maximum", func(j *sandbox.Job) { j.Limits.Timeout = 11 * time.Second }, "timeout", []string{"from 10ms to 10s"}},
		{"memory at policy minimum", func(j *sandbox.Job) { j.Limits.MemoryBytes = 128 * mib }, "", nil},
		{"memory under policy minimum", func(j *sandbox.Job) { j.Limits.MemoryBytes = 100 * mib }, "memory", []string{"from 128MiB to 16GiB"}},
		{"code at policy limit", func(j *sandbox.Job) { j.Code = strings.Repeat("x", 16) }, "", nil},
		{"code over policy limit", func(j *sandbox.Job) { j.Code = strings.Repeat("x", 17) }, "code", []string{"is 17B, over the 16B limit"}},
		{"files at policy count", func(j *sandbox.Job) { j.Files = []sandbox.File{{Path: "a"}, {Path: "b"}} }, "", nil},
		{"files over policy count", func(j *sandbox.Job) { j.Files = []sandbox.File{{Path: "a"}, {Path: "b"}, {Path: "c"}} }, "files", []string{"3 files given, the limit is 2"}},
		{"bytes at policy limit", func(j *sandbox.Job) {
			j.Files = []sandbox.File{{Path: "a", Data: make([]byte, 60)}}
			j.Stdin = make([]byte, 40)
		}, "", nil},
		{"bytes over policy limit", func(j *sandbox.Job) {
			j.Files = []sandbox.File{{Path: "a", Data: make([]byte, 60)}}
			j.Stdin = make([]byte, 41)
		}, "files", []string{"total 101 bytes, over the 100B limit"}},
		{"file named like the code file", func(j *sandbox.Job) { j.Files = []sandbox.File{{Path: "main.rb"}} }, "files", []string{"where the code is written"}},
		{"another language's code file is fine", func(j *sandbox.Job) { j.Files = []sandbox.File{{Path: "main.py"}} }, "", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			job := rubyJob()
			tt.edit(&job)
			_, _, err := p.Check(job)
			if tt.field == "" {
				if err != nil {
					t.Fatalf("Check: %v", err)
				}
				return
			}
			wantInputError(t, err, tt.field, tt.msgs...)
		})
	}
}

// files returns n files with distinct paths.
func files(n int) []sandbox.File {
	fs := make([]sandbox.File, n)
	for i := range fs {
		fs[i].Path = fmt.Sprintf("file%03d.txt", i)
	}
	return fs
}

func TestPolicyCheckFiles(t *testing.T) {
	big := make([]byte, sandbox.DefaultMaxFilesBytes+1)
	tests := []struct {
		name  string
		files []sandbox.File
		stdin []byte
		msg   string // "" means the job is accepted
	}{
		{"no files", nil, nil, ""},
		{"nested paths", []sandbox.File{{Path: "data/input.csv"}, {Path: "a/b/c.txt"}, {Path: "data/more.csv"}}, nil, ""},
		{"hidden and dotted names", []sandbox.File{{Path: ".hidden"}, {Path: "..data"}, {Path: "a/...b"}}, nil, ""},
		{"spaces and non-ASCII", []sandbox.File{{Path: "my file.txt"}, {Path: "données/été.csv"}}, nil, ""},
		{"another language's code file", []sandbox.File{{Path: "main.js"}, {Path: "main.py.bak"}, {Path: "lib/main.py"}}, nil, ""},
		{"executable with data", []sandbox.File{{Path: "run.sh", Data: []byte("#!/bin/sh\n"), Executable: true}}, nil, ""},

		{"empty path", []sandbox.File{{Path: ""}}, nil, "empty file path"},
		{"absolute path", []sandbox.File{{Path: "/etc/passwd"}}, nil, "is absolute"},
		{"parent directory", []sandbox.File{{Path: "../x"}}, nil, "leaves the workspace"},
		{"parent directory in the middle", []sandbox.File{{Path: "a/../../x"}}, nil, "leaves the workspace"},
		{"parent directory that stays inside", []sandbox.File{{Path: "a/../b"}}, nil, "leaves the workspace"},
		{"dot component", []sandbox.File{{Path: "a/./b"}}, nil, `not clean; write it as "a/b"`},
		{"leading dot component", []sandbox.File{{Path: "./a"}}, nil, "not clean"},
		{"double slash", []sandbox.File{{Path: "a//b"}}, nil, `not clean; write it as "a/b"`},
		{"trailing slash", []sandbox.File{{Path: "a/"}}, nil, "not clean"},
		{"backslash", []sandbox.File{{Path: `a\b`}}, nil, "backslash"},
		{"newline", []sandbox.File{{Path: "a\nb"}}, nil, "control characters"},
		{"DEL", []sandbox.File{{Path: "a\x7fb"}}, nil, "control characters"},
		{"invalid UTF-8", []sandbox.File{{Path: "a\xffb"}}, nil, "invalid UTF-8"},
		{"path too long", []sandbox.File{{Path: strings.Repeat("a/", 512) + "b"}}, nil, "too long"},
		{"name too long", []sandbox.File{{Path: strings.Repeat("n", 256)}}, nil, "over 255 bytes"},
		{"bad path after good ones", []sandbox.File{{Path: "ok.txt"}, {Path: "/abs"}}, nil, "is absolute"},
		{"code file", []sandbox.File{{Path: "main.py"}}, nil, `"main.py" is where the code is written`},
		{"duplicate", []sandbox.File{{Path: "a.txt"}, {Path: "b.txt"}, {Path: "a.txt"}}, nil, `"a.txt" is given twice`},
		{"file and directory", []sandbox.File{{Path: "a"}, {Path: "a/b"}}, nil, `"a" is both a file and a directory`},
		{"directory and file", []sandbox.File{{Path: "a/b"}, {Path: "a"}}, nil, `"a" is both a file and a directory`},
		{"file and deep directory", []sandbox.File{{Path: "x/y"}, {Path: "x/y/z/w"}}, nil, `"x/y" is both a file and a directory`},
		{"at the file count limit", files(sandbox.DefaultMaxFiles), nil, ""},
		{"too many files", files(sandbox.DefaultMaxFiles + 1), nil, "257 files given, the limit is 256"},
		{"at the byte limit", []sandbox.File{{Path: "big", Data: big[:sandbox.DefaultMaxFilesBytes-10]}}, big[:10], ""},
		{"files over the byte limit", []sandbox.File{{Path: "big", Data: big}}, nil, "files and stdin total"},
		{"files and stdin over the byte limit", []sandbox.File{{Path: "a", Data: big[:sandbox.DefaultMaxFilesBytes/2]}, {Path: "b", Data: big[:sandbox.DefaultMaxFilesBytes/2]}}, big[:1], "over the 64MiB limit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			job := pythonJob()
			job.Files, job.Stdin = tt.files, tt.stdin
			got, _, err := sandbox.Policy{}.Check(job)
			if tt.msg == "" {
				if err != nil {
					t.Fatalf("Check: %v", err)
				}
				if len(got.Files) != len(tt.files) {
					t.Errorf("Check returned %d files, want %d", len(got.Files), len(tt.files))
				}
				return
			}
			wantInputError(t, err, "files", tt.msg)
		})
	}
}

func TestPolicyCheckStdinOverLimit(t *testing.T) {
	job := pythonJob()
	job.Stdin = make([]byte, sandbox.DefaultMaxFilesBytes+1)
	_, _, err := sandbox.Policy{}.Check(job)
	wantInputError(t, err, "stdin", "over the 64MiB limit")
}

// TestPolicyCheckFilesBelowCodeFile checks that a file cannot turn the code
// file, or a directory the code file is written in, into something else: the
// run would fail in the sandbox, blamed on the sandbox rather than the input.
func TestPolicyCheckFilesBelowCodeFile(t *testing.T) {
	t.Run("code file used as a directory", func(t *testing.T) {
		job := pythonJob()
		job.Files = []sandbox.File{{Path: "main.py/data.txt"}}
		_, _, err := sandbox.Policy{}.Check(job)
		wantInputError(t, err, "files", "main.py")
	})
	t.Run("code file's directory used as a file", func(t *testing.T) {
		p := sandbox.Policy{Languages: []sandbox.Language{{Name: "python", Filename: "src/main.py", Command: []string{"python3", "src/main.py"}}}}
		job := pythonJob()
		job.Files = []sandbox.File{{Path: "src"}}
		_, _, err := p.Check(job)
		wantInputError(t, err, "files", "src")
	})
}

func TestCheckPath(t *testing.T) {
	// A path of exactly 1024 bytes made of names within the 255-byte limit.
	name := strings.Repeat("n", 204)
	path1024 := strings.Join([]string{name, name, name, name, name}, "/")
	if len(path1024) != 1024 {
		t.Fatalf("test path is %d bytes, want 1024", len(path1024))
	}

	tests := []struct {
		path string
		msg  string // "" means the path is accepted
	}{
		{"a", ""},
		{"data/input.csv", ""},
		{"a/b/c/d/e", ""},
		{".hidden", ""},
		{"..data", ""},
		{"a..", ""},
		{"a/.b/..c", ""},
		{"with space", ""},
		{"tilde~", ""},
		{"é/世界.txt", ""},
		{strings.Repeat("n", 255), ""},
		{path1024, ""},

		{"", "empty file path"},
		{"/", "is absolute"},
		{"/a", "is absolute"},
		{"..", "leaves the workspace"},
		{"../a", "leaves the workspace"},
		{"a/..", "leaves the workspace"},
		{"a/../b", "leaves the workspace"},
		{".", "not clean"},
		{"./a", "not clean"},
		{"a/.", "not clean"},
		{"a/./b", "not clean"},
		{"a//b", "not clean"},
		{"a/", "not clean"},
		{`a\b`, "backslash"},
		{`..\a`, "backslash"},
		{"a\x00b", "control characters"},
		{"a\tb", "control characters"},
		{"a\nb", "control characters"},
		{"a\rb", "control characters"},
		{"a\x1fb", "control characters"},
		{"a\x7fb", "control characters"},
		{"a\xffb", "invalid UTF-8"},
		{"\xc3", "invalid UTF-8"},
		{strings.Repeat("n", 256), "over 255 bytes"},
		{"a/" + strings.Repeat("n", 256), "over 255 bytes"},
		{path1024 + "n", "1025 bytes is too long"},
	}
	for _, tt := range tests {
		name := fmt.Sprintf("%.40q", tt.path)
		t.Run(name, func(t *testing.T) {
			err := sandbox.CheckPath(tt.path)
			if tt.msg == "" {
				if err != nil {
					t.Errorf("CheckPath(%q) = %v, want nil", tt.path, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("CheckPath(%q) = nil, want an error containing %q", tt.path, tt.msg)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("CheckPath(%q) = %q, want it to contain %q", tt.path, err, tt.msg)
			}
		})
	}
}

func TestPolicyCheckImage(t *testing.T) {
	ruby := sandbox.Language{Name: "ruby", Filename: "main.rb", Command: []string{"ruby", "main.rb"}, Image: "ruby:3.3"}
	p := sandbox.Policy{Languages: append(slices.Clone(sandbox.DefaultLanguages), ruby), Images: []string{"python:3.12-slim", "team/ds:1"}}
	tests := []struct {
		lang, image string
		wantErr     string
	}{
		{"python", "", ""},
		{"python", "python:3.12-slim", ""},
		{"bash", "team/ds:1", ""},
		{"ruby", "ruby:3.3", ""}, // the language's own image needs no listing
		{"python", "ruby:3.3", `"ruby:3.3" is not allowed; use one of python:3.12-slim, team/ds:1`},
		{"python", "evil:latest", "not allowed"},
	}
	for _, tt := range tests {
		job, _, err := p.Check(sandbox.Job{Language: tt.lang, Code: "x", Image: tt.image})
		if tt.wantErr == "" {
			if err != nil || job.Image != tt.image {
				t.Errorf("Check(%s in %q) = %v, image %q", tt.lang, tt.image, err, job.Image)
			}
			continue
		}
		var in *sandbox.InputError
		if !errors.As(err, &in) || in.Field != "image" || !strings.Contains(in.Msg, tt.wantErr) {
			t.Errorf("Check(%s in %q) = %v, want an image error containing %q", tt.lang, tt.image, err, tt.wantErr)
		}
	}
	var in *sandbox.InputError
	if _, _, err := (sandbox.Policy{}).Check(sandbox.Job{Language: "python", Code: "x", Image: "python:3.12-slim"}); !errors.As(err, &in) || !strings.Contains(in.Msg, "no image may be chosen") {
		t.Errorf("Check with no images allowed = %v", err)
	}
}

func TestMergeLanguages(t *testing.T) {
	got := sandbox.MergeLanguages(sandbox.DefaultLanguages, []sandbox.Language{
		{Name: "python", Image: "python:3.12-slim"},
		{Name: "ruby", Filename: "main.rb", Command: []string{"ruby", "main.rb"}, Image: "ruby:3.3"},
		{Name: "bash", Command: []string{"sh", "main.sh"}},
	})
	if err := sandbox.CheckLanguages(got); err != nil {
		t.Fatalf("sandbox.CheckLanguages: %v", err)
	}
	want := []sandbox.Language{
		{Name: "python", Filename: "main.py", Command: []string{"python3", "-u", "main.py"}, Interpreter: "python", Image: "python:3.12-slim"},
		sandbox.DefaultLanguages[1],
		{Name: "bash", Filename: "main.sh", Command: []string{"sh", "main.sh"}},
		{Name: "ruby", Filename: "main.rb", Command: []string{"ruby", "main.rb"}, Image: "ruby:3.3"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("sandbox.MergeLanguages =\n%+v\nwant\n%+v", got, want)
	}
	if sandbox.DefaultLanguages[0].Image != "" {
		t.Error("sandbox.MergeLanguages changed sandbox.DefaultLanguages")
	}
}

func TestCheckLanguages(t *testing.T) {
	ok := sandbox.Language{Name: "ruby", Filename: "main.rb", Command: []string{"ruby", "main.rb"}}
	tests := []struct {
		name string
		lang sandbox.Language
		want string
	}{
		{"no name", sandbox.Language{Filename: "a", Command: []string{"a"}}, "no name"},
		{"no command", sandbox.Language{Name: "x", Filename: "a"}, "no command"},
		{"no filename", sandbox.Language{Name: "x", Command: []string{"x"}}, "no filename"},
		{"escaping filename", sandbox.Language{Name: "x", Filename: "../a", Command: []string{"x"}}, "leaves the workspace"},
		{"unknown interpreter", sandbox.Language{Name: "x", Filename: "a", Command: []string{"x"}, Interpreter: "ruby"}, "not one of"},
		{"twice", ok, "twice"},
	}
	for _, tt := range tests {
		err := sandbox.CheckLanguages([]sandbox.Language{ok, tt.lang})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: sandbox.CheckLanguages = %v, want an error containing %q", tt.name, err, tt.want)
		}
	}
}

// TestPolicyValidate checks the configured policy as a server checks it at
// start: a maximum timeout beyond the ceiling, a default outside the
// bounds, and language names that could not stand in a schema or a log
// line are refused.
func TestPolicyValidate(t *testing.T) {
	withName := func(name string) []sandbox.Language {
		return sandbox.MergeLanguages(sandbox.DefaultLanguages, []sandbox.Language{{Name: name, Filename: "main.rb", Command: []string{"ruby", "main.rb"}}})
	}
	for _, tc := range []struct {
		name   string
		policy sandbox.Policy
		want   string // substring of the error; "" means valid
	}{
		{"the defaults", sandbox.Policy{}, ""},
		{"a maximum timeout of a day", sandbox.Policy{Max: sandbox.Limits{Timeout: 24 * time.Hour}}, ""},
		{"a maximum timeout over a day", sandbox.Policy{Max: sandbox.Limits{Timeout: 1000 * time.Hour}}, "above the longest safe-run allows, 24h0m0s"},
		{"a default timeout over the maximum is lowered", sandbox.Policy{Default: sandbox.Limits{Timeout: time.Hour}, Max: sandbox.Limits{Timeout: time.Minute}}, ""},
		{"a default memory under the minimum", sandbox.Policy{Default: sandbox.Limits{MemoryBytes: sandbox.MiB}}, "memory"},
		{"a language named plainly", sandbox.Policy{Languages: withName("ruby3.3")}, ""},
		{"a language name with a NUL", sandbox.Policy{Languages: withName("ru\x00by")}, "not a short name"},
		{"a language name with a newline", sandbox.Policy{Languages: withName("ruby\nlevel=ERROR")}, "not a short name"},
		{"a language name with a space", sandbox.Policy{Languages: withName("ru by")}, "not a short name"},
		{"a language name of 33 letters", sandbox.Policy{Languages: withName(strings.Repeat("r", 33))}, "not a short name"},
		{"a language name of other letters", sandbox.Policy{Languages: withName("рубин")}, "not a short name"},
		{"a language name starting with a dash", sandbox.Policy{Languages: withName("-ruby")}, "not a short name"},
		{"a command with a NUL", sandbox.Policy{Languages: sandbox.MergeLanguages(sandbox.DefaultLanguages, []sandbox.Language{{Name: "ruby", Filename: "main.rb", Command: []string{"ruby\x00", "main.rb"}}})}, "NUL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.policy.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate = %v, want the policy valid", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v, want an error about %q", err, tc.want)
			}
		})
	}
}
