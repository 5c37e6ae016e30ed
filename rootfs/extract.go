package rootfs

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"time"
)

// ExtractLimits bound what an archive may put on disk.
type ExtractLimits struct {
	// MaxBytes caps the total size of regular files.
	MaxBytes int64
	// MaxEntries caps the number of entries.
	MaxEntries int
}

// DefaultExtractLimits suit a full distribution image with a data-science
// stack (the default image is about 1.3 GiB in 60,000 entries).
var DefaultExtractLimits = ExtractLimits{MaxBytes: 32 << 30, MaxEntries: 2_000_000}

// ExtractStats says what an extraction wrote and what it refused to.
type ExtractStats struct {
	Entries int   // entries written
	Bytes   int64 // bytes of regular files written
	// Skipped counts entries not written: device nodes, fifos, sockets.
	Skipped int
	// Stripped counts entries whose setuid or setgid bits (or, on files,
	// sticky bit) were removed.
	Stripped int
}

// Extract unpacks a tar archive (plain or gzip-compressed) into the
// existing directory dst, which should be empty, safely:
//   - every path, link target of a hard link, and parent directory stays
//     inside dst (symbolic links may point anywhere, but are never followed
//     out of dst while extracting);
//   - device nodes, fifos and sockets are skipped;
//   - setuid and setgid bits are stripped, and extended attributes (file
//     capabilities among them) are not written;
//   - sizes and entry counts are capped.
//
// Ownership is kept when running as root. A failed extraction leaves dst in
// an unspecified state; callers extract into a temporary directory.
func Extract(r io.Reader, dst string, limits ExtractLimits) (ExtractStats, error) {
	var st ExtractStats
	br := bufio.NewReaderSize(r, 1<<20)
	var src io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return st, fmt.Errorf("extract: %w", err)
		}
		defer zr.Close()
		src = zr
	}
	root, err := os.OpenRoot(dst)
	if err != nil {
		return st, fmt.Errorf("extract: %w", err)
	}
	defer root.Close()
	x := extractor{root: root, limits: limits, stats: &st, chown: os.Geteuid() == 0}
	tr := tar.NewReader(src)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			// Read the compressed stream to its end, so that its checksum
			// and length are verified.
			if _, err := io.Copy(io.Discard, src); err != nil {
				return st, fmt.Errorf("extract: read archive: %w", err)
			}
			return st, x.finishDirs()
		}
		if err != nil {
			return st, fmt.Errorf("extract: read archive: %w", err)
		}
		if err := x.entry(hdr, tr); err != nil {
			return st, fmt.Errorf("extract %q: %w", hdr.Name, err)
		}
	}
}

type extractor struct {
	root   *os.Root
	limits ExtractLimits
	stats  *ExtractStats
	chown  bool
	// dirModes are applied after the last entry: a read-only directory
	// must still receive the entries listed after it.
	dirModes map[string]fs.FileMode
}

// finishDirs gives every directory the archive listed its mode.
func (x *extractor) finishDirs() error {
	for name, mode := range x.dirModes {
		if fi, err := x.root.Lstat(name); err != nil || !fi.IsDir() {
			continue // replaced by a later entry
		}
		if err := x.root.Chmod(name, mode); err != nil {
			return fmt.Errorf("extract: set mode of %q: %w", name, err)
		}
	}
	return nil
}

// ErrUnsafePath reports an archive entry that would land outside the root.
var ErrUnsafePath = errors.New("path leaves the image root")

// cleanName turns an archive path into one relative to the root. Leading
// slashes and "./" are dropped (many archives have them); ".." is refused.
func cleanName(name string) (string, error) {
	for _, part := range strings.Split(name, "/") {
		if part == ".." {
			return "", ErrUnsafePath
		}
	}
	clean := strings.TrimLeft(path.Clean("/"+name), "/")
	if clean == "" {
		return ".", nil
	}
	return clean, nil
}

func (x *extractor) entry(hdr *tar.Header, body io.Reader) error {
	name, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	if x.stats.Entries+x.stats.Skipped >= x.limits.MaxEntries {
		return fmt.Errorf("archive has more than %d entries", x.limits.MaxEntries)
	}
	mode := fs.FileMode(hdr.Mode) & fs.ModePerm
	if hdr.Mode&0o6000 != 0 || hdr.Typeflag != tar.TypeDir && hdr.Mode&0o1000 != 0 {
		x.stats.Stripped++
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if hdr.Mode&0o1000 != 0 {
			mode |= fs.ModeSticky // /tmp-like directories keep their sticky bit
		}
		if name != "." {
			if err := x.prepare(name, true); err != nil {
				return err
			}
			if err := x.root.Mkdir(name, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
		}
		if x.dirModes == nil {
			x.dirModes = make(map[string]fs.FileMode)
		}
		x.dirModes[name] = mode
		if name == "." {
			return nil
		}
	case tar.TypeReg:
		if err := x.regular(name, hdr, mode, body); err != nil {
			return err
		}
	case tar.TypeSymlink:
		if err := x.prepare(name, false); err != nil {
			return err
		}
		if err := x.root.Symlink(hdr.Linkname, name); err != nil {
			return err
		}
	case tar.TypeLink:
		target, err := cleanName(hdr.Linkname)
		if err != nil {
			return fmt.Errorf("hard link to %q: %w", hdr.Linkname, err)
		}
		if fi, err := x.root.Lstat(target); err != nil || !fi.Mode().IsRegular() {
			return fmt.Errorf("hard link to %q: target is not a regular file already in the archive", hdr.Linkname)
		}
		if err := x.prepare(name, false); err != nil {
			return err
		}
		if err := x.root.Link(target, name); err != nil {
			return err
		}
		x.stats.Entries++
		return nil // the link shares its target's owner and times
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		x.stats.Skipped++
		return nil
	case tar.TypeXGlobalHeader:
		return nil
	default:
		return fmt.Errorf("unsupported entry type %q", hdr.Typeflag)
	}
	if x.chown {
		if err := x.root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
			return err
		}
	}
	x.stats.Entries++
	return nil
}

// regular writes one regular file, keeping its modification time: Python
// checks cached bytecode against it, and a read-only image cannot refresh
// stale bytecode, so every import would compile from source again.
func (x *extractor) regular(name string, hdr *tar.Header, mode fs.FileMode, body io.Reader) error {
	if hdr.Size < 0 || x.stats.Bytes+hdr.Size > x.limits.MaxBytes {
		return fmt.Errorf("archive holds more than %d bytes of files", x.limits.MaxBytes)
	}
	if err := x.prepare(name, false); err != nil {
		return err
	}
	f, err := x.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	n, err := io.Copy(f, io.LimitReader(body, hdr.Size))
	if err == nil && n != hdr.Size {
		err = io.ErrUnexpectedEOF
	}
	if err == nil {
		err = f.Chmod(mode) // exactly mode: no umask, no setuid/setgid
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	x.stats.Bytes += n
	return x.root.Chtimes(name, time.Time{}, hdr.ModTime)
}

// prepare makes room for name: its parent directories exist (created 0755
// when the archive did not list them) and whatever stood at name is gone,
// unless both it and the new entry are directories.
func (x *extractor) prepare(name string, isDir bool) error {
	if err := mkdirAll(x.root, path.Dir(name)); err != nil {
		return err
	}
	fi, err := x.root.Lstat(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return err
	case isDir && fi.IsDir():
		return nil
	}
	return x.root.RemoveAll(name)
}

// mkdirAll creates dir and its missing parents below root with mode 0755,
// whatever the umask.
func mkdirAll(root *os.Root, dir string) error {
	if dir == "." || dir == "/" {
		return nil
	}
	if fi, err := root.Stat(dir); err == nil && fi.IsDir() {
		return nil // a directory, or a link to one inside the root
	}
	if err := mkdirAll(root, path.Dir(dir)); err != nil {
		return err
	}
	if err := root.Mkdir(dir, 0o755); err != nil {
		return err
	}
	return root.Chmod(dir, 0o755)
}
