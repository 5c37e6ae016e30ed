//go:build linux

package agent

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func init() {
	// As cmd/safe-run-agent does: asUser never runs on the first thread.
	runtime.LockOSThread()
}

// raceTries is how many times each file operation runs against a program
// swapping a directory for a link: inside gVisor the old checks lost such
// races within 32 (read_file) and 72 (output collection) tries.
const raceTries = 2000

// nobody is the programs' user, as the sandbox's agent is given it.
var nobody = &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}

// swapper keeps replacing the directory ws/name with a symbolic link to
// target and back, as a thread of the program can, until stop is called.
// While it runs, name is by turns a real directory (holding a decoy file
// called secret), missing, and a link.
func swapper(t *testing.T, ws, name, target string) (stop func() int64) {
	t.Helper()
	d := filepath.Join(ws, name)
	if err := os.MkdirAll(d, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "secret"), []byte("decoy"), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, d+".link"); err != nil {
		t.Fatal(err)
	}
	var done atomic.Bool
	var swaps atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !done.Load() {
			os.Rename(d, d+".dir")             // missing
			os.Rename(d+".link", d)            // a link
			os.Rename(d, d+".link")            // missing
			if os.Rename(d+".dir", d) != nil { // a directory
				// The operation made d while it was missing: away with it.
				os.RemoveAll(d)
				os.Rename(d+".dir", d)
			}
			swaps.Add(1)
		}
	}()
	return func() int64 { done.Store(true); wg.Wait(); return swaps.Load() }
}

// outsideDir makes a directory outside the workspace that the programs' user
// could read and write itself: only the resolution stands in the way.
func outsideDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"secret", "outside-only"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("outside secret"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// raceUsers are the credentials the race tests run the operations with:
// the agent's own, and the programs' user where the test may switch to it.
func raceUsers() map[string]*syscall.Credential {
	users := map[string]*syscall.Credential{"own credentials": nil}
	if os.Geteuid() == 0 {
		users["as uid 65534"] = nobody
	}
	return users
}

// workspaceFor makes a workspace the user can work in.
func workspaceFor(t *testing.T, user *syscall.Credential) string {
	t.Helper()
	ws := t.TempDir()
	if user != nil {
		// t.TempDir's directories are root's and 0700: open the way.
		for d := ws; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
			os.Chmod(d, 0o755)
		}
		if err := os.Chown(ws, int(user.Uid), int(user.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	return ws
}

// TestFileOpsRaceLinkSwaps runs each file operation thousands of times
// while a goroutine swaps the directory on its way for a link out of the
// workspace: no operation may ever read, list or write through the link.
// The decoy and link counts show that the race reached both states.
func TestFileOpsRaceLinkSwaps(t *testing.T) {
	for label, user := range raceUsers() {
		t.Run(label, func(t *testing.T) {
			outside := outsideDir(t)
			ws := workspaceFor(t, user)
			stop := swapper(t, ws, "d", outside)
			stopOut := swapper(t, ws, "out/d", outside)
			var decoys, links int
			for i := range raceTries {
				exit := readFile(ws, "d/secret", 1<<20, user)
				if len(exit.Files) == 1 && bytes.Contains(exit.Files[0].Data, []byte("outside secret")) {
					t.Fatalf("try %d: read_file read through the link: %q", i, exit.Files[0].Data)
				}
				if len(exit.Files) == 1 {
					decoys++
				} else if strings.Contains(exit.Error, "symbolic link") {
					links++
				}
				name := "d/written-" + strings.Repeat("x", i%3)
				_ = writeFiles(ws, []File{{Path: name, Data: []byte("w")}}, user)
				for _, f := range listFiles(ws, "d", 100, user).Files {
					if strings.Contains(f.Path, "outside-only") {
						t.Fatalf("try %d: list_files showed %q", i, f.Path)
					}
				}
				for _, f := range collect(ws, &Collect{Dir: "out", MaxFiles: 10, MaxFileBytes: 1 << 20, MaxTotalBytes: 1 << 20}, user) {
					if bytes.Contains(f.Data, []byte("outside secret")) {
						t.Fatalf("try %d: collect read %s through the link", i, f.Path)
					}
				}
			}
			swaps := stop() + stopOut()
			t.Logf("%d tries, %d swaps; read_file saw the decoy %d times and a link %d times", raceTries, swaps, decoys, links)
			entries, _ := os.ReadDir(outside)
			for _, e := range entries {
				if e.Name() != "secret" && e.Name() != "outside-only" {
					t.Errorf("write_file created %s outside the workspace", e.Name())
				}
			}
			if decoys == 0 || links == 0 {
				t.Errorf("the race never reached both states (decoy %d, link %d): the test proves nothing", decoys, links)
			}
		})
	}
}

// TestFileOpsHaveTheProgramsPermissions: with a user set, the agent's file
// operations have exactly that user's permissions, so a resolution a race
// led astray gains nothing the program does not have. Inside the
// workspace a root-owned file the program cannot read is not read for it,
// and files written are the program's. Only root can switch users.
func TestFileOpsHaveTheProgramsPermissions(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("switching to the programs' user needs root")
	}
	ws := workspaceFor(t, nobody)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(ws, "root-only"), []byte("root secret"), 0o600))
	must(os.Mkdir(filepath.Join(ws, "root-dir"), 0o755))
	must(os.MkdirAll(filepath.Join(ws, "out"), 0o777))
	must(os.WriteFile(filepath.Join(ws, "out", "root-only"), []byte("root secret"), 0o600))

	if exit := readFile(ws, "root-only", 1<<20, nobody); exit.Error == "" || !strings.Contains(exit.Error, "permission denied") {
		t.Errorf("read_file of a root-only file: %+v", exit)
	}
	if err := writeFiles(ws, []File{{Path: "root-dir/x", Data: []byte("x")}}, nobody); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("write_file into a root-owned directory: %v", err)
	}
	for _, f := range collect(ws, &Collect{Dir: "out", MaxFiles: 10, MaxFileBytes: 1 << 20, MaxTotalBytes: 1 << 20}, nobody) {
		if f.Data != nil {
			t.Errorf("collect read %s, which only root may read: %q", f.Path, f.Data)
		}
	}
	must(writeFiles(ws, []File{{Path: "new/dir/f", Data: []byte("f"), Mode: 0o600}}, nobody))
	for _, p := range []string{"new", "new/dir", "new/dir/f"} {
		fi, err := os.Lstat(filepath.Join(ws, p))
		must(err)
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != nobody.Uid || st.Gid != nobody.Gid {
			t.Errorf("%s is owned by %d:%d, want the program's %d:%d", p, st.Uid, st.Gid, nobody.Uid, nobody.Gid)
		}
	}
	if exit := readFile(ws, "new/dir/f", 1<<20, nobody); exit.Error != "" || string(exit.Files[0].Data) != "f" {
		t.Errorf("read_file of the program's own file: %+v", exit)
	}
	// The agent itself keeps its credentials: only the user thread
	// switched, and only its effective and file-system IDs.
	if uid, gid := syscall.Geteuid(), syscall.Getegid(); uid != 0 || gid != 0 {
		t.Errorf("the caller's thread now has uid %d gid %d", uid, gid)
	}
	checkOnlyUserThreadSwitched(t)
}

// checkOnlyUserThreadSwitched fails t unless at most one thread of this
// process (the user thread of nobody, see asUser) has IDs other than
// root's, and that one only its effective and file-system user: with real
// and saved IDs root's, the program can neither signal it nor read its
// memory.
func checkOnlyUserThreadSwitched(t *testing.T) {
	t.Helper()
	kept := switchedThreads()
	if len(kept) > 1 {
		t.Errorf("more than the user thread has the program's credentials: %s", kept)
	}
	want := fmt.Sprintf("Uid: 0 %d 0 %d", nobody.Uid, nobody.Uid)
	for _, k := range kept {
		if _, line, _ := strings.Cut(k, " "); strings.Join(strings.Fields(line), " ") != want {
			t.Errorf("the user thread's IDs: %s, want %q", k, want)
		}
	}
}

// TestUserThreadIsKept: every file operation as the programs' user runs on
// one thread, made once and kept, not the first thread and not the
// caller's, whose real and saved IDs stay root's.
func TestUserThreadIsKept(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("switching to the programs' user needs root")
	}
	type seen struct {
		tid, euid, ruid int
	}
	var got []seen
	for range 3 {
		err := asUser(nobody, func() error {
			r, e, _ := unix.Getresuid()
			got = append(got, seen{tid: unix.Gettid(), euid: e, ruid: r})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for i, g := range got {
		switch {
		case g.tid != got[0].tid:
			t.Errorf("call %d ran on thread %d, call 0 on %d: the thread was not kept", i, g.tid, got[0].tid)
		case g.tid == unix.Getpid():
			t.Errorf("call %d ran on the process's first thread", i)
		case g.euid != int(nobody.Uid) || g.ruid != 0:
			t.Errorf("call %d ran with effective uid %d and real uid %d, want %d and 0", i, g.euid, g.ruid, nobody.Uid)
		}
	}
	if tid := unix.Gettid(); tid == got[0].tid {
		t.Errorf("the caller's thread %d is the user thread", tid)
	}
	checkOnlyUserThreadSwitched(t)
}

// switchedThreads lists this process's threads whose user is not root's.
func switchedThreads() []string {
	var kept []string
	tasks, _ := filepath.Glob("/proc/self/task/*/status")
	for _, task := range tasks {
		data, err := os.ReadFile(task)
		if err != nil {
			continue // the thread ended meanwhile
		}
		for _, line := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(line, "Uid:") && strings.Join(strings.Fields(line)[1:], " ") != "0 0 0 0" {
				kept = append(kept, task+" "+line)
			}
		}
	}
	return kept
}

// TestWriteFileRefusesFifo: a FIFO the program left where a file is to be
// written is refused at once; opening it for writing would wait for a
// reader forever.
func TestWriteFileRefusesFifo(t *testing.T) {
	ws := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(ws, "fifo"), 0o666); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- writeFiles(ws, []File{{Path: "fifo", Data: []byte("x")}}, nil) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("write over a FIFO: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("write over a FIFO still waits after 10 s")
	}
}
