package main

// Writing a run's output files on the host (`safe-run run --out DIR`). The
// names and the contents are the program's: untrusted. A name the program
// chooses must not make the host run anything, so the writer never
// replaces a file unless told, never writes a name beginning with a dot
// (.git/config, .envrc, .bashrc), never follows a link, and a DIR that is
// the root of a version-control checkout is refused before anything runs.

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/safe-run/safe-run/mcp"
	"github.com/safe-run/safe-run/sandbox"
)

// outOptions say what `--out DIR` may do besides creating new files.
type outOptions struct {
	overwrite bool // replace existing regular files (--out-overwrite)
	allowVCS  bool // DIR may be the root of a checkout (--out-allow-vcs)
}

// vcsMarkers are the entries that make a directory the root of a
// version-control checkout. Git also marks worktrees and submodules with a
// .git file.
var vcsMarkers = []string{".git", ".hg", ".svn", ".bzr", "_darcs", ".jj", ".pijul", ".fslckout", "_FOSSIL_", "CVS"}

// vcsMetadata are the directories a version-control tool keeps its own
// configuration and hooks in: never a place for a program's output.
var vcsMetadata = []string{".git", ".hg", ".svn", ".bzr", "_darcs", ".jj", ".pijul", "CVS"}

// checkOutDir refuses, before the run, a DIR whose files the host's tools
// would act on: inside a version-control directory always, the root of a
// checkout unless allowVCS.
func checkOutDir(dir string, opts outOptions) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return usageError("--out %s: %v", dir, err)
	}
	abs = resolveExisting(abs)
	for _, part := range strings.Split(abs, string(filepath.Separator)) {
		for _, m := range vcsMetadata {
			if part == m {
				return usageError("--out %s is inside %s, a version-control directory whose files its tool runs; choose another directory", dir, m)
			}
		}
	}
	if opts.allowVCS {
		return nil
	}
	for _, m := range vcsMarkers {
		if _, err := os.Lstat(filepath.Join(abs, m)); err == nil {
			return usageError("--out %s is the root of a version-control checkout (it has %s): files written there, such as a Makefile or a CI workflow, may run on this host; "+
				"choose an empty directory, or pass --out-allow-vcs", dir, m)
		}
	}
	return nil
}

// resolveExisting resolves the links in the longest existing prefix of the
// absolute path p, so that a link to a checkout counts as the checkout.
func resolveExisting(p string) string {
	var rest []string
	for {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			return filepath.Join(append([]string{r}, rest...)...)
		}
		parent := filepath.Dir(p)
		if parent == p {
			return filepath.Join(append([]string{p}, rest...)...)
		}
		rest = append([]string{filepath.Base(p)}, rest...)
		p = parent
	}
}

// outNameProblem says why a program-chosen relative path is not written on
// the host, or "" if it may be.
func outNameProblem(name string) string {
	if !utf8.ValidString(name) {
		return "its name is not valid UTF-8"
	}
	for _, r := range name {
		if unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) {
			return "its name has a control character"
		}
	}
	if name == "" || strings.HasPrefix(name, "/") {
		return "its name is not a relative path"
	}
	for _, part := range strings.Split(name, "/") {
		switch {
		case part == "" || part == "." || part == "..":
			return "its name is not a plain relative path"
		case strings.HasPrefix(part, "."):
			return "names beginning with a dot (dotfiles and dot-directories such as .git, .envrc) are never written on the host"
		}
	}
	return ""
}

// outRefusal is a file the writer did not write, and why.
type outRefusal struct {
	index  int // in the files given to writeOutFiles
	reason string
	err    error // set for a failure of the host, not a refusal
}

// writeOutFiles writes files below dir, which it creates if missing; dir's
// own path is the user's and may go through links, nothing below it does.
// It returns one refusal per file not written; a file whose write fails
// is removed.
func writeOutFiles(dir string, files []sandbox.OutputFile, opts outOptions) ([]outRefusal, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("save output files: %w", err)
	}
	dirFD, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("save output files: open %s: %w", dir, err)
	}
	defer unix.Close(dirFD)
	var refused []outRefusal
	for i, f := range files {
		if f.Skipped != "" {
			continue // the sandbox did not return it; already said why
		}
		if reason := outNameProblem(f.Path); reason != "" {
			refused = append(refused, outRefusal{index: i, reason: reason})
			continue
		}
		if reason, err := writeOutFile(dirFD, f.Path, f.Data, opts.overwrite); reason != "" || err != nil {
			refused = append(refused, outRefusal{index: i, reason: reason, err: err})
		}
	}
	return refused, nil
}

// writeOutFile writes one file below the directory dirFD; name is checked.
// A refusal comes back as reason, a failure of the host as err.
func writeOutFile(dirFD int, name string, data []byte, overwrite bool) (reason string, err error) {
	parts := strings.Split(name, "/")
	fd := dirFD
	defer func() {
		if fd != dirFD {
			unix.Close(fd)
		}
	}()
	for _, part := range parts[:len(parts)-1] {
		if err := unix.Mkdirat(fd, part, 0o755); err != nil && err != unix.EEXIST {
			return "", fmt.Errorf("create directory %s: %w", part, err)
		}
		next, err := unix.Openat(fd, part, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		switch {
		case err == unix.ELOOP || err == unix.ENOTDIR:
			return fmt.Sprintf("%s already exists on the host and is not a directory (links are never followed)", part), nil
		case err != nil:
			return "", fmt.Errorf("open directory %s: %w", part, err)
		}
		if fd != dirFD {
			unix.Close(fd)
		}
		fd = next
	}
	base := parts[len(parts)-1]
	if !overwrite {
		return createNew(fd, base, data)
	}
	var st unix.Stat_t
	switch err := unix.Fstatat(fd, base, &st, unix.AT_SYMLINK_NOFOLLOW); {
	case err == unix.ENOENT:
		return createNew(fd, base, data)
	case err != nil:
		return "", fmt.Errorf("stat %s: %w", name, err)
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return "it exists on the host and is not a regular file; --out-overwrite replaces regular files only", nil
	}
	// A new file renamed over the old one: the old name's entry is
	// replaced, never written through (a hard link to another file keeps
	// that file's content).
	tmp := ".safe-run-out-" + randomSuffix()
	if reason, err := createNew(fd, tmp, data); reason != "" || err != nil {
		return reason, err
	}
	if err := unix.Renameat(fd, tmp, fd, base); err != nil {
		_ = unix.Unlinkat(fd, tmp, 0)
		return "", fmt.Errorf("replace %s: %w", name, err)
	}
	return "", nil
}

// createNew creates name below fd with data; an existing entry of any kind
// is left alone.
func createNew(fd int, name string, data []byte) (reason string, err error) {
	f, err := unix.Openat(fd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err == unix.EEXIST {
		return "it already exists on the host and is kept; pass --out-overwrite to replace existing files", nil
	}
	if err != nil {
		return "", fmt.Errorf("create %s: %w", name, err)
	}
	file := os.NewFile(uintptr(f), name)
	_, err = file.Write(data)
	if cerr := file.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = unix.Unlinkat(fd, name, 0)
		return "", fmt.Errorf("write %s: %w", name, err)
	}
	return "", nil
}

func randomSuffix() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// saveFiles writes the run's output files below dir and notes in files,
// and on stderr, each file not written and why. It fails for a failure
// of the host, after trying every file.
func saveFiles(dir string, files []sandbox.OutputFile, opts outOptions) error {
	for _, f := range files {
		if f.Skipped != "" {
			fmt.Fprintf(os.Stderr, "safe-run: out/%s not copied: %s\n", mcp.EscapeName(f.Path), f.Skipped)
		}
	}
	refused, err := writeOutFiles(dir, files, opts)
	if err != nil {
		return err
	}
	var first error
	for _, r := range refused {
		f := &files[r.index]
		if r.err != nil {
			r.reason = r.err.Error()
			if first == nil {
				first = fmt.Errorf("save %s: %w", mcp.EscapeName(f.Path), r.err)
			}
		}
		f.Skipped = "not saved: " + r.reason
		fmt.Fprintf(os.Stderr, "safe-run: out/%s not saved in %s: %s\n", mcp.EscapeName(f.Path), dir, r.reason)
	}
	return first
}
