package sandbox

import (
	"errors"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"
)

// workspace stands for the sandbox's /workspace in the path invariants.
const workspace = "/workspace"

// insideWorkspace reports whether the workspace path p, joined to the
// workspace as the agent does, names something strictly below it, and
// exactly p.
func insideWorkspace(p string) bool {
	joined := filepath.Join(workspace, p)
	rel, err := filepath.Rel(workspace, joined)
	return err == nil && strings.HasPrefix(joined, workspace+"/") && rel == p
}

// FuzzCheckPath: an accepted path is relative, clean, printable and stays
// inside the workspace, naming exactly the file it spells.
func FuzzCheckPath(f *testing.F) {
	f.Fuzz(func(t *testing.T, p string) {
		err := CheckPath(p)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("refusal without a message")
			}
			return
		}
		switch {
		case !insideWorkspace(p):
			t.Fatalf("accepted %q, which resolves to %q", p, filepath.Join(workspace, p))
		case path.Clean(p) != p || path.IsAbs(p) || p == ".":
			t.Fatalf("accepted %q, which is not a clean relative path", p)
		case !utf8.ValidString(p) || strings.ContainsFunc(p, unicode.IsControl) || strings.Contains(p, "\\"):
			t.Fatalf("accepted %q, which has control characters, invalid UTF-8 or a backslash", p)
		case slices.Contains(strings.Split(p, "/"), ".."):
			t.Fatalf("accepted %q, which has a '..'", p)
		}
	})
}

// fields are the InputError fields Policy.Check may name.
var fields = []string{"language", "code", "image", "files", "stdin", "output_dir",
	"timeout", "memory", "processes", "cpus", "output", "workspace", "tmp", "file_size", "open_files"}

// FuzzPolicyCheck: every refusal is an InputError naming a job field; an
// accepted job is within the policy in every respect.
func FuzzPolicyCheck(f *testing.F) {
	p := Policy{MaxCodeBytes: 64, MaxFiles: 4, MaxFilesBytes: 256}
	def, lo, hi := p.Limits()
	f.Fuzz(func(t *testing.T, lang, code, paths string, data []byte, stdin uint16, outputDir string,
		timeout, memory int64, processes int, cpus float64, output int64) {
		job := Job{Language: lang, Code: code, Stdin: make([]byte, stdin%512), OutputDir: outputDir,
			Limits: Limits{Timeout: time.Duration(timeout), MemoryBytes: memory, Processes: processes, CPUs: cpus, OutputBytes: output}}
		if paths != "" {
			for _, name := range strings.Split(paths, "\n") {
				job.Files = append(job.Files, File{Path: name, Data: data})
			}
		}
		checked, l, err := p.Check(job)
		if err != nil {
			var in *InputError
			if !errors.As(err, &in) || !slices.Contains(fields, in.Field) || in.Msg == "" {
				t.Fatalf("refusal %#v is not an InputError naming a job field", err)
			}
			return
		}
		if l.Name != lang || strings.TrimSpace(checked.Code) == "" || len(checked.Code) > 64 ||
			strings.ContainsRune(checked.Code, 0) || !utf8.ValidString(checked.Code) {
			t.Fatalf("accepted language %q, code %q", lang, checked.Code)
		}
		if outputDir != "" && !insideWorkspace(outputDir) {
			t.Fatalf("accepted output directory %q", outputDir)
		}
		total := int64(len(checked.Stdin))
		names := map[string]bool{l.Filename: true}
		for _, file := range checked.Files {
			if !insideWorkspace(file.Path) || names[file.Path] || file.Path == outputDir {
				t.Fatalf("accepted file %q (outside, duplicate, the code file or the output directory)", file.Path)
			}
			names[file.Path] = true
			total += int64(len(file.Data))
		}
		for name := range names {
			for dir := path.Dir(name); dir != "."; dir = path.Dir(dir) {
				if names[dir] {
					t.Fatalf("accepted %q both as a file and as the directory of %q", dir, name)
				}
			}
		}
		if len(checked.Files) > 4 || total > 256 {
			t.Fatalf("accepted %d files of %d bytes, over the caps", len(checked.Files), total)
		}
		got, in := checked.Limits, job.Limits
		for _, b := range []struct {
			name           string
			v, in, d, l, h float64
		}{
			{"timeout", float64(got.Timeout), float64(in.Timeout), float64(def.Timeout), float64(lo.Timeout), float64(hi.Timeout)},
			{"memory", float64(got.MemoryBytes), float64(in.MemoryBytes), float64(def.MemoryBytes), float64(lo.MemoryBytes), float64(hi.MemoryBytes)},
			{"processes", float64(got.Processes), float64(in.Processes), float64(def.Processes), float64(lo.Processes), float64(hi.Processes)},
			{"cpus", got.CPUs, in.CPUs, def.CPUs, lo.CPUs, hi.CPUs},
			{"output", float64(got.OutputBytes), float64(in.OutputBytes), float64(def.OutputBytes), float64(lo.OutputBytes), float64(hi.OutputBytes)},
		} {
			want := b.in
			if b.in == 0 {
				want = b.d
			}
			if b.v != want || !(b.v >= b.l && b.v <= b.h) {
				t.Fatalf("limit %s = %v (asked %v): want %v within [%v, %v]", b.name, b.v, b.in, want, b.l, b.h)
			}
		}
		if again, _, err := p.Check(checked); err != nil || again.Limits != checked.Limits {
			t.Fatalf("a checked job does not pass again unchanged: %v", err)
		}
	})
}
