package gvisor

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// lockRunDir creates and locks dir/lock. The lock is held for as long as
// the sandbox lives, by the process that owns it; the kernel drops it when
// that process dies, however it dies, which is how reapStale tells a live
// run from a leftover.
func lockRunDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock run directory: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock run directory %s: %w", dir, err)
	}
	return f, nil
}

// createRunDir creates the run directory dir and locks it. Between the two
// the directory exists unlocked, as a dead process's would, so it holds the
// state directory shared meanwhile: reapStale holds it exclusively, and so
// never takes a run directory being created for a leftover.
func createRunDir(dir string) (*os.File, error) {
	release, err := holdStateDir(filepath.Dir(dir), unix.LOCK_SH)
	if err != nil {
		return nil, err
	}
	defer release()
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create run directory %s: %w", dir, err)
	}
	return lockRunDir(dir)
}

// removeRunDir removes a live run's directory (see cleanRunDir) holding
// the state directory shared, as createRunDir does: a reaper that locked
// the directory's lock file as the removal unlinked it would lock a new,
// unlocked one, take the run for a leftover, and race the removal.
func removeRunDir(g *Backend, dir, id string) error {
	release, err := holdStateDir(filepath.Dir(dir), unix.LOCK_SH)
	if err != nil {
		return err
	}
	defer release()
	return cleanRunDir(g, dir, id)
}

// holdStateDir flocks the state directory itself as how says (LOCK_SH or
// LOCK_EX), waiting for it, and returns the release.
func holdStateDir(dir string, how int) (release func(), err error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("lock state directory: %w", err)
	}
	for {
		err = unix.Flock(int(f.Fd()), how)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock state directory %s: %w", dir, err)
	}
	return func() { f.Close() }, nil
}

// reapStale removes what runs of a safe-run process that died left in the
// state directory: each unlocked run directory has its sandbox killed, its
// runsc state deleted, its null network namespace unmounted, its cgroups
// (where this process would have created them) removed, and is deleted.
// It returns the IDs it reaped.
func (g *Backend) reapStale() ([]string, error) {
	release, err := holdStateDir(g.cfg.StateDir, unix.LOCK_EX)
	if err != nil {
		return nil, fmt.Errorf("reap stale sandboxes: %w", err)
	}
	defer release()
	entries, err := os.ReadDir(g.cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("reap stale sandboxes: %w", err)
	}
	var reaped []string
	var errs []error
	for _, e := range entries {
		id := e.Name()
		if !e.IsDir() || !strings.HasPrefix(id, "safe-run-") {
			continue
		}
		dir := filepath.Join(g.cfg.StateDir, id)
		lock, err := lockRunDir(dir)
		if errors.Is(err, unix.EWOULDBLOCK) {
			continue // a live run of another safe-run process
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		cg := &runCgroup{paths: map[string]string{}}
		for c, parent := range g.cgroups.Parents {
			cg.paths[c] = filepath.Join(parent, id)
		}
		if err := cg.open(g.cgroups); err == nil {
			g.removeCgroup(id, cg)
		}
		if err := cleanRunDir(g, dir, id); err != nil {
			errs = append(errs, fmt.Errorf("reap %s: %w", id, err))
		}
		lock.Close()
		reaped = append(reaped, id)
	}
	// Empty cgroups whose removal a dead process did not finish. One with
	// processes, or made in the last minute, may belong to a live run of
	// another safe-run process (with another state directory): leave it.
	for c, parent := range g.cgroups.Parents {
		dirs, _ := filepath.Glob(filepath.Join(parent, "safe-run-*"))
		for _, d := range dirs {
			fi, err := os.Stat(d)
			if err != nil || time.Since(fi.ModTime()) < time.Minute {
				continue
			}
			cg := &runCgroup{paths: map[string]string{c: d}}
			if cg.open(g.cgroups) != nil {
				continue
			}
			if pids, err := cg.mgr.GetAllPids(); err == nil && len(pids) == 0 {
				_ = cg.mgr.Destroy()
			}
		}
	}
	return reaped, errors.Join(errs...)
}
