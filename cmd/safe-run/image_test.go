package main

// End-to-end tests of images: an image is built here from the host's own
// bash and the libraries it needs, pushed to a registry served on loopback
// by this test, pulled or imported with the built binary into a cache of
// the test's own, and run in with the real runsc.

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/safe-run/safe-run/rootfs"
)

// layerOf builds a layer from tar entries; regular files take their body.
func layerOf(t *testing.T, entries []tar.Header, bodies map[string][]byte) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range entries {
		h.ModTime = time.Unix(1700000000, 0)
		body := bodies[h.Name]
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(body))
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	data := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// bashImage is a two-layer image: the host's bash with its libraries and a
// file the upper layer deletes; then a program on the image's PATH, the
// whiteout, an environment variable and a WORKDIR.
func bashImage(t *testing.T) v1.Image {
	t.Helper()
	return bashImageGreeting(t, "hi-from-image")
}

// bashImageGreeting is bashImage with another GREETING.
func bashImageGreeting(t *testing.T, greeting string) v1.Image {
	t.Helper()
	bash, err := filepath.EvalSymlinks("/bin/bash")
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{"usr/bin/bash": bash}
	out, err := exec.Command("ldd", bash).Output()
	if err != nil {
		t.Fatalf("ldd %s: %v", bash, err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		// "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)" or
		// "/lib64/ld-linux-x86-64.so.2 (0x…)"
		fields := strings.Fields(line)
		var p string
		switch {
		case len(fields) >= 3 && fields[1] == "=>":
			p = fields[2]
		case len(fields) >= 1 && strings.HasPrefix(fields[0], "/"):
			p = fields[0]
		default:
			continue
		}
		// Stored under the usr/ path, reached through the lib links.
		rel := strings.TrimPrefix(p, "/")
		if !strings.HasPrefix(rel, "usr/") {
			rel = "usr/" + rel
		}
		files[rel] = p
	}
	lowerEntries := []tar.Header{
		{Name: "bin", Typeflag: tar.TypeSymlink, Linkname: "usr/bin"},
		{Name: "lib", Typeflag: tar.TypeSymlink, Linkname: "usr/lib"},
		{Name: "lib64", Typeflag: tar.TypeSymlink, Linkname: "usr/lib64"},
		{Name: "opt/gone", Typeflag: tar.TypeReg, Mode: 0o644},
	}
	bodies := map[string][]byte{"opt/gone": []byte("removed by the upper layer")}
	for rel, host := range files {
		data, err := os.ReadFile(host)
		if err != nil {
			t.Fatal(err)
		}
		lowerEntries = append(lowerEntries, tar.Header{Name: rel, Typeflag: tar.TypeReg, Mode: 0o755})
		bodies[rel] = data
	}
	upper := layerOf(t, []tar.Header{
		{Name: "opt/.wh.gone", Typeflag: tar.TypeReg, Mode: 0o644},
		{Name: "opt/tools/greet", Typeflag: tar.TypeReg, Mode: 0o755},
	}, map[string][]byte{"opt/tools/greet": []byte("#!/usr/bin/bash\necho greetings from the image PATH\n")})
	img, err := mutate.AppendLayers(empty.Image, layerOf(t, lowerEntries, bodies), upper)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", rootfs.Platform.Architecture
	cf.Config = v1.Config{Env: []string{"PATH=/opt/tools:/usr/bin:/bin", "GREETING=" + greeting}, WorkingDir: "/srv/work", User: "1000"}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// bashProgram shows what the image gives a program.
const bashProgram = `echo "greeting=$GREETING"
echo "pwd=$PWD"
echo "uid=$UID"
greet
[[ -e /opt/gone ]] && echo "gone=present" || echo "gone=absent"
echo data > made.txt && echo "wrote=$(< made.txt)"
`

const bashWant = `greeting=hi-from-image
pwd=/srv/work
uid=65534
greetings from the image PATH
gone=absent
wrote=data
`

// serveRegistry serves an in-memory registry on loopback for the test.
func serveRegistry(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// imageArgs puts --cache-dir after the image subcommand.
func imageArgs(cache, sub string, args ...string) []string {
	return append([]string{"image", sub, "--cache-dir", cache}, args...)
}

func TestImagePullAndRun(t *testing.T) {
	binary(t)
	host := serveRegistry(t)
	ref := host + "/team/bash:1"
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, bashImage(t)); err != nil {
		t.Fatalf("push: %v", err)
	}
	cache := filepath.Join(t.TempDir(), "cache")

	start := time.Now()
	res := safeRun(t, "", imageArgs(cache, "pull", "--json", ref)...)
	took := time.Since(start)
	if res.code != 0 {
		t.Fatalf("image pull: exit %d\n%s", res.code, res.stderr)
	}
	var img rootfs.Image
	if err := json.Unmarshal([]byte(res.stdout), &img); err != nil {
		t.Fatalf("image pull --json: %v\n%s", err, res.stdout)
	}
	t.Logf("pulled %s in %v: %d bytes in %d entries, %d whiteouts", ref, took.Round(time.Millisecond), img.Stats.Bytes, img.Stats.Entries, img.Stats.Whiteouts)
	if !strings.Contains(res.stderr, "pulling "+ref) {
		t.Errorf("no progress on stderr: %q", res.stderr)
	}
	if img.Config == nil || img.Config.WorkingDir != "/srv/work" || img.Stats.Whiteouts != 1 {
		t.Errorf("pulled image %+v", img)
	}

	res = safeRun(t, "", "run", "--cache-dir", cache, "--image", ref, "--lang", "bash", "-c", bashProgram)
	if res.code != 0 || res.stdout != bashWant {
		t.Fatalf("run in the pulled image: exit %d\nstdout:\n%s\nwant:\n%s\nstderr: %s", res.code, res.stdout, bashWant, res.stderr)
	}

	// A second pull finds the image in the cache.
	if res := safeRun(t, "", imageArgs(cache, "pull", "--name", "again", ref)...); res.code != 0 {
		t.Fatalf("second pull: exit %d: %s", res.code, res.stderr)
	}
	res = safeRun(t, "", imageArgs(cache, "ls", "--json")...)
	var ls struct{ Images []rootfs.Image }
	if err := json.Unmarshal([]byte(res.stdout), &ls); err != nil || len(ls.Images) != 1 || len(ls.Images[0].Names) != 2 {
		t.Fatalf("image ls --json = %s (%v), want one image with two names", res.stdout, err)
	}

	// Removing both names removes the image; a run then says what to do.
	if res := safeRun(t, "", imageArgs(cache, "rm", "again", ref)...); res.code != 0 {
		t.Fatalf("image rm: exit %d: %s", res.code, res.stderr)
	}
	res = safeRun(t, "", "run", "--cache-dir", cache, "--image", ref, "--lang", "bash", "-c", "true")
	if res.code != exitSandboxError || !strings.Contains(res.stderr, "safe-run image pull "+ref) {
		t.Errorf("run in a removed image: exit %d, stderr %q; want 125 and how to pull it", res.code, res.stderr)
	}
}

// TestImageImportFormats imports the image as a docker save archive and as
// an OCI layout archive, and runs in each.
func TestImageImportFormats(t *testing.T) {
	binary(t)
	img := bashImage(t)
	dir := t.TempDir()
	dockerTar := filepath.Join(dir, "docker.tar")
	tag, _ := name.NewTag("team/bash:docker")
	if err := tarball.WriteToFile(dockerTar, tag, img); err != nil {
		t.Fatal(err)
	}
	ociDir := filepath.Join(dir, "oci")
	p, err := layout.Write(ociDir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "team/bash:oci"})); err != nil {
		t.Fatal(err)
	}
	ociTar := filepath.Join(dir, "oci.tar")
	if out, err := exec.Command("tar", "-C", ociDir, "-cf", ociTar, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v: %s", err, out)
	}
	for _, tt := range []struct{ file, name string }{{dockerTar, tag.String()}, {ociTar, "team/bash:oci"}} {
		t.Run(filepath.Base(tt.file), func(t *testing.T) {
			cache := filepath.Join(t.TempDir(), "cache")
			res := safeRun(t, "", imageArgs(cache, "import", tt.file)...)
			if res.code != 0 || !strings.Contains(res.stderr, "image \""+tt.name+"\"") {
				t.Fatalf("image import: exit %d: %s", res.code, res.stderr)
			}
			res = safeRun(t, "", "run", "--cache-dir", cache, "--image", tt.name, "--lang", "bash", "-c", bashProgram)
			if res.code != 0 || res.stdout != bashWant {
				t.Fatalf("run in the imported image: exit %d\nstdout:\n%s\nstderr: %s", res.code, res.stdout, res.stderr)
			}
		})
	}
}

// TestImageImportMalicious checks that the CLI refuses a hostile image
// with a message that says what is wrong, and keeps nothing of it.
func TestImageImportMalicious(t *testing.T) {
	binary(t)
	for _, tt := range []struct {
		name  string
		entry tar.Header
		args  []string
		want  string
	}{
		{"traversal", tar.Header{Name: "../../../tmp/evil", Typeflag: tar.TypeReg, Mode: 0o644}, nil, "path leaves the image root"},
		{"hard link outside", tar.Header{Name: "passwd", Typeflag: tar.TypeLink, Linkname: "../../etc/passwd"}, nil, "leaves the image root"},
		{"huge file", tar.Header{Name: "big", Typeflag: tar.TypeReg, Mode: 0o644}, []string{"--max-file-size", "1KiB"}, "limit of one file"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			bodies := map[string][]byte{"big": bytes.Repeat([]byte("x"), 4096)}
			img, err := mutate.AppendLayers(empty.Image, layerOf(t, []tar.Header{tt.entry}, bodies))
			if err != nil {
				t.Fatal(err)
			}
			file := filepath.Join(t.TempDir(), "bad.tar")
			tag, _ := name.NewTag("bad:1")
			if err := tarball.WriteToFile(file, tag, img); err != nil {
				t.Fatal(err)
			}
			cache := filepath.Join(t.TempDir(), "cache")
			res := safeRun(t, "", imageArgs(cache, "import", append(tt.args, file)...)...)
			if res.code != exitSandboxError || !strings.Contains(res.stderr, tt.want) {
				t.Errorf("import of a hostile image: exit %d, stderr %q; want 125 and %q", res.code, res.stderr, tt.want)
			}
			if entries, _ := os.ReadDir(filepath.Join(cache, "images")); len(entries) != 0 {
				t.Errorf("the cache kept %d images", len(entries))
			}
			if _, err := os.Lstat("/tmp/evil"); err == nil {
				t.Error("/tmp/evil was written")
			}
		})
	}
}

// TestMCPImageArgument serves MCP with an allowed image: run_code runs in
// it when asked, and refuses any other image.
func TestMCPImageArgument(t *testing.T) {
	binary(t)
	cache := filepath.Join(t.TempDir(), "cache")
	for _, img := range []struct {
		name     string
		greeting string
	}{{"plain", "plain"}, {"team/bash:1", "hi-from-image"}} {
		file := filepath.Join(t.TempDir(), "bash.tar")
		if err := tarball.WriteToFile(file, nil, bashImageGreeting(t, img.greeting)); err != nil {
			t.Fatal(err)
		}
		if res := safeRun(t, "", imageArgs(cache, "import", "--name", img.name, file)...); res.code != 0 {
			t.Fatalf("image import: exit %d: %s", res.code, res.stderr)
		}
	}
	// plain is the default image, with a warm bash sandbox in it; shell is
	// a language the operator maps to the other image.
	ts := startServer(t, "stdio", "--cache-dir", cache, "--image", "plain", "--images", "team/bash:1", "--pool", "bash=1",
		"--languages", `[{"name": "shell", "filename": "run.sh", "command": ["bash", "run.sh"], "image": "team/bash:1"}]`)
	for _, tt := range []struct {
		lang, image, greeting string
	}{
		{"bash", "", "plain"},
		{"bash", "team/bash:1", "hi-from-image"},
		{"shell", "", "hi-from-image"},
		{"bash", "plain", "plain"}, // the language's own image needs no listing
	} {
		args := map[string]any{"language": tt.lang, "code": bashProgram}
		if tt.image != "" {
			args["image"] = tt.image
		}
		want := strings.Replace(bashWant, "hi-from-image", tt.greeting, 1)
		if res, out := ts.mustCall(t, args); res.IsError || out["stdout"] != want {
			t.Errorf("run_code %s in image %q: %s", tt.lang, tt.image, text(res))
		}
	}
	res, _ := ts.mustCall(t, map[string]any{"language": "bash", "code": "true", "image": "other:1"})
	if !res.IsError || !strings.Contains(text(res), `"other:1" is not allowed; use one of team/bash:1`) {
		t.Errorf("run_code in an image not allowed: %s", text(res))
	}
}

// TestLanguagesSetting checks that the config file's list of languages
// reaches the flag as JSON and merges into the defaults.
func TestLanguagesSetting(t *testing.T) {
	f, fs, err := applyConfigFile(t, `{"languages": [{"name": "ruby", "image": "ruby:3.3", "filename": "main.rb", "command": ["ruby", "main.rb"]},
		{"name": "python", "image": "python:3.12-slim"}], "images": ["python:3.12-slim", "ruby:3.3"]}`)
	if err != nil {
		t.Fatalf("applySettings: %v", err)
	}
	langs := f.host.languageTable()
	var got []string
	for _, l := range langs {
		got = append(got, l.Name+"@"+l.Image)
	}
	if want := []string{"python@python:3.12-slim", "node@default", "bash@default", "ruby@ruby:3.3"}; !slices.Equal(got, want) {
		t.Errorf("languages %q, want %q", got, want)
	}
	if f.images != "python:3.12-slim,ruby:3.3" {
		t.Errorf("images %q", f.images)
	}
	for _, bad := range []string{`[{"name": "x"}]`, `[{"name": "ruby", "cmd": ["ruby"]}]`, `{"name": "ruby"}`} {
		if err := fs.Set("languages", bad); err == nil {
			t.Errorf("--languages %s accepted", bad)
		}
	}
}
