package main

// Threat cases of the state directory's parents (issue 14, item 10): a
// user whose XDG_RUNTIME_DIR another local user can write to, or owns,
// would have that user able to swap the state directory — and so the
// bundles runsc reads — after safe-run checked it.

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestThreatStateDirParent(t *testing.T) {
	u := newOrdinaryUser(t)
	// dir makes a runtime directory owned by uid (-1: the user's own) with
	// mode, and optionally a safe-run directory in it owned by inner.
	dir := func(t *testing.T, owner int, mode os.FileMode, inner int) string {
		d, err := os.MkdirTemp("", "safe-run-xdg-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(d) })
		if inner != 0 {
			state := filepath.Join(d, "safe-run")
			if err := os.Mkdir(state, 0o700); err != nil {
				t.Fatal(err)
			}
			if inner > 0 {
				if err := os.Chown(state, inner, inner); err != nil {
					t.Fatal(err)
				}
			}
		}
		if owner >= 0 {
			if err := os.Chown(d, owner, owner); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chmod(d, mode); err != nil {
			t.Fatal(err)
		}
		return d
	}
	run := func(t *testing.T, xdg string) cliResult {
		cmd := u.command(u.become(), "run", "--lang", "bash", "-c", "echo ran")
		cmd.Env = slices.DeleteFunc(cmd.Env, func(e string) bool { return strings.HasPrefix(e, "SAFE_RUN_STATE_DIR=") })
		cmd.Env = append(cmd.Env, "XDG_RUNTIME_DIR="+xdg)
		var out, errOut strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errOut
		_ = cmd.Run()
		return cliResult{code: cmd.ProcessState.ExitCode(), stdout: out.String(), stderr: errOut.String()}
	}
	user := -1 // the user's own uid: as root, 65534; as the user, itself
	if os.Geteuid() == 0 {
		user = 65534
	}
	const other = 12345 // another local user
	cases := []struct {
		name        string
		rootOnly    bool // needs root to make a directory another user's
		owner       int
		mode        os.FileMode
		inner       int // owner of a safe-run directory already there: 0 none, -1 the user's
		wantRefused string
	}{
		{"the user's own, private (control)", false, user, 0o700, 0, ""},
		{"the user's own, open to all, not sticky", false, user, 0o777, 0, "not sticky"},
		{"another user's, open to all, not sticky", true, other, 0o777, 0, "belongs to uid 12345"},
		{"another user's, holding the user's state directory", true, other, 0o755, 65534, "belongs to uid 12345"},
		{"the user's, holding another user's state directory", true, user, 0o700, other, "belongs to uid 12345"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.rootOnly && os.Geteuid() != 0 {
				t.Skip("making a directory another user's needs root; the suite's root run covers it")
			}
			r := run(t, dir(t, tc.owner, tc.mode, tc.inner))
			if tc.wantRefused == "" {
				if r.code != 0 || r.stdout != "ran\n" {
					t.Fatalf("exit %d, stdout %q, stderr %s; want the run to work", r.code, r.stdout, r.stderr)
				}
				return
			}
			if r.code == 0 || strings.Contains(r.stdout, "ran") {
				t.Fatalf("exit %d, stdout %q; want the run refused", r.code, r.stdout)
			}
			if !strings.Contains(r.stderr, tc.wantRefused) || !strings.Contains(r.stderr, "--state-dir") || strings.Count(strings.TrimSpace(r.stderr), "\n") > 0 {
				t.Errorf("stderr %q: want one line naming %q and --state-dir", r.stderr, tc.wantRefused)
			}
		})
	}
}
