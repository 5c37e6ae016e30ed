package rootfs

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
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
	// MaxBytes caps the total size of regular files written, over all
	// layers of an image (files a later layer removes still count).
	MaxBytes int64
	// MaxFileBytes caps the size of one regular file; zero means MaxBytes.
	MaxFileBytes int64
	// MaxEntries caps the number of entries.
	MaxEntries int
	// MaxDepth caps the components of an entry's path: every entry costs
	// a walk of its path, so depth costs quadratic time.
	MaxDepth int
	// MaxLayers caps the layers of an image.
	MaxLayers int
}

// DefaultExtractLimits suit a full distribution image with a data-science
// stack (the default image is about 1.2 GiB in 45,000 entries, its deepest
// path 17 components) and keep a hostile archive from filling the disk or
// the CPU. Docker's overlay storage stops at 128 layers, so no image that
// Docker runs has more than MaxLayers.
var DefaultExtractLimits = ExtractLimits{MaxBytes: 8 << 30, MaxFileBytes: 2 << 30, MaxEntries: 2_000_000,
	MaxDepth: 128, MaxLayers: 256}

// maxPathBytes caps an entry's path and a link's target: PATH_MAX, beyond
// which programs cannot name the file anyway (tar's PAX headers allow
// names of up to a megabyte).
const maxPathBytes = 4096

// maxTrailingBytes is how much a compressed archive or an image layer may
// hold after its end marker: tar pads archives to a record (10 KiB by
// default, a few blocking factors more), and reading that padding to the
// end lets the decompressor and the layer's digest check see the whole
// stream. More is refused, not decompressed: it would cost the CPU for
// nothing.
const maxTrailingBytes = 1 << 20

func (l ExtractLimits) withDefaults() ExtractLimits {
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultExtractLimits.MaxBytes
	}
	if l.MaxEntries <= 0 {
		l.MaxEntries = DefaultExtractLimits.MaxEntries
	}
	if l.MaxDepth <= 0 {
		l.MaxDepth = DefaultExtractLimits.MaxDepth
	}
	if l.MaxLayers <= 0 {
		l.MaxLayers = DefaultExtractLimits.MaxLayers
	}
	if l.MaxFileBytes <= 0 || l.MaxFileBytes > l.MaxBytes {
		l.MaxFileBytes = l.MaxBytes
	}
	return l
}

// ExtractStats says what an extraction wrote and what it refused to.
type ExtractStats struct {
	Entries int   // entries written
	Bytes   int64 // bytes of regular files written
	// Skipped counts entries not written: device nodes, fifos, sockets.
	Skipped int
	// Stripped counts entries whose setuid or setgid bits (or, on files,
	// sticky bit) were removed.
	Stripped int
	// Whiteouts counts paths removed by a later layer of an image.
	Whiteouts int `json:",omitempty"`
}

// Extract unpacks a tar archive (plain or gzip-compressed) into the
// existing directory dst, which should be empty, safely:
//   - every path, link target of a hard link, and parent directory stays
//     inside dst (symbolic links may point anywhere, but are never followed
//     out of dst while extracting);
//   - device nodes, fifos and sockets are skipped;
//   - setuid and setgid bits are stripped, and extended attributes (file
//     capabilities among them) are not written;
//   - sizes, entry counts and path depths are capped, and at most
//     maxTrailingBytes after the archive's end are read.
//
// Ownership is kept when running as root. A failed extraction leaves dst in
// an unspecified state; callers extract into a temporary directory.
func Extract(r io.Reader, dst string, limits ExtractLimits) (ExtractStats, error) {
	return ExtractContext(context.Background(), r, dst, limits)
}

// ExtractContext is Extract, stopped with ctx's error once ctx is done.
func ExtractContext(ctx context.Context, r io.Reader, dst string, limits ExtractLimits) (ExtractStats, error) {
	x, err := newExtractor(ctx, dst, limits)
	if err != nil {
		return ExtractStats{}, err
	}
	defer x.root.Close()
	if err := x.archive(r, false); err != nil {
		return *x.stats, err
	}
	return *x.stats, x.finishDirs()
}

// ExtractLayers unpacks the layers of an image, bottom first, into the
// existing empty directory dst, as Extract does, and applies their OCI
// whiteouts: a ".wh.NAME" entry removes NAME of the layers below, and
// ".wh..wh..opq" empties its directory of them. The limits cover all layers
// together. Each element of layers opens one layer's uncompressed tar
// stream.
func ExtractLayers(dst string, limits ExtractLimits, layers []func() (io.ReadCloser, error)) (ExtractStats, error) {
	return ExtractLayersContext(context.Background(), dst, limits, layers)
}

// ExtractLayersContext is ExtractLayers, stopped with ctx's error once ctx
// is done.
func ExtractLayersContext(ctx context.Context, dst string, limits ExtractLimits, layers []func() (io.ReadCloser, error)) (ExtractStats, error) {
	x, err := newExtractor(ctx, dst, limits)
	if err != nil {
		return ExtractStats{}, err
	}
	defer x.root.Close()
	if err := checkLayerCount(len(layers), x.limits); err != nil {
		return *x.stats, err
	}
	for i, open := range layers {
		layer, err := open()
		if err != nil {
			return *x.stats, fmt.Errorf("layer %d of %d: %w", i+1, len(layers), err)
		}
		err = x.archive(layer, true)
		if cerr := layer.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return *x.stats, fmt.Errorf("layer %d of %d: %w", i+1, len(layers), err)
		}
	}
	return *x.stats, x.finishDirs()
}

func newExtractor(ctx context.Context, dst string, limits ExtractLimits) (*extractor, error) {
	root, err := os.OpenRoot(dst)
	if err != nil {
		return nil, fmt.Errorf("extract: %w", err)
	}
	return &extractor{ctx: ctx, root: root, limits: limits.withDefaults(), stats: &ExtractStats{}, chown: os.Geteuid() == 0}, nil
}

// archive unpacks one tar stream; layered applies whiteouts.
func (x *extractor) archive(r io.Reader, layered bool) error {
	br := bufio.NewReaderSize(contextReader{x.ctx, r}, 1<<20)
	var src io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("extract: %w", err)
		}
		defer zr.Close()
		src = contextReader{x.ctx, zr}
	}
	x.layer = nil
	if layered {
		x.layer = map[string]bool{}
	}
	tr := tar.NewReader(src)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			// A plain archive's padding costs no more to read than the
			// file's own size; decompressed padding can cost any amount.
			return readTrailer(src, layered || src != io.Reader(br))
		}
		if err != nil {
			return fmt.Errorf("extract: read archive: %w", err)
		}
		if err := x.entry(hdr, tr); err != nil {
			// At most 200 bytes of the name: PAX names may be huge.
			return fmt.Errorf("extract %.200q: %w", hdr.Name, err)
		}
	}
}

type extractor struct {
	ctx    context.Context
	root   *os.Root
	limits ExtractLimits
	stats  *ExtractStats
	chown  bool
	// dirModes are applied after the last entry: a read-only directory
	// must still receive the entries listed after it.
	dirModes map[string]fs.FileMode
	// layer holds the paths the current image layer wrote and their
	// parents, which its opaque whiteouts keep; nil outside images.
	layer map[string]bool
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

// keptMode is what an image's entry keeps of mode, its permission and
// special bits (as a tar header or st_mode holds them): the permissions,
// and the sticky bit on a directory (/tmp-like directories keep it);
// setuid and setgid never. stripped says whether a bit was dropped.
func keptMode(mode int64, dir bool) (kept fs.FileMode, stripped bool) {
	kept = fs.FileMode(mode) & fs.ModePerm
	if dir && mode&0o1000 != 0 {
		kept |= fs.ModeSticky
	}
	return kept, mode&0o6000 != 0 || !dir && mode&0o1000 != 0
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
	if err := x.ctx.Err(); err != nil {
		return err
	}
	name, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	if err := checkPath(name, hdr.Linkname, x.limits); err != nil {
		return err
	}
	if x.stats.Entries+x.stats.Skipped >= x.limits.MaxEntries {
		return fmt.Errorf("archive has more than %d entries", x.limits.MaxEntries)
	}
	if x.layer != nil {
		if done, err := x.whiteout(name); done || err != nil {
			return err
		}
		// The layer keeps the path and its parents from its own opaque
		// whiteouts.
		for p := name; p != "." && !x.layer[p]; p = path.Dir(p) {
			x.layer[p] = true
		}
	}
	mode, stripped := keptMode(hdr.Mode, hdr.Typeflag == tar.TypeDir)
	if stripped {
		x.stats.Stripped++
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
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
	if hdr.Size < 0 || hdr.Size > x.limits.MaxFileBytes {
		return fmt.Errorf("file of %d bytes is over the %d-byte limit of one file", hdr.Size, x.limits.MaxFileBytes)
	}
	if x.stats.Bytes+hdr.Size > x.limits.MaxBytes {
		return fmt.Errorf("archive holds more than %d bytes of files, the limit of an image", x.limits.MaxBytes)
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

// whiteoutPrefix marks an OCI layer entry that removes a path of the layers
// below instead of adding one; opaqueWhiteout empties its directory.
const (
	whiteoutPrefix = ".wh."
	opaqueWhiteout = ".wh..wh..opq"
)

// whiteout applies name if it is a whiteout entry, and says whether it was.
func (x *extractor) whiteout(name string) (bool, error) {
	dir, base := path.Split(name)
	dir = path.Clean("./" + dir)
	switch {
	case base == opaqueWhiteout:
		entries, err := x.readDir(dir)
		if err != nil {
			return true, err
		}
		for _, e := range entries {
			child := path.Join(dir, e.Name())
			if x.layer[child] {
				continue
			}
			if err := x.root.RemoveAll(child); err != nil {
				return true, err
			}
			x.stats.Whiteouts++
		}
		return true, nil
	case strings.HasPrefix(base, whiteoutPrefix):
		target := path.Join(dir, strings.TrimPrefix(base, whiteoutPrefix))
		if _, err := x.root.Lstat(target); errors.Is(err, fs.ErrNotExist) {
			return true, nil
		}
		if err := x.root.RemoveAll(target); err != nil {
			return true, err
		}
		x.stats.Whiteouts++
		return true, nil
	}
	return false, nil
}

// readDir lists dir below the root; a missing directory is empty.
func (x *extractor) readDir(dir string) ([]fs.DirEntry, error) {
	f, err := x.root.Open(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.ReadDir(-1)
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
		if fi, lerr := root.Lstat(dir); lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
			return fmt.Errorf("%w: %q is a symbolic link out of the image root, not a directory to write into", ErrUnsafePath, dir)
		}
		return err
	}
	return root.Chmod(dir, 0o755)
}
