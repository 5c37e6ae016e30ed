package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
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

// TestImageCacheChoice checks when the system cache is looked in: only for
// a cache directory nobody chose, and after the user's own.
func TestImageCacheChoice(t *testing.T) {
	own, other := t.TempDir(), t.TempDir()
	for _, tc := range []struct {
		name   string
		args   []string
		env    map[string]string
		system bool
	}{
		{name: "default", system: true},
		{name: "--cache-dir", args: []string{"--cache-dir", other}},
		{name: "SAFE_RUN_CACHE", env: map[string]string{"SAFE_RUN_CACHE": other}},
		// safe-run continuing in its user namespace, as enterUserNamespace
		// starts it for a user who chose no cache.
		{name: "user namespace, default", env: map[string]string{"SAFE_RUN_CACHE": own, defaultCacheEnv: "1"}, system: true},
		{name: "user namespace, SAFE_RUN_CACHE", env: map[string]string{"SAFE_RUN_CACHE": other, defaultCacheEnv: ""}},
		{name: "user namespace, --cache-dir", args: []string{"--cache-dir", other}, env: map[string]string{"SAFE_RUN_CACHE": own, defaultCacheEnv: "1"}},
		{name: "the system cache itself", args: []string{"--cache-dir", rootfs.SystemDir}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("SAFE_RUN_CACHE", "")
			t.Setenv(defaultCacheEnv, "")
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			fs := flag.NewFlagSet("run", flag.ContinueOnError)
			var h hostFlags
			env := registerWithEnv(fs, h.register)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			if err := applySettings(fs, env, os.LookupEnv, ""); err != nil {
				t.Fatal(err)
			}
			want := tc.system
			if h.cacheDir == rootfs.SystemDir {
				want = false // root's default: the system cache is the cache
			}
			if got := h.store().system != nil; got != want {
				t.Errorf("cache %s: system cache looked in: %v, want %v", h.cacheDir, got, want)
			}
		})
	}
}

// TestImageCacheFind looks an image up in the user's cache, then the
// system's, and names both when neither has it.
func TestImageCacheFind(t *testing.T) {
	own, system := t.TempDir(), t.TempDir()
	fakeImage(t, own, "mine", "aaaa")
	fakeImage(t, system, "mine", "bbbb")
	fakeImage(t, system, rootfs.DefaultName, "cccc")
	c := imageCache{own: rootfs.Store{Dir: own}, system: &rootfs.Store{Dir: system}}
	for _, tc := range []struct{ name, key, dir string }{
		{"mine", "aaaa", own},
		{rootfs.DefaultName, "cccc", system},
	} {
		img, dir, err := c.find(tc.name)
		if err != nil || img.Key != tc.key || dir != tc.dir {
			t.Errorf("find %s = %s from %s, %v; want %s from %s", tc.name, img.Key, dir, err, tc.key, tc.dir)
		}
	}
	if !strings.Contains(c.describe(system), "system cache") || strings.Contains(c.describe(own), "system") {
		t.Errorf("describe: %q, %q", c.describe(system), c.describe(own))
	}
	_, _, err := c.find("absent")
	var missing *rootfs.NotFoundError
	if !errors.As(err, &missing) || !strings.Contains(err.Error(), own+" or "+system) {
		t.Errorf("find absent: %v, want not found in both", err)
	}
	// Without the system cache, only the user's own.
	if _, _, err := (imageCache{own: rootfs.Store{Dir: own}}).find(rootfs.DefaultName); !errors.As(err, &missing) {
		t.Errorf("find default without the system cache: %v, want not found", err)
	}
}

// fakeImage makes a complete image entry in the store at dir by hand.
func fakeImage(t *testing.T, dir, name, key string) {
	t.Helper()
	for _, d := range []string{filepath.Join(dir, "images", key, "rootfs"), filepath.Join(dir, "names")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	meta, _ := json.Marshal(rootfs.Image{Key: key})
	if err := os.WriteFile(filepath.Join(dir, "images", key, "image.json"), meta, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "names", name), []byte(key), 0o644); err != nil {
		t.Fatal(err)
	}
}
