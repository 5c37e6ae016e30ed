package rootfs

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// defaultRecipe builds the default image: a shell script (debootstrap plus
// packages), embedded so that the binary can build the image by itself.
//
//go:embed build-rootfs.sh
var defaultRecipe []byte

// recipeScript is the script runRecipe runs: defaultRecipe, or a test's
// stand-in that needs neither debootstrap nor the network.
var recipeScript = defaultRecipe

// DefaultKey is the default image's key: the first 16 hex digits of its
// recipe's SHA-256, as the script computes it of itself. Any change to the
// recipe makes a new image and leaves the old one alone.
func DefaultKey() string {
	sum := sha256.Sum256(defaultRecipe)
	return hex.EncodeToString(sum[:])[:16]
}

// BuildDefault makes the store's default image current: unless the name
// "default" already points to a complete image of DefaultKey, it builds
// one. An archive archives/default-KEY.tar.gz already there (one built
// elsewhere, say) is imported. Otherwise root runs the recipe straight into
// the store (debootstrap; see buildInPlace), and other users have it write
// that archive with mmdebstrap, kept, and import it. The recipe's progress
// lines go to log. built says whether anything was done.
func (s Store) BuildDefault(ctx context.Context, opts ImportOptions, log io.Writer) (img Image, built bool, err error) {
	key := DefaultKey()
	if img, err := s.Lookup(DefaultName); err == nil && img.Key == key {
		return img, false, nil
	}
	opts.Key, opts.Context = key, ctx
	opts.Replace = true // building the default image is asking to replace it
	archive := filepath.Join(s.dir(), "archives", "default-"+key+".tar.gz")
	if fi, err := os.Stat(archive); err == nil && fi.Size() > 0 {
		fmt.Fprintf(log, "reusing archive %s\n", archive)
	} else if os.Geteuid() == 0 {
		img, err := s.buildInPlace(opts, log)
		return img, true, err
	} else if err := runRecipe(ctx, log, "--archive", archive); err != nil {
		return Image{}, false, err
	}
	img, err = s.Import(DefaultName, archive, opts)
	return img, true, err
}

// buildInPlace has the recipe build the image, as root, in a staging
// directory of the store, settles it as an extraction would and installs
// it: no archive is written and none extracted (28 s of a 225 s build on a
// fresh machine here; on a disk that writes slowly the extraction alone
// took 229 s). The store stays locked throughout, as for an import.
func (s Store) buildInPlace(opts ImportOptions, log io.Writer) (Image, error) {
	return s.locked(DefaultName, opts, func() (Image, error) { return s.recipeInStaging(opts, log) })
}

// recipeInStaging runs the recipe in a new staging directory and installs
// what it built; the caller holds the store's lock.
func (s Store) recipeInStaging(opts ImportOptions, log io.Writer) (Image, error) {
	work, rootDir, err := s.newStaging()
	if err != nil {
		return Image{}, err
	}
	defer func() {
		// A recipe stopped midway can leave debootstrap's mounts (proc,
		// sysfs, in some containers the host's /dev bound) in the tree:
		// detach them before removing what is left.
		unmountBelow(work)
		os.RemoveAll(work) // after a successful rename, nothing is left
	}()
	if err := runRecipe(opts.context(), log, "--root", rootDir); err != nil {
		return Image{}, err
	}
	stats, err := settleTree(opts.context(), rootDir, opts.Limits)
	if err != nil {
		return Image{}, fmt.Errorf("build the default image: %w", err)
	}
	if err := makeMountpoints(rootDir, opts.Mountpoints); err != nil {
		return Image{}, fmt.Errorf("build the default image: %w", err)
	}
	img := Image{Key: opts.Key, Source: "recipe default-" + opts.Key + " (debootstrap, built in place)",
		Created: time.Now().UTC(), Stats: stats, Mountpoints: recorded(opts.Mountpoints)}
	return s.install(work, img)
}

// settleTree makes a root built on this host hold only what Extract lets
// through from an archive — no device nodes, fifos or sockets, no setuid or
// setgid bits (nor sticky bits on files), no extended attributes (file
// capabilities among them) — within the same limits, and counts it as
// Extract counts an archive. A mount inside the tree is refused: the image
// would not be what is on disk.
func settleTree(ctx context.Context, root string, limits ExtractLimits) (ExtractStats, error) {
	limits = limits.withDefaults()
	var st unix.Stat_t
	if err := unix.Lstat(root, &st); err != nil {
		return ExtractStats{}, &os.PathError{Op: "lstat", Path: root, Err: err}
	}
	dev := st.Dev
	var stats ExtractStats
	seen := map[uint64]bool{} // hard-linked files' inodes, counted once
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == root {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel := path[len(root)+1:]
		if strings.Count(rel, "/")+1 > limits.MaxDepth {
			return fmt.Errorf("%s: deeper than %d components", rel, limits.MaxDepth)
		}
		if d.Type()&(fs.ModeDevice|fs.ModeCharDevice|fs.ModeNamedPipe|fs.ModeSocket) != 0 {
			stats.Skipped++
			return os.Remove(path)
		}
		if err := unix.Lstat(path, &st); err != nil {
			return &os.PathError{Op: "lstat", Path: path, Err: err}
		}
		if st.Dev != dev {
			return fmt.Errorf("%s: a file system is mounted there; unmount it", rel)
		}
		if stats.Entries++; stats.Entries > limits.MaxEntries {
			return fmt.Errorf("more than %d entries", limits.MaxEntries)
		}
		if err := dropXattrs(path); err != nil {
			return err
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		if kept, stripped := keptMode(int64(st.Mode&0o7777), d.IsDir()); stripped {
			stats.Stripped++
			if err := os.Chmod(path, kept); err != nil {
				return err
			}
		}
		if !d.Type().IsRegular() {
			return nil
		}
		if st.Nlink > 1 {
			if seen[st.Ino] {
				return nil
			}
			seen[st.Ino] = true
		}
		if st.Size > limits.MaxFileBytes {
			return fmt.Errorf("%s: %d bytes, over the %d-byte limit of one file", rel, st.Size, limits.MaxFileBytes)
		}
		if stats.Bytes += st.Size; stats.Bytes > limits.MaxBytes {
			return fmt.Errorf("more than %d bytes of files, the limit of an image", limits.MaxBytes)
		}
		return nil
	})
	return stats, err
}

// unmountBelow detaches every mount below dir, the deepest first.
func unmountBelow(dir string) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var below []string
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 5 {
			continue
		}
		// The mount point is field 5, its spaces and such escaped in octal.
		mp := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(fields[4])
		if strings.HasPrefix(mp, dir+"/") {
			below = append(below, mp)
		}
	}
	sort.Slice(below, func(i, j int) bool { return len(below[i]) > len(below[j]) })
	for _, mp := range below {
		_ = unix.Unmount(mp, unix.MNT_DETACH)
	}
}

// dropXattrs removes every extended attribute of path, not following a
// symbolic link.
func dropXattrs(path string) error {
	n, err := unix.Llistxattr(path, nil)
	if errors.Is(err, unix.ENOTSUP) || err == nil && n == 0 {
		return nil
	}
	buf := make([]byte, n)
	if err == nil {
		n, err = unix.Llistxattr(path, buf)
	}
	if err != nil {
		return &os.PathError{Op: "listxattr", Path: path, Err: err}
	}
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		if name == "" {
			continue
		}
		if err := unix.Lremovexattr(path, name); err != nil && !errors.Is(err, unix.ENODATA) {
			return &os.PathError{Op: "removexattr " + name, Path: path, Err: err}
		}
	}
	return nil
}

// runRecipe runs the recipe with args: "--archive FILE" (the recipe writes
// it under another name and renames it when complete, so an interrupted
// build leaves no archive that a later build would take for finished) or
// "--root DIR".
func runRecipe(ctx context.Context, log io.Writer, args ...string) error {
	out := args[len(args)-1]
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return fmt.Errorf("build the default image: %w", err)
	}
	script, err := os.CreateTemp("", "safe-run-recipe-*.sh")
	if err != nil {
		return fmt.Errorf("build the default image: %w", err)
	}
	defer os.Remove(script.Name())
	_, err = script.Write(recipeScript)
	if cerr := script.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("build the default image: %w", err)
	}
	cmd := exec.CommandContext(ctx, "bash", append([]string{script.Name()}, args...)...)
	cmd.Stdout, cmd.Stderr = log, log
	// debootstrap and apt run below the script: stop them all, letting the
	// script's exit trap remove its work directory.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("build the default image: %w", ctx.Err())
		}
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return fmt.Errorf("build the default image: the recipe failed (%v); its messages are above", err)
		}
		return fmt.Errorf("build the default image: %w", err)
	}
	if _, err := os.Stat(out); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("build the default image: the recipe wrote no %s", out)
	}
	return nil
}
