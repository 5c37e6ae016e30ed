package gvisor

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// stateParentProblemEnv carries, from a safe-run without root to itself
// inside its user namespace, what was wrong with the default state
// directory or its parents. Only the outer process sees their owners' host uids:
// inside, root's directories and another user's look the same (both are
// the overflow uid), so the inner process cannot tell them apart.
const stateParentProblemEnv = "SAFE_RUN_STATE_PARENT_PROBLEM"

// ensurePrivateDir creates the state directory dir if needed and makes sure
// that it is this user's alone, and stays so. Whoever can write there can
// rewrite a bundle between safe-run writing it and runsc reading it, and so
// choose what the sandbox mounts; and the fallback in /tmp has a name any
// local user can create first, or point elsewhere with a symbolic link.
// Whoever can write to one of its parents can swap it for another later,
// so they are checked too.
func ensurePrivateDir(dir string) error {
	if problem := os.Getenv(stateParentProblemEnv); problem != "" && dir == DefaultStateDir() {
		return partError(ErrStateDir, "%s", problem)
	}
	if err := checkStateParents(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return partError(ErrStateDir, "create state directory %s: %v", dir, err)
	}
	fi, err := checkStateDirOwner(dir)
	if err != nil {
		return err
	}
	if fi.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("make state directory %s private: %w", dir, err)
		}
	}
	return nil
}

// checkStateDirOwner refuses a state directory that is a symbolic link, not
// a directory, or another user's.
func checkStateDirOwner(dir string) (fs.FileInfo, error) {
	fi, err := os.Lstat(dir)
	if err != nil {
		return nil, fmt.Errorf("check state directory: %w", err)
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		return nil, partError(ErrStateDir, "state directory %s is a symbolic link or not a directory", dir)
	case st == nil || int(st.Uid) != os.Geteuid():
		return nil, partError(ErrStateDir, "state directory %s belongs to %s, not to this user (uid %d)", dir, describeOwner(st), HostUID())
	}
	return fi, nil
}

// checkStateParents checks every existing parent of the state directory
// dir: each must belong to root or to this user, and one that others may
// write to must be sticky, as /tmp is — otherwise another user could
// rename the state directory away and put one of theirs in its place.
// Symbolic links among the parents are resolved first and the directories
// they lead to are checked.
func checkStateParents(dir string) error {
	parent, err := existingParent(filepath.Dir(filepath.Clean(dir)))
	if err != nil {
		return fmt.Errorf("check the parents of state directory %s: %w", dir, err)
	}
	for d := parent; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("check the parents of state directory %s: %w", dir, err)
		}
		st, _ := fi.Sys().(*syscall.Stat_t)
		switch {
		case st == nil || !trustedOwner(int(st.Uid)):
			return partError(ErrStateDir, "state directory %s is inside %s, which belongs to %s: that user could replace it", dir, d, describeOwner(st))
		case fi.Mode().Perm()&0o022 != 0 && fi.Mode()&fs.ModeSticky == 0:
			return partError(ErrStateDir, "state directory %s is inside %s, which others may write to (mode %04o, not sticky): they could replace it", dir, d, fi.Mode().Perm())
		}
		if d == "/" {
			return nil
		}
	}
}

// existingParent resolves dir, or its deepest ancestor that exists, to a
// path without symbolic links.
func existingParent(dir string) (string, error) {
	for {
		real, err := filepath.EvalSymlinks(dir)
		if err == nil {
			return filepath.Abs(real)
		}
		if !errors.Is(err, fs.ErrNotExist) || dir == filepath.Dir(dir) {
			return "", err
		}
		dir = filepath.Dir(dir)
	}
}

// trustedOwner reports whether a directory owned by uid (as this process
// sees uids) may hold the state directory: root's and this user's. Inside
// safe-run's own user namespace root's directories show as the overflow
// uid, like any other user's; the outer process, which sees host uids,
// checked the default state directory's parents before entering it (see
// stateParentProblemEnv).
func trustedOwner(uid int) bool {
	return uid == 0 || uid == os.Geteuid() || (inOwnUserNamespace() && uid == overflowUID())
}

// describeOwner names a file's owner for a message: by host uid outside a
// user namespace; inside one, a uid the namespace does not map is only
// "another user (or root)".
func describeOwner(st *syscall.Stat_t) string {
	switch {
	case st == nil:
		return "an unknown user"
	case inOwnUserNamespace() && int(st.Uid) == overflowUID():
		return "a user this namespace does not map (another user, or root)"
	case inOwnUserNamespace() && int(st.Uid) == 0:
		return fmt.Sprintf("uid %d", HostUID())
	}
	return fmt.Sprintf("uid %d", st.Uid)
}

// overflowUID is the uid the kernel shows for files whose owner a user
// namespace does not map.
func overflowUID() int {
	data, err := os.ReadFile("/proc/sys/kernel/overflowuid")
	if err != nil {
		return 65534
	}
	uid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return 65534
	}
	return uid
}

// stateParentCheckEnv is the environment entry that tells the process
// UserNamespaceMain starts what is wrong with the default state directory
// and its parents, checked here with host uids (empty if nothing is).
func stateParentCheckEnv() string {
	dir, problem := DefaultStateDir(), ""
	err := checkStateParents(dir)
	if _, lerr := os.Lstat(dir); err == nil && lerr == nil {
		_, err = checkStateDirOwner(dir)
	}
	if err != nil {
		problem = err.Error()
	}
	return stateParentProblemEnv + "=" + problem
}
