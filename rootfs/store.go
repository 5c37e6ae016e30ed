// Package rootfs keeps the images sandboxes run in: root directories on
// disk, extracted safely from archives (see Extract) into a cache keyed by
// content or recipe, and given names such as "default". Every sandbox uses
// an image's root read-only; nothing writes to it after import.
package rootfs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
)

// DefaultName is the name of the image runs use unless told otherwise.
const DefaultName = "default"

// SystemDir is root's cache, which other users may read images from.
const SystemDir = "/var/cache/safe-run"

// DefaultDir returns the cache directory: $SAFE_RUN_CACHE if set, else
// /var/cache/safe-run for root and $XDG_CACHE_HOME/safe-run (or
// ~/.cache/safe-run) for other users. A user with neither variable nor a
// home gets root's cache, to use read-only: a directory of a predictable
// name in /tmp could be another user's, holding an image of their choice.
func DefaultDir() string {
	if d := os.Getenv("SAFE_RUN_CACHE"); d != "" {
		return d
	}
	if os.Geteuid() != 0 {
		if d, err := os.UserCacheDir(); err == nil {
			return filepath.Join(d, "safe-run")
		}
	}
	return SystemDir
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
	// Key identifies the image's content: the build recipe's hash, the
	// archive's SHA-256, or for an OCI or Docker image its origin and ID
	// ("pull-…", "import-…"; "sha256-…" before layers were checked).
	Key string `json:"key"`
	// Names are the names that point to the image.
	Names []string `json:"names,omitempty"`
	// Root is the host path of the image's root directory.
	Root string `json:"root"`
	// Origin is OriginPull or OriginImport for an OCI or Docker image;
	// empty for a root file system archive and for images imported before
	// it was recorded.
	Origin string `json:"origin,omitempty"`
	// Source is the archive the image came from, and its SHA-256; or the
	// reference it was pulled by.
	Source       string `json:"source"`
	SourceSHA256 string `json:"source_sha256"`
	// Created is when the image was imported.
	Created time.Time `json:"created"`
	// Stats says what the extraction wrote.
	Stats ExtractStats `json:"stats"`
	// ImageID is the digest of an OCI or Docker image's configuration;
	// empty for a root file system archive.
	ImageID string `json:"image_id,omitempty"`
	// LayersVerified says that every layer was checked against the digest
	// the configuration lists for it, so that ImageID names the content.
	// Images imported before that check have an ID that proves nothing.
	LayersVerified bool `json:"layers_verified,omitempty"`
	// Digest is the image manifest's digest, checked, where the source has
	// one: a registry, an OCI layout.
	Digest string `json:"digest,omitempty"`
	// Config is what an OCI or Docker image asks of the processes run in
	// it; nil for a root file system archive.
	Config *ImageConfig `json:"config,omitempty"`
	// Mountpoints were created in the root at import; every lookup checks
	// that they are still there. Images imported before this field existed
	// have none recorded.
	Mountpoints *Mountpoints `json:"mountpoints,omitempty"`

	// What an import just did, not stored: Reused says that the image was
	// already in the store; NameChange says what became of the name
	// ("created", "unchanged" or "replaced"), and PreviousKey the image
	// it pointed to before it was replaced.
	Reused      bool   `json:"reused,omitempty"`
	NameChange  string `json:"name_change,omitempty"`
	PreviousKey string `json:"previous_key,omitempty"`
}

// ImageConfig is the part of an image's configuration sandboxes honour.
type ImageConfig struct {
	// Env is the image's environment, e.g. PATH=/usr/local/bin:/usr/bin.
	Env []string `json:"env,omitempty"`
	// WorkingDir is the image's WORKDIR: an absolute path, or empty.
	WorkingDir string `json:"working_dir,omitempty"`
	// User is the image's USER, kept for information only: sandboxes run
	// programs as an unprivileged user of their own.
	User string `json:"user,omitempty"`
}

// The lengths are checked apart from the patterns: a counted repetition
// such as {0,199} compiles to that many copies of its class, which every
// start of the binary paid in package init (0.6-3 ms of the CLI's cold path).
var (
	keyChars = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)
	// A name is a plain name like "default" or an image reference like
	// "registry.example:5000/team/python:3.12@sha256:…".
	nameChars = regexp.MustCompile(`^[a-z0-9][a-zA-Z0-9._:/@+-]*$`)
)

const (
	maxKeyLen  = 64
	maxNameLen = 200
)

// validKey reports whether key can be an image's key.
func validKey(key string) bool { return len(key) <= maxKeyLen && keyChars.MatchString(key) }

// checkName reports whether name can name an image.
func checkName(name string) error {
	ok := len(name) <= maxNameLen && nameChars.MatchString(name) && len(nameFile(name)) <= 250 // a file name's limit is 255
	if _, digest, pinned := strings.Cut(name, "@"); pinned {
		// Only a digest may follow "@": the name means that digest.
		ok = ok && strings.HasPrefix(digest, "sha256:") && isSHA256Hex(strings.TrimPrefix(digest, "sha256:"))
	}
	for _, part := range strings.Split(name, "/") {
		ok = ok && part != "" && part != "." && part != ".."
	}
	if !ok {
		return fmt.Errorf("invalid image name %q; use a name of lower-case letters, digits, '.', '_' and '-', or an image reference such as python:3.12-slim or python@sha256:<64 hex digits>", name)
	}
	return nil
}

// checkPin checks that a digest-pinned name ("repo@sha256:…") is given
// only to an image that digest names: one of digests, the manifest and
// index digests checked on the way to it.
func checkPin(name string, digests []v1.Hash) error {
	_, pin, pinned := strings.Cut(name, "@")
	if !pinned {
		return nil
	}
	for _, d := range digests {
		if d.String() == pin {
			return nil
		}
	}
	if len(digests) == 0 {
		return fmt.Errorf("image name %q pins a digest, but this archive has no manifest digest to check it against (docker save keeps none, a root file system has none); name it without @sha256:…", name)
	}
	have := make([]string, len(digests))
	for i, d := range digests {
		have[i] = d.String()
	}
	return fmt.Errorf("image name %q pins digest %s, but this image is %s; a digest-pinned name can only name that digest, so nothing was changed", name, pin, strings.Join(have, " in "))
}

// nameFile is the file in names/ that holds name's key: the name itself,
// with every byte other than [a-z0-9._-] escaped as %XX, so that "default"
// is names/default and references such as "a/b:1" stay one file name.
func nameFile(name string) string {
	var b strings.Builder
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// nameOfFile reverses nameFile; ok is false for other files.
func nameOfFile(file string) (string, bool) {
	name, err := url.PathUnescape(file)
	if err != nil || checkName(name) != nil || nameFile(name) != file {
		return "", false
	}
	return name, true
}

// Mountpoints are paths created in every imported image so that sandboxes
// can mount over them: the runtime cannot create them later, because the
// root is read-only and shared by every run.
type Mountpoints struct {
	Dirs  []string `json:"dirs,omitempty"`
	Files []string `json:"files,omitempty"`
}

// ImportOptions tune Import.
type ImportOptions struct {
	// Key names the image's content; empty means the archive's SHA-256.
	Key string
	// Mountpoints are created in the image after extraction.
	Mountpoints Mountpoints
	// Limits bound the extraction; zero means DefaultExtractLimits.
	Limits ExtractLimits
	// Replace lets the import point a name that points to another
	// complete image at this one; without it that is refused.
	Replace bool
	// Context, if set, stops an import of a root file system archive once
	// done (ImportImage, Pull and ImportFile take their own).
	Context context.Context
	// Progress, if set, is called as the archive is read or the image's
	// layers are downloaded, with bytes done and the total (0 when not
	// known in advance).
	Progress func(done, total int64)
}

// Import extracts the archive at archivePath into the store and points
// name at it. If an image with the same key is already complete, only the
// name is updated. Imports of one store are serialised by a lock file.
func (s Store) Import(name, archivePath string, opts ImportOptions) (Image, error) {
	if err := checkName(name); err != nil {
		return Image{}, fmt.Errorf("import: %w", err)
	}
	if opts.Key != "" && !validKey(opts.Key) {
		return Image{}, fmt.Errorf("import: invalid key %q", opts.Key)
	}
	if err := checkPin(name, nil); err != nil {
		return Image{}, fmt.Errorf("import %s: %w", archivePath, err)
	}
	return s.locked(name, opts, func() (Image, error) { return s.extract(name, archivePath, opts) })
}

// locked makes an image with build, under the store's lock, and points name
// at it: unless opts.Key names an image already complete (one made while
// this call waited for the lock, say), which is reused. An empty key is
// only known once build has read its source, which checks the name itself.
func (s Store) locked(name string, opts ImportOptions, build func() (Image, error)) (Image, error) {
	unlock, err := s.lock()
	if err != nil {
		return Image{}, err
	}
	defer unlock()
	s.removeStaging()

	if opts.Key != "" {
		if _, err := s.checkRename(name, opts.Key, opts.Replace); err != nil {
			return Image{}, err
		}
	}
	img, err := s.image(opts.Key)
	if opts.Key == "" || err != nil {
		if img, err = build(); err != nil {
			return Image{}, err
		}
	} else {
		img.Reused = true
	}
	return s.name(name, img, opts.Replace)
}

func (s Store) extract(name, archivePath string, opts ImportOptions) (Image, error) {
	f, err := os.Open(archivePath)
	if err != nil {
		return Image{}, fmt.Errorf("import: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return Image{}, fmt.Errorf("import: %w", err)
	}
	work, rootDir, err := s.newStaging()
	if err != nil {
		return Image{}, err
	}
	defer os.RemoveAll(work) // after a successful rename, nothing is left

	limits := opts.Limits
	hash := sha256.New()
	var r io.Reader = io.TeeReader(f, hash)
	if opts.Progress != nil {
		r = &progressReader{r: r, total: fi.Size(), report: opts.Progress}
	}
	stats, err := ExtractContext(opts.context(), r, rootDir, limits)
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
		// Only now is the key known: a refused name leaves nothing.
		if _, err := s.checkRename(name, key, opts.Replace); err != nil {
			return Image{}, err
		}
		// The same archive imported before: keep that copy.
		if img, err := s.image(key); err == nil {
			img.Reused = true
			return img, nil
		}
	}
	abs, _ := filepath.Abs(archivePath)
	img := Image{Key: key, Source: abs, SourceSHA256: sum, Created: time.Now().UTC(), Stats: stats, Mountpoints: recorded(opts.Mountpoints)}
	return s.install(work, img)
}

// recorded is mp as image.json records it: nil when empty.
func recorded(mp Mountpoints) *Mountpoints {
	if len(mp.Dirs) == 0 && len(mp.Files) == 0 {
		return nil
	}
	return &mp
}

// newStaging creates a directory in staging/ holding an empty rootfs/ for
// an import to fill; the caller removes it when done.
func (s Store) newStaging() (work, rootDir string, err error) {
	staging := filepath.Join(s.dir(), "staging")
	if err := os.MkdirAll(staging, 0o755); err != nil {
		return "", "", fmt.Errorf("import: %w", err)
	}
	if work, err = os.MkdirTemp(staging, "import-"); err != nil {
		return "", "", fmt.Errorf("import: %w", err)
	}
	rootDir = filepath.Join(work, "rootfs")
	if err := os.Mkdir(rootDir, 0o755); err == nil {
		err = os.Chmod(rootDir, 0o755) // whatever the umask
	}
	if err != nil {
		os.RemoveAll(work)
		return "", "", fmt.Errorf("import: %w", err)
	}
	return work, rootDir, nil
}

// install completes an import: it writes the image's metadata into work,
// last, as the mark of a complete image, and moves work into images/ in one
// rename. Until then no lookup sees the image.
func (s Store) install(work string, img Image) (Image, error) {
	data, err := json.MarshalIndent(img, "", "  ")
	if err != nil {
		return Image{}, err
	}
	if err := writeSynced(filepath.Join(work, "image.json"), data); err != nil {
		return Image{}, fmt.Errorf("import: %w", err)
	}
	if err := os.Chmod(work, 0o755); err != nil {
		return Image{}, fmt.Errorf("import: %w", err)
	}
	final := filepath.Join(s.dir(), "images", img.Key)
	if err := os.MkdirAll(filepath.Dir(final), 0o755); err != nil {
		return Image{}, fmt.Errorf("import: %w", err)
	}
	// A leftover that is not a complete image is an interrupted import or
	// a damaged image: replace it.
	if _, err := s.image(img.Key); err != nil {
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

// writeSynced writes a file and flushes it to disk, so that a crash right
// after cannot leave a complete-looking image with an empty image.json.
func writeSynced(name string, data []byte) error {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// removeStaging removes what imports that died left in staging/. The
// caller holds the store's lock, so no import is in progress.
func (s Store) removeStaging() {
	entries, _ := os.ReadDir(filepath.Join(s.dir(), "staging"))
	for _, e := range entries {
		_ = os.RemoveAll(filepath.Join(s.dir(), "staging", e.Name()))
	}
}

// makeMountpoints creates mp in the image at root without following any
// link: whatever the image has at a mountpoint or on the way to one that
// is not a directory (or, for a file, the path itself) is removed first.
// The sandbox mounts over these paths, so nothing of the image there is
// ever seen; a link would instead send the mount, and the chmod here, to
// a file of the image's choosing — a hard link too, for files.
func makeMountpoints(root string, mp Mountpoints) error {
	r, err := os.OpenRoot(root)
	if err != nil {
		return err
	}
	defer r.Close()
	for _, d := range mp.Dirs {
		if err := mkdirNoFollow(r, filepath.Clean("./"+d)); err != nil {
			return fmt.Errorf("create mountpoint %s: %w", d, err)
		}
	}
	for _, name := range mp.Files {
		rel := filepath.Clean("./" + name)
		if err := mkdirNoFollow(r, filepath.Dir(rel)); err != nil {
			return fmt.Errorf("create mountpoint %s: %w", name, err)
		}
		// An existing file of its own is kept (the mount hides it); a
		// link, hard or symbolic, or anything else is replaced.
		flags := os.O_WRONLY | unix.O_NOFOLLOW
		if !ownFile(r, rel) {
			if err := r.RemoveAll(rel); err != nil {
				return fmt.Errorf("create mountpoint %s: %w", name, err)
			}
			flags |= os.O_CREATE | os.O_EXCL
		}
		f, err := r.OpenFile(rel, flags, 0o644)
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

// ownFile says whether rel is a regular file, not a link, with no other
// name (a hard link would carry the chmod to its other names).
func ownFile(r *os.Root, rel string) bool {
	fi, err := r.Lstat(rel)
	if err != nil || !fi.Mode().IsRegular() {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && st.Nlink == 1
}

// mkdirNoFollow makes dir and its parents in r as real directories: a
// component that is anything else, a link included, is replaced.
func mkdirNoFollow(r *os.Root, dir string) error {
	if dir == "." {
		return nil
	}
	if err := mkdirNoFollow(r, filepath.Dir(dir)); err != nil {
		return err
	}
	fi, err := r.Lstat(dir)
	if err == nil && fi.IsDir() {
		return nil
	}
	if err == nil {
		if err := r.RemoveAll(dir); err != nil {
			return err
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := r.Mkdir(dir, 0o755); err != nil {
		return err
	}
	return r.Chmod(dir, 0o755) // just made: a directory, whatever the umask
}

// makeWorkingDir creates an image's working directory, as the image's
// WORKDIR would be: through its links, which os.Root keeps inside root.
func makeWorkingDir(root, dir string) error {
	r, err := os.OpenRoot(root)
	if err != nil {
		return err
	}
	defer r.Close()
	if err := mkdirAll(r, filepath.Clean("./"+dir)); err != nil {
		return fmt.Errorf("create the working directory %s: %w", dir, err)
	}
	return nil
}

// Lookup returns the complete image that name points to.
func (s Store) Lookup(name string) (Image, error) {
	if err := checkName(name); err != nil {
		return Image{}, err
	}
	key, err := os.ReadFile(filepath.Join(s.dir(), "names", nameFile(name)))
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
	names := s.names()
	var out []Image
	for _, e := range entries {
		img, err := s.image(e.Name())
		if err != nil {
			continue
		}
		img.Names = names[img.Key]
		out = append(out, img)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// names maps each key to the names that point to it, sorted.
func (s Store) names() map[string][]string {
	files, _ := os.ReadDir(filepath.Join(s.dir(), "names"))
	out := map[string][]string{}
	for _, f := range files {
		name, ok := nameOfFile(f.Name())
		if !ok {
			continue
		}
		if k, err := os.ReadFile(filepath.Join(s.dir(), "names", f.Name())); err == nil {
			out[string(k)] = append(out[string(k)], name)
		}
	}
	for _, n := range out {
		sort.Strings(n)
	}
	return out
}

// Remove removes the name, and the image it pointed to once no other name
// points to it. Sandboxes already running in the image must have ended:
// its files are deleted.
func (s Store) Remove(name string) (removed Image, err error) {
	if err := checkName(name); err != nil {
		return Image{}, err
	}
	unlock, err := s.lock()
	if err != nil {
		return Image{}, err
	}
	defer unlock()
	file := filepath.Join(s.dir(), "names", nameFile(name))
	key, err := os.ReadFile(file)
	if errors.Is(err, fs.ErrNotExist) {
		return Image{}, &NotFoundError{Name: name, Dir: s.dir()}
	}
	if err != nil {
		return Image{}, fmt.Errorf("remove image %q: %w", name, err)
	}
	if err := os.Remove(file); err != nil {
		return Image{}, fmt.Errorf("remove image %q: %w", name, err)
	}
	removed = Image{Key: string(key), Names: []string{name}}
	if len(s.names()[string(key)]) > 0 || !validKey(string(key)) {
		return removed, nil // still named
	}
	// Out of images/ in one rename, so that no lookup sees a half-deleted
	// image, then deleted.
	dir := filepath.Join(s.dir(), "images", string(key))
	if err := os.MkdirAll(filepath.Join(s.dir(), "staging"), 0o755); err != nil {
		return removed, fmt.Errorf("remove image %q: %w", name, err)
	}
	trash := filepath.Join(s.dir(), "staging", "removed-"+string(key))
	if err := os.Rename(dir, trash); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return removed, fmt.Errorf("remove image %q: %w", name, err)
	}
	if err := os.RemoveAll(trash); err != nil {
		return removed, fmt.Errorf("remove image %q: %w", name, err)
	}
	removed.Root = filepath.Join(dir, "rootfs")
	return removed, nil
}

// image reads the metadata of the image with key; it fails for an image
// whose import did not finish, or whose root lost a mountpoint.
func (s Store) image(key string) (Image, error) {
	if !validKey(key) {
		return Image{}, fmt.Errorf("invalid image key %q", key)
	}
	dir := filepath.Join(s.dir(), "images", key)
	img, err := readMetadata(filepath.Join(dir, "image.json"))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return Image{}, fmt.Errorf("image %s is incomplete or missing: %w", key, err)
	case err != nil:
		return Image{}, fmt.Errorf("image %s has corrupt metadata: %w", key, err)
	case img.Key != key:
		return Image{}, fmt.Errorf("image %s has corrupt metadata; re-import it", key)
	}
	img.Root = filepath.Join(dir, "rootfs")
	if fi, err := os.Stat(img.Root); err != nil || !fi.IsDir() {
		return Image{}, fmt.Errorf("image %s has no root directory; re-import it", key)
	}
	if err := img.checkMountpoints(); err != nil {
		return Image{}, fmt.Errorf("image %s is damaged: %w; re-import it", key, err)
	}
	return img, nil
}

// checkMountpoints checks that the root still has the mountpoints its
// import created: cheap, and a sandbox cannot start without them.
func (img Image) checkMountpoints() error {
	if img.Mountpoints == nil {
		return nil
	}
	root, err := os.OpenRoot(img.Root)
	if err != nil {
		return err
	}
	defer root.Close()
	for _, d := range img.Mountpoints.Dirs {
		if fi, err := root.Stat(filepath.Clean("./" + d)); err != nil || !fi.IsDir() {
			return fmt.Errorf("directory %s is missing", d)
		}
	}
	for _, f := range img.Mountpoints.Files {
		if fi, err := root.Lstat(filepath.Clean("./" + f)); err != nil || !fi.Mode().IsRegular() {
			return fmt.Errorf("file %s is missing", f)
		}
	}
	return nil
}

// checkRename checks that name may point to key: it is new, already
// points there, points to no complete image, or replace is set. It returns
// the key name points to now, if any. The caller holds the store's lock.
func (s Store) checkRename(name, key string, replace bool) (previous string, err error) {
	data, err := os.ReadFile(filepath.Join(s.dir(), "names", nameFile(name)))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("name image: %w", err)
	}
	previous = string(data)
	if previous == key || replace {
		return previous, nil
	}
	old, err := s.image(previous)
	if err != nil {
		return previous, nil // a name of nothing usable: repaired
	}
	return "", fmt.Errorf("image name %q already points to image %s (from %s); nothing was changed: add --replace to point it at this image, or choose another name with --name", name, previous, old.Source)
}

// name points name at img, as checkRename allows, and says in img what it
// did.
func (s Store) name(name string, img Image, replace bool) (Image, error) {
	previous, err := s.checkRename(name, img.Key, replace)
	if err != nil {
		return Image{}, err
	}
	switch previous {
	case "":
		img.NameChange = "created"
	case img.Key:
		img.NameChange = "unchanged"
		img.Names = []string{name}
		return img, nil
	default:
		img.NameChange, img.PreviousKey = "replaced", previous
	}
	if err := s.setName(name, img.Key); err != nil {
		return Image{}, err
	}
	img.Names = []string{name}
	return img, nil
}

func (s Store) setName(name, key string) error {
	dir := filepath.Join(s.dir(), "names")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("name image: %w", err)
	}
	file := nameFile(name)
	tmp := filepath.Join(dir, "."+file+".tmp")
	if err := os.WriteFile(tmp, []byte(key), 0o644); err != nil {
		return fmt.Errorf("name image: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, file)); err != nil {
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
	switch {
	case e.Name == DefaultName:
		return fmt.Sprintf("the default image is not in %s; build it with `safe-run image build default` or `make rootfs` (as root), or import an archive with `safe-run image import --name default FILE`", e.Dir)
	case strings.ContainsAny(e.Name, ":/@"):
		return fmt.Sprintf("no image named %q in %s; pull it with `safe-run image pull %s`, or import an archive with `safe-run image import --name %s FILE`", e.Name, e.Dir, e.Name, e.Name)
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
