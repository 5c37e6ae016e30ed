//go:build linux

package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The agent, root in the sandbox, works in a workspace the program can
// change at any moment: a check that a directory is real, followed by an
// open, is a race the program can win by swapping in a symbolic link
// between the two. So every file operation is made safe two ways at once:
// each path is resolved with openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS)
// from the workspace, one open, which fails rather than follow a link or
// leave the workspace; and it runs on a thread with the program's
// credentials (asUser), so that even a resolution that went astray could do
// only what the program can do itself. Measured inside gVisor, and kept so
// by TestThreatAgentFileRaces in cmd/safe-run: gVisor honours
// RESOLVE_BENEATH, RESOLVE_NO_SYMLINKS and per-thread credentials, while its
// openat follows a link despite O_NOFOLLOW when O_DIRECTORY is also given,
// which is why os.Root cannot be used here.

// asUser runs fn on the agent's user thread for user: an OS thread of its
// own whose effective user and group are user's, with user's supplementary
// groups and no effective capabilities; with user nil it runs fn as it is.
// The real and saved IDs stay root's, so the program cannot signal or
// inspect that thread. fn must not start goroutines (they would run on
// other threads, as root), nor call asUser (it would wait for itself).
//
// The thread is made once per user and kept, never given back to the Go
// scheduler: its goroutine stays locked to it, waiting for the next fn.
// Inside gVisor a thread made and ended per operation cost more than the
// operation (on a warm Bash run, the agent's writing of main.sh: a clone by
// the runtime's template thread, the thread's exit, and the hand-overs of
// the agent's one P between them). The process's first thread cannot be
// it (the runtime would park it forever, with the program's credentials,
// and it is the thread /proc/1 describes), so the agent keeps that one for
// its main goroutine (cmd/safe-run-agent) and asUser refuses to switch on
// it.
func asUser(user *syscall.Credential, fn func() error) error {
	if user == nil {
		return fn()
	}
	t, err := userThreadFor(user)
	if err != nil {
		return err
	}
	errc := make(chan error, 1)
	t.work <- func() { errc <- fn() }
	return <-errc
}

// userThread is a goroutine locked to an OS thread whose effective IDs are
// a user's (see asUser); it runs the functions sent on work, one at a time.
type userThread struct {
	work chan func()
}

// userThreads holds the user threads made so far, by user (in practice one:
// the agent's programs all run as one user).
var userThreads = struct {
	sync.Mutex
	byUser map[string]*userThread
}{byUser: make(map[string]*userThread)}

// userThreadFor returns user's thread, made on first use.
func userThreadFor(user *syscall.Credential) (*userThread, error) {
	key := fmt.Sprint(user.Uid, user.Gid, user.Groups)
	userThreads.Lock()
	defer userThreads.Unlock()
	if t := userThreads.byUser[key]; t != nil {
		return t, nil
	}
	t := &userThread{work: make(chan func())}
	started := make(chan error, 1)
	go t.serve(*user, slices.Clone(user.Groups), started)
	if err := <-started; err != nil {
		return nil, err
	}
	userThreads.byUser[key] = t
	return t, nil
}

// serve becomes user on a thread of its own and runs the work sent to it,
// for the rest of the process. If it cannot, the goroutine returns still
// locked, and its thread ends.
func (t *userThread) serve(user syscall.Credential, groups []uint32, started chan<- error) {
	runtime.LockOSThread() // never unlocked: the thread keeps the user's IDs
	if unix.Gettid() == unix.Getpid() {
		started <- errors.New("file operations cannot switch users on the process's first thread; lock it to the main goroutine (runtime.LockOSThread in init)")
		return
	}
	user.Groups = groups
	if err := becomeOnThisThread(&user); err != nil {
		started <- fmt.Errorf("switch to uid %d for file operations: %w", user.Uid, err)
		return
	}
	started <- nil
	for fn := range t.work {
		fn()
	}
}

// startUserThread makes user's thread now, in the background, so that the
// first file operation of a run does not wait for a thread to be made: the
// warm-up of a Bash run calls it; a cold run leaves it to its first
// operation. A failure is left for that operation to meet and report.
func startUserThread(user *syscall.Credential) {
	if user != nil {
		go func() { _, _ = userThreadFor(user) }()
	}
}

// becomeOnThisThread sets the calling thread's effective IDs and groups to
// user's. Raw system calls: the syscall package's Setresuid and friends
// change every thread of the process, the agent's own included.
func becomeOnThisThread(user *syscall.Credential) error {
	groups := make([]uint32, len(user.Groups))
	copy(groups, user.Groups)
	var list unsafe.Pointer
	if len(groups) > 0 {
		list = unsafe.Pointer(&groups[0])
	}
	keep := ^uintptr(0) // -1: leave unchanged
	calls := []struct {
		name           string
		nr, a1, a2, a3 uintptr
	}{
		// Groups and group first: they need CAP_SETGID, which the change
		// of the effective user clears.
		{"setgroups", unix.SYS_SETGROUPS, uintptr(len(groups)), uintptr(list), 0},
		{"setresgid", unix.SYS_SETRESGID, keep, uintptr(user.Gid), keep},
		{"setresuid", unix.SYS_SETRESUID, keep, uintptr(user.Uid), keep},
	}
	for _, c := range calls {
		if _, _, e := unix.RawSyscall(c.nr, c.a1, c.a2, c.a3); e != 0 {
			return fmt.Errorf("%s: %w", c.name, e)
		}
	}
	runtime.KeepAlive(groups)
	return nil
}

// beneathFlags is how every path below the workspace is resolved.
const beneathFlags = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS

// openWorkspace opens the workspace directory itself.
func openWorkspace(workdir string) (*os.File, error) {
	fd, err := unix.Open(workdir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open workspace: %w", err)
	}
	return os.NewFile(uintptr(fd), workdir), nil
}

// inWorkspace runs fn as user (see asUser) with the workspace open.
func inWorkspace(workdir string, user *syscall.Credential, fn func(ws *os.File) error) error {
	return asUser(user, func() error {
		ws, err := openWorkspace(workdir)
		if err != nil {
			return err
		}
		defer ws.Close()
		return fn(ws)
	})
}

// openBeneath opens name below dir, following no symbolic link on the way
// or at the end (ELOOP), and never leaving dir (EXDEV).
func openBeneath(dir *os.File, name string, flags int, mode uint32) (*os.File, error) {
	fd, err := openFdBeneath(int(dir.Fd()), name, flags, mode)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), name), nil
}

// openFdBeneath is openBeneath on raw descriptors, for the paths where
// wrapping one in an *os.File costs two more system calls (the flags read,
// the poller's registration of a non-blocking descriptor), each 0.05-0.2 ms
// inside a sandbox that waited idle.
func openFdBeneath(dirfd int, name string, flags int, mode uint32) (int, error) {
	if flags&unix.O_DIRECTORY == 0 {
		// Redundant with RESOLVE_NO_SYMLINKS, which covers the last
		// component too; with O_DIRECTORY, Linux would answer ENOTDIR for a
		// link rather than ELOOP.
		flags |= unix.O_NOFOLLOW
	}
	how := &unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Mode: uint64(mode), Resolve: beneathFlags}
	return unix.Openat2(dirfd, name, how)
}

// openDirBeneath opens the directory name below dir (see openBeneath).
func openDirBeneath(dir *os.File, name string) (*os.File, error) {
	return openBeneath(dir, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
}

// explain turns the error of a file operation on name into one line.
func explain(name string, err error) error {
	switch {
	case errors.Is(err, unix.ELOOP):
		return fmt.Errorf("%s: it or a directory on its way is a symbolic link; links are not followed", name)
	case errors.Is(err, unix.EXDEV):
		return fmt.Errorf("%s: path leaves the workspace", name)
	case errors.Is(err, unix.ENOSYS):
		return fmt.Errorf("%s: this kernel has no openat2, which the agent needs to keep file operations in the workspace", name)
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return fmt.Errorf("%s: permission denied (file operations have the program's permissions)", name)
	}
	return fmt.Errorf("%s: %w", name, err)
}

// entry is what walkBeneath found: a name in a directory it holds open.
type entry struct {
	rel    string // the path below the walk's start
	parent *os.File
	name   string
	st     unix.Stat_t // lstat of the entry, taken through parent
}

func (e *entry) isDir() bool     { return e.st.Mode&unix.S_IFMT == unix.S_IFDIR }
func (e *entry) isLink() bool    { return e.st.Mode&unix.S_IFMT == unix.S_IFLNK }
func (e *entry) isRegular() bool { return e.st.Mode&unix.S_IFMT == unix.S_IFREG }

// stampOf tells whether a file changed since it was last seen.
func stampOf(st *unix.Stat_t) fileStamp {
	return fileStamp{size: st.Size, mtime: time.Unix(st.Mtim.Unix())}
}

// walkBeneath calls fn for every entry below dir, in name order, each
// directory before what it holds, as fs.WalkDir does; rel prefixes the
// paths. Nothing is reached by path: each directory is opened from its
// parent with openDirBeneath, so a directory swapped for a link since it was
// listed is not entered. fn returns fs.SkipDir to skip a directory, any
// other error to stop the walk.
func walkBeneath(dir *os.File, rel string, fn func(e *entry) error) error {
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return nil // unreadable: nothing below it to report
	}
	slices.Sort(names)
	for _, name := range names {
		e := &entry{rel: path.Join(rel, name), parent: dir, name: name}
		if unix.Fstatat(int(dir.Fd()), name, &e.st, unix.AT_SYMLINK_NOFOLLOW) != nil {
			continue // gone since it was listed
		}
		if err := fn(e); errors.Is(err, fs.SkipDir) {
			continue
		} else if err != nil {
			return err
		}
		if !e.isDir() {
			continue
		}
		sub, err := openDirBeneath(dir, name)
		if err != nil {
			continue // gone, or a link now: not followed
		}
		err = walkBeneath(sub, e.rel, fn)
		sub.Close()
		if err != nil {
			return err
		}
	}
	return nil
}
