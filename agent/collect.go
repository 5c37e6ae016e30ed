//go:build linux

package agent

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path"
	"syscall"

	"golang.org/x/sys/unix"
)

// collect gathers the regular files below workdir/c.Dir, within c's bounds,
// as user (see asUser). It never follows a symbolic link: the program may
// have planted links to files it could not read itself, or to paths outside
// the workspace, and may swap them in while the walk runs.
func collect(workdir string, c *Collect, user *syscall.Credential) []OutputFile {
	var out []OutputFile
	for _, f := range collectStamped(workdir, c, user) {
		out = append(out, f.OutputFile)
	}
	return out
}

// stampedFile is a collected file and how it looked when it was read.
type stampedFile struct {
	OutputFile
	stamp fileStamp
}

func collectStamped(workdir string, c *Collect, user *syscall.Credential) []stampedFile {
	var (
		out   []stampedFile
		total int64
	)
	_ = inWorkspace(workdir, user, func(ws *os.File) error {
		dir, err := openDirBeneath(ws, c.Dir)
		if err != nil {
			return nil // no such directory (or a link to one): nothing to collect
		}
		defer dir.Close()
		return walkBeneath(dir, "", func(e *entry) error {
			if e.isDir() {
				if depth(e.rel) >= 8 {
					return fs.SkipDir
				}
				return nil
			}
			if len(out) >= c.MaxFiles {
				return fs.SkipAll
			}
			f := stampedFile{OutputFile: OutputFile{Path: e.rel}, stamp: stampOf(&e.st)}
			switch {
			case e.isLink():
				f.Skipped = "symbolic link (not followed)"
			case !e.isRegular():
				f.Skipped = "not a regular file"
			default:
				file, err := openBeneath(e.parent, e.name, unix.O_RDONLY|unix.O_NONBLOCK, 0)
				if err != nil {
					f.Skipped = "cannot be opened"
					break
				}
				if fi, err := file.Stat(); err == nil { // what was read, not what was listed
					f.stamp = fileStamp{size: fi.Size(), mtime: fi.ModTime()}
				}
				f.Data, f.Size, f.Skipped = readRegular(file, c.MaxFileBytes, c.MaxTotalBytes-total)
				file.Close()
				total += int64(len(f.Data))
			}
			out = append(out, f)
			return nil
		})
	})
	return out
}

// readRegular reads file, which must be a regular file, within max bytes
// and what is left of the total.
func readRegular(file *os.File, max, left int64) (data []byte, size int64, skipped string) {
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
