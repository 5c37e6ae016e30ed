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
	goruntime "runtime"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Platform is the platform whose image is taken from a multi-platform
// image: Linux on this machine's architecture.
var Platform = v1.Platform{OS: "linux", Architecture: goruntime.GOARCH}

// Where images come from: the first word of their key, so that an image
// imported from an archive can never be taken for one pulled from a
// registry, whatever configuration the archive copied.
const (
	OriginPull   = "pull"
	OriginImport = "import"
)

// imageSource says where an image comes from.
type imageSource struct {
	origin string // OriginPull or OriginImport
	source string // the reference pulled, or the archive's absolute path
	// digests are the manifest (and index) digests checked on the way to
	// the image: those a digest-pinned name may pin.
	digests []v1.Hash
}

// ImportImage flattens img — an OCI or Docker image from a registry, an
// archive or a layout — into the store and points name at it, as imported
// from source. Its layers are applied bottom first with their whiteouts,
// through the same safe extraction as Import, into a staging directory
// that becomes the image only once complete; each is checked against the
// digest its configuration lists (diff_ids), so the image's ID names its
// content. An image already in the store is not extracted again.
func (s Store) ImportImage(ctx context.Context, name string, img v1.Image, source string, opts ImportOptions) (Image, error) {
	if err := checkName(name); err != nil {
		return Image{}, fmt.Errorf("import: %w", err)
	}
	if opts.Key != "" {
		return Image{}, fmt.Errorf("import: a key is only for root file system archives; an image's key is its ID")
	}
	src := imageSource{origin: OriginImport, source: source}
	if d, err := img.Digest(); err == nil {
		src.digests = []v1.Hash{d}
	}
	return s.lockedImport(ctx, name, img, src, opts)
}

// lockedImport is importImage, with the store locked for it.
func (s Store) lockedImport(ctx context.Context, name string, img v1.Image, src imageSource, opts ImportOptions) (Image, error) {
	unlock, err := s.lock()
	if err != nil {
		return Image{}, err
	}
	defer unlock()
	s.removeStaging()
	return s.importImage(ctx, name, img, src, opts)
}

// imageKey is the key of the image with configuration digest id from
// origin. The configuration lists the digests of its layers, and every
// import checks them, so one key holds one content; the origin keeps
// imports and pulls apart all the same, and keys of images imported before
// layers were checked ("sha256-…") are never reused.
func imageKey(origin string, id v1.Hash) string {
	return origin + "-" + id.Hex[:32]
}

// importImage is ImportImage with the store locked.
func (s Store) importImage(ctx context.Context, name string, img v1.Image, src imageSource, opts ImportOptions) (Image, error) {
	id, err := img.ConfigName()
	if err != nil {
		return Image{}, fmt.Errorf("import %s: read the image configuration: %w", src.source, err)
	}
	if err := checkPin(name, src.digests); err != nil {
		return Image{}, fmt.Errorf("import %s: %w", src.source, err)
	}
	key := imageKey(src.origin, id)
	// Refused before anything is extracted.
	if _, err := s.checkRename(name, key, opts.Replace); err != nil {
		return Image{}, err
	}
	out, err := s.image(key)
	if err == nil {
		out.Reused = true
	} else if out, err = s.flatten(ctx, key, img, src, opts); err != nil {
		return Image{}, err
	}
	return s.name(name, out, opts.Replace)
}

func (s Store) flatten(ctx context.Context, key string, img v1.Image, src imageSource, opts ImportOptions) (Image, error) {
	source := src.source
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
	diffIDs := cf.RootFS.DiffIDs
	if len(diffIDs) != len(layers) {
		return Image{}, fmt.Errorf("import %s: the image has %d layers but its configuration lists %d (rootfs.diff_ids); the archive is not one image", source, len(layers), len(diffIDs))
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
			if err != nil {
				return nil, err
			}
			// What is extracted is what the configuration, and so the
			// image's ID, names: the end of the layer fails otherwise.
			rc = newDigestReader(rc, diffIDs[i], -1, "the layer (as rootfs.diff_ids lists it)", false)
			if opts.Progress == nil {
				return rc, nil
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
	if err := makeMountpoints(rootDir, mp); err != nil {
		return Image{}, fmt.Errorf("import %s: %w", source, err)
	}
	if cfg.WorkingDir != "" && cfg.WorkingDir != "/" {
		// Not mounted over: created as the image's WORKDIR would be,
		// through the image's own links inside its root.
		if err := makeWorkingDir(rootDir, cfg.WorkingDir); err != nil {
			return Image{}, fmt.Errorf("import %s: %w", source, err)
		}
		mp.Dirs = append(mp.Dirs[:len(mp.Dirs):len(mp.Dirs)], cfg.WorkingDir)
	}
	out := Image{Key: key, Origin: src.origin, Source: source, Created: time.Now().UTC(), Stats: stats,
		ImageID: imageID(img), LayersVerified: true, Config: cfg, Mountpoints: recorded(mp)}
	if len(src.digests) > 0 {
		out.Digest = src.digests[len(src.digests)-1].String()
	}
	return s.install(work, out)
}

// imageID is img's ID, its configuration's digest, already read without error.
func imageID(img v1.Image) string {
	h, _ := img.ConfigName()
	return h.String()
}

// Pull downloads the image ref from its registry, with credentials from
// the Docker configuration (~/.docker/config.json, credential helpers),
// and imports it under name. A multi-platform image gives its Platform
// image. Progress counts the bytes of the image's blobs downloaded. The
// name ref itself is re-pointed to what the registry now says it is;
// another name only with opts.Replace.
func (s Store) Pull(ctx context.Context, name, ref string, opts ImportOptions) (Image, error) {
	r, err := parseReference(ref)
	if err != nil {
		return Image{}, err
	}
	if err := checkName(name); err != nil {
		return Image{}, fmt.Errorf("pull: %w", err)
	}
	counter := &countingTransport{base: remote.DefaultTransport}
	desc, err := remote.Get(r, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain),
		remote.WithPlatform(Platform), remote.WithTransport(counter))
	if err != nil {
		return Image{}, fmt.Errorf("pull %s: %w", ref, err)
	}
	img, err := desc.Image()
	if err != nil {
		return Image{}, fmt.Errorf("pull %s: %w", ref, err)
	}
	// What ref names (checked against its digest, if it has one), and the
	// platform's image in it.
	src := imageSource{origin: OriginPull, source: r.Name(), digests: []v1.Hash{desc.Digest}}
	if d, err := img.Digest(); err != nil {
		return Image{}, fmt.Errorf("pull %s: %w", ref, err)
	} else if d != desc.Digest {
		src.digests = append(src.digests, d)
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
	opts.Replace = opts.Replace || name == ref
	return s.lockedImport(ctx, name, img, src, opts)
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

// digestName reports whether name holds a digest, as the names image
// archives give their blobs do: "<hex>/layer.tar", "<hex>.json",
// "sha256:<hex>" or "<hex>.tar.gz".
func digestName(name string) bool { return hexRun(name) >= sha256HexLen }

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
		case name == "", name == "index.json", name == "repositories", top == "blobs", digestName(top):
		default:
			return formatRootfs, nil
		}
	}
}

// openImageArchive opens the one image of a docker save archive or an OCI
// layout archive (an OCI layout directory works too), and returns where it
// comes from and the name the archive gives it, if any. An OCI archive is
// first unpacked, safely, into a directory of the store's staging area;
// done removes it.
func (s Store) openImageArchive(file, format string, limits ExtractLimits) (img v1.Image, src imageSource, tag string, done func(), err error) {
	done = func() {}
	abs, _ := filepath.Abs(file)
	src = imageSource{origin: OriginImport, source: abs}
	if format == formatDocker {
		opener := func() (io.ReadCloser, error) { return openMaybeGzip(file) }
		m, err := tarball.LoadManifest(opener)
		if err != nil {
			return nil, src, "", done, fmt.Errorf("read docker archive %s: %w", file, err)
		}
		if len(m) != 1 {
			return nil, src, "", done, fmt.Errorf("read docker archive %s: it holds %d images; save one image per archive", file, len(m))
		}
		if len(m[0].RepoTags) > 0 {
			tag = m[0].RepoTags[0]
		}
		// No manifest digest: docker save keeps none, so no digest-pinned
		// name can be given to its image.
		if err := checkDockerConfig(opener, m[0].Config); err != nil {
			return nil, src, "", done, fmt.Errorf("read docker archive %s: %w", file, err)
		}
		img, err := tarball.Image(opener, nil)
		if err != nil {
			return nil, src, "", done, fmt.Errorf("read docker archive %s: %w", file, err)
		}
		return img, src, tag, done, nil
	}
	dir := file
	if fi, err := os.Stat(file); err == nil && !fi.IsDir() {
		work, rootDir, err := s.newStaging()
		if err != nil {
			return nil, src, "", done, err
		}
		done = func() { os.RemoveAll(work) }
		f, err := os.Open(file)
		if err != nil {
			return nil, src, "", done, err
		}
		_, err = Extract(f, rootDir, limits)
		f.Close()
		if err != nil {
			return nil, src, "", done, fmt.Errorf("unpack OCI archive %s: %w", file, err)
		}
		dir = rootDir
	}
	l, err := openLayout(dir, file)
	if err != nil {
		return nil, src, "", done, fmt.Errorf("read OCI layout %s: %w", file, err)
	}
	prev := done
	done = func() { l.Close(); prev() }
	m, err := l.readIndex()
	if err != nil {
		return nil, src, "", done, fmt.Errorf("read OCI layout %s: %w", file, err)
	}
	if len(m.Manifests) == 1 {
		// containerd and Docker put the full name here; the OCI key often
		// holds only the tag.
		tag = m.Manifests[0].Annotations["io.containerd.image.name"]
		if tag == "" {
			tag = m.Manifests[0].Annotations["org.opencontainers.image.ref.name"]
		}
	}
	img, src.digests, err = l.image(m, 0)
	if err == nil {
		err = checkManifestConfig(img)
	}
	if err != nil {
		return nil, src, "", done, fmt.Errorf("read OCI layout %s: %w", file, err)
	}
	return img, src, tag, done, nil
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
	img, src, tag, done, err := s.openImageArchive(file, format, opts.Limits)
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
	return s.importImage(ctx, name, img, src, opts)
}
