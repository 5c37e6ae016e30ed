package main

// The threat suite's image import section (issue 14): hostile image
// archives and a hostile registry, built here and served on loopback,
// imported and pulled with the built binary into caches of the test's own
// — never the shared one — as root and as an ordinary user
// (scripts/test-rootless.sh). Images are for users to import images they
// did not build: none may read the importer's files, pass for another
// image, take over a name, or damage the image it is.

import (
	"archive/tar"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/safe-run/safe-run/rootfs"
	"github.com/safe-run/safe-run/rootfs/hostile"
)

// greetProgram prints what the image's greet program and GREETING say.
const greetProgram = `greet; echo "greeting=$GREETING"`

// uncompressedLayers returns img's layers as tar streams.
func uncompressedLayers(t *testing.T, img v1.Image) [][]byte {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

// hostileFile writes entries as a tar archive in a fresh directory.
func hostileFile(t *testing.T, entries []hostile.Entry) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "image.tar")
	if err := hostile.WriteTar(file, entries); err != nil {
		t.Fatal(err)
	}
	return file
}

// cacheImages lists a test cache's images with `image ls --json`.
func cacheImages(t *testing.T, cache string) []rootfs.Image {
	t.Helper()
	res := safeRun(t, "", imageArgs(cache, "ls", "--json")...)
	var ls struct{ Images []rootfs.Image }
	if res.code != 0 || json.Unmarshal([]byte(res.stdout), &ls) != nil {
		t.Fatalf("image ls --json: exit %d: %s %s", res.code, res.stdout, res.stderr)
	}
	return ls.Images
}

// runIn runs code in image of cache and returns its standard output.
func runIn(t *testing.T, cache, image, code string) cliResult {
	t.Helper()
	return safeRun(t, "", "run", "--cache-dir", cache, "--image", image, "--lang", "bash", "-c", code)
}

func TestThreatImageImport(t *testing.T) {
	binary(t)

	// 14.1: an OCI archive whose blobs/sha256 (or blobs) is a link to a
	// content store of the importer's, private to it, and whose index
	// names an image there by its digest.
	t.Run("OCI archive links to a private content store", func(t *testing.T) {
		store := filepath.Join(t.TempDir(), "content")
		p, err := layout.Write(store, empty.Index)
		if err != nil {
			t.Fatal(err)
		}
		private := bashImageGreeting(t, "PRIVATE-CONFIG-SECRET")
		if err := p.AppendImage(private); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(store, 0o700); err != nil {
			t.Fatal(err)
		}
		digest, _ := private.Digest()
		raw, _ := private.RawManifest()
		top := []hostile.Entry{
			{Name: "oci-layout", Body: []byte(`{"imageLayoutVersion": "1.0.0"}`)},
			{Name: "index.json", Body: hostile.Index(digest.String(), len(raw), "innocent:1")},
		}
		for _, link := range []hostile.Entry{
			{Name: "blobs/sha256", Link: filepath.Join(store, "blobs", "sha256")},
			{Name: "blobs", Link: filepath.Join(store, "blobs")},
		} {
			t.Run(link.Name, func(t *testing.T) {
				file := hostileFile(t, append(top[:2:2], link))
				if fi, _ := os.Stat(file); fi.Size() > 16<<10 {
					t.Fatalf("the hostile archive has %d bytes", fi.Size())
				}
				cache := filepath.Join(t.TempDir(), "cache")
				res := safeRun(t, "", imageArgs(cache, "import", file)...)
				if res.code == 0 {
					out := runIn(t, cache, "innocent:1", greetProgram)
					t.Errorf("the import took the private image: LEAK %q", out.stdout)
				}
				if res.code != exitSandboxError || !strings.Contains(res.stderr, "is a symbolic link") {
					t.Errorf("image import: exit %d, stderr %q; want 125 and the link refused", res.code, res.stderr)
				}
				if imgs := cacheImages(t, cache); len(imgs) != 0 {
					t.Errorf("the cache holds %+v", imgs)
				}
			})
		}
	})

	// 14.2: an archive carrying the exact configuration of an image on a
	// trusted registry, with layers of its own, imported under any name;
	// then `image pull REF` and `REF@sha256:…` of the genuine image.
	t.Run("archive with a trusted image's configuration and other layers", func(t *testing.T) {
		host := serveRegistry(t)
		ref := host + "/team/bash:1"
		trusted := bashImage(t)
		r, _ := name.ParseReference(ref)
		if err := remote.Write(r, trusted); err != nil {
			t.Fatalf("push: %v", err)
		}
		digest, _ := trusted.Digest()
		config, _ := trusted.RawConfigFile()
		layers := uncompressedLayers(t, trusted)
		evilUpper := layerOf(t, []tar.Header{
			{Name: "opt/tools/greet", Typeflag: tar.TypeReg, Mode: 0o755},
		}, map[string][]byte{"opt/tools/greet": []byte("#!/usr/bin/bash\necho ATTACKER-LAYER\n")})
		evil := [][]byte{layers[0], uncompressedLayers(t, mustImage(t, evilUpper))[0]}
		ociEntries, _ := hostile.OCI(config, evil, "")
		for _, tt := range []struct {
			name    string
			entries []hostile.Entry
		}{{"docker save", hostile.Docker(config, evil, "")}, {"oci", ociEntries}} {
			t.Run(tt.name, func(t *testing.T) {
				cache := filepath.Join(t.TempDir(), "cache")
				res := safeRun(t, "", imageArgs(cache, "import", "--name", "anything", hostileFile(t, tt.entries))...)
				if res.code != exitSandboxError || !strings.Contains(res.stderr, "rootfs.diff_ids") {
					t.Errorf("image import: exit %d, stderr %q; want 125 and the layers refused against diff_ids", res.code, res.stderr)
				}
				for _, pull := range []string{ref, host + "/team/bash@" + digest.String()} {
					if res := safeRun(t, "", imageArgs(cache, "pull", pull)...); res.code != 0 {
						t.Fatalf("image pull %s: exit %d: %s", pull, res.code, res.stderr)
					}
					out := runIn(t, cache, pull, greetProgram)
					if out.code != 0 || out.stdout != "greetings from the image PATH\ngreeting=hi-from-image\n" {
						t.Errorf("run in the pulled %s: exit %d, stdout %q (LEAK if ATTACKER-LAYER), stderr %q", pull, out.code, out.stdout, out.stderr)
					}
				}
				for _, img := range cacheImages(t, cache) {
					if img.Origin != rootfs.OriginPull || !img.LayersVerified || img.Source != r.Name() {
						t.Errorf("image ls shows %+v; want only the pulled image, verified", img)
					}
				}
				res = safeRun(t, "", imageArgs(cache, "ls")...)
				if !strings.Contains(res.stdout, "pull "+r.Name()) {
					t.Errorf("image ls does not say where the image came from:\n%s", res.stdout)
				}
			})
		}
	})

	// 14.3: an archive tagged "default", imported without --name into a
	// cache whose default image exists; an archive tagged with a
	// digest-pinned name that names another image.
	t.Run("archive's own tag re-points existing names", func(t *testing.T) {
		cache := filepath.Join(t.TempDir(), "cache")
		write := func(greeting, ref string) (string, string) {
			img := bashImageGreeting(t, greeting)
			config, _ := img.RawConfigFile()
			entries, digest := hostile.OCI(config, uncompressedLayers(t, img), ref)
			return hostileFile(t, entries), digest
		}
		genuine, genuineDigest := write("genuine", "")
		if res := safeRun(t, "", imageArgs(cache, "import", "--name", rootfs.DefaultName, genuine)...); res.code != 0 {
			t.Fatalf("image import: exit %d: %s", res.code, res.stderr)
		}
		pinned := "team/bash@" + genuineDigest
		res := safeRun(t, "", imageArgs(cache, "import", "--name", pinned, genuine)...)
		if res.code != 0 {
			t.Fatalf("image import under its digest: exit %d: %s", res.code, res.stderr)
		}
		if !strings.Contains(res.stderr, "new name") {
			t.Errorf("image import does not say it made a new name: %s", res.stderr)
		}
		taggedDefault, _ := write("taken-over", rootfs.DefaultName)
		taggedPinned, _ := write("taken-over", pinned)
		for _, tt := range []struct {
			args []string
			want string
		}{
			{[]string{taggedDefault}, `"default" already points to image`},
			{[]string{taggedPinned}, "pins digest " + genuineDigest},
			{[]string{"--replace", taggedPinned}, "pins digest " + genuineDigest},
			{[]string{"--replace", "--name", pinned, taggedDefault}, "pins digest " + genuineDigest},
		} {
			res := safeRun(t, "", imageArgs(cache, "import", tt.args...)...)
			if res.code != exitSandboxError || !strings.Contains(res.stderr, tt.want) || !strings.Contains(res.stderr, "nothing was changed") {
				t.Errorf("image import %q: exit %d, stderr %q; want 125, %q and nothing changed", tt.args, res.code, res.stderr, tt.want)
			}
		}
		for _, n := range []string{rootfs.DefaultName, pinned} {
			if out := runIn(t, cache, n, `echo "$GREETING"`); out.code != 0 || out.stdout != "genuine\n" {
				t.Errorf("run in %s: exit %d, stdout %q, stderr %q; want the genuine image", n, out.code, out.stdout, out.stderr)
			}
		}
		// Asked for, the name moves, and the CLI says from where.
		res = safeRun(t, "", imageArgs(cache, "import", "--replace", taggedDefault)...)
		if res.code != 0 || !strings.Contains(res.stderr, "name replaced: it pointed to import-") {
			t.Errorf("image import --replace: exit %d, stderr %q", res.code, res.stderr)
		}
	})

	// 14.9: an image whose .safe-run/agent is a link to its own bash.
	t.Run("image links its agent mountpoint to its bash", func(t *testing.T) {
		links := layerOf(t, []tar.Header{
			{Name: ".safe-run/", Typeflag: tar.TypeDir, Mode: 0o755},
			{Name: ".safe-run/agent", Typeflag: tar.TypeSymlink, Linkname: "../usr/bin/bash"},
			{Name: "workspace", Typeflag: tar.TypeSymlink, Linkname: "usr/bin"},
		}, nil)
		img, err := mutate.AppendLayers(bashImage(t), links)
		if err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(t.TempDir(), "linked.tar")
		if err := tarball.WriteToFile(file, nil, img); err != nil {
			t.Fatal(err)
		}
		cache := filepath.Join(t.TempDir(), "cache")
		if res := safeRun(t, "", imageArgs(cache, "import", "--name", "linked", file)...); res.code != 0 {
			t.Fatalf("image import: exit %d: %s", res.code, res.stderr)
		}
		for range 2 { // and again: nothing changed by the first run either
			if out := runIn(t, cache, "linked", bashProgram); out.code != 0 || out.stdout != bashWant {
				t.Errorf("run in the image: exit %d, stdout %q, stderr %q", out.code, out.stdout, out.stderr)
			}
		}
		imgs := cacheImages(t, cache)
		if len(imgs) != 1 {
			t.Fatalf("the cache holds %+v", imgs)
		}
		if fi, err := os.Stat(filepath.Join(imgs[0].Root, "usr/bin/bash")); err != nil || fi.Mode().Perm() != 0o755 {
			t.Errorf("the image's bash: %v, %v; want mode 0755 untouched", fi.Mode(), err)
		}
	})
}

// mustImage is an image of layers.
func mustImage(t *testing.T, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	return img
}
