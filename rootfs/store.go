// Package rootfs keeps the images sandboxes run in: root directories on
// disk, extracted safely from archives (see Extract) into a cache keyed by
// content or recipe, and given names such as "default". Every sandbox uses
// an image's root read-only; nothing writes to it after import.
package rootfs

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultName is the name of the image runs use unless told otherwise.
const DefaultName = "default"

// DefaultDir returns the cache directory: $SAFE_RUN_CACHE if set, else
// /var/cache/safe-run for root and $XDG_CACHE_HOME/safe-run (or
// ~/.cache/safe-run) for other users.
func DefaultDir() string {
	if d := os.Getenv("SAFE_RUN_CACHE"); d != "" {
		return d
	}
	if os.Geteuid() == 0 {
		return "/var/cache/safe-run"
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "safe-run")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("safe-run-%d", os.Geteuid()))
}

// Store is an image cache in a directory:
//
//	images/<key>/rootfs/      the image's root, used read-only
//	images/<key>/image.json   its metadata, written last: an image without it is incomplete
//	names/<name>              the key an image name points to
//	archives/                 archives kept for re-import (the build script's output)
//	staging/                  extractions in progress
type Store struct {
	// Dir is the cache directory; empty means DefaultDir().
	Dir string
}

func (s Store) dir() string {
	if s.Dir == "" {
		return DefaultDir()
	}
	return s.Dir
}

// Path returns the store's directory.
func (s Store) Path() string { return s.dir() }

// Image is an image in the store.
type Image struct {
	// Key identifies the image's content: the build recipe's hash, or the
	// archive's SHA-256.
	Key string `json:"key"`
	// Names are the names that point to the image.
	Names []string `json:"names,omitempty"`
	// Root is the host path of the image's root directory.
	Root string `json:"root"`
	// Source is the archive the image came from, and its SHA-256.
	Source       string `json:"source"`
	SourceSHA256 string `json:"source_sha256"`
	// Created is when the image was imported.
	Created time.Time `json:"created"`
	// Stats says what the extraction wrote.
	Stats ExtractStats `json:"stats"`
}

var validKey = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)

// Mountpoints are paths created in every imported image so that sandboxes
// can mount over them: the runtime cannot create them later, because the
// root is read-only and shared by every run.
type Mountpoints struct {
	Dirs  []string
	Files []string
}

// ImportOptions tune Import.
type ImportOptions struct {
	// Key names the image's content; empty means the archive's SHA-256.
	Key string
	// Mountpoints are created in the image after extraction.
	Mountpoints Mountpoints
	// Limits bound the extraction; zero means DefaultExtractLimits.
	Limits ExtractLimits
	// Progress, if set, is called as the archive is read.
	Progress func(done, total int64)
}

// Import extracts the archive at archivePath into the store and points
// name at it. If an image with the same key is already complete, only the
// name is updated. Imports of one store are serialised by a lock file.
func (s Store) Import(name, archivePath string, opts ImportOptions) (Image, error) {
	if !validKey.MatchString(name) {
		return Image{}, fmt.Errorf("import: invalid image name %q; use lower-case letters, digits, '.', '_' and '-'", name)
	}
	if opts.Key != "" && !validKey.MatchString(opts.Key) {
		return Image{}, fmt.Errorf("import: invalid key %q", opts.Key)
	}
	unlock, err := s.lock()
	if err != nil {
		return Image{}, err
	}
	defer unlock()

	img, err := s.image(opts.Key)
	if opts.Key == "" || err != nil {
		if img, err = s.extract(archivePath, opts); err != nil {
			return Image{}, err
		}
	}
	if err := s.setName(name, img.Key); err != nil {
		return Image{}, err
	}
	img.Names = []string{name}
	return img, nil
}

func (s Store) extract(archivePath string, opts ImportOptions) (Image, error) {
	f, err := os.Open(archivePath)
	if err != nil {
		return Image{}, fmt.Errorf("import: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return Image{}, fmt.Errorf("import: %w", err)
	}
	staging := filepath.Join(s.dir(), "staging")
	if err := os.MkdirAll(staging, 0o755); err != nil {
		return Image{}, fmt.Errorf("import: %w", err)
	}
	work, err := os.MkdirTemp(staging, "import-")
	if err != nil {
		return Image{}, fmt.Errorf("import: %w", err)
	}
	defer os.RemoveAll(work) // after a successful rename, only the empty shell is left

	rootDir := filepath.Join(work, "rootfs")
	if err := os.Mkdir(rootDir, 0o755); err != nil {
		return Image{}, fmt.Errorf("import: %w", err)
	}
	if err := os.Chmod(rootDir, 0o755); err != nil { // whatever the umask
		return Image{}, fmt.Errorf("import: %w", err)
	}
	limits := opts.Limits
	if limits == (ExtractLimits{}) {
		limits = DefaultExtractLimits
	}
	hash := sha256.New()
	var r io.Reader = io.TeeReader(f, hash)
	if opts.Progress != nil {
		r = &progressReader{r: r, total: fi.Size(), report: opts.Progress}
	}
	stats, err := Extract(r, rootDir, limits)
	if err != nil {
		return Image{}, fmt.Errorf("import %s: %w", archivePath, err)
	}
	// Read to the end so the hash covers trailing padding too.
	if _, err := io.Copy(io.Discard, r); err != nil {
		return Image{}, fmt.Errorf("import %s: %w", archivePath, err)
	}
	if err := makeMountpoints(rootDir, opts.Mountpoints); err != nil {
		return Image{}, fmt.Errorf("import %s: %w", archivePath, err)
	}
	sum := hex.EncodeToString(hash.Sum(nil))
	key := opts.Key
	if key == "" {
		key = "sha256-" + sum[:32]
		// The same archive imported before: keep that copy.
		if img, err := s.image(key); err == nil {
			return img, nil
		}
	}
	abs, _ := filepath.Abs(archivePath)
	img := Image{Key: key, Source: abs, SourceSHA256: sum, Created: time.Now().UTC(), Stats: stats}
	data, err := json.MarshalIndent(img, "", "  ")
	if err != nil {
		return Image{}, err
	}
	if err := os.WriteFile(filepath.Join(work, "image.json"), data, 0o644); err != nil {
		return Image{}, fmt.Errorf("import: %w", err)
	}
	if err := os.Chmod(work, 0o755); err != nil {
		return Image{}, fmt.Errorf("import: %w", err)
	}
	final := filepath.Join(s.dir(), "images", key)
	if err := os.MkdirAll(filepath.Dir(final), 0o755); err != nil {
		return Image{}, fmt.Errorf("import: %w", err)
	}
	// A leftover without image.json is an interrupted import: replace it.
	if _, err := s.image(key); err != nil {
		if err := os.RemoveAll(final); err != nil {
			return Image{}, fmt.Errorf("import: remove incomplete %s: %w", final, err)
		}
	}
	if err := os.Rename(work, final); err != nil {
		return Image{}, fmt.Errorf("import: %w", err)
	}
	img.Root = filepath.Join(final, "rootfs")
	return img, nil
}

func makeMountpoints(root string, mp Mountpoints) error {
	r, err := os.OpenRoot(root)
	if err != nil {
		return err
	}
	defer r.Close()
	for _, d := range mp.Dirs {
		if err := mkdirAll(r, filepath.Clean("./"+d)); err != nil {
			return fmt.Errorf("create mountpoint %s: %w", d, err)
		}
	}
	for _, name := range mp.Files {
		rel := filepath.Clean("./" + name)
		if err := mkdirAll(r, filepath.Dir(rel)); err != nil {
			return fmt.Errorf("create mountpoint %s: %w", name, err)
		}
		f, err := r.OpenFile(rel, os.O_WRONLY|os.O_CREATE, 0o644)
		if err != nil {
			return fmt.Errorf("create mountpoint %s: %w", name, err)
		}
		err = f.Chmod(0o644)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("create mountpoint %s: %w", name, err)
		}
	}
	return nil
}

// Lookup returns the complete image that name points to.
func (s Store) Lookup(name string) (Image, error) {
	if !validKey.MatchString(name) {
		return Image{}, fmt.Errorf("invalid image name %q; use lower-case letters, digits, '.', '_' and '-'", name)
	}
	key, err := os.ReadFile(filepath.Join(s.dir(), "names", name))
	if errors.Is(err, fs.ErrNotExist) {
		return Image{}, &NotFoundError{Name: name, Dir: s.dir()}
	}
	if err != nil {
		return Image{}, fmt.Errorf("look up image %q: %w", name, err)
	}
	img, err := s.image(string(key))
	if err != nil {
		return Image{}, fmt.Errorf("look up image %q: %w", name, err)
	}
	img.Names = []string{name}
	return img, nil
}

// List returns every complete image in the store with the names pointing
// to it, sorted by key.
func (s Store) List() ([]Image, error) {
	entries, err := os.ReadDir(filepath.Join(s.dir(), "images"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("list images: %w", err)
	}
	names, _ := os.ReadDir(filepath.Join(s.dir(), "names"))
	var out []Image
	for _, e := range entries {
		img, err := s.image(e.Name())
		if err != nil {
			continue
		}
		for _, n := range names {
			if k, err := os.ReadFile(filepath.Join(s.dir(), "names", n.Name())); err == nil && string(k) == img.Key {
				img.Names = append(img.Names, n.Name())
			}
		}
		out = append(out, img)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// image reads the metadata of the image with key; it fails for an image
// whose import did not finish.
func (s Store) image(key string) (Image, error) {
	if !validKey.MatchString(key) {
		return Image{}, fmt.Errorf("invalid image key %q", key)
	}
	dir := filepath.Join(s.dir(), "images", key)
	data, err := os.ReadFile(filepath.Join(dir, "image.json"))
	if err != nil {
		return Image{}, fmt.Errorf("image %s is incomplete or missing: %w", key, err)
	}
	var img Image
	if err := json.Unmarshal(data, &img); err != nil || img.Key != key {
		return Image{}, fmt.Errorf("image %s has corrupt metadata; re-import it", key)
	}
	img.Root = filepath.Join(dir, "rootfs")
	if fi, err := os.Stat(img.Root); err != nil || !fi.IsDir() {
		return Image{}, fmt.Errorf("image %s has no root directory; re-import it", key)
	}
	return img, nil
}

func (s Store) setName(name, key string) error {
	dir := filepath.Join(s.dir(), "names")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("name image: %w", err)
	}
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(key), 0o644); err != nil {
		return fmt.Errorf("name image: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		return fmt.Errorf("name image: %w", err)
	}
	return nil
}

// lock takes the store's exclusive lock, waiting for another import.
func (s Store) lock() (func(), error) {
	if err := os.MkdirAll(s.dir(), 0o755); err != nil {
		return nil, fmt.Errorf("lock image store: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(s.dir(), "lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock image store: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock image store: %w", err)
	}
	return func() { f.Close() }, nil
}

// NotFoundError reports a name that points to no image.
type NotFoundError struct {
	Name, Dir string
}

func (e *NotFoundError) Error() string {
	if e.Name == DefaultName {
		return fmt.Sprintf("the default image is not in %s; build it with `make rootfs` (as root), or import an archive with `safe-run image import --name default FILE`", e.Dir)
	}
	return fmt.Sprintf("no image named %q in %s; import one with `safe-run image import --name %s FILE`", e.Name, e.Dir, e.Name)
}

type progressReader struct {
	r      io.Reader
	done   int64
	total  int64
	report func(done, total int64)
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.done += int64(n)
	p.report(p.done, p.total)
	return n, err
}
