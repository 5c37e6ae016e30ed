package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/safe-run/safe-run/rootfs"
)

// TestSystemCacheForOrdinaryUser is a new user's first run after root
// installed safe-run and built the default image: uid 65534, an empty
// cache of its own, no SAFE_RUN_CACHE. The run uses root's image
// read-only, doctor says it came from the system cache, a warm run's
// checkpoint goes to the user's own cache, and an explicit cache stays the
// only one looked in.
func TestSystemCacheForOrdinaryUser(t *testing.T) {
	u := newOrdinaryUser(t)
	system, err := rootfs.Store{Dir: rootfs.SystemDir}.Lookup(rootfs.DefaultName)
	if err != nil {
		t.Skipf("this test needs root's default image in the system cache %s: %v", rootfs.SystemDir, err)
	}
	noCache := "SAFE_RUN_CACHE=" // overrides the one command sets: unset, as for a new user
	run := func(env string, args ...string) (string, int) {
		t.Helper()
		cmd := u.command(u.become(), args...)
		cmd.Env = append(cmd.Env, env)
		cmd.Dir = u.home
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		_ = cmd.Run()
		return out.String(), cmd.ProcessState.ExitCode()
	}

	if out, code := run(noCache, "run", "--lang", "python", "-c", "print('first run')"); code != 0 || !strings.Contains(out, "first run") {
		t.Errorf("first run as uid 65534 without a cache of its own: exit %d:\n%s", code, out)
	}
	report := u.doctor(t, u.become(), noCache)
	img := report.check("image")
	if !img.OK || !strings.Contains(img.Detail, "from the system cache "+rootfs.SystemDir) || !strings.Contains(img.Detail, system.Root) {
		t.Errorf("image check = %+v, want a pass naming the system cache %s and %s", img, rootfs.SystemDir, system.Root)
	}
	if c := report.check("sandbox"); !c.OK {
		t.Errorf("sandbox check = %+v", c)
	}

	// Checkpoints are written, so they go to the user's own cache.
	if out, code := run(noCache, "run", "--warm", "--lang", "python", "-c", "print('warm run')"); code != 0 || !strings.Contains(out, "warm run") {
		t.Errorf("warm run: exit %d:\n%s", code, out)
	}
	if entries, err := os.ReadDir(filepath.Join(u.home, ".cache", "safe-run", "checkpoints")); err != nil || len(entries) == 0 {
		t.Errorf("no checkpoint in the user's own cache: %v %v", entries, err)
	}

	// A cache the user names is the only one: no image there, no run.
	own := filepath.Join(u.home, "own-cache")
	out, code := run("SAFE_RUN_CACHE="+own, "run", "--lang", "python", "-c", "print(1)")
	if code != exitSandboxError || !strings.Contains(out, "the default image is not in "+own+";") {
		t.Errorf("with SAFE_RUN_CACHE=%s: exit %d, want %d and the image missing from that cache:\n%s", own, code, exitSandboxError, out)
	}
}
