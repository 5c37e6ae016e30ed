package gvisor

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// A restore hands a whole checkpoint image to gVisor's sentry, which runs
// on the host (as root, for root) and rebuilds the sandbox's kernel from
// it: an edited pages.img changed what restored sandboxes ran. So every
// image is sealed when it is built with an HMAC-SHA256 of its files, under
// a key that lives outside the cache (checkpointKeyPath), and a restore
// goes ahead only if the seal matches. An image changed at rest, or copied
// in from another machine or cache (a CI cache restored from elsewhere),
// is refused; the pool then removes it and builds its own.
//
// Hashing a 60 MiB image costs tens of milliseconds, so a full check also
// writes a second MAC, over the stat identity of each file (inode, size,
// modification and change times): while that still matches, the files are
// the ones checked. Changing a file's content changes its change time,
// which only root can set back, and without the key nobody can write a
// MAC for the new identity.
const (
	checkpointSeal     = "safe-run-checkpoint.seal"
	checkpointVerified = "safe-run-checkpoint.verified"
)

// checkpointKeyPath is where the key of the checkpoint seals lives: with
// the user's persistent state, not in the cache beside the images it
// guards — /var/lib/safe-run for root, $XDG_STATE_HOME/safe-run
// (~/.local/state/safe-run) for others, the state directory for a user
// without a home.
func checkpointKeyPath(stateDir string) string {
	if HostRoot() {
		return "/var/lib/safe-run/checkpoint.key"
	}
	if d := os.Getenv("XDG_STATE_HOME"); filepath.IsAbs(d) {
		return filepath.Join(d, "safe-run", "checkpoint.key")
	}
	if home := os.Getenv("HOME"); filepath.IsAbs(home) && home != "/" {
		return filepath.Join(home, ".local", "state", "safe-run", "checkpoint.key")
	}
	return filepath.Join(stateDir, "checkpoint.key")
}

// sealKeys holds the keys read, by path: each is read or made once.
var sealKeys sync.Map

// sealKey returns the key at path, making a random one if there is none.
// A key that is not a private regular file of this user's is refused.
func sealKey(path string) ([]byte, error) {
	if k, ok := sealKeys.Load(path); ok {
		return k.([]byte), nil
	}
	key, err := readSealKey(path)
	if errors.Is(err, fs.ErrNotExist) {
		key, err = makeSealKey(path)
	}
	if err != nil {
		return nil, fmt.Errorf("checkpoint seal key %s: %w", path, err)
	}
	k, _ := sealKeys.LoadOrStore(path, key)
	return k.([]byte), nil
}

const sealKeySize = 32

func readSealKey(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.Mode().IsRegular():
		return nil, errors.New("not a regular file")
	case st == nil || int(st.Uid) != os.Geteuid() || fi.Mode().Perm()&0o077 != 0:
		return nil, errors.New("not a private file of this user's; remove it and a new key is made")
	}
	key := make([]byte, sealKeySize+1)
	n, err := io.ReadFull(f, key)
	if n != sealKeySize || err != io.ErrUnexpectedEOF {
		return nil, fmt.Errorf("not a key of %d bytes; remove it and a new key is made", sealKeySize)
	}
	return key[:n], nil
}

// makeSealKey writes a new random key at path, unless another safe-run
// wrote one first: then that one is the key.
func makeSealKey(path string) ([]byte, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	key := make([]byte, sealKeySize)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".checkpoint.key-")
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(key); err != nil {
		tmp.Close()
		return nil, err
	}
	if err := tmp.Close(); err != nil {
		return nil, err
	}
	if err := os.Link(tmp.Name(), path); errors.Is(err, fs.ErrExist) {
		return readSealKey(path)
	} else if err != nil {
		return nil, err
	}
	return key, nil
}

// sealCheckpoint writes the seal of the image in dir.
func sealCheckpoint(dir string, key []byte) error {
	mac, err := contentMAC(dir, key)
	if err != nil {
		return fmt.Errorf("seal checkpoint image: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, checkpointSeal), mac, 0o600); err != nil {
		return fmt.Errorf("seal checkpoint image: %w", err)
	}
	return nil
}

// verifyCheckpoint checks the image in dir against its seal.
func verifyCheckpoint(dir string, key []byte) error {
	before, err := identityMAC(dir, key)
	if err != nil {
		return fmt.Errorf("check checkpoint image %s: %w", dir, err)
	}
	if rec, err := os.ReadFile(filepath.Join(dir, checkpointVerified)); err == nil && hmac.Equal(rec, before) {
		return nil
	}
	want, err := os.ReadFile(filepath.Join(dir, checkpointSeal))
	if err != nil {
		return fmt.Errorf("checkpoint image %s has no seal: it was made by an older safe-run or elsewhere", dir)
	}
	got, err := contentMAC(dir, key)
	if err != nil {
		return fmt.Errorf("check checkpoint image %s: %w", dir, err)
	}
	if !hmac.Equal(got, want) {
		return fmt.Errorf("checkpoint image %s does not match its seal: it was changed, or made with another key", dir)
	}
	after, err := identityMAC(dir, key)
	if err != nil || !hmac.Equal(before, after) {
		return fmt.Errorf("checkpoint image %s changed while it was checked", dir)
	}
	_ = os.WriteFile(filepath.Join(dir, checkpointVerified), after, 0o600) // only a shortcut
	return nil
}

// contentMAC is the MAC of the names and contents of the image's files.
func contentMAC(dir string, key []byte) ([]byte, error) {
	m := hmac.New(sha256.New, key)
	err := eachImageFile(dir, false, func(name string, f *os.File, st *unix.Stat_t) error {
		fmt.Fprintf(m, "%q %d\n", name, st.Size)
		n, err := io.Copy(m, f)
		if err == nil && n != st.Size {
			err = fmt.Errorf("%s changed while it was read", name)
		}
		return err
	})
	return sumOrNil(m, err)
}

// identityMAC is the MAC of the names and stat identities of the image's
// files, its seal included.
func identityMAC(dir string, key []byte) ([]byte, error) {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("identity\n"))
	err := eachImageFile(dir, true, func(name string, _ *os.File, st *unix.Stat_t) error {
		fmt.Fprintf(m, "%q dev=%d ino=%d size=%d mtime=%d.%09d ctime=%d.%09d\n", name, st.Dev, st.Ino, st.Size,
			st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec)
		return nil
	})
	return sumOrNil(m, err)
}

func sumOrNil(h hash.Hash, err error) ([]byte, error) {
	if err != nil {
		return nil, err
	}
	return h.Sum(nil), nil
}

// eachImageFile opens each file of the image in dir, in name order, without
// following links, and calls f with it. The shortcut is left out, and so is
// the seal unless withSeal; anything but a regular file is an error.
func eachImageFile(dir string, withSeal bool, f func(name string, file *os.File, st *unix.Stat_t) error) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		if n := e.Name(); n != checkpointVerified && (withSeal || n != checkpointSeal) {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		file, err := os.OpenFile(filepath.Join(dir, name), os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		var st unix.Stat_t
		err = unix.Fstat(int(file.Fd()), &st)
		if err == nil && st.Mode&unix.S_IFMT != unix.S_IFREG {
			err = errors.New("not a regular file")
		}
		if err == nil {
			err = f(name, file, &st)
		}
		file.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return nil
}
