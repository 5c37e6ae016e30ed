package rootfs

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
)

// Caps on what an image's configuration may ask for. Real configurations
// are a few KiB (python:3.12's is about 7 KiB, its ENV 8 variables of 30
// bytes or so); these leave two orders of magnitude of margin and keep a
// hostile configuration from costing gigabytes at import and at every run.
const (
	// MaxConfigBytes caps an image's configuration blob, checked before
	// it is decoded: containerd caps manifests at the same 4 MiB.
	MaxConfigBytes = 4 << 20
	// MaxEnvEntries caps the variables of an image's ENV.
	MaxEnvEntries = 1024
	// MaxEnvEntryBytes caps one of them, well under the kernel's 128 KiB
	// limit on one string passed to exec.
	MaxEnvEntryBytes = 32 << 10
	// MaxEnvBytes caps them all together, a tenth of the 2 MiB that exec
	// allows arguments and environment together by default.
	MaxEnvBytes = 256 << 10
	// maxImageJSONBytes caps an image's image.json in the store: the capped
	// ENV, even with every byte escaped, and the rest.
	maxImageJSONBytes = 4 << 20
)

// context is the import's context: opts.Context, or one never done.
func (opts ImportOptions) context() context.Context {
	if opts.Context != nil {
		return opts.Context
	}
	return context.Background()
}

// contextReader fails with its context's error once the context is done,
// so that a long extraction stops within one read of a cancellation.
type contextReader struct {
	ctx context.Context
	r   io.Reader
}

func (c contextReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// readTrailer reads what follows an archive's end marker, to the end of
// the stream, refusing more than maxTrailingBytes if capped.
func readTrailer(r io.Reader, capped bool) error {
	if capped {
		r = io.LimitReader(r, maxTrailingBytes+1)
	}
	n, err := io.Copy(io.Discard, r)
	if err != nil {
		return fmt.Errorf("extract: read archive: %w", err)
	}
	if capped && n > maxTrailingBytes {
		return fmt.Errorf("extract: the archive goes on for more than %d bytes after its end-of-archive marker; not read further (rebuild it with tar)", maxTrailingBytes)
	}
	return nil
}

// checkPath refuses an entry whose path (already cleaned) is too deep or
// long, or whose link target is too long.
func checkPath(name, linkname string, l ExtractLimits) error {
	if len(name) > maxPathBytes || len(linkname) > maxPathBytes {
		return fmt.Errorf("path or link target of more than %d bytes, the limit of a path", maxPathBytes)
	}
	if depth := strings.Count(name, "/") + 1; depth > l.MaxDepth {
		return fmt.Errorf("path of %d components is deeper than the limit of %d", depth, l.MaxDepth)
	}
	return nil
}

// checkLayerCount refuses an image of more than l.MaxLayers layers.
func checkLayerCount(n int, l ExtractLimits) error {
	if n > l.MaxLayers {
		return fmt.Errorf("the image has %d layers, more than the limit of %d; squash it (docker build --squash, or a multi-stage build)", n, l.MaxLayers)
	}
	return nil
}

// checkConfigSize refuses a configuration blob over MaxConfigBytes, from
// the size a manifest declares before the blob is read (a registry's blob
// is checked against that size as it is read) or from the blob itself.
func checkConfigSize(size int64) error {
	if size > MaxConfigBytes {
		return fmt.Errorf("the image configuration is %d bytes, over the limit of %d; no real image needs that much", size, MaxConfigBytes)
	}
	return nil
}

// checkManifestConfig checks the configuration size img's manifest
// declares; call it only where the manifest is at hand (a registry's, a
// layout's), not computed from the layers.
func checkManifestConfig(img v1.Image) error {
	m, err := img.Manifest()
	if err != nil {
		return fmt.Errorf("read the image manifest: %w", err)
	}
	return checkConfigSize(m.Config.Size)
}

// checkDockerConfig checks the size of the configuration entry config of a
// docker save archive from its tar header, before the library reads it
// into memory whole.
func checkDockerConfig(open func() (io.ReadCloser, error), config string) error {
	rc, err := open()
	if err != nil {
		return err
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil // the library reports the missing entry
		}
		if err != nil {
			return fmt.Errorf("read archive: %w", err)
		}
		if hdr.Name == config {
			return checkConfigSize(hdr.Size)
		}
	}
}

// checkImage refuses an image whose configuration is over the caps: its
// size (before it is decoded), its ENV, its layer count (before any layer
// is opened).
func checkImage(img v1.Image, l ExtractLimits) error {
	raw, err := img.RawConfigFile()
	if err != nil {
		return fmt.Errorf("read the image configuration: %w", err)
	}
	if err := checkConfigSize(int64(len(raw))); err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("read the image configuration: %w", err)
	}
	if err := checkEnv(cf.Config.Env); err != nil {
		return err
	}
	return checkLayerCount(len(cf.RootFS.DiffIDs), l.withDefaults())
}

// checkEnv refuses an ENV over MaxEnvEntries, MaxEnvEntryBytes or
// MaxEnvBytes.
func checkEnv(env []string) error {
	if len(env) > MaxEnvEntries {
		return fmt.Errorf("the image's ENV has %d variables, more than the limit of %d", len(env), MaxEnvEntries)
	}
	total := 0
	for _, kv := range env {
		if len(kv) > MaxEnvEntryBytes {
			name, _, _ := strings.Cut(kv, "=")
			return fmt.Errorf("the image's ENV variable %.40q is %d bytes, over the limit of %d", name, len(kv), MaxEnvEntryBytes)
		}
		total += len(kv)
	}
	if total > MaxEnvBytes {
		return fmt.Errorf("the image's ENV is %d bytes, over the limit of %d", total, MaxEnvBytes)
	}
	return nil
}

// fileIdentity tells one version of a file from another: an image.json
// rewritten in place, replaced or touched changes at least one field.
type fileIdentity struct {
	dev, ino     uint64
	size         int64
	mtime, ctime unix.Timespec
}

// metadataCache holds the parsed image.json of each image looked up, so
// that a server's runs do not read and decode it again each time.
var metadataCache struct {
	sync.Mutex
	m map[string]cachedMetadata
}

type cachedMetadata struct {
	id  fileIdentity
	img Image
}

// readMetadata returns the parsed image.json at file: from the cache if the
// file is the one cached, else read (refused over maxImageJSONBytes) and
// cached. The caller gets its own copy.
func readMetadata(file string) (Image, error) {
	var st unix.Stat_t
	if err := unix.Stat(file, &st); err != nil {
		return Image{}, &os.PathError{Op: "stat", Path: file, Err: err}
	}
	id := fileIdentity{dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim, ctime: st.Ctim}
	metadataCache.Lock()
	c, ok := metadataCache.m[file]
	metadataCache.Unlock()
	if ok && c.id == id {
		return c.img.clone(), nil
	}
	if st.Size > maxImageJSONBytes {
		return Image{}, fmt.Errorf("its image.json is %d bytes, over the limit of %d; re-import it", st.Size, maxImageJSONBytes)
	}
	f, err := os.Open(file)
	if err != nil {
		return Image{}, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxImageJSONBytes+1))
	if err != nil {
		return Image{}, err
	}
	if len(data) > maxImageJSONBytes {
		return Image{}, fmt.Errorf("its image.json is over the limit of %d bytes; re-import it", maxImageJSONBytes)
	}
	var img Image
	if err := json.Unmarshal(data, &img); err != nil {
		return Image{}, fmt.Errorf("its image.json is not valid JSON: %w; re-import it", err)
	}
	if img.Config != nil {
		if err := checkEnv(img.Config.Env); err != nil {
			return Image{}, fmt.Errorf("%w; re-import it", err)
		}
	}
	metadataCache.Lock()
	if metadataCache.m == nil {
		metadataCache.m = map[string]cachedMetadata{}
	}
	metadataCache.m[file] = cachedMetadata{id: id, img: img}
	metadataCache.Unlock()
	return img.clone(), nil
}

// clone copies img deeply enough that its user may change anything.
func (img Image) clone() Image {
	img.Names = slices.Clone(img.Names)
	if img.Config != nil {
		c := *img.Config
		c.Env = slices.Clone(c.Env)
		img.Config = &c
	}
	if img.Mountpoints != nil {
		m := Mountpoints{Dirs: slices.Clone(img.Mountpoints.Dirs), Files: slices.Clone(img.Mountpoints.Files)}
		img.Mountpoints = &m
	}
	return img
}
