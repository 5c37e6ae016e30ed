package agent

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path"
	"syscall"
)

// collect gathers the regular files below workdir/c.Dir, within c's bounds.
// It never follows a symbolic link: the program may have planted links to
// files it could not read itself, or to paths outside the workspace.
func collect(workdir string, c *Collect) []OutputFile {
	root, err := os.OpenRoot(workdir)
	if err != nil {
		return nil
	}
	defer root.Close()
	if fi, err := root.Lstat(c.Dir); err != nil || !fi.IsDir() {
		return nil // no such directory (or a link to one): nothing to collect
	}
	var (
		out   []OutputFile
		total int64
	)
	_ = fs.WalkDir(root.FS(), c.Dir, func(name string, d fs.DirEntry, err error) error {
		if err != nil || name == c.Dir && d.IsDir() {
			return nil
		}
		rel := name[len(c.Dir)+1:]
		if d.IsDir() {
			if depth(rel) >= 8 {
				return fs.SkipDir
			}
			return nil
		}
		if len(out) >= c.MaxFiles {
			return fs.SkipAll
		}
		f := OutputFile{Path: rel}
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			f.Skipped = "symbolic link (not followed)"
		case !d.Type().IsRegular():
			f.Skipped = "not a regular file"
		default:
			f.Data, f.Size, f.Skipped = readRegular(root, name, c.MaxFileBytes, c.MaxTotalBytes-total)
			total += int64(len(f.Data))
		}
		out = append(out, f)
		return nil
	})
	return out
}

// readRegular reads a regular file without following a link at its last
// component, within max bytes and what is left of the total.
func readRegular(root *os.Root, name string, max, left int64) (data []byte, size int64, skipped string) {
	file, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, 0, "cannot be opened"
	}
	defer file.Close()
	fi, err := file.Stat()
	switch {
	case err != nil || !fi.Mode().IsRegular():
		return nil, 0, "not a regular file"
	case fi.Size() > max:
		return nil, fi.Size(), "larger than the per-file limit"
	case fi.Size() > left:
		return nil, fi.Size(), "over the total limit of output files"
	}
	data, err = io.ReadAll(io.LimitReader(file, fi.Size()))
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fi.Size(), "cannot be read"
	}
	return data, int64(len(data)), ""
}

func depth(p string) int {
	n := 0
	for d := p; d != "." && d != "/"; d = path.Dir(d) {
		n++
	}
	return n
}
