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
	"syscall"
	"time"
)

// defaultRecipe builds the default image: a shell script (debootstrap plus
// packages), embedded so that the binary can build the image by itself.
//
//go:embed build-rootfs.sh
var defaultRecipe []byte

// DefaultKey is the default image's key: the first 16 hex digits of its
// recipe's SHA-256, as the script computes it of itself. Any change to the
// recipe makes a new image and leaves the old one alone.
func DefaultKey() string {
	sum := sha256.Sum256(defaultRecipe)
	return hex.EncodeToString(sum[:])[:16]
}

// BuildDefault makes the store's default image current: unless the name
// "default" already points to a complete image of DefaultKey, it runs the
// recipe to build the archive archives/default-KEY.tar.gz (kept, and reused
// if there) and imports it. The recipe uses debootstrap as root and
// mmdebstrap otherwise; its progress lines go to log. built says whether
// anything was done.
func (s Store) BuildDefault(ctx context.Context, opts ImportOptions, log io.Writer) (img Image, built bool, err error) {
	key := DefaultKey()
	if img, err := s.Lookup(DefaultName); err == nil && img.Key == key {
		return img, false, nil
	}
	archive := filepath.Join(s.dir(), "archives", "default-"+key+".tar.gz")
	if fi, err := os.Stat(archive); err != nil || fi.Size() == 0 {
		if err := runRecipe(ctx, archive, log); err != nil {
			return Image{}, false, err
		}
	} else {
		fmt.Fprintf(log, "reusing archive %s\n", archive)
	}
	opts.Key, opts.Context = key, ctx
	opts.Replace = true // building the default image is asking to replace it
	img, err = s.Import(DefaultName, archive, opts)
	return img, true, err
}

// runRecipe runs the recipe to write the archive. The recipe writes it
// under another name and renames it when complete, so an interrupted build
// leaves no archive that a later build would take for finished.
func runRecipe(ctx context.Context, archive string, log io.Writer) error {
	if err := os.MkdirAll(filepath.Dir(archive), 0o755); err != nil {
		return fmt.Errorf("build the default image: %w", err)
	}
	script, err := os.CreateTemp("", "safe-run-recipe-*.sh")
	if err != nil {
		return fmt.Errorf("build the default image: %w", err)
	}
	defer os.Remove(script.Name())
	_, err = script.Write(defaultRecipe)
	if cerr := script.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("build the default image: %w", err)
	}
	cmd := exec.CommandContext(ctx, "bash", script.Name(), "--archive", archive)
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
	if _, err := os.Stat(archive); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("build the default image: the recipe wrote no archive %s", archive)
	}
	return nil
}
