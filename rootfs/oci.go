package rootfs

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"regexp"
	goruntime "runtime"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Platform is the platform whose image is taken from a multi-platform
// image: Linux on this machine's architecture.
var Platform = v1.Platform{OS: "linux", Architecture: goruntime.GOARCH}

// ImportImage flattens img — an OCI or Docker image from a registry, an
// archive or a layout — into the store and points name at it. Its layers
// are applied bottom first with their whiteouts, through the same safe
// extraction as Import, into a staging directory that becomes the image
// only once complete. The key is derived from the image's configuration
// digest (its ID), so an image already in the store is not extracted
// again. source says where img came from, for the record.
func (s Store) ImportImage(ctx context.Context, name string, img v1.Image, source string, opts ImportOptions) (Image, error) {
	if err := checkName(name); err != nil {
		return Image{}, fmt.Errorf("import: %w", err)
	}
	if opts.Key != "" {
		return Image{}, fmt.Errorf("import: a key is only for root file system archives; an image's key is its ID")
	}
	unlock, err := s.lock()
	if err != nil {
		return Image{}, err
	}
	defer unlock()
	s.removeStaging()
	return s.importImage(ctx, name, img, source, opts)
}

// importImage is ImportImage with the store locked.
func (s Store) importImage(ctx context.Context, name string, img v1.Image, source string, opts ImportOptions) (Image, error) {
	id, err := img.ConfigName()
	if err != nil {
		return Image{}, fmt.Errorf("import %s: read the image configuration: %w", source, err)
	}
	key := "sha256-" + id.Hex[:32]
	out, err := s.image(key)
	if err != nil {
		if out, err = s.flatten(ctx, key, img, source, opts); err != nil {
			return Image{}, err
		}
	}
	if err := s.setName(name, key); err != nil {
		return Image{}, err
	}
	out.Names = []string{name}
	return out, nil
}

func (s Store) flatten(ctx context.Context, key string, img v1.Image, source string, opts ImportOptions) (Image, error) {
	if err := checkImage(img, opts.Limits); err != nil {
		return Image{}, fmt.Errorf("import %s: %w", source, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return Image{}, fmt.Errorf("import %s: read the image configuration: %w", source, err)
	}
	if cf.OS != "" && cf.OS != "linux" {
		return Image{}, fmt.Errorf("import %s: the image is for %s, not linux", source, cf.OS)
	}
	cfg := &ImageConfig{Env: cf.Config.Env, User: cf.Config.User}
	if wd := cf.Config.WorkingDir; wd != "" {
		cfg.WorkingDir = path.Clean("/" + wd)
	}
	layers, err := img.Layers()
	if err != nil {
		return Image{}, fmt.Errorf("import %s: list layers: %w", source, err)
	}
	work, rootDir, err := s.newStaging()
	if err != nil {
		return Image{}, err
	}
	defer os.RemoveAll(work) // after a successful rename, nothing is left

	var read int64
	opens := make([]func() (io.ReadCloser, error), len(layers))
	for i, l := range layers {
		opens[i] = func() (io.ReadCloser, error) {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			rc, err := l.Uncompressed()
			if err != nil || opts.Progress == nil {
				return rc, err
			}
			// Uncompressed bytes: how much a local archive's layers will
			// unpack to is not known before they are read.
			pr := &progressReader{r: rc, done: read, report: func(done, _ int64) { read = done; opts.Progress(done, 0) }}
			return struct {
				io.Reader
				io.Closer
			}{pr, rc}, nil
		}
	}
	stats, err := ExtractLayersContext(ctx, rootDir, opts.Limits, opens)
	if err == nil {
		err = ctx.Err() // a cancelled download may look like a short layer
	}
	if err != nil {
		return Image{}, fmt.Errorf("import %s: %w", source, err)
	}
	mp := opts.Mountpoints
	if cfg.WorkingDir != "" && cfg.WorkingDir != "/" {
		mp.Dirs = append(mp.Dirs[:len(mp.Dirs):len(mp.Dirs)], cfg.WorkingDir)
	}
	if err := makeMountpoints(rootDir, mp); err != nil {
		return Image{}, fmt.Errorf("import %s: %w", source, err)
	}
	id, _ := img.ConfigName()
	out := Image{Key: key, Source: source, Created: time.Now().UTC(), Stats: stats,
		ImageID: id.String(), Config: cfg, Mountpoints: recorded(mp)}
	return s.install(work, out)
}

// Pull downloads the image ref from its registry, with credentials from
// the Docker configuration (~/.docker/config.json, credential helpers),
// and imports it under name. A multi-platform image gives its Platform
// image. Progress counts the bytes of the image's blobs downloaded.
func (s Store) Pull(ctx context.Context, name, ref string, opts ImportOptions) (Image, error) {
	r, err := parseReference(ref)
	if err != nil {
		return Image{}, err
	}
	counter := &countingTransport{base: remote.DefaultTransport}
	img, err := remote.Image(r, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain),
		remote.WithPlatform(Platform), remote.WithTransport(counter))
	if err != nil {
		return Image{}, fmt.Errorf("pull %s: %w", ref, err)
	}
	if err := checkManifestConfig(img); err != nil {
		return Image{}, fmt.Errorf("pull %s: %w", ref, err)
	}
	if progress := opts.Progress; progress != nil {
		m, err := img.Manifest()
		if err != nil {
			return Image{}, fmt.Errorf("pull %s: %w", ref, err)
		}
		total := m.Config.Size
		for _, l := range m.Layers {
			total += l.Size
		}
		counter.report = func(done int64) { progress(done, total) }
	}
	opts.Progress = nil
	return s.ImportImage(ctx, name, img, r.Name(), opts)
}

// parseReference parses an image reference, as Docker does: "python" is
// docker.io/library/python:latest.
func parseReference(ref string) (name.Reference, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("invalid image reference %q: %w", ref, err)
	}
	return r, nil
}

// countingTransport counts the bytes of blob downloads, for progress.
type countingTransport struct {
	base   http.RoundTripper
	done   atomic.Int64
	report func(done int64)
}

func (t *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req)
	if err != nil || t.report == nil || req.Method != http.MethodGet || !strings.Contains(req.URL.Path, "/blobs/") {
		return resp, err
	}
	resp.Body = &countingBody{ReadCloser: resp.Body, t: t}
	return resp, nil
}

type countingBody struct {
	io.ReadCloser
	t *countingTransport
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.t.report(b.t.done.Add(int64(n)))
	}
	return n, err
}

// Archive formats Import recognises.
const (
	formatRootfs = "rootfs" // a tar of a root directory
	formatDocker = "docker" // docker save: manifest.json naming config and layers
	formatOCI    = "oci"    // an OCI image layout: oci-layout, index.json, blobs/
)

// digestName matches the names image archives give their blobs, such as
// "<hex>/layer.tar", "<hex>.json", "sha256:<hex>" or "<hex>.tar.gz".
var digestName = regexp.MustCompile(`[a-f0-9]{64}`)

// archiveFormat tells an image archive (docker save, OCI layout) from a
// root file system archive by its entries: an image archive holds only
// its own files at the top, and the first entry that is not one of those
// shows a root file system.
func archiveFormat(file string) (string, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", err
	}
	defer f.Close()
	var r io.Reader = f
	br := bufio.NewReader(f)
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return "", err
		}
		defer zr.Close()
		r = zr
	} else {
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return "", err
		}
	}
	tr := tar.NewReader(r) // seeks past bodies in an uncompressed file
	oci := false
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			if oci {
				return formatOCI, nil
			}
			return formatRootfs, nil
		}
		if err != nil {
			return "", fmt.Errorf("read archive: %w", err)
		}
		name := strings.TrimPrefix(path.Clean("/"+hdr.Name), "/")
		top, _, _ := strings.Cut(name, "/")
		switch {
		case name == "manifest.json":
			return formatDocker, nil
		case name == "oci-layout":
			oci = true
		case name == "", name == "index.json", name == "repositories", top == "blobs", digestName.MatchString(top):
		default:
			return formatRootfs, nil
		}
	}
}

// openImageArchive opens the one image of a docker save archive or an OCI
// layout archive (an OCI layout directory works too), and returns the name
// the archive gives it, if any. An OCI archive is first unpacked, safely,
// into a directory of the store's staging area; done removes it.
func (s Store) openImageArchive(file, format string, limits ExtractLimits) (img v1.Image, tag string, done func(), err error) {
	done = func() {}
	if format == formatDocker {
		opener := func() (io.ReadCloser, error) { return openMaybeGzip(file) }
		m, err := tarball.LoadManifest(opener)
		if err != nil {
			return nil, "", done, fmt.Errorf("read docker archive %s: %w", file, err)
		}
		if len(m) != 1 {
			return nil, "", done, fmt.Errorf("read docker archive %s: it holds %d images; save one image per archive", file, len(m))
		}
		if len(m[0].RepoTags) > 0 {
			tag = m[0].RepoTags[0]
		}
		if err := checkDockerConfig(opener, m[0].Config); err != nil {
			return nil, "", done, fmt.Errorf("read docker archive %s: %w", file, err)
		}
		img, err := tarball.Image(opener, nil)
		if err != nil {
			return nil, "", done, fmt.Errorf("read docker archive %s: %w", file, err)
		}
		return img, tag, done, nil
	}
	dir := file
	if fi, err := os.Stat(file); err == nil && !fi.IsDir() {
		work, rootDir, err := s.newStaging()
		if err != nil {
			return nil, "", done, err
		}
		done = func() { os.RemoveAll(work) }
		f, err := os.Open(file)
		if err != nil {
			return nil, "", done, err
		}
		_, err = Extract(f, rootDir, limits)
		f.Close()
		if err != nil {
			return nil, "", done, fmt.Errorf("unpack OCI archive %s: %w", file, err)
		}
		dir = rootDir
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, "", done, fmt.Errorf("read OCI layout %s: %w", file, err)
	}
	if m, err := idx.IndexManifest(); err == nil && len(m.Manifests) == 1 {
		// containerd and Docker put the full name here; the OCI key often
		// holds only the tag.
		tag = m.Manifests[0].Annotations["io.containerd.image.name"]
		if tag == "" {
			tag = m.Manifests[0].Annotations["org.opencontainers.image.ref.name"]
		}
	}
	img, err = onlyImage(idx)
	if err == nil {
		err = checkManifestConfig(img)
	}
	if err != nil {
		return nil, "", done, fmt.Errorf("read OCI layout %s: %w", file, err)
	}
	return img, tag, done, nil
}

// onlyImage picks the image of an index: its only one, or the one for
// Platform among several, following nested indexes.
func onlyImage(idx v1.ImageIndex) (v1.Image, error) {
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	var candidates []v1.Descriptor
	for _, d := range m.Manifests {
		if len(m.Manifests) == 1 || d.Platform == nil || d.Platform.Satisfies(Platform) {
			candidates = append(candidates, d)
		}
	}
	if len(candidates) != 1 {
		return nil, fmt.Errorf("it holds %d images for %s/%s; import an archive of one image", len(candidates), Platform.OS, Platform.Architecture)
	}
	d := candidates[0]
	if d.MediaType.IsIndex() {
		child, err := idx.ImageIndex(d.Digest)
		if err != nil {
			return nil, err
		}
		return onlyImage(child)
	}
	return idx.Image(d.Digest)
}

func openMaybeGzip(file string) (io.ReadCloser, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	br := bufio.NewReader(f)
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			f.Close()
			return nil, err
		}
		return struct {
			io.Reader
			io.Closer
		}{zr, f}, nil
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// ImportFile imports the archive at file under name, whatever its kind: a
// docker save archive, an OCI image layout (archive or directory), or a
// root file system tar (plain or gzip-compressed) as Import takes. An empty
// name means the image's tag in the archive, or DefaultName for a root
// file system.
func (s Store) ImportFile(ctx context.Context, name, file string, opts ImportOptions) (Image, error) {
	format := formatOCI
	if fi, err := os.Stat(file); err != nil {
		return Image{}, fmt.Errorf("import: %w", err)
	} else if !fi.IsDir() {
		if format, err = archiveFormat(file); err != nil {
			return Image{}, fmt.Errorf("import %s: %w", file, err)
		}
	}
	if format == formatRootfs {
		if name == "" {
			name = DefaultName
		}
		opts.Context = ctx
		return s.Import(name, file, opts)
	}
	if opts.Key != "" {
		return Image{}, fmt.Errorf("import %s: --key is only for root file system archives; this is a %s image archive", file, format)
	}
	if name != "" {
		if err := checkName(name); err != nil {
			return Image{}, fmt.Errorf("import: %w", err)
		}
	}
	unlock, err := s.lock()
	if err != nil {
		return Image{}, err
	}
	defer unlock()
	s.removeStaging()
	img, tag, done, err := s.openImageArchive(file, format, opts.Limits)
	defer done()
	if err != nil {
		return Image{}, err
	}
	if name == "" {
		if name = tag; name == "" {
			return Image{}, fmt.Errorf("import %s: the archive names no image; give it a name with --name", file)
		}
		if err := checkName(name); err != nil {
			return Image{}, fmt.Errorf("import %s: the archive's image name: %w; give another with --name", file, err)
		}
	}
	abs, _ := filepath.Abs(file)
	return s.importImage(ctx, name, img, abs, opts)
}
