package rootfs

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"
)

// maxMetadataBlob bounds index.json, manifests, indexes and image
// configurations, which are read whole into memory.
const maxMetadataBlob = 8 << 20

// isSHA256Hex reports whether s is the hex part of a SHA-256 digest: 64
// lower-case hex digits. A function, not a regexp: `[a-f0-9]{64}` compiles
// to 64 copies of its class, paid in package init by every start of the
// binary (the CLI's cold path included).
func isSHA256Hex(s string) bool { return len(s) == sha256HexLen && hexRun(s) == len(s) }

// sha256HexLen is the length of a SHA-256 digest in hex.
const sha256HexLen = 64

// hexRun returns the length of the longest run of lower-case hex digits in s.
func hexRun(s string) int {
	longest, run := 0, 0
	for i := range len(s) {
		if c := s[i]; '0' <= c && c <= '9' || 'a' <= c && c <= 'f' {
			run++
			longest = max(longest, run)
		} else {
			run = 0
		}
	}
	return longest
}

// ociLayout is an OCI image layout directory, read without following any
// symbolic link in it: index.json, blobs, blobs/sha256 and every blob must
// be the layout's own directories and regular files. A link there would
// let an archive name files of the host — such as containerd's or Docker's
// content store, whose blobs are named by their digests too — and have the
// import, running as a user who can read them, copy them into an image.
// Every blob is checked against its digest as it is read.
type ociLayout struct {
	name  string   // the archive or directory, for messages
	root  *os.File // the layout directory
	blobs *os.File // its blobs/sha256
}

// openLayout opens the layout in dir; name is what messages call it.
func openLayout(dir, name string) (*ociLayout, error) {
	root, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	l := &ociLayout{name: name, root: root}
	blobs, err := openNoFollow(root, "blobs", true)
	if err != nil {
		root.Close()
		return nil, err
	}
	defer blobs.Close()
	if l.blobs, err = openNoFollow(blobs, "sha256", true); err != nil {
		root.Close()
		return nil, fmt.Errorf("blobs/%w", err)
	}
	return l, nil
}

// Close releases the layout's directories.
func (l *ociLayout) Close() error {
	l.blobs.Close()
	return l.root.Close()
}

// openNoFollow opens the entry name of dir: a directory if wantDir, else a
// regular file, and never through a symbolic link.
func openNoFollow(dir *os.File, name string, wantDir bool) (*os.File, error) {
	flags := unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_CLOEXEC | unix.O_NONBLOCK // a FIFO must not block the import
	if wantDir {
		flags |= unix.O_DIRECTORY
	}
	fd, err := unix.Openat(int(dir.Fd()), name, flags, 0)
	if err != nil {
		var st unix.Stat_t
		if unix.Fstatat(int(dir.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
			return nil, fmt.Errorf("%s is a symbolic link; an image layout must hold its own files, and links are not followed", name)
		}
		if errors.Is(err, unix.ENOENT) {
			return nil, fmt.Errorf("%s is missing", name)
		}
		return nil, fmt.Errorf("open %s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	fi, err := f.Stat()
	if err == nil && !wantDir && !fi.Mode().IsRegular() {
		err = fmt.Errorf("%s is not a regular file", name)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// readIndex reads the layout's index.json.
func (l *ociLayout) readIndex() (*v1.IndexManifest, error) {
	f, err := openNoFollow(l.root, "index.json", false)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxMetadataBlob+1))
	if err == nil && len(data) > maxMetadataBlob {
		err = fmt.Errorf("index.json is larger than %d bytes", maxMetadataBlob)
	}
	if err != nil {
		return nil, err
	}
	m, err := v1.ParseIndexManifest(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("index.json: %w", err)
	}
	return m, nil
}

// blob opens the blob d names; what it reads is checked against d's size
// and digest.
func (l *ociLayout) blob(d v1.Descriptor) (io.ReadCloser, error) {
	if d.Digest.Algorithm != "sha256" || !isSHA256Hex(d.Digest.Hex) {
		return nil, fmt.Errorf("blob %q: only sha256 digests are supported", d.Digest)
	}
	f, err := openNoFollow(l.blobs, d.Digest.Hex, false)
	if err != nil {
		return nil, fmt.Errorf("blobs/sha256/%w", err)
	}
	return newDigestReader(f, d.Digest, d.Size, "blob "+d.Digest.String(), true), nil
}

// readBlob reads a small blob whole: a manifest, an index, a configuration.
func (l *ociLayout) readBlob(d v1.Descriptor) ([]byte, error) {
	if d.Size > maxMetadataBlob {
		return nil, fmt.Errorf("blob %s: %d bytes is more than a manifest or configuration may have (%d)", d.Digest, d.Size, maxMetadataBlob)
	}
	rc, err := l.blob(d)
	if err != nil {
		return nil, err
	}
	data, err := io.ReadAll(rc)
	if cerr := rc.Close(); err == nil {
		err = cerr
	}
	return data, err
}

// image picks the image of index m — its only one, or the one for Platform
// among several, following nested indexes — and returns it with the
// digests of the manifests on the way, every one checked: the digests a
// name such as "repo@sha256:…" may pin.
func (l *ociLayout) image(m *v1.IndexManifest, depth int) (v1.Image, []v1.Hash, error) {
	var candidates []v1.Descriptor
	for _, d := range m.Manifests {
		if len(m.Manifests) == 1 || d.Platform == nil || d.Platform.Satisfies(Platform) {
			candidates = append(candidates, d)
		}
	}
	if len(candidates) != 1 {
		return nil, nil, fmt.Errorf("it holds %d images for %s/%s; import an archive of one image", len(candidates), Platform.OS, Platform.Architecture)
	}
	d := candidates[0]
	raw, err := l.readBlob(d)
	if err != nil {
		return nil, nil, err
	}
	if d.MediaType.IsIndex() {
		if depth >= 4 {
			return nil, nil, fmt.Errorf("indexes nested more than 4 deep")
		}
		child, err := v1.ParseIndexManifest(bytes.NewReader(raw))
		if err != nil {
			return nil, nil, fmt.Errorf("index %s: %w", d.Digest, err)
		}
		img, digests, err := l.image(child, depth+1)
		return img, append([]v1.Hash{d.Digest}, digests...), err
	}
	man, err := v1.ParseManifest(bytes.NewReader(raw))
	if err != nil {
		return nil, nil, fmt.Errorf("manifest %s: %w", d.Digest, err)
	}
	img, err := partial.CompressedToImage(&layoutImage{l: l, desc: d, raw: raw, manifest: man})
	return img, []v1.Hash{d.Digest}, err
}

// layoutImage is an image of an ociLayout, its manifest already checked.
type layoutImage struct {
	l        *ociLayout
	desc     v1.Descriptor
	raw      []byte
	manifest *v1.Manifest
	config   []byte
}

func (i *layoutImage) RawManifest() ([]byte, error) { return i.raw, nil }

func (i *layoutImage) MediaType() (types.MediaType, error) {
	if i.manifest.MediaType != "" {
		return i.manifest.MediaType, nil
	}
	return i.desc.MediaType, nil
}

func (i *layoutImage) RawConfigFile() ([]byte, error) {
	if i.config == nil {
		data, err := i.l.readBlob(i.manifest.Config)
		if err != nil {
			return nil, fmt.Errorf("image configuration: %w", err)
		}
		i.config = data
	}
	return i.config, nil
}

func (i *layoutImage) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	if h == i.manifest.Config.Digest {
		return &layoutBlob{l: i.l, desc: i.manifest.Config}, nil
	}
	for _, d := range i.manifest.Layers {
		if d.Digest == h {
			return &layoutBlob{l: i.l, desc: d}, nil
		}
	}
	return nil, fmt.Errorf("the manifest names no blob %s", h)
}

// layoutBlob is a layer (or the configuration) of a layoutImage.
type layoutBlob struct {
	l    *ociLayout
	desc v1.Descriptor
}

func (b *layoutBlob) Digest() (v1.Hash, error)            { return b.desc.Digest, nil }
func (b *layoutBlob) Compressed() (io.ReadCloser, error)  { return b.l.blob(b.desc) }
func (b *layoutBlob) Size() (int64, error)                { return b.desc.Size, nil }
func (b *layoutBlob) MediaType() (types.MediaType, error) { return b.desc.MediaType, nil }

// digestReader passes a stream through and checks, when it ends, that it
// had the expected size (unless that is negative) and digest: the end of
// the stream is an error if they differ. Closing it before the end is an
// error too — what was not read was not checked — unless drain is set,
// when the rest is read and checked first (for local files).
type digestReader struct {
	r     io.Reader
	c     io.Closer
	h     hash.Hash
	n     int64
	size  int64
	want  v1.Hash
	what  string
	drain bool
	ended bool
	err   error
}

func newDigestReader(rc io.ReadCloser, want v1.Hash, size int64, what string, drain bool) *digestReader {
	d := &digestReader{r: rc, c: rc, h: sha256.New(), size: size, want: want, what: what, drain: drain}
	if size >= 0 {
		d.r = io.LimitReader(rc, size+1) // one more, to see a longer blob
	}
	return d
}

func (d *digestReader) Read(p []byte) (int, error) {
	if d.ended {
		return 0, d.endErr()
	}
	n, err := d.r.Read(p)
	d.h.Write(p[:n])
	d.n += int64(n)
	if errors.Is(err, io.EOF) {
		d.ended = true
		return n, d.endErr()
	}
	return n, err
}

// endErr is io.EOF for a stream that matched, else what differs.
func (d *digestReader) endErr() error {
	if d.err == nil {
		got := fmt.Sprintf("%x", d.h.Sum(nil))
		switch {
		case d.want.Algorithm != "sha256":
			d.err = fmt.Errorf("%s: digest %s is not sha256", d.what, d.want)
		case d.size >= 0 && d.n != d.size:
			d.err = fmt.Errorf("%s has %d bytes, not the %d its descriptor says", d.what, d.n, d.size)
		case got != d.want.Hex:
			d.err = fmt.Errorf("%s has digest sha256:%s, not %s: its content is not what it is named by", d.what, got, d.want)
		default:
			d.err = io.EOF
		}
	}
	return d.err
}

func (d *digestReader) Close() error {
	if !d.ended && d.drain {
		_, _ = io.Copy(io.Discard, d)
	}
	cerr := d.c.Close()
	switch {
	case !d.ended:
		return fmt.Errorf("%s was not read to its end, so its digest is unchecked", d.what)
	case d.endErr() != io.EOF:
		return d.endErr()
	}
	return cerr
}
