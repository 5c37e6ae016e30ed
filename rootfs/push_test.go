package rootfs

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// pushAgent is where the push tests add their file, as the CLI adds the agent.
const pushAgent = "/.safe-run/agent"

// smallImage imports a small image with every kind of entry the store
// keeps into a new store under name, with key (so that two imports of one
// archive are two extractions).
func smallImage(t *testing.T, s Store, name, key string) Image {
	t.Helper()
	owned := func(e tarEntry, uid int) tarEntry { e.hdr.Uid, e.hdr.Gid = uid, uid; return e }
	archive := filepath.Join(t.TempDir(), "small.tar")
	data := makeTar(t,
		dirEntry("bin/", 0o755),
		regEntry("bin/tool", 0o755, "#!/bin/sh\necho tool\n"),
		hardlinkEntry("bin/tool2", "bin/tool"),
		symlinkEntry("bin/sh", "tool"),
		dirEntry("etc/", 0o755),
		regEntry("etc/os-release", 0o644, "ID=small\n"),
		dirEntry("tmp/", 0o1777),
		owned(dirEntry("home/user/", 0o700), 1000),
		owned(regEntry("home/user/notes", 0o600, "mine\n"), 1000),
		dirEntry("usr/lib/python3/", 0o755),
		regEntry("usr/lib/python3/mod.py", 0o644, "x = 1\n"),
	)
	if err := os.WriteFile(archive, data, 0o600); err != nil {
		t.Fatal(err)
	}
	img, err := s.Import(name, archive, ImportOptions{Key: key, Mountpoints: Mountpoints{Dirs: []string{"/workspace"}, Files: []string{pushAgent, "/etc/resolv.conf"}}})
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// fakeAgent writes a file to add as the agent.
func fakeAgent(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "agent")
	if err := os.WriteFile(p, []byte(body), 0o700); err != nil {
		t.Fatal(err)
	}
	return p
}

// pushOnce builds the OCI image of name with agent and pushes it to ref,
// returning its digest and the bytes progress last reported.
func pushOnce(t *testing.T, s Store, name, agent, ref string) (v1.Hash, int64) {
	t.Helper()
	ctx := context.Background()
	img, done, err := s.OCIImage(ctx, name, OCIOptions{Files: []AddedFile{{Path: pushAgent, Source: agent, Mode: 0o555}},
		Entrypoint: []string{pushAgent, "--wait"}, User: "65534:65534", TempDir: t.TempDir()})
	if err != nil {
		t.Fatalf("OCIImage(%s): %v", name, err)
	}
	defer done()
	var last int64
	d, err := Push(ctx, img, ref, func(done, total int64) { last = done })
	if err != nil {
		t.Fatalf("Push(%s): %v", ref, err)
	}
	return d, last
}

// node is what a tree comparison sees of one path.
type node struct {
	kind, perm, content, target, mtime, owner string
}

// tree describes every path below root: kind, mode, content's hash, link
// target, a regular file's modification time, owner; and which regular
// files are one inode, by the first path of each.
func tree(t *testing.T, root string) map[string]node {
	t.Helper()
	out := make(map[string]node)
	inodes := make(map[uint64]string)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		n := node{perm: fi.Mode().Perm().String() + fmt.Sprint(fi.Mode()&fs.ModeSticky != 0), owner: fmt.Sprintf("%d:%d", st.Uid, st.Gid)}
		switch {
		case fi.IsDir():
			n.kind = "dir"
		case fi.Mode()&fs.ModeSymlink != 0:
			n.kind = "symlink"
			n.target, _ = os.Readlink(p)
		default:
			n.kind = "file"
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(b)
			n.content = hex.EncodeToString(sum[:8])
			n.mtime = fi.ModTime().UTC().Format(time.RFC3339)
			if first, ok := inodes[st.Ino]; ok {
				n.target = "inode of " + first
			} else {
				inodes[st.Ino] = rel
			}
		}
		out[rel] = n
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestPushPullBack pushes a small image plus an agent to a registry on
// loopback twice, and from two extractions of one archive, and pulls it
// back: one digest for one content, and the same tree as the cached image
// with the agent in it.
func TestPushPullBack(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	s := Store{Dir: t.TempDir()}
	orig := smallImage(t, s, "small", "small-a")
	smallImage(t, s, "again", "small-b") // another extraction, later: other times on disk
	agent := fakeAgent(t, "the agent\n")

	ref := host + "/safe-run/small:1"
	first, sent := pushOnce(t, s, "small", agent, ref)
	if sent == 0 {
		t.Errorf("first push reported no bytes uploaded")
	}
	// The registry has every blob: nothing is uploaded again.
	if again, sent := pushOnce(t, s, "small", agent, ref); again != first || sent != 0 {
		t.Errorf("second push of one image: digest %s (first %s), %d bytes uploaded again", again, first, sent)
	}
	if other, _ := pushOnce(t, s, "again", agent, host+"/safe-run/small:2"); other != first {
		t.Errorf("push of another extraction of the same archive: digest %s, first %s", other, first)
	}
	if changed, _ := pushOnce(t, s, "small", fakeAgent(t, "a new agent\n"), host+"/safe-run/small:3"); changed == first {
		t.Errorf("push with another agent gave the same digest %s", first)
	}

	back := Store{Dir: t.TempDir()}
	pulled, err := back.Pull(context.Background(), ref, ref, ImportOptions{})
	if err != nil {
		t.Fatalf("pull back %s: %v", ref, err)
	}
	if pulled.Digest != first.String() {
		t.Errorf("pulled back digest %s, pushed %s", pulled.Digest, first)
	}
	want := tree(t, orig.Root)
	got := tree(t, pulled.Root)
	// What the push changes: the agent replaces its empty mountpoint,
	// owned by root, read-only; and the mountpoint files made at import
	// have no time of their own any more.
	wantAgent := want[strings.TrimPrefix(pushAgent, "/")]
	wantAgent.perm, wantAgent.content, wantAgent.owner = "-r-xr-xr-xfalse", got[".safe-run/agent"].content, "0:0"
	if os.Geteuid() != 0 {
		wantAgent.owner = got[".safe-run/agent"].owner // only root extracts owners
	}
	wantAgent.mtime = Epoch.Format(time.RFC3339)
	want[".safe-run/agent"] = wantAgent
	conf := want["etc/resolv.conf"]
	conf.mtime = Epoch.Format(time.RFC3339)
	want["etc/resolv.conf"] = conf
	for p, w := range want {
		if g, ok := got[p]; !ok {
			t.Errorf("%s: missing from the pulled image", p)
		} else if g != w {
			t.Errorf("%s: pulled %+v, cached %+v", p, g, w)
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("%s: in the pulled image only", p)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(pulled.Root, pushAgent)); string(b) != "the agent\n" {
		t.Errorf("pulled agent holds %q", b)
	}
	if pulled.Config == nil || len(pulled.Config.Env) == 0 || pulled.Config.User != "65534:65534" {
		t.Errorf("pulled configuration %+v: want the default PATH and user 65534:65534", pulled.Config)
	}
}

// TestPushBadInputs: every refusal names the problem and the fix.
func TestPushBadInputs(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	smallImage(t, s, "small", "small-a")
	agent := fakeAgent(t, "agent\n")
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprint(w, `{"errors":[{"code":"DENIED","message":"requested access to the resource is denied"}]}`)
	}))
	t.Cleanup(refusing.Close)
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	tests := []struct {
		name, image, ref string
		want             []string
	}{
		{"unknown image", "nosuch", "127.0.0.1:1/x:1", []string{`no image named "nosuch"`, "safe-run image import"}},
		{"bad reference", "small", "Not A/Ref::", []string{"invalid image reference", "use a tag such as"}},
		{"digest reference", "small", "127.0.0.1:1/x@sha256:" + strings.Repeat("a", 64), []string{"push to a tag"}},
		{"registry refuses", "small", strings.TrimPrefix(refusing.URL, "http://") + "/x:1", []string{"refused", "403", "docker login"}},
		{"registry unreachable", "small", strings.TrimPrefix(gone.URL, "http://") + "/x:1", []string{"cannot reach the registry", "host and port"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			err := func() error {
				if _, err := PushReference(tc.ref); err != nil {
					return err
				}
				img, done, err := s.OCIImage(ctx, tc.image, OCIOptions{Files: []AddedFile{{Path: pushAgent, Source: agent, Mode: 0o555}}, TempDir: t.TempDir()})
				if err != nil {
					return err
				}
				defer done()
				_, err = Push(ctx, img, tc.ref, nil)
				return err
			}()
			if err == nil {
				t.Fatalf("push %s to %s: no error", tc.image, tc.ref)
			}
			msg := err.Error()
			if strings.Contains(msg, "\n") {
				t.Errorf("error is not one line: %q", msg)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not say %q", msg, w)
				}
			}
		})
	}
}

// TestOCIImageLayerEntries: the root's layer lists every path once, in
// lexical order, with hard links as links, at Epoch where the store keeps
// no time.
func TestOCIImageLayerEntries(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	smallImage(t, s, "small", "small-a")
	img, done, err := s.OCIImage(context.Background(), "small", OCIOptions{TempDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers %d, %v; want 1", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	var names []string
	for {
		hdr, err := tr.Next()
		if err != nil {
			break
		}
		names = append(names, hdr.Name)
		if hdr.Typeflag != tar.TypeReg && !hdr.ModTime.Equal(Epoch) {
			t.Errorf("%s: time %s, want %s", hdr.Name, hdr.ModTime, Epoch)
		}
		if hdr.Name == "bin/tool2" && (hdr.Typeflag != tar.TypeLink || hdr.Linkname != "bin/tool") {
			t.Errorf("bin/tool2: type %c link %q, want a hard link to bin/tool", hdr.Typeflag, hdr.Linkname)
		}
	}
	for i := 1; i < len(names); i++ {
		if strings.TrimSuffix(names[i-1], "/") >= strings.TrimSuffix(names[i], "/") {
			t.Errorf("entries out of order: %q before %q", names[i-1], names[i])
		}
	}
	if len(names) < 12 {
		t.Errorf("only %d entries: %q", len(names), names)
	}
}
