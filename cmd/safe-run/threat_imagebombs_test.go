package main

// Threat cases of issue 14.6 and 14.7: images whose archive or
// configuration costs the host CPU, memory or time out of proportion (deep
// nesting, thousands of layers, data after an archive's end, huge ENV and
// configuration), and imports that Ctrl-C could not stop. Every import
// goes to a temporary --cache-dir, never the shared cache.

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/safe-run/safe-run/rootfs"
)

// writeTarGz writes a gzip-compressed tar archive to file, its entries
// given by add, which writes them with tw.
func writeTarGz(t *testing.T, file string, add func(tw *tar.Writer) error) {
	t.Helper()
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	zw, _ := gzip.NewWriterLevel(f, gzip.BestSpeed)
	tw := tar.NewWriter(zw)
	err = add(tw)
	for _, c := range []interface{ Close() error }{tw, zw, f} {
		if cerr := c.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		t.Fatal(err)
	}
}

// withConfig is img with its configuration changed by change.
func withConfig(t *testing.T, img v1.Image, change func(c *v1.Config)) v1.Image {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	change(&cf.Config)
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

// saveImage writes img as a docker save archive in a new directory.
func saveImage(t *testing.T, img v1.Image) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "image.tar")
	tag, _ := name.NewTag("bomb:1")
	if err := tarball.WriteToFile(file, tag, img); err != nil {
		t.Fatal(err)
	}
	return file
}

// layersArchive writes a docker save archive of an image of n layers, by
// hand: the library takes minutes to build one of thousands. Every layer
// is the same one-file tar.
func layersArchive(t *testing.T, n int) string {
	t.Helper()
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	tw.WriteHeader(&tar.Header{Name: "f", Typeflag: tar.TypeReg, Mode: 0o644})
	tw.Close()
	diffID := fmt.Sprintf("sha256:%x", sha256.Sum256(layer.Bytes()))
	layers := make([]string, n)
	diffIDs := make([]string, n)
	for i := range layers {
		layers[i], diffIDs[i] = "layer.tar", diffID
	}
	config, _ := json.Marshal(map[string]any{"architecture": rootfs.Platform.Architecture, "os": "linux",
		"rootfs": map[string]any{"type": "layers", "diff_ids": diffIDs}})
	configName := fmt.Sprintf("%x.json", sha256.Sum256(config))
	manifest, _ := json.Marshal([]map[string]any{{"Config": configName, "RepoTags": []string{"bomb:1"}, "Layers": layers}})
	file := filepath.Join(t.TempDir(), "layers.tar")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := tar.NewWriter(f)
	for _, e := range []struct {
		name string
		data []byte
	}{{"manifest.json", manifest}, {configName, config}, {"layer.tar", layer.Bytes()}} {
		if err := out.WriteHeader(&tar.Header{Name: e.name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(e.data))}); err != nil {
			t.Fatal(err)
		}
		if _, err := out.Write(e.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	return file
}

// manyVars is n variables VAR_0=… to VAR_n-1=….
func manyVars(n int) []string {
	env := make([]string, n)
	for i := range env {
		env[i] = fmt.Sprintf("VAR_%d=value-%d", i, i)
	}
	return env
}

// assertCacheEmpty fails unless the cache holds no image, name or staging.
func assertCacheEmpty(t *testing.T, cache string) {
	t.Helper()
	for _, d := range []string{"images", "names", "staging"} {
		if entries, _ := os.ReadDir(filepath.Join(cache, d)); len(entries) != 0 {
			t.Errorf("the cache's %s/ holds %d entries after a refused import", d, len(entries))
		}
	}
}

// TestThreatImageBombs imports hostile archives through the CLI: each is
// refused with one line naming the limit, and leaves nothing in the cache.
// An ordinary image with a long ENV still imports and runs with it.
func TestThreatImageBombs(t *testing.T) {
	binary(t)
	dir := t.TempDir()
	deep := filepath.Join(dir, "deep.tar.gz")
	writeTarGz(t, deep, func(tw *tar.Writer) error {
		p := ""
		for range 8000 {
			p += "d/"
			if err := tw.WriteHeader(&tar.Header{Name: p, Typeflag: tar.TypeDir, Mode: 0o755}); err != nil {
				return err
			}
		}
		return nil
	})
	var trailing bytes.Buffer
	tw := tar.NewWriter(&trailing)
	tw.WriteHeader(&tar.Header{Name: "f", Typeflag: tar.TypeReg, Mode: 0o644})
	tw.Close()
	trailing.Write(make([]byte, 64<<20)) // 64 MiB of zeros: 64 KiB compressed
	// From an opener, not LayerFromReader, which copies the bytes to a file
	// in $TMPDIR that it never removes (64 MiB left there per run).
	junkLayer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(trailing.Bytes())), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	junk, err := mutate.AppendLayers(empty.Image, junkLayer)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, file, want string
	}{
		{"8000 levels of directories", deep, "path of 129 components is deeper than the limit of 128"},
		{"3001 layers", layersArchive(t, 3001), "the image has 3001 layers, more than the limit of 256"},
		{"64 MiB after a layer's end", saveImage(t, junk), "after its end-of-archive marker"},
		{"20,000 ENV variables", saveImage(t, withConfig(t, bashImage(t), func(c *v1.Config) { c.Env = manyVars(20_000) })),
			"the image's ENV has 20000 variables, more than the limit of 1024"},
		{"a 5 MiB configuration", saveImage(t, withConfig(t, bashImage(t), func(c *v1.Config) {
			c.Labels = map[string]string{"junk": strings.Repeat("x", 5<<20)}
		})), "over the limit of 4194304"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cache := filepath.Join(t.TempDir(), "cache")
			res := safeRun(t, "", imageArgs(cache, "import", "--name", "bomb", tt.file)...)
			if res.code != exitSandboxError || !strings.Contains(res.stderr, tt.want) {
				t.Fatalf("import: exit %d, stderr %q; want %d and %q", res.code, res.stderr, exitSandboxError, tt.want)
			}
			if lines := strings.Count(strings.TrimSpace(res.stderr), "\n"); len(res.stderr) > 2000 {
				t.Errorf("the refusal is %d bytes in %d lines, want one short line", len(res.stderr), lines+1)
			}
			assertCacheEmpty(t, cache)
		})
	}
	// Positive control: 1000 variables are within the caps, and a run in
	// the image sees the last of them over the base environment.
	t.Run("control: 1000 ENV variables", func(t *testing.T) {
		cache := filepath.Join(t.TempDir(), "cache")
		file := saveImage(t, withConfig(t, bashImage(t), func(c *v1.Config) { c.Env = append(c.Env, manyVars(998)...) }))
		if res := safeRun(t, "", imageArgs(cache, "import", "--name", "long-env", file)...); res.code != 0 {
			t.Fatalf("import: exit %d: %s", res.code, res.stderr)
		}
		res := safeRun(t, "", "run", "--cache-dir", cache, "--image", "long-env", "--lang", "bash", "-c", `echo "$GREETING $VAR_997 $LANG"`)
		if res.code != 0 || res.stdout != "hi-from-image value-997 C.UTF-8\n" {
			t.Fatalf("run: exit %d, stdout %q, stderr %s", res.code, res.stdout, res.stderr)
		}
	})
}

// TestThreatImageImportInterrupted interrupts a long import with SIGINT
// (Ctrl-C) and SIGTERM once it has begun writing: the import stops, says
// so, and leaves neither an image, nor its name, nor staging behind.
func TestThreatImageImportInterrupted(t *testing.T) {
	bin := binary(t)
	archive := filepath.Join(t.TempDir(), "slow.tar.gz")
	writeTarGz(t, archive, func(tw *tar.Writer) error {
		body := []byte("x")
		for i := range 300_000 {
			if err := tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("d%03d/f%d", i%500, i), Typeflag: tar.TypeReg, Mode: 0o644, Size: 1}); err != nil {
				return err
			}
			if _, err := tw.Write(body); err != nil {
				return err
			}
		}
		return nil
	})
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			cache := filepath.Join(t.TempDir(), "cache")
			cmd := exec.Command(bin, imageArgs(cache, "import", "--name", "slow", archive)...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			// Wait until the import has written part of the image.
			for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
				roots, _ := filepath.Glob(filepath.Join(cache, "staging", "import-*", "rootfs", "d*"))
				if len(roots) >= 10 {
					break
				}
				select {
				case err := <-exited:
					t.Fatalf("the import ended (%v) before it could be interrupted: %s", err, stderr.String())
				default:
				}
				if time.Now().After(deadline) {
					cmd.Process.Kill()
					t.Fatal("the import wrote nothing in two minutes")
				}
			}
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			select {
			case <-exited:
			case <-time.After(2 * time.Minute):
				cmd.Process.Kill()
				<-exited
				t.Fatalf("the import went on for two minutes after %v: %s", sig, stderr.String())
			}
			if code := cmd.ProcessState.ExitCode(); code == 0 || !strings.Contains(stderr.String(), "context canceled") {
				t.Errorf("interrupted import: exit %d, stderr %q; want a failure saying it was cancelled", code, stderr.String())
			}
			assertCacheEmpty(t, cache)
		})
	}
}
