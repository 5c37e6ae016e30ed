package rootfs

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// testLayer is a layer holding entries.
func testLayer(t *testing.T, entries ...tarEntry) v1.Layer {
	t.Helper()
	return rawLayer(t, makeTar(t, entries...))
}

// rawLayer is a layer whose uncompressed content is data.
func rawLayer(t *testing.T, data []byte) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// testImage is an image of layers with cfg, for linux.
func testImage(t *testing.T, cfg v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Config = "linux", Platform.Architecture, cfg
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

// layeredImage has a lower layer, and an upper one that removes, hides
// and adds files and links to a file below.
func layeredImage(t *testing.T) v1.Image {
	lower := testLayer(t,
		dirEntry("etc", 0o755),
		regEntry("etc/os-release", 0o644, "ID=lower\n"),
		regEntry("opt/gone", 0o644, "gone"),
		regEntry("opt/kept", 0o644, "kept"),
		regEntry("data/old/a", 0o644, "a"),
		regEntry("data/old/sub/b", 0o644, "b"),
		regEntry("usr/bin/tool", 0o4755, "#!tool"),
	)
	upper := testLayer(t,
		regEntry("opt/.wh.gone", 0o644, ""),
		regEntry("data/old/new", 0o644, "new"),
		regEntry("data/old/.wh..wh..opq", 0o644, ""),
		hardlinkEntry("etc/release-link", "etc/os-release"),
		regEntry("srv/app/README", 0o644, "app"),
	)
	return testImage(t, v1.Config{
		Env:        []string{"PATH=/opt/bin:/usr/bin:/bin", "GREETING=hello"},
		WorkingDir: "srv/app/../work",
		User:       "1000:1000",
	}, lower, upper)
}

func checkLayeredImage(t *testing.T, img Image) {
	t.Helper()
	r := img.Root
	if got := readFile(t, filepath.Join(r, "etc/os-release")); got != "ID=lower\n" {
		t.Errorf("etc/os-release = %q", got)
	}
	for _, gone := range []string{"opt/gone", "data/old/a", "data/old/sub", "opt/.wh.gone", "data/old/.wh..wh..opq"} {
		if _, err := os.Lstat(filepath.Join(r, gone)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: %v, want it removed by a whiteout", gone, err)
		}
	}
	for p, want := range map[string]string{"opt/kept": "kept", "data/old/new": "new", "etc/release-link": "ID=lower\n"} {
		if got := readFile(t, filepath.Join(r, p)); got != want {
			t.Errorf("%s = %q, want %q", p, got, want)
		}
	}
	if m := lmode(t, filepath.Join(r, "usr/bin/tool")); m != 0o755 {
		t.Errorf("usr/bin/tool: mode %v, want setuid stripped", m)
	}
	if img.Stats.Whiteouts != 3 || img.Stats.Stripped != 1 {
		t.Errorf("stats %+v, want 3 whiteouts and 1 stripped", img.Stats)
	}
	want := ImageConfig{Env: []string{"PATH=/opt/bin:/usr/bin:/bin", "GREETING=hello"}, WorkingDir: "/srv/work", User: "1000:1000"}
	if img.Config == nil || !slices.Equal(img.Config.Env, want.Env) || img.Config.WorkingDir != want.WorkingDir || img.Config.User != want.User {
		t.Errorf("config %+v, want %+v", img.Config, want)
	}
	if m := lmode(t, filepath.Join(r, "srv/work")); !m.IsDir() {
		t.Errorf("the working directory was not created: %v", m)
	}
	if !strings.HasPrefix(img.ImageID, "sha256:") || img.Key != img.Origin+"-"+strings.TrimPrefix(img.ImageID, "sha256:")[:32] ||
		(img.Origin != OriginImport && img.Origin != OriginPull) || !img.LayersVerified {
		t.Errorf("key %q, origin %q, image ID %q, layers verified %v", img.Key, img.Origin, img.ImageID, img.LayersVerified)
	}
}

func TestImportImageLayers(t *testing.T) {
	s := newStore(t)
	mp := Mountpoints{Dirs: []string{"/workspace"}, Files: []string{"/.safe-run/agent"}}
	img, err := s.ImportImage(context.Background(), "team/ds:1", layeredImage(t), "test", ImportOptions{Mountpoints: mp})
	if err != nil {
		t.Fatalf("ImportImage: %v", err)
	}
	checkLayeredImage(t, img)
	got, err := s.Lookup("team/ds:1")
	if err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	checkLayeredImage(t, got)
	if want := []string{"/workspace", "/srv/work"}; got.Mountpoints == nil || !slices.Equal(got.Mountpoints.Dirs, want) {
		t.Errorf("mountpoints %+v, want dirs %q", got.Mountpoints, want)
	}
	if names := dirNames(t, filepath.Join(s.Dir, "names")); !slices.Equal(names, []string{"team%2Fds%3A1"}) {
		t.Errorf("names/ holds %q", names)
	}
	imgs, err := s.List()
	if err != nil || len(imgs) != 1 || !slices.Equal(imgs[0].Names, []string{"team/ds:1"}) {
		t.Errorf("List = %+v, %v", imgs, err)
	}
	// The same image again is not extracted again.
	again, err := s.ImportImage(context.Background(), "other", layeredImage(t), "test", ImportOptions{Mountpoints: mp})
	if err != nil || again.Key != img.Key || !again.Created.Equal(img.Created) {
		t.Errorf("second ImportImage = %+v, %v; want the first image", again, err)
	}
}

// TestImportFileFormats imports one image as a docker save archive (plain
// and gzip-compressed), an OCI layout archive and an OCI layout directory.
func TestImportFileFormats(t *testing.T) {
	img := layeredImage(t)
	dir := t.TempDir()
	dockerTar := filepath.Join(dir, "docker.tar")
	tag, _ := name.NewTag("team/ds:1")
	if err := tarball.WriteToFile(dockerTar, tag, img); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(dockerTar)
	if err != nil {
		t.Fatal(err)
	}
	dockerGz := filepath.Join(dir, "docker.tar.gz")
	if err := os.WriteFile(dockerGz, gzipBytes(t, data), 0o644); err != nil {
		t.Fatal(err)
	}
	ociDir := filepath.Join(dir, "oci")
	p, err := layout.Write(ociDir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	ociTar := filepath.Join(dir, "oci.tar")
	if err := os.WriteFile(ociTar, tarDir(t, ociDir), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, file := range []string{dockerTar, dockerGz, ociTar, ociDir} {
		t.Run(filepath.Base(file), func(t *testing.T) {
			s := newStore(t)
			var progressed bool
			got, err := s.ImportFile(context.Background(), "ds", file, ImportOptions{Progress: func(done, total int64) { progressed = done > 0 }})
			if err != nil {
				t.Fatalf("ImportFile: %v", err)
			}
			checkLayeredImage(t, got)
			if !progressed {
				t.Error("no progress reported")
			}
			if names := dirNames(t, filepath.Join(s.Dir, "staging")); len(names) != 0 {
				t.Errorf("staging holds %q", names)
			}
		})
	}
	// A root file system archive still goes to Import, with its key.
	s := newStore(t)
	got, err := s.ImportFile(context.Background(), "default", writeArchive(t, imageEntries...), ImportOptions{Key: "k"})
	if err != nil || got.Key != "k" || got.Config != nil {
		t.Errorf("ImportFile of a root file system = %+v, %v", got, err)
	}
	if _, err := s.ImportFile(context.Background(), "x", dockerTar, ImportOptions{Key: "k"}); err == nil {
		t.Error("ImportFile of an image archive with a key succeeded")
	}
}

// tarDir archives the files below dir, as `tar -C dir -cf - .` would.
func tarDir(t *testing.T, dir string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.AddFS(os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// headerOnly is a tar stream holding hdr and nothing else: no body, no
// end marker, as a hostile archive claiming a huge file would start.
func headerOnly(t *testing.T, hdr tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := tar.NewWriter(&buf).WriteHeader(&hdr); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestImportImageMalicious feeds hostile layers through ImportImage: each
// is refused with a message naming the problem, or neutralised, and
// nothing is written outside the image.
func TestImportImageMalicious(t *testing.T) {
	base := []tarEntry{regEntry("etc/os-release", 0o644, "ID=test\n")}
	tests := []struct {
		name    string
		layer   func(t *testing.T) v1.Layer
		wantErr string                        // empty: imported, then check
		check   func(t *testing.T, img Image) // for an import that succeeds
	}{
		{"traversal", func(t *testing.T) v1.Layer { return testLayer(t, regEntry("../../evil", 0o644, "x")) }, "leaves the image root", nil},
		{"whiteout traversal", func(t *testing.T) v1.Layer { return testLayer(t, regEntry("../.wh.outside", 0o644, "")) }, "leaves the image root", nil},
		{"absolute symlink then write through it", func(t *testing.T) v1.Layer {
			return testLayer(t, symlinkEntry("escape", "/"), regEntry("escape/tmp/pwned", 0o644, "x"))
		}, "symbolic link out of the image root", nil},
		{"absolute symlink alone", func(t *testing.T) v1.Layer { return testLayer(t, symlinkEntry("etc/shadow-link", "/etc/shadow")) }, "",
			func(t *testing.T, img Image) {
				// Kept as a link, which resolves inside the sandbox's own root.
				if got, err := os.Readlink(filepath.Join(img.Root, "etc/shadow-link")); err != nil || got != "/etc/shadow" {
					t.Errorf("link = %q, %v", got, err)
				}
			}},
		{"hard link outside", func(t *testing.T) v1.Layer { return testLayer(t, hardlinkEntry("passwd", "../../../etc/passwd")) }, "leaves the image root", nil},
		{"hard link to a host path", func(t *testing.T) v1.Layer { return testLayer(t, hardlinkEntry("passwd", "/etc/passwd")) }, "not a regular file already in the archive", nil},
		{"device nodes", func(t *testing.T) v1.Layer {
			return testLayer(t,
				tarEntry{hdr: tar.Header{Name: "dev/sda", Typeflag: tar.TypeBlock, Mode: 0o666, Devmajor: 8}},
				tarEntry{hdr: tar.Header{Name: "dev/mem", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 1}})
		}, "", func(t *testing.T, img Image) {
			for _, p := range []string{"dev/sda", "dev/mem"} {
				if _, err := os.Lstat(filepath.Join(img.Root, p)); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("%s: %v, want it skipped", p, err)
				}
			}
			if img.Stats.Skipped != 2 {
				t.Errorf("stats %+v, want 2 skipped", img.Stats)
			}
		}},
		{"setuid and setgid", func(t *testing.T) v1.Layer {
			return testLayer(t, regEntry("bin/su", 0o4755, "su"), regEntry("bin/wall", 0o2755, "wall"))
		}, "", func(t *testing.T, img Image) {
			for _, p := range []string{"bin/su", "bin/wall"} {
				if m := lmode(t, filepath.Join(img.Root, p)); m != 0o755 {
					t.Errorf("%s: mode %v, want 0755", p, m)
				}
			}
		}},
		{"huge file", func(t *testing.T) v1.Layer {
			return rawLayer(t, headerOnly(t, tar.Header{Name: "huge", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1 << 40}))
		}, "limit of one file", nil},
		{"too much in total", func(t *testing.T) v1.Layer {
			return testLayer(t, regEntry("a", 0o644, strings.Repeat("a", 600)), regEntry("b", 0o644, strings.Repeat("b", 600)))
		}, "limit of an image", nil},
	}
	limits := ExtractLimits{MaxBytes: 1000, MaxFileBytes: 800, MaxEntries: 100}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newStore(t)
			img := testImage(t, v1.Config{}, testLayer(t, base...), tt.layer(t))
			got, err := s.ImportImage(context.Background(), "bad", img, "test", ImportOptions{Limits: limits})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ImportImage = %v, want an error containing %q", err, tt.wantErr)
				}
				if _, err := s.Lookup("bad"); err == nil {
					t.Error("the refused image can be looked up")
				}
				if imgs, _ := s.List(); len(imgs) != 0 {
					t.Errorf("List = %+v after a refused import", imgs)
				}
			} else {
				if err != nil {
					t.Fatalf("ImportImage: %v", err)
				}
				tt.check(t, got)
			}
			if _, err := os.Lstat("/tmp/pwned"); err == nil {
				t.Error("a file was written through a symbolic link to the host's /tmp")
			}
			entries, _ := os.ReadDir(filepath.Dir(s.Dir))
			if len(entries) != 1 {
				t.Errorf("the store's parent holds %d entries, want only the store", len(entries))
			}
			if names := dirNames(t, filepath.Join(s.Dir, "staging")); len(names) != 0 {
				t.Errorf("staging holds %q", names)
			}
		})
	}
}

// failingLayer is a layer whose content breaks off with err after some
// bytes, as an interrupted download does.
type failingLayer struct {
	v1.Layer
	err error
}

func (l failingLayer) Uncompressed() (io.ReadCloser, error) {
	rc, err := l.Layer.Uncompressed()
	if err != nil {
		return nil, err
	}
	return struct {
		io.Reader
		io.Closer
	}{io.MultiReader(io.LimitReader(rc, 1024), errReader{l.err}), rc}, nil
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// TestImportImageInterrupted checks that an import broken off halfway
// leaves no image: neither its name nor a half root that runs could use,
// nor anything in staging; and that a later import succeeds.
func TestImportImageInterrupted(t *testing.T) {
	s := newStore(t)
	var big []tarEntry
	for i := range 20 {
		big = append(big, regEntry("data/f"+string(rune('a'+i)), 0o644, strings.Repeat("x", 512)))
	}
	good := testLayer(t, big...)
	broken := testImage(t, v1.Config{}, testLayer(t, imageEntries...), failingLayer{good, errors.New("connection reset")})
	_, err := s.ImportImage(context.Background(), "img", broken, "test", ImportOptions{})
	if err == nil || !strings.Contains(err.Error(), "connection reset") {
		t.Fatalf("ImportImage of a broken layer = %v, want the layer's error", err)
	}
	var nf *NotFoundError
	if _, err := s.Lookup("img"); !errors.As(err, &nf) {
		t.Errorf("Lookup after an interrupted import = %v, want not found", err)
	}
	if names := dirNames(t, filepath.Join(s.Dir, "images")); len(names) != 0 {
		t.Errorf("images/ holds %q after an interrupted import", names)
	}
	if names := dirNames(t, filepath.Join(s.Dir, "staging")); len(names) != 0 {
		t.Errorf("staging holds %q", names)
	}

	// A cancelled import, too.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.ImportImage(ctx, "img", testImage(t, v1.Config{}, good), "test", ImportOptions{}); !errors.Is(err, context.Canceled) {
		t.Errorf("ImportImage with a cancelled context = %v", err)
	}
	if _, err := s.ImportImage(context.Background(), "img", testImage(t, v1.Config{}, testLayer(t, imageEntries...), good), "test", ImportOptions{}); err != nil {
		t.Fatalf("ImportImage after interrupted ones: %v", err)
	}
}

// TestStoreRemovesDeadImports checks that what a killed import left in
// staging/ is removed by the next import, and never looked up.
func TestStoreRemovesDeadImports(t *testing.T) {
	s := newStore(t)
	dead := filepath.Join(s.Dir, "staging", "import-123", "rootfs")
	if err := os.MkdirAll(dead, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dead, "half"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Import("x", writeArchive(t, imageEntries...), ImportOptions{Key: "k"}); err != nil {
		t.Fatal(err)
	}
	if names := dirNames(t, filepath.Join(s.Dir, "staging")); len(names) != 0 {
		t.Errorf("staging holds %q after the next import", names)
	}
}

// TestStoreDamagedImage checks that an image whose root lost what its
// import put there is reported, not used, and repaired by a re-import.
func TestStoreDamagedImage(t *testing.T) {
	s := newStore(t)
	mp := Mountpoints{Dirs: []string{"/workspace"}, Files: []string{"/.safe-run/agent"}}
	archive := writeArchive(t, imageEntries...)
	img, err := s.Import("default", archive, ImportOptions{Key: "k", Mountpoints: mp})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(img.Root, ".safe-run")); err != nil {
		t.Fatal(err)
	}
	_, err = s.Lookup("default")
	if err == nil || !strings.Contains(err.Error(), "damaged") || !strings.Contains(err.Error(), "/.safe-run/agent") {
		t.Errorf("Lookup of a damaged image = %v, want it reported as damaged", err)
	}
	if imgs, _ := s.List(); len(imgs) != 0 {
		t.Errorf("List shows a damaged image: %+v", imgs)
	}
	if _, err := s.Import("default", archive, ImportOptions{Key: "k", Mountpoints: mp}); err != nil {
		t.Fatalf("re-import: %v", err)
	}
	if _, err := s.Lookup("default"); err != nil {
		t.Errorf("Lookup after re-import: %v", err)
	}
}

// TestStoreLegacyImage checks that an image imported before image.json
// recorded mountpoints, as the shared cache holds, is still used.
func TestStoreLegacyImage(t *testing.T) {
	s := newStore(t)
	dir := filepath.Join(s.Dir, "images", "6e7b7a2c28fa8130")
	if err := os.MkdirAll(filepath.Join(dir, "rootfs", "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	legacy := `{"key": "6e7b7a2c28fa8130", "root": "", "source": "/x.tar.gz", "source_sha256": "89",
  "created": "2026-11-29T09:10:35.907005653Z", "stats": {"Entries": 1, "Bytes": 2, "Skipped": 0, "Stripped": 3}}`
	if err := os.WriteFile(filepath.Join(dir, "image.json"), []byte(legacy), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(s.Dir, "names"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.Dir, "names", "default"), []byte("6e7b7a2c28fa8130"), 0o644); err != nil {
		t.Fatal(err)
	}
	img, err := s.Lookup("default")
	if err != nil || img.Root != filepath.Join(dir, "rootfs") || img.Stats.Stripped != 3 || img.Config != nil {
		t.Errorf("Lookup of a legacy image = %+v, %v", img, err)
	}
}

func TestStoreRemove(t *testing.T) {
	s := newStore(t)
	archive := writeArchive(t, imageEntries...)
	for _, n := range []string{"a", "b:1"} {
		if _, err := s.Import(n, archive, ImportOptions{Key: "k"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Remove("a"); err != nil {
		t.Fatalf("Remove(a): %v", err)
	}
	if img, err := s.Lookup("b:1"); err != nil {
		t.Fatalf("Lookup(b:1) after removing the other name: %v", err)
	} else if _, err := os.Stat(img.Root); err != nil {
		t.Errorf("the image was deleted while another name points to it: %v", err)
	}
	removed, err := s.Remove("b:1")
	if err != nil {
		t.Fatalf("Remove(b:1): %v", err)
	}
	if removed.Root == "" {
		t.Error("Remove of the last name did not remove the image")
	}
	for _, d := range []string{"images", "names", "staging"} {
		if names := dirNames(t, filepath.Join(s.Dir, d)); len(names) != 0 {
			t.Errorf("%s/ holds %q", d, names)
		}
	}
	var nf *NotFoundError
	if _, err := s.Remove("a"); !errors.As(err, &nf) {
		t.Errorf("Remove of a missing name = %v, want not found", err)
	}
}

func TestNameFile(t *testing.T) {
	for name, want := range map[string]string{
		"default":          "default",
		"python:3.12-slim": "python%3A3.12-slim",
		"127.0.0.1:5000/team/ds@sha256:" + strings.Repeat("ab", 32): "127.0.0.1%3A5000%2Fteam%2Fds%40sha256%3A" + strings.Repeat("ab", 32),
		"r/Tag": "r%2F%54ag",
	} {
		if got := nameFile(name); got != want {
			t.Errorf("nameFile(%q) = %q, want %q", name, got, want)
		}
		if back, ok := nameOfFile(want); !ok || back != name {
			t.Errorf("nameOfFile(%q) = %q, %v", want, back, ok)
		}
	}
	for _, file := range []string{".default.tmp", "a%2F..%2Fb", "%41"} {
		if n, ok := nameOfFile(file); ok {
			t.Errorf("nameOfFile(%q) = %q, want no name", file, n)
		}
	}
}

// newRegistry serves an in-memory registry on loopback; wrap, if set,
// wraps its handler.
func newRegistry(t *testing.T, wrap func(http.Handler) http.Handler) string {
	t.Helper()
	var h http.Handler = registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	if wrap != nil {
		h = wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func push(t *testing.T, ref string, img v1.Image) {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
}

func TestPull(t *testing.T) {
	host := newRegistry(t, nil)
	ref := host + "/team/ds:1"
	push(t, ref, layeredImage(t))
	s := newStore(t)
	var done, total int64
	img, err := s.Pull(context.Background(), ref, ref, ImportOptions{Progress: func(d, tot int64) { done, total = d, tot }})
	if err != nil {
		t.Fatalf("Pull: %v", err)
	}
	checkLayeredImage(t, img)
	if total == 0 || done != total {
		t.Errorf("progress ended at %d of %d bytes", done, total)
	}
	if got, err := s.Lookup(ref); err != nil || got.Key != img.Key {
		t.Errorf("Lookup(%s) = %+v, %v", ref, got, err)
	}
	if _, err := s.Pull(context.Background(), "x", host+"/team/missing:1", ImportOptions{}); err == nil {
		t.Error("Pull of a missing image succeeded")
	}
}

// TestPullInterrupted breaks off every layer download halfway: the pull
// fails and leaves no image behind.
func TestPullInterrupted(t *testing.T) {
	var big []tarEntry
	for i := range 64 {
		big = append(big, regEntry("data/f"+string(rune('A'+i)), 0o644, strings.Repeat(string(rune('a'+i%26)), 4096)))
	}
	img := testImage(t, v1.Config{}, testLayer(t, big...))
	layers, _ := img.Layers()
	digest, _ := layers[0].Digest()
	size, _ := layers[0].Size()
	host := newRegistry(t, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/blobs/"+digest.String()) {
				w.Header().Set("Content-Length", "1000000")
				w.WriteHeader(http.StatusOK)
				rec := httptest.NewRecorder()
				next.ServeHTTP(rec, r)
				w.Write(rec.Body.Bytes()[:size/2])
				w.(http.Flusher).Flush()
				panic(http.ErrAbortHandler) // the connection breaks
			}
			next.ServeHTTP(w, r)
		})
	})
	ref := host + "/team/big:1"
	push(t, ref, img)
	s := newStore(t)
	if got, err := s.Pull(context.Background(), ref, ref, ImportOptions{}); err == nil {
		t.Fatalf("Pull of a broken download succeeded: %+v", got)
	}
	for _, d := range []string{"images", "names", "staging"} {
		if names := dirNames(t, filepath.Join(s.Dir, d)); len(names) != 0 {
			t.Errorf("%s/ holds %q after a broken pull", d, names)
		}
	}
}
