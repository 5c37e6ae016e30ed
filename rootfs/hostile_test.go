package rootfs

// Hostile image archives and registries (issue 14): archives that reach
// outside themselves, that carry another image's configuration, that name
// images already in the store, and images whose own links point the
// mountpoints elsewhere.

import (
	"bytes"
	"context"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/safe-run/safe-run/rootfs/hostile"
)

// rawConfig returns img's configuration as stored.
func rawConfig(t *testing.T, img v1.Image) []byte {
	t.Helper()
	b, err := img.RawConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// writeHostile writes entries as a tar archive named name in a fresh
// directory.
func writeHostile(t *testing.T, name string, entries []hostile.Entry) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), name)
	if err := hostile.WriteTar(file, entries); err != nil {
		t.Fatal(err)
	}
	return file
}

// checkNothingOf fails if any file below dir holds marker.
func checkNothingOf(t *testing.T, dir, marker string) {
	t.Helper()
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if b, _ := os.ReadFile(p); strings.Contains(string(b), marker) {
				t.Errorf("%s holds the private content", p)
			}
		}
		return nil
	})
}

// TestImportOCILinksOut: an OCI archive (or layout directory) whose blobs,
// blobs/sha256 or a blob is a link to a private content store on the host
// — blobs named by their digests, as containerd's and Docker's are — is
// refused, and nothing of the store reaches the image cache.
func TestImportOCILinksOut(t *testing.T) {
	const secret = "PRIVATE-LAYER-CONTENT"
	private := testImage(t, v1.Config{Env: []string{"API_TOKEN=" + secret}}, testLayer(t, regEntry("root/private.txt", 0o600, secret)))
	store := filepath.Join(t.TempDir(), "content")
	layers, _ := private.Layers()
	var blobs [][]byte
	raw, _ := private.RawManifest()
	blobs = append(blobs, raw, rawConfig(t, private))
	for _, l := range layers {
		rc, _ := l.Compressed()
		b := readAllClose(t, rc)
		blobs = append(blobs, b)
	}
	for _, b := range blobs {
		writeBlob(t, filepath.Join(store, "blobs", "sha256"), b)
	}
	if err := os.Chmod(store, 0o700); err != nil { // the store is its owner's only
		t.Fatal(err)
	}
	digest, _ := private.Digest()
	top := []hostile.Entry{
		{Name: "oci-layout", Body: []byte(`{"imageLayoutVersion": "1.0.0"}`)},
		{Name: "index.json", Body: hostile.Index(digest.String(), len(raw), "innocent:1")},
	}
	perBlob := append([]hostile.Entry(nil), top...)
	for _, b := range blobs {
		h := strings.TrimPrefix(hostile.Digest(b), "sha256:")
		perBlob = append(perBlob, hostile.Entry{Name: "blobs/sha256/" + h, Link: filepath.Join(store, "blobs", "sha256", h)})
	}
	for _, tt := range []struct {
		name    string
		entries []hostile.Entry
	}{
		{"blobs is a link", append(top[:2:2], hostile.Entry{Name: "blobs", Link: filepath.Join(store, "blobs")})},
		{"blobs/sha256 is a link", append(top[:2:2], hostile.Entry{Name: "blobs/sha256", Link: filepath.Join(store, "blobs", "sha256")})},
		{"every blob is a link", perBlob},
	} {
		file := writeHostile(t, "oci.tar", tt.entries)
		dir := t.TempDir()
		if _, err := Extract(mustOpen(t, file), dir, testLimits); err != nil {
			t.Fatal(err)
		}
		for _, in := range []string{file, dir} {
			t.Run(tt.name+"/"+map[bool]string{true: "archive", false: "directory"}[in == file], func(t *testing.T) {
				s := newStore(t)
				_, err := s.ImportFile(context.Background(), "", in, ImportOptions{})
				if err == nil || !strings.Contains(err.Error(), "is a symbolic link") {
					t.Errorf("ImportFile = %v, want it refused for a link", err)
				}
				if imgs, _ := s.List(); len(imgs) != 0 {
					t.Errorf("the store holds %+v", imgs)
				}
				checkNothingOf(t, s.Dir, secret)
			})
		}
	}
}

func mustOpen(t *testing.T, file string) *os.File {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func writeBlob(t *testing.T, dir string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, strings.TrimPrefix(hostile.Digest(b), "sha256:")), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestImportOCIBlobDigests: a blob whose content is not its name is
// refused, manifests and layers alike.
func TestImportOCIBlobDigests(t *testing.T) {
	img := testImage(t, v1.Config{}, testLayer(t, imageEntries...))
	layer := makeTar(t, imageEntries...)
	entries, _ := hostile.OCI(rawConfig(t, img), [][]byte{layer}, "x:1")
	for i, what := range map[int]string{2: "manifest", 4: "layer"} {
		t.Run(what, func(t *testing.T) {
			bad := append([]hostile.Entry(nil), entries...)
			// Same size, other content: a letter of a file or of a value.
			if what == "manifest" {
				bad[i].Body = bytes.Replace(bad[i].Body, []byte("schemaVersion"), []byte("schemaVersioN"), 1)
			} else {
				bad[i].Body = bytes.Replace(bad[i].Body, []byte("ID=test"), []byte("ID=tesT"), 1)
			}
			s := newStore(t)
			_, err := s.ImportFile(context.Background(), "", writeHostile(t, "oci.tar", bad), ImportOptions{})
			if err == nil || !strings.Contains(err.Error(), "is not what it is named by") {
				t.Errorf("ImportFile = %v, want the blob's digest refused", err)
			}
			if imgs, _ := s.List(); len(imgs) != 0 {
				t.Errorf("the store holds %+v", imgs)
			}
		})
	}
}

// TestImportLayersNotTheConfigs: docker save and OCI archives carrying the
// exact configuration of a trusted image, with other layers, are refused;
// and no import, even a genuine one, is ever taken for a pull.
func TestImportLayersNotTheConfigs(t *testing.T) {
	genuine := testLayer(t, regEntry("etc/os-release", 0o644, "ID=genuine\n"))
	trusted := testImage(t, v1.Config{Env: []string{"PATH=/usr/bin"}}, genuine)
	config := rawConfig(t, trusted)
	evil := [][]byte{makeTar(t, regEntry("etc/os-release", 0o644, "ID=evil\n"))}
	ociEntries, _ := hostile.OCI(config, evil, "trusted:1")
	for _, tt := range []struct{ name, file string }{
		{"docker save", writeHostile(t, "docker.tar", hostile.Docker(config, evil, "trusted:1"))},
		{"oci", writeHostile(t, "oci.tar", ociEntries)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := newStore(t)
			_, err := s.ImportFile(context.Background(), "anything", tt.file, ImportOptions{})
			if err == nil || !strings.Contains(err.Error(), "rootfs.diff_ids") || !strings.Contains(err.Error(), "is not what it is named by") {
				t.Errorf("ImportFile = %v, want the layer refused against the configuration's diff_ids", err)
			}
			if imgs, _ := s.List(); len(imgs) != 0 {
				t.Errorf("the store holds %+v", imgs)
			}
		})
	}

	// A genuine import, then a pull of the same image: the pull is its own
	// image, downloaded, whatever the cache holds for that ID.
	host := newRegistry(t, nil)
	ref := host + "/team/trusted:1"
	push(t, ref, trusted)
	s := newStore(t)
	imported, err := s.ImportImage(context.Background(), "copy", trusted, "test", ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// And an entry of the old scheme, keyed by the ID alone, poisoned.
	id, _ := trusted.ConfigName()
	legacy := filepath.Join(s.Dir, "images", "sha256-"+id.Hex[:32])
	if err := os.MkdirAll(filepath.Join(legacy, "rootfs", "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(legacy, "rootfs", "etc", "os-release"), []byte("ID=evil\n"), 0o644)
	os.WriteFile(filepath.Join(legacy, "image.json"), []byte(`{"key": "sha256-`+id.Hex[:32]+`", "image_id": "`+id.String()+`"}`), 0o644)
	digest, _ := trusted.Digest()
	for _, r := range []string{ref, host + "/team/trusted@" + digest.String()} {
		pulled, err := s.Pull(context.Background(), r, r, ImportOptions{})
		if err != nil {
			t.Fatalf("Pull(%s): %v", r, err)
		}
		if pulled.Key == imported.Key || pulled.Key == "sha256-"+id.Hex[:32] || pulled.Origin != OriginPull || pulled.Digest != digest.String() {
			t.Errorf("Pull(%s) = key %q origin %q digest %q; want its own pulled image, not import %q or the old entry",
				r, pulled.Key, pulled.Origin, pulled.Digest, imported.Key)
		}
		if got := readFile(t, filepath.Join(pulled.Root, "etc/os-release")); got != "ID=genuine\n" {
			t.Errorf("Pull(%s) gives etc/os-release %q", r, got)
		}
	}
	imgs, _ := s.List()
	for _, img := range imgs {
		if img.Key == "sha256-"+id.Hex[:32] && img.LayersVerified {
			t.Errorf("the old entry is listed as verified: %+v", img)
		}
	}
}

// TestImportNames: an archive's own name never re-points a name that
// already names another image, unless Replace says so; and a
// digest-pinned name only ever names that digest.
func TestImportNames(t *testing.T) {
	ctx := context.Background()
	oci := func(body, ref string) (string, string) {
		layer := makeTar(t, regEntry("etc/os-release", 0o644, body))
		img := testImage(t, v1.Config{}, rawLayer(t, layer))
		entries, digest := hostile.OCI(rawConfig(t, img), [][]byte{layer}, ref)
		return writeHostile(t, "oci.tar", entries), digest
	}
	s := newStore(t)
	def, err := s.Import(DefaultName, writeArchive(t, imageEntries...), ImportOptions{})
	if err != nil || def.NameChange != "created" {
		t.Fatalf("Import(default) = %+v, %v", def, err)
	}
	tagged, _ := oci("ID=tagged-default\n", "default")
	for _, opts := range []ImportOptions{{}, {Replace: false}} {
		_, err := s.ImportFile(ctx, "", tagged, opts)
		if err == nil || !strings.Contains(err.Error(), `"default" already points to image `+def.Key) || !strings.Contains(err.Error(), "nothing was changed") {
			t.Errorf("ImportFile of an archive tagged default = %v, want it refused", err)
		}
	}
	if img, err := s.Lookup(DefaultName); err != nil || img.Key != def.Key {
		t.Errorf("default is now %q, %v; want %s still", img.Key, err, def.Key)
	}
	// A root file system archive again under default, as well.
	if _, err := s.Import(DefaultName, writeArchive(t, regEntry("x", 0o644, "other")), ImportOptions{}); err == nil {
		t.Error("Import of another root file system over default succeeded without Replace")
	}
	// With Replace it is re-pointed, and says so; the same again changes
	// nothing.
	got, err := s.ImportFile(ctx, "", tagged, ImportOptions{Replace: true})
	if err != nil || got.NameChange != "replaced" || got.PreviousKey != def.Key {
		t.Errorf("ImportFile with Replace = %+v, %v", got, err)
	}
	if got, err := s.ImportFile(ctx, "", tagged, ImportOptions{}); err != nil || got.NameChange != "unchanged" || !got.Reused {
		t.Errorf("ImportFile of the same image again = %+v, %v; want it unchanged", got, err)
	}

	// Digest-pinned names.
	first, firstDigest := oci("ID=first\n", "")
	pinned := "team/app@" + firstDigest
	if got, err := s.ImportFile(ctx, pinned, first, ImportOptions{}); err != nil || got.Digest != firstDigest {
		t.Fatalf("ImportFile under its own digest = %+v, %v", got, err)
	}
	other, _ := oci("ID=other\n", pinned) // and tagged with the pinned name
	for _, tt := range []struct {
		name, file string
	}{{pinned, other}, {"", other}} {
		_, err := s.ImportFile(ctx, tt.name, tt.file, ImportOptions{Replace: true})
		if err == nil || !strings.Contains(err.Error(), "pins digest "+firstDigest) {
			t.Errorf("ImportFile(%q) of another image under a pinned name = %v, want it refused", tt.name, err)
		}
	}
	if img, err := s.Lookup(pinned); err != nil || img.Digest != firstDigest {
		t.Errorf("Lookup(%s) = %+v, %v", pinned, img, err)
	}
	// Nothing without a manifest digest gets a pinned name.
	docker := writeHostile(t, "docker.tar", hostile.Docker(rawConfig(t, testImage(t, v1.Config{}, rawLayer(t, makeTar(t, imageEntries...)))),
		[][]byte{makeTar(t, imageEntries...)}, ""))
	for _, file := range []string{docker, writeArchive(t, imageEntries...)} {
		if _, err := s.ImportFile(ctx, "team/new@"+firstDigest, file, ImportOptions{}); err == nil || !strings.Contains(err.Error(), "no manifest digest") {
			t.Errorf("ImportFile(%s) under a pinned name = %v, want it refused", filepath.Base(file), err)
		}
	}
	if err := checkName("team/app@latest"); err == nil {
		t.Error("a name with @ and no digest is valid")
	}

	// A pull re-points its own reference, and no other name without Replace.
	host := newRegistry(t, nil)
	ref := host + "/team/app:1"
	push(t, ref, testImage(t, v1.Config{}, testLayer(t, regEntry("v", 0o644, "1"))))
	if _, err := s.Pull(ctx, ref, ref, ImportOptions{}); err != nil {
		t.Fatal(err)
	}
	push(t, ref, testImage(t, v1.Config{}, testLayer(t, regEntry("v", 0o644, "2"))))
	if got, err := s.Pull(ctx, ref, ref, ImportOptions{}); err != nil || got.NameChange != "replaced" {
		t.Errorf("second Pull = %+v, %v; want the reference re-pointed", got, err)
	}
	if _, err := s.Pull(ctx, DefaultName, ref, ImportOptions{}); err == nil || !strings.Contains(err.Error(), "--replace") {
		t.Errorf("Pull under the default name = %v, want it refused", err)
	}
}

// TestMountpointsDoNotFollowLinks: an image whose own links stand where
// the sandbox's mountpoints go neither has the import change what they
// point to nor ends up damaged.
func TestMountpointsDoNotFollowLinks(t *testing.T) {
	mp := Mountpoints{Dirs: []string{"/workspace", "/tmp"}, Files: []string{"/.safe-run/agent"}}
	bash := regEntry("usr/bin/bash", 0o755, "#!bash")
	for _, tt := range []struct {
		name    string
		entries []tarEntry
	}{
		{"agent is a link to bash", []tarEntry{bash, dirEntry(".safe-run", 0o755), symlinkEntry(".safe-run/agent", "../usr/bin/bash")}},
		{"agent is an absolute link", []tarEntry{bash, dirEntry(".safe-run", 0o755), symlinkEntry(".safe-run/agent", "/usr/bin/bash")}},
		{"agent is a hard link to bash", []tarEntry{bash, dirEntry(".safe-run", 0o755), hardlinkEntry(".safe-run/agent", "usr/bin/bash")}},
		{".safe-run is a link to usr/bin", []tarEntry{bash, regEntry("usr/bin/agent", 0o755, "#!agent"), symlinkEntry(".safe-run", "usr/bin")}},
		{"workspace and tmp are links", []tarEntry{bash, symlinkEntry("workspace", "usr/bin"), symlinkEntry("tmp", "/usr/bin")}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := newStore(t)
			img, err := s.ImportImage(context.Background(), "img", testImage(t, v1.Config{}, testLayer(t, tt.entries...)), "test", ImportOptions{Mountpoints: mp})
			if err != nil {
				t.Fatalf("ImportImage: %v", err)
			}
			if m := lmode(t, filepath.Join(img.Root, "usr/bin/bash")); m != 0o755 {
				t.Errorf("usr/bin/bash: mode %v, want 0755 untouched", m)
			}
			if got := readFile(t, filepath.Join(img.Root, "usr/bin/bash")); got != "#!bash" {
				t.Errorf("usr/bin/bash = %q", got)
			}
			if tt.name == ".safe-run is a link to usr/bin" {
				if m := lmode(t, filepath.Join(img.Root, "usr/bin/agent")); m != 0o755 {
					t.Errorf("usr/bin/agent: mode %v, want 0755 untouched", m)
				}
			}
			for _, d := range []string{"workspace", "tmp", ".safe-run"} {
				if m := lmode(t, filepath.Join(img.Root, d)); !m.IsDir() {
					t.Errorf("%s: mode %v, want a directory of its own", d, m)
				}
			}
			if m := lmode(t, filepath.Join(img.Root, ".safe-run/agent")); !m.IsRegular() {
				t.Errorf(".safe-run/agent: mode %v, want a file of its own", m)
			}
			if _, err := s.Lookup("img"); err != nil {
				t.Errorf("Lookup: %v", err)
			}
		})
	}
}

func readAllClose(t *testing.T, rc io.ReadCloser) []byte {
	t.Helper()
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
