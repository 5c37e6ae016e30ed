package gvisor

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/safe-run/safe-run/sandbox"
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

// TestStateDirParents checks that a state directory is refused below a
// parent that another user could rename it in: one others may write to
// without the sticky bit, one that is another user's, or a link to such
// a one; and accepted below a sticky one, as in /tmp.
func TestStateDirParents(t *testing.T) {
	base := t.TempDir()
	mkdir := func(name string, mode os.FileMode) string {
		dir := filepath.Join(base, name)
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, mode); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	open := mkdir("open", 0o777)
	group := mkdir("group", 0o770)
	sticky := mkdir("sticky", 0o777|os.ModeSticky)
	private := mkdir("private", 0o755)
	link := filepath.Join(base, "link")
	if err := os.Symlink(open, link); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, dir, want string // want: substring of the error; "" means accepted
	}{
		{"below a private directory", filepath.Join(private, "safe-run"), ""},
		{"below a sticky directory open to all", filepath.Join(sticky, "safe-run"), ""},
		{"two levels below a private directory, not there yet", filepath.Join(private, "a", "b"), ""},
		{"below a directory open to all", filepath.Join(open, "safe-run"), "not sticky"},
		{"below a directory its group may write", filepath.Join(group, "safe-run"), "not sticky"},
		{"deeper below one open to all", filepath.Join(open, "x", "safe-run"), "not sticky"},
		{"below a link to one open to all", filepath.Join(link, "safe-run"), "not sticky"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ensurePrivateDir(tc.dir)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("ensurePrivateDir(%s) = %v, want it accepted", tc.dir, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrStateDir) || sandbox.Class(err) != sandbox.ErrUnavailable {
				t.Fatalf("ensurePrivateDir(%s) = %v, want an error about %q of part ErrStateDir, class unavailable", tc.dir, err, tc.want)
			}
			if _, err := os.Lstat(tc.dir); err == nil {
				t.Errorf("%s was created although refused", tc.dir)
			}
		})
	}
	t.Run("below another user's directory", func(t *testing.T) {
		if !HostRoot() {
			t.Skip("only root can make a directory another user's; TestThreatStateDirParent covers an ordinary user")
		}
		theirs := mkdir("theirs", 0o755)
		if err := os.Chown(theirs, 12345, 12345); err != nil {
			t.Fatal(err)
		}
		if err := ensurePrivateDir(filepath.Join(theirs, "safe-run")); err == nil || !strings.Contains(err.Error(), "belongs to uid 12345") {
			t.Fatalf("ensurePrivateDir = %v, want an error naming uid 12345", err)
		}
	})
	t.Run("a problem the process outside the namespace found", func(t *testing.T) {
		t.Setenv("XDG_RUNTIME_DIR", private)
		t.Setenv(stateParentProblemEnv, "state directory is inside a directory of uid 12345")
		if err := ensurePrivateDir(DefaultStateDir()); err == nil || !strings.Contains(err.Error(), "uid 12345") {
			t.Fatalf("ensurePrivateDir(default) = %v, want the problem passed in", err)
		}
		if err := ensurePrivateDir(filepath.Join(private, "elsewhere")); err != nil {
			t.Fatalf("another state directory = %v, want it accepted: the problem is the default's", err)
		}
	})
}
