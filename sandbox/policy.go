package sandbox

import (
	"fmt"
	"path"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/safe-run/safe-run/egress"
)

// Language says how to run code of one language inside the image.
type Language struct {
	// Name is what jobs ask for, e.g. "python".
	Name string `json:"name"`
	// Filename is where the code is written, relative to the workspace. It
	// is the code's own directory so that imports of workspace files work.
	Filename string `json:"filename"`
	// Command runs the code; it is resolved inside the sandbox's PATH.
	Command []string `json:"command"`
	// Interpreter is the kind of persistent interpreter sessions of this
	// language use ("python", "node" or "bash"); empty means the language
	// has no sessions.
	Interpreter string `json:"interpreter,omitempty"`
	// Install is the command that installs Job.Packages before the code
	// runs, the packages appended to it, in the workspace as the program's
	// user; empty means the language installs none (Policy.Check refuses
	// packages for it).
	Install []string `json:"install,omitempty"`
	// Image is the image the language runs in, e.g. "ruby:3.3"; empty
	// means the runner's default image.
	Image string `json:"image,omitempty"`
}

// DefaultLanguages are the languages of the default image.
var DefaultLanguages = []Language{
	{Name: "python", Filename: "main.py", Command: []string{"python3", "-u", "main.py"}, Interpreter: "python",
		Install: []string{"python3", "-m", "pip", "install", "--user", "--no-warn-script-location", "--disable-pip-version-check", "--progress-bar", "off", "--no-input", "--"}},
	{Name: "node", Filename: "main.js", Command: []string{"node", "main.js"}, Interpreter: "node",
		Install: []string{"npm", "install", "--no-audit", "--no-fund", "--no-update-notifier", "--no-save", "--"}},
	{Name: "bash", Filename: "main.sh", Command: []string{"bash", "main.sh"}, Interpreter: "bash"},
}

// Policy decides which jobs are acceptable and fills in their defaults.
// The zero Policy uses DefaultLanguages, DefaultLimits, MinLimits, MaxLimits
// and the default input caps.
type Policy struct {
	Languages []Language
	Default   Limits
	Min       Limits
	Max       Limits
	// MaxCodeBytes caps the size of Job.Code.
	MaxCodeBytes int
	// MaxFiles caps the number of Job.Files.
	MaxFiles int
	// MaxFilesBytes caps the total size of Job.Files plus Job.Stdin.
	MaxFilesBytes int64
	// OutputFiles bounds what comes back from a job's OutputDir; zero
	// fields take DefaultOutputFiles'.
	OutputFiles OutputFileLimits
	// Images are the images a job may ask for by Job.Image, besides its
	// language's own.
	Images []string
	// Network is what jobs may ask to reach (Job.Network selects from it);
	// the zero Allowlist gives no job a network.
	Network egress.Allowlist
	// NetworkLimits cap each networked sandbox; zero fields take egress's
	// defaults.
	NetworkLimits egress.Limits
	// Packages are what jobs may ask to install (Job.Packages): names,
	// names with a version specifier, or "*".
	Packages []string
	// PackageIndex names the indexes installs use instead of the public
	// ones, e.g. a mirror reached through a pinned entry.
	PackageIndex PackageIndex
}

// PackageIndex names the package indexes of installs; empty fields mean
// the public ones (the pypi and npm presets).
type PackageIndex struct {
	// PipIndexURL is pip's index (PIP_INDEX_URL), e.g. https://mirror.corp/simple.
	PipIndexURL string `json:"pip_index_url,omitempty"`
	// NPMRegistry is npm's registry (npm_config_registry).
	NPMRegistry string `json:"npm_registry,omitempty"`
}

// OutputFileLimits bound the files a run returns.
type OutputFileLimits struct {
	MaxFiles      int   `json:"max_files"`
	MaxFileBytes  int64 `json:"max_file_bytes"`
	MaxTotalBytes int64 `json:"max_total_bytes"`
}

// DefaultOutputFiles are the output file caps of the zero Policy.
var DefaultOutputFiles = OutputFileLimits{MaxFiles: 32, MaxFileBytes: 8 << 20, MaxTotalBytes: 32 << 20}

// OutputFileLimits returns the policy's output file caps.
func (p Policy) OutputFileLimits() OutputFileLimits {
	l := p.OutputFiles
	if l.MaxFiles == 0 {
		l.MaxFiles = DefaultOutputFiles.MaxFiles
	}
	if l.MaxFileBytes == 0 {
		l.MaxFileBytes = DefaultOutputFiles.MaxFileBytes
	}
	if l.MaxTotalBytes == 0 {
		l.MaxTotalBytes = DefaultOutputFiles.MaxTotalBytes
	}
	return l
}

// Default input caps of the zero Policy.
const (
	DefaultMaxCodeBytes  = 1 << 20
	DefaultMaxFiles      = 256
	DefaultMaxFilesBytes = 64 << 20
)

func (p Policy) languages() []Language {
	if len(p.Languages) == 0 {
		return DefaultLanguages
	}
	return p.Languages
}

// LanguageNames lists the names of the policy's languages, in order.
func (p Policy) LanguageNames() []string {
	var names []string
	for _, l := range p.languages() {
		names = append(names, l.Name)
	}
	return names
}

// Language returns the language called name.
func (p Policy) Language(name string) (Language, bool) {
	i := slices.IndexFunc(p.languages(), func(l Language) bool { return l.Name == name })
	if i < 0 {
		return Language{}, false
	}
	return p.languages()[i], true
}

// LanguageForFile returns the first of the policy's languages whose code
// file (Filename) has the extension of the file name, so that a language
// added to the policy is found by its files too. Besides, .cjs finds the
// language of .js files and .bash that of .sh files: those languages run
// such files alike.
func (p Policy) LanguageForFile(name string) (Language, bool) {
	ext := path.Ext(name)
	if same, ok := extensionSynonyms[ext]; ok {
		ext = same
	}
	if ext == "" {
		return Language{}, false
	}
	i := slices.IndexFunc(p.languages(), func(l Language) bool { return path.Ext(l.Filename) == ext })
	if i < 0 {
		return Language{}, false
	}
	return p.languages()[i], true
}

// extensionSynonyms are file extensions that name the same kind of file as
// another: node runs a .cjs file as it runs main.js (CommonJS), and bash a
// .bash file as main.sh.
var extensionSynonyms = map[string]string{".cjs": ".js", ".bash": ".sh"}

// MergeLanguages returns base with each of extra added, or replacing the
// language of the same name. A replacement keeps the filename and command
// it leaves out, and the interpreter when it keeps the command: mapping
// python to another image is {"name": "python", "image": "python:3.12"}.
func MergeLanguages(base, extra []Language) []Language {
	out := slices.Clone(base)
	for _, l := range extra {
		if i := slices.IndexFunc(out, func(b Language) bool { return b.Name == l.Name }); i >= 0 {
			if l.Filename == "" {
				l.Filename = out[i].Filename
			}
			if len(l.Command) == 0 {
				l.Command = out[i].Command
			}
			if l.Interpreter == "" && slices.Equal(l.Command, out[i].Command) {
				l.Interpreter = out[i].Interpreter
			}
			out[i] = l
			continue
		}
		out = append(out, l)
	}
	return out
}

// CheckLanguages reports a language table that cannot run code: names
// missing or repeated, commands or filenames missing or unsafe.
func CheckLanguages(langs []Language) error {
	seen := map[string]bool{}
	for _, l := range langs {
		switch {
		case l.Name == "":
			return fmt.Errorf("a language has no name")
		case !validLanguageName(l.Name):
			return fmt.Errorf("language name %q is not a short name: use 1 to 32 letters, digits and _ + . - (such as ruby or python3.12)", l.Name)
		case seen[l.Name]:
			return fmt.Errorf("language %q is given twice", l.Name)
		case len(l.Command) == 0 || l.Command[0] == "":
			return fmt.Errorf("language %q has no command; give one such as [\"ruby\", \"main.rb\"]", l.Name)
		case slices.ContainsFunc(l.Command, func(arg string) bool { return strings.IndexByte(arg, 0) >= 0 }):
			return fmt.Errorf("language %q: its command contains a NUL byte, which no program can be given", l.Name)
		case l.Filename == "":
			return fmt.Errorf("language %q has no filename; give the file its code is written to, such as main.rb", l.Name)
		case l.Interpreter != "" && !slices.Contains([]string{"python", "node", "bash"}, l.Interpreter):
			return fmt.Errorf("language %q: interpreter %q is not one of python, node, bash; leave it out to run without sessions", l.Name, l.Interpreter)
		}
		if err := CheckPath(l.Filename); err != nil {
			return fmt.Errorf("language %q: %v", l.Name, err)
		}
		seen[l.Name] = true
	}
	return nil
}

// validLanguageName reports whether name can stand in tool schemas, metric
// labels, log lines and audit records as it is: 1 to 32 letters, digits
// and _ + . -, starting with a letter or digit.
func validLanguageName(name string) bool {
	if len(name) == 0 || len(name) > 32 {
		return false
	}
	for i, r := range name {
		switch {
		case r < utf8.RuneSelf && (unicode.IsLetter(r) || unicode.IsDigit(r)):
		case i > 0 && strings.ContainsRune("_+.-", r):
		default:
			return false
		}
	}
	return true
}

// Validate reports a policy that cannot serve: a language table that
// cannot run code, network settings that cannot serve (validateNetwork),
// a maximum timeout beyond TimeoutCeiling, or a default limit outside the
// policy's bounds.
func (p Policy) Validate() error {
	if err := CheckLanguages(p.languages()); err != nil {
		return err
	}
	if err := p.validateNetwork(); err != nil {
		return err
	}
	def, lo, hi := p.Limits()
	if hi.Timeout > TimeoutCeiling {
		return fmt.Errorf("the maximum timeout %s is above the longest safe-run allows, %s", hi.Timeout, TimeoutCeiling)
	}
	return def.check(lo, hi)
}

// Limits returns the default, minimum and maximum limits of the policy. A
// default above the policy's maximum is lowered to it, so that a policy with
// a small maximum does not refuse every job that asks for nothing.
func (p Policy) Limits() (def, lo, hi Limits) {
	lo, hi = p.Min.withDefaults(MinLimits), p.Max.withDefaults(MaxLimits)
	def = p.Default.withDefaults(DefaultLimits)
	def.Timeout = min(def.Timeout, hi.Timeout)
	def.MemoryBytes = min(def.MemoryBytes, hi.MemoryBytes)
	def.Processes = min(def.Processes, hi.Processes)
	def.CPUs = min(def.CPUs, hi.CPUs)
	def.OutputBytes = min(def.OutputBytes, hi.OutputBytes)
	def.WorkspaceBytes = min(def.WorkspaceBytes, hi.WorkspaceBytes)
	def.TmpBytes = min(def.TmpBytes, hi.TmpBytes)
	def.FileSizeBytes = min(def.FileSizeBytes, hi.FileSizeBytes)
	def.OpenFiles = min(def.OpenFiles, hi.OpenFiles)
	return def, lo, hi
}

// Check validates job and returns it with defaults filled in, and the
// language it asks for. Every error is an *InputError.
func (p Policy) Check(job Job) (Job, Language, error) {
	lang, ok := p.Language(job.Language)
	if !ok {
		names := p.LanguageNames()
		if job.Language == "" {
			return job, lang, &InputError{Field: "language", Msg: "no language given; use one of " + strings.Join(names, ", ")}
		}
		return job, lang, &InputError{Field: "language", Msg: fmt.Sprintf("%q is not available; use one of %s", job.Language, strings.Join(names, ", "))}
	}
	if job.Image != "" && job.Image != lang.Image && !slices.Contains(p.Images, job.Image) {
		if len(p.Images) == 0 {
			return job, lang, &InputError{Field: "image", Msg: fmt.Sprintf("%q is not allowed: no image may be chosen here; leave it out", job.Image)}
		}
		return job, lang, &InputError{Field: "image", Msg: fmt.Sprintf("%q is not allowed; use one of %s, or leave it out", job.Image, strings.Join(p.Images, ", "))}
	}
	if err := p.CheckCodeSize(len(job.Code)); err != nil {
		return job, lang, err
	}
	switch {
	case strings.TrimSpace(job.Code) == "":
		return job, lang, &InputError{Field: "code", Msg: "is empty; pass the program to run"}
	case strings.IndexByte(job.Code, 0) >= 0:
		return job, lang, &InputError{Field: "code", Msg: "contains a NUL byte; send source text"}
	case !utf8.ValidString(job.Code):
		return job, lang, &InputError{Field: "code", Msg: "is not valid UTF-8; send source text in UTF-8"}
	}
	if err := p.checkFiles(job, lang); err != nil {
		return job, lang, err
	}
	if job.OutputDir != "" {
		if err := CheckPath(job.OutputDir); err != nil {
			return job, lang, &InputError{Field: "output_dir", Msg: err.Error()}
		}
	}
	network, err := p.checkNetwork(&job)
	if err != nil {
		return job, lang, err
	}
	if err := p.checkPackages(job, lang, network); err != nil {
		return job, lang, err
	}
	def, lo, hi := p.Limits()
	job.Limits = job.Limits.withDefaults(def)
	if err := job.Limits.check(lo, hi); err != nil {
		return job, lang, err
	}
	return job, lang, nil
}

// CheckCodeSize refuses code of n bytes if it is over the policy's limit,
// as Check does. Callers holding a request's raw arguments use it to refuse
// an oversized program before copying it further.
func (p Policy) CheckCodeSize(n int) error {
	maxCode := p.MaxCodeBytes
	if maxCode == 0 {
		maxCode = DefaultMaxCodeBytes
	}
	if n > maxCode {
		return &InputError{Field: "code", Msg: fmt.Sprintf("is %s, over the %s limit; send a shorter program or pass data as files",
			FormatBytes(int64(n)), FormatBytes(int64(maxCode)))}
	}
	return nil
}

func (p Policy) checkFiles(job Job, lang Language) error {
	maxFiles, maxBytes := p.MaxFiles, p.MaxFilesBytes
	if maxFiles == 0 {
		maxFiles = DefaultMaxFiles
	}
	if maxBytes == 0 {
		maxBytes = DefaultMaxFilesBytes
	}
	if len(job.Files) > maxFiles {
		return &InputError{Field: "files", Msg: fmt.Sprintf("%d files given, the limit is %d; pack them into an archive", len(job.Files), maxFiles)}
	}
	if int64(len(job.Stdin)) > maxBytes {
		return &InputError{Field: "stdin", Msg: fmt.Sprintf("is %d bytes, over the %s limit", len(job.Stdin), FormatBytes(maxBytes))}
	}
	total := int64(len(job.Stdin))
	seen := make(map[string]bool, len(job.Files))
	for _, f := range job.Files {
		if err := CheckPath(f.Path); err != nil {
			return &InputError{Field: "files", Msg: err.Error()}
		}
		clean := path.Clean(f.Path)
		if clean == lang.Filename {
			return &InputError{Field: "files", Msg: fmt.Sprintf("%q is where the code is written; rename the file", f.Path)}
		}
		if job.OutputDir != "" && clean == path.Clean(job.OutputDir) {
			return &InputError{Field: "files", Msg: fmt.Sprintf("%q is the output directory; put files inside it or rename the file", f.Path)}
		}
		if seen[clean] {
			return &InputError{Field: "files", Msg: fmt.Sprintf("%q is given twice", f.Path)}
		}
		seen[clean] = true
		total += int64(len(f.Data))
	}
	seen[lang.Filename] = true // no file may sit below the code file either
	for p := range seen {
		for dir := path.Dir(p); dir != "."; dir = path.Dir(dir) {
			if seen[dir] {
				return &InputError{Field: "files", Msg: fmt.Sprintf("%q is both a file and a directory", dir)}
			}
		}
	}
	if total > maxBytes {
		return &InputError{Field: "files", Msg: fmt.Sprintf("files and stdin total %d bytes, over the %s limit", total, FormatBytes(maxBytes))}
	}
	return nil
}

// CheckPath reports whether p is acceptable as a workspace file path: a
// relative, clean, slash-separated path of printable names that stays
// inside the workspace.
func CheckPath(p string) error {
	switch {
	case p == "":
		return fmt.Errorf("empty file path; give a path relative to /workspace")
	case len(p) > 1024:
		return fmt.Errorf("file path of %d bytes is too long; the limit is 1024", len(p))
	case !utf8.ValidString(p) || strings.ContainsFunc(p, unicode.IsControl):
		return fmt.Errorf("file path %q has control characters or invalid UTF-8", p)
	case strings.HasPrefix(p, "/"):
		return fmt.Errorf("file path %q is absolute; give a path relative to /workspace", p)
	case strings.Contains(p, "\\"):
		return fmt.Errorf("file path %q has a backslash; use / between names", p)
	}
	for _, name := range strings.Split(p, "/") {
		switch {
		case name == "..":
			return fmt.Errorf("file path %q leaves the workspace; remove the '..'", p)
		case name == "" || name == ".":
			return fmt.Errorf("file path %q is not clean; write it as %q", p, path.Clean(p))
		case len(name) > 255:
			return fmt.Errorf("file path %q has a name over 255 bytes", p)
		}
	}
	return nil
}

// InputError is a job the policy refuses, naming the offending field and
// what to do instead.
type InputError struct {
	// Field is the job field at fault: language, code, files, stdin,
	// network, packages, or a limit's name (timeout, memory, processes,
	// cpus, output, ...).
	Field string
	// Msg says what is wrong and how to fix it.
	Msg string
}

func (e *InputError) Error() string { return e.Field + ": " + e.Msg }

// Is makes every InputError of class ErrInvalid.
func (e *InputError) Is(target error) bool { return target == ErrInvalid }
