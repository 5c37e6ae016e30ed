package main

import (
	"archive/tar"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// TestImagePush pulls an image into a cache, pushes it back with an agent
// through the CLI, and reads what the registry got; then the refusals,
// each one line with its fix.
func TestImagePush(t *testing.T) {
	binary(t)
	host := serveRegistry(t)
	src := host + "/team/bash:1"
	r, _ := name.ParseReference(src)
	if err := remote.Write(r, bashImage(t)); err != nil {
		t.Fatalf("push the source image: %v", err)
	}
	cache := filepath.Join(t.TempDir(), "cache")
	if res := safeRun(t, "", imageArgs(cache, "pull", src)...); res.code != 0 {
		t.Fatalf("image pull: exit %d: %s", res.code, res.stderr)
	}
	agent := filepath.Join(t.TempDir(), "safe-run-agent")
	if err := os.WriteFile(agent, []byte("agent bytes"), 0o700); err != nil {
		t.Fatal(err)
	}
	dst := host + "/team/sandbox:1"
	res := safeRun(t, "", imageArgs(cache, "push", "--json", "--agent", agent, src, dst)...)
	if res.code != 0 {
		t.Fatalf("image push: exit %d: %s", res.code, res.stderr)
	}
	var out struct{ Digest, Pinned string }
	if err := json.Unmarshal([]byte(res.stdout), &out); err != nil || !strings.HasPrefix(out.Digest, "sha256:") {
		t.Fatalf("image push --json = %s (%v)", res.stdout, err)
	}
	if !strings.Contains(res.stderr, "pushing "+dst) {
		t.Errorf("no progress on stderr: %q", res.stderr)
	}
	pinned, err := name.ParseReference(out.Pinned)
	if err != nil {
		t.Fatalf("pinned %q: %v", out.Pinned, err)
	}
	img, err := remote.Image(pinned)
	if err != nil {
		t.Fatalf("read back %s: %v", out.Pinned, err)
	}
	layers, _ := img.Layers()
	if len(layers) != 2 {
		t.Fatalf("%d layers, want the root's and the agent's", len(layers))
	}
	rc, err := layers[1].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	found := false
	for hdr, err := tr.Next(); err == nil; hdr, err = tr.Next() {
		if hdr.Name == ".safe-run/agent" {
			found = true
			if hdr.Mode != 0o555 || hdr.Uid != 0 || hdr.Gid != 0 || hdr.Size != int64(len("agent bytes")) {
				t.Errorf("agent entry mode %o owner %d:%d size %d; want 0555, root's, the agent", hdr.Mode, hdr.Uid, hdr.Gid, hdr.Size)
			}
		}
	}
	if !found {
		t.Error("no .safe-run/agent in the agent layer")
	}
	cf, _ := img.ConfigFile()
	if got := strings.Join(cf.Config.Entrypoint, " "); got != "/.safe-run/agent --wait" {
		t.Errorf("entrypoint %q", got)
	}

	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown image", []string{"--agent", agent, "nosuch", dst}, `no image named "nosuch"`},
		{"bad reference", []string{"--agent", agent, src, "Bad Ref"}, "invalid image reference"},
		{"no agent", []string{"--agent", filepath.Join(t.TempDir(), "none"), src, dst}, "--agent PATH"},
		{"one operand", []string{src}, "takes the cached image's NAME and the REF"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := safeRun(t, "", imageArgs(cache, "push", tc.args...)...)
			msg := strings.TrimSpace(res.stderr)
			if res.code == 0 || strings.Contains(msg, "\n") || !strings.Contains(msg, tc.want) {
				t.Errorf("exit %d, stderr %q; want a failure of one line saying %q", res.code, msg, tc.want)
			}
		})
	}
}
