package runtime

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEnsurePrivateDir checks that a state directory someone else could
// write to, or that points elsewhere, is refused or made private.
func TestEnsurePrivateDir(t *testing.T) {
	base := t.TempDir()
	other := filepath.Join(base, "other")
	if err := os.Mkdir(other, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		setup func(dir string) error
		want  string // substring of the error; "" means accepted
	}{
		{"missing: created", func(string) error { return nil }, ""},
		{"open to others: made private", func(dir string) error {
			if err := os.Mkdir(dir, 0o777); err != nil {
				return err
			}
			return os.Chmod(dir, 0o777)
		}, ""},
		{"symbolic link", func(dir string) error { return os.Symlink(other, dir) }, "symbolic link"},
		{"a file", func(dir string) error { return os.WriteFile(dir, nil, 0o600) }, "not a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(base, strings.ReplaceAll(tc.name, " ", "-"))
			if err := tc.setup(dir); err != nil {
				t.Fatal(err)
			}
			err := ensurePrivateDir(dir)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("ensurePrivateDir = %v, want an error about %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			fi, err := os.Lstat(dir)
			if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
				t.Fatalf("after ensurePrivateDir: %v, %v; want a directory with mode 0700", fi.Mode(), err)
			}
		})
	}
	t.Run("another user's", func(t *testing.T) {
		dir := filepath.Join(base, "theirs")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		// Root hands it to another uid; anyone else finds a directory of
		// root's (which, in a user namespace, belongs to no mapped uid).
		if os.Geteuid() == 0 && !inOwnUserNamespace() {
			if err := os.Chown(dir, 12345, 12345); err != nil {
				t.Fatal(err)
			}
		} else {
			dir = "/"
		}
		if err := ensurePrivateDir(dir); err == nil || !strings.Contains(err.Error(), "not to this user") {
			t.Fatalf("ensurePrivateDir(%s) = %v, want an error naming its owner", dir, err)
		}
	})
}
