package main

// Threat cases of the server's configuration (issue 14, item 11): settings
// that a mistake or a hostile config file could make into something else
// than what they say are refused at start, with one line naming the
// setting, before anything listens or runs.

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/safe-run/safe-run/rootfs"
)

func TestThreatConfigRefusedAtStart(t *testing.T) {
	dir := t.TempDir()
	config := func(body string) string {
		p := filepath.Join(dir, strings.NewReplacer("{", "", "}", "", `"`, "", ":", "", " ", "").Replace(body)[:8]+".json")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"a token that is not a string", []string{"--config", config(`{"token": true}`)}, `"token" must be a string, not true`},
		{"a switch that is not true or false", []string{"--config", config(`{"audit-code": "no"}`)}, `"audit-code" must be true or false`},
		{"a maximum timeout of 1000 hours", []string{"--max-timeout", "1000h"}, "above the longest safe-run allows, 24h0m0s"},
		{"a language name with a newline", []string{"--languages", `[{"name": "ruby\nlevel=ERROR", "filename": "main.rb", "command": ["ruby", "main.rb"]}]`}, "not a short name"},
		{"a language name with a NUL", []string{"--languages", `[{"name": "ruby\u0000", "filename": "main.rb", "command": ["ruby", "main.rb"]}]`}, "not a short name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := safeRun(t, "", append([]string{"serve"}, tc.args...)...)
			if r.code != exitUsage || !strings.Contains(r.stderr, tc.want) || strings.Count(strings.TrimSpace(r.stderr), "\n") > 0 {
				t.Errorf("exit %d, stderr %q; want exit %d and one line with %q", r.code, r.stderr, exitUsage, tc.want)
			}
		})
	}
}

// TestThreatRelativeCacheDir runs code with a relative --cache-dir: it
// names the directory from where safe-run started, as any path argument
// would, instead of failing every run with "must be absolute paths".
func TestThreatRelativeCacheDir(t *testing.T) {
	cache := os.Getenv("SAFE_RUN_CACHE")
	if cache == "" {
		cache = rootfs.DefaultDir()
	}
	cmd := exec.Command(binary(t), "run", "--cache-dir", filepath.Base(cache), "--lang", "bash", "-c", "echo ran")
	cmd.Dir = filepath.Dir(cache)
	out, err := cmd.CombinedOutput()
	if err != nil || string(out) != "ran\n" {
		t.Fatalf("run with --cache-dir %s from %s: %v: %s", filepath.Base(cache), cmd.Dir, err, out)
	}
}
