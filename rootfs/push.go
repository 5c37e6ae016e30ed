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
	"net"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Epoch is the time an OCI image built from the store gives everything
// whose time the store does not keep (directories, links, the added
// files, the configuration), so that one image's content always gives one
// digest. Regular files of the image keep their modification time: Python
// checks cached bytecode against it, and a read-only root cannot refresh it.
var Epoch = time.Unix(0, 0).UTC()

// AddedFile is a host file an OCI image built from the store gets on top
// of the image's root, in a layer of its own, owned by root.
type AddedFile struct {
	// Path is where it goes in the image: an absolute path.
	Path string
	// Source is the host file copied.
	Source string
	// Mode is its permission bits in the image.
	Mode fs.FileMode
}

// OCIOptions shape the OCI image built from a stored one.
type OCIOptions struct {
	// Files are added in a second layer, so that a new agent re-uploads
	// only that layer.
	Files []AddedFile
	// Entrypoint and User go into the image's configuration.
	Entrypoint []string
	User       string
	// TempDir holds the compressed layers while the image is used; empty
	// means os.TempDir().
	TempDir string
	// Progress, if set, is called as the root's files are read, with the
	// bytes done and the image's total.
	Progress func(done, total int64)
}

// OCIImage builds an OCI image of the stored image name plus opts.Files:
// a layer of its root (entries sorted, directories and links at Epoch,
// owners as stored when the store was filled by root, else root's, since
// the files' owner is then only the user who imported them), a layer of
// the added files, and a configuration of the image's environment and
// working directory. The same stored image and files always give the
// same digest. The layers are written compressed to files in
// opts.TempDir; done removes them, once the image is no longer used.
func (s Store) OCIImage(ctx context.Context, name string, opts OCIOptions) (img v1.Image, done func(), err error) {
	stored, err := s.Lookup(name)
	if err != nil {
		return nil, func() {}, err
	}
	var files []string
	done = func() {
		for _, f := range files {
			os.Remove(f)
		}
	}
	defer func() {
		if err != nil {
			done()
		}
	}()
	skip := make(map[string]bool, len(opts.Files))
	for _, f := range opts.Files {
		if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path {
			return nil, done, fmt.Errorf("image %s: added file path %q is not a clean absolute path", name, f.Path)
		}
		skip[strings.TrimPrefix(f.Path, "/")] = true
	}
	base, err := s.layerFile(opts.TempDir, &files, func(tw *tar.Writer) error {
		return writeRoot(ctx, tw, stored, skip, opts.Progress)
	})
	if err != nil {
		return nil, done, fmt.Errorf("image %s: layer of its root: %w", name, err)
	}
	layers := []v1.Layer{base}
	if len(opts.Files) > 0 {
		added, err := s.layerFile(opts.TempDir, &files, func(tw *tar.Writer) error { return writeAdded(tw, opts.Files) })
		if err != nil {
			return nil, done, fmt.Errorf("image %s: layer of the added files: %w", name, err)
		}
		layers = append(layers, added)
	}
	img, err = mutate.AppendLayers(mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON), layers...)
	if err != nil {
		return nil, done, fmt.Errorf("image %s: %w", name, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, done, fmt.Errorf("image %s: %w", name, err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = Platform.OS, Platform.Architecture
	cf.Created = v1.Time{Time: Epoch}
	cf.Config.Entrypoint, cf.Config.User = opts.Entrypoint, opts.User
	cf.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	if c := stored.Config; c != nil {
		if len(c.Env) > 0 {
			cf.Config.Env = c.Env
		}
		cf.Config.WorkingDir = c.WorkingDir
	}
	cf.History = nil
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, done, fmt.Errorf("image %s: %w", name, err)
	}
	return img, done, nil
}

// layerFile writes the gzip-compressed tar that write fills to a new file
// in dir (added to files) and opens it as a layer: compressed once, its
// digests read back from the file.
func (s Store) layerFile(dir string, files *[]string, write func(*tar.Writer) error) (v1.Layer, error) {
	f, err := os.CreateTemp(dir, "safe-run-layer-*.tar.gz")
	if err != nil {
		return nil, err
	}
	*files = append(*files, f.Name())
	bw := bufio.NewWriterSize(f, 1<<20)
	zw, _ := gzip.NewWriterLevel(bw, gzip.BestSpeed) // no name, no time: deterministic
	tw := tar.NewWriter(zw)
	err = write(tw)
	for _, c := range []func() error{tw.Close, zw.Close, bw.Flush, f.Close} {
		if cerr := c(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return nil, err
	}
	return tarball.LayerFromFile(f.Name(), tarball.WithMediaType(types.OCILayer))
}

// writeRoot writes the root of img, in lexical order, leaving out skip.
func writeRoot(ctx context.Context, tw *tar.Writer, img Image, skip map[string]bool, progress func(done, total int64)) error {
	fi, err := os.Lstat(img.Root)
	if err != nil {
		return err
	}
	keepOwners := false
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid == 0 {
		keepOwners = true
	}
	// The files made as mountpoints at import hold nothing of the image's
	// and carry the time of the import.
	made := make(map[string]bool)
	if mp := img.Mountpoints; mp != nil {
		for _, f := range mp.Files {
			made[strings.TrimPrefix(path.Clean("/"+f), "/")] = true
		}
	}
	type inode struct{ dev, ino uint64 }
	links := make(map[inode]string)
	var done int64
	return filepath.WalkDir(img.Root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(img.Root, p)
		if err != nil || rel == "." {
			return err
		}
		rel = filepath.ToSlash(rel)
		if skip[rel] {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		hdr := &tar.Header{Name: rel, ModTime: Epoch, Mode: int64(fi.Mode().Perm())}
		if fi.Mode()&fs.ModeSticky != 0 {
			hdr.Mode |= 0o1000
		}
		st, _ := fi.Sys().(*syscall.Stat_t)
		if st != nil && keepOwners {
			hdr.Uid, hdr.Gid = int(st.Uid), int(st.Gid)
		}
		switch {
		case fi.IsDir():
			hdr.Typeflag, hdr.Name = tar.TypeDir, rel+"/"
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
		case fi.Mode().IsRegular():
			if st != nil && st.Nlink > 1 {
				key := inode{uint64(st.Dev), st.Ino}
				if first, ok := links[key]; ok {
					hdr.Typeflag, hdr.Linkname = tar.TypeLink, first
					return tw.WriteHeader(hdr)
				}
				links[key] = rel
			}
			hdr.Typeflag, hdr.Size = tar.TypeReg, fi.Size()
			if !made[rel] {
				hdr.ModTime = fi.ModTime().Truncate(time.Second)
			}
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			if err := copyFile(tw, p, fi.Size()); err != nil {
				return err
			}
			if done += fi.Size(); progress != nil {
				progress(done, img.Stats.Bytes)
			}
			return nil
		default:
			return nil // the store keeps no other kind
		}
		return tw.WriteHeader(hdr)
	})
}

// writeAdded writes files, and the directories above them, owned by root.
func writeAdded(tw *tar.Writer, files []AddedFile) error {
	dirs := make(map[string]bool)
	for _, f := range files {
		rel := strings.TrimPrefix(f.Path, "/")
		var parents []string
		for d := path.Dir(rel); d != "." && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
			parents = append([]string{d}, parents...)
		}
		for _, d := range parents {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: Epoch}); err != nil {
				return err
			}
		}
		fi, err := os.Stat(f.Source)
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("%s is not a regular file", f.Source)
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: rel, Mode: int64(f.Mode.Perm()), Size: fi.Size(), ModTime: Epoch}); err != nil {
			return err
		}
		if err := copyFile(tw, f.Source, fi.Size()); err != nil {
			return err
		}
	}
	return nil
}

// copyFile copies exactly size bytes of file to w: a file that changed
// size since it was listed fails rather than corrupting the archive.
func copyFile(w io.Writer, file string, size int64) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.Copy(w, io.LimitReader(f, size))
	if err == nil && n != size {
		err = fmt.Errorf("%s: %w (the file changed while it was read)", file, io.ErrUnexpectedEOF)
	}
	return err
}

// Push uploads img to the registry as ref, a tag, with credentials from
// the Docker configuration as Pull takes them, and returns the digest of
// its manifest. Progress counts the bytes uploaded.
func Push(ctx context.Context, img v1.Image, ref string, progress func(done, total int64)) (v1.Hash, error) {
	r, err := PushReference(ref)
	if err != nil {
		return v1.Hash{}, err
	}
	opts := []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)}
	var updates chan v1.Update
	finished := make(chan struct{})
	if progress != nil {
		updates = make(chan v1.Update, 16)
		opts = append(opts, remote.WithProgress(updates))
		go func() {
			defer close(finished)
			for u := range updates {
				if u.Error == nil && u.Total > 0 { // the last update is only the end
					progress(u.Complete, u.Total)
				}
			}
		}()
	} else {
		close(finished)
	}
	err = remote.Write(r, img, opts...)
	<-finished // remote.Write closes updates
	if err != nil {
		return v1.Hash{}, pushError(r, err)
	}
	return img.Digest()
}

// PushReference parses ref as a tag an image can be pushed to.
func PushReference(ref string) (name.Tag, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return name.Tag{}, fmt.Errorf("invalid image reference %q: %w; use a tag such as registry.example:5000/team/safe-run:1", ref, err)
	}
	t, ok := r.(name.Tag)
	if !ok {
		return name.Tag{}, fmt.Errorf("cannot push to %q: a digest names content already made; push to a tag such as %s:1 (the digest pushed is printed)", ref, r.Context().Name())
	}
	return t, nil
}

// pushError says why a registry did not take an image, and what to do.
func pushError(r name.Reference, err error) error {
	host := r.Context().RegistryStr()
	var terr *transport.Error
	var nerr net.Error
	var oerr *net.OpError
	switch {
	case errors.As(err, &terr) && (terr.StatusCode == http.StatusUnauthorized || terr.StatusCode == http.StatusForbidden):
		return fmt.Errorf("push %s: the registry refused it (%d %s): %w; log in with `docker login %s` (credentials are read from ~/.docker/config.json and its helpers) and check that you may push to %s",
			r, terr.StatusCode, http.StatusText(terr.StatusCode), err, host, r.Context().RepositoryStr())
	case errors.As(err, &terr):
		return fmt.Errorf("push %s: the registry refused it (%d %s): %w; check the reference's registry and repository", r, terr.StatusCode, http.StatusText(terr.StatusCode), err)
	case errors.As(err, &oerr), errors.As(err, &nerr):
		return fmt.Errorf("push %s: cannot reach the registry %s: %w; check the reference's host and port, and that the registry is up", r, host, err)
	}
	return fmt.Errorf("push %s: %w", r, err)
}
