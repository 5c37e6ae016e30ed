//go:build linux

package agent

import (
	"bytes"
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

// emptyDir says whether dir (relative to the workspace) is a directory with
// nothing in it, so that collecting it, which walks it on a thread of its
// own as the program's user (see asUser), can be skipped: most runs leave
// their output directory empty. It looks as the agent itself, root, but
// only opens a directory for reading, never through a symbolic link or out
// of the workspace, and returns nothing of what it sees but "empty": where
// the answer is no, or the look fails, the walk as the user decides what
// comes back, as it always did.
//
// The workspace stays open from the first look (see workspace): opening
// and closing it were two more system calls between a warm run's end and
// its Exit.
func (s *server) emptyDir(dir string) bool {
	ws, err := s.workspace()
	if err != nil {
		return false
	}
	fd, err := openFdBeneath(ws, dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NONBLOCK, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	buf := make([]byte, 4096)
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			return false
		}
		if n == 0 {
			return true
		}
		for b := buf[:n]; len(b) > 0; {
			// struct linux_dirent64: ino (8), off (8), reclen (2), type (1), name.
			reclen := int(b[16]) | int(b[17])<<8
			if reclen < 20 || reclen > len(b) {
				return false
			}
			name := b[19:reclen]
			if i := bytes.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			if s := string(name); s != "." && s != ".." {
				return false
			}
			b = b[reclen:]
		}
	}
}

// workspace returns a descriptor of the workspace directory, opened on
// first use (O_PATH: it reads nothing through it itself) and kept: the
// workspace is a mount point that nothing in the sandbox can replace.
func (s *server) workspace() (int, error) {
	if s.wsOpen {
		return s.ws, nil
	}
	ws, err := unix.Open(s.cfg.Workdir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	s.ws, s.wsOpen = ws, true
	return ws, nil
}
