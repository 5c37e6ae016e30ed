package rootfs

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// nested is depth directory entries, each inside the one before.
func nested(depth int) []tarEntry {
	var entries []tarEntry
	p := ""
	for range depth {
		p += "d/"
		entries = append(entries, dirEntry(p, 0o755))
	}
	return entries
}

// TestExtractDepthBomb checks that deep nesting is refused at the depth
// limit, after as many entries, not walked to its end: 8000 levels took two
// minutes of quadratic work, and PAX names allow half a million.
func TestExtractDepthBomb(t *testing.T) {
	for _, tt := range []struct {
		name    string
		entries []tarEntry
		want    string // "" means extracted
	}{
		{"129 levels", nested(129), "deeper than the limit of 128"},
		{"128 levels", nested(128), ""},
		{"one file 2000 levels down", []tarEntry{regEntry(strings.Repeat("d/", 2000)+"f", 0o644, "x")}, "path of 2001 components is deeper than the limit of 128"},
		{"a name of 500,000 bytes", []tarEntry{regEntry(strings.Repeat("d/", 250_000)+"f", 0o644, "x")}, "more than 4096 bytes"},
		{"a link target of 8 KiB", []tarEntry{symlinkEntry("l", strings.Repeat("x/", 4096))}, "more than 4096 bytes"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, _, st, err := extractTar(t, makeTar(t, tt.entries...), ExtractLimits{MaxBytes: 1 << 20, MaxEntries: 10_000})
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Extract: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Extract = %v, want an error saying %q", err, tt.want)
			}
			if st.Entries > 128 {
				t.Errorf("wrote %d entries before refusing, want at most 128", st.Entries)
			}
		})
	}
}

// TestExtractDepthBomb8000 streams the 8000 levels that took two minutes:
// the extractor refuses the 129th and reads no further.
func TestExtractDepthBomb8000(t *testing.T) {
	pr, pw := io.Pipe()
	var written atomic.Int64
	go func() {
		tw := tar.NewWriter(pw)
		p := ""
		for range 8000 {
			p += "d/"
			if err := tw.WriteHeader(&tar.Header{Name: p, Typeflag: tar.TypeDir, Mode: 0o755, ModTime: testTime}); err != nil {
				return // the extractor stopped reading
			}
			written.Add(1)
		}
		pw.CloseWithError(tw.Close())
	}()
	_, dst := newDst(t)
	st, err := Extract(pr, dst, ExtractLimits{MaxBytes: 1 << 20, MaxEntries: 10_000})
	pr.CloseWithError(errors.New("extraction over"))
	if err == nil || !strings.Contains(err.Error(), "path of 129 components is deeper than the limit of 128") {
		t.Fatalf("Extract of 8000 levels = %v, want refused at 129", err)
	}
	if st.Entries != 128 {
		t.Errorf("wrote %d entries, want the 128 within the limit", st.Entries)
	}
	// The pipe holds no more than the extractor's 1 MiB buffer asked for.
	if n := written.Load(); n > 1000 {
		t.Errorf("the extractor read %d of the 8000 levels, want it to stop at the 129th", n)
	}
	if len(err.Error()) > 400 {
		t.Errorf("error of %d bytes, want one short line", len(err.Error()))
	}
}

// TestExtractTrailingData checks that what follows a compressed archive's
// or a layer's end marker is read only up to maxTrailingBytes, not
// decompressed to its end, while real padding is still read through.
func TestExtractTrailingData(t *testing.T) {
	archive := makeTar(t, imageEntries...)
	junk := make([]byte, 16<<20) // incompressible: its compressed bytes show how far it was read
	if _, err := rand.Read(junk); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name    string
		data    []byte
		refused bool
	}{
		{"gzip, 16 MiB after the end", gzipBytes(t, append(bytes.Clone(archive), junk...)), true},
		{"gzip, 10 KiB of padding", gzipBytes(t, append(bytes.Clone(archive), make([]byte, 10240)...)), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, dst := newDst(t)
			cr := &countingReader{r: bytes.NewReader(tt.data)}
			_, err := Extract(cr, dst, testLimits)
			if tt.refused != (err != nil) || err != nil && !strings.Contains(err.Error(), "after its end-of-archive marker") {
				t.Fatalf("Extract = %v, want refused %v", err, tt.refused)
			}
			if limit := int64(len(archive)) + 3<<20; tt.refused && cr.n.Load() > limit {
				t.Errorf("read %d bytes of the archive, want at most %d: the end marker plus the allowance and a buffer", cr.n.Load(), limit)
			}
		})
	}
	// A layer is an uncompressed stream whose decompression is the
	// library's: it is read no further either.
	t.Run("layer", func(t *testing.T) {
		var read *countingReader
		layer := func() (io.ReadCloser, error) {
			read = &countingReader{r: io.MultiReader(bytes.NewReader(archive), zeros{})} // never ends
			return io.NopCloser(read), nil
		}
		_, dst := newDst(t)
		_, err := ExtractLayers(dst, testLimits, []func() (io.ReadCloser, error){layer})
		if err == nil || !strings.Contains(err.Error(), "after its end-of-archive marker") {
			t.Fatalf("ExtractLayers = %v, want the trailing data refused", err)
		}
		if limit := int64(len(archive)) + 3<<20; read.n.Load() > limit {
			t.Errorf("read %d bytes of the layer, want at most %d", read.n.Load(), limit)
		}
	})
}

// zeros reads as an endless run of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// openCounter counts the layers opened.
type openCounter struct{ n atomic.Int64 }

func (c *openCounter) layers(n int) []func() (io.ReadCloser, error) {
	opens := make([]func() (io.ReadCloser, error), n)
	for i := range opens {
		opens[i] = func() (io.ReadCloser, error) {
			c.n.Add(1)
			return io.NopCloser(bytes.NewReader(makeTarBytes())), nil
		}
	}
	return opens
}

// makeTarBytes is an empty tar archive: its end marker.
func makeTarBytes() []byte { return make([]byte, 1024) }

// TestLayerCountBomb checks that an image of too many layers is refused
// before any is opened: 3001 layers took 85 s.
func TestLayerCountBomb(t *testing.T) {
	for _, tt := range []struct {
		layers int
		ok     bool
	}{{3001, false}, {257, false}, {256, true}} {
		t.Run(fmt.Sprint(tt.layers), func(t *testing.T) {
			var c openCounter
			_, dst := newDst(t)
			_, err := ExtractLayers(dst, testLimits, c.layers(tt.layers))
			if tt.ok {
				if err != nil || c.n.Load() != int64(tt.layers) {
					t.Fatalf("ExtractLayers of %d layers = %v after %d opened", tt.layers, err, c.n.Load())
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), "more than the limit of 256") || c.n.Load() != 0 {
				t.Fatalf("ExtractLayers of %d layers = %v after %d opened, want refused before any", tt.layers, err, c.n.Load())
			}
		})
	}
	// Through an image, from its configuration, before its layers are
	// listed or opened.
	l := testLayer(t, regEntry("f", 0o644, "x"))
	layers := make([]v1.Layer, 300)
	for i := range layers {
		layers[i] = l
	}
	s := newStore(t)
	_, err := s.ImportImage(context.Background(), "img", testImage(t, v1.Config{}, layers...), "test", ImportOptions{})
	if err == nil || !strings.Contains(err.Error(), "the image has 300 layers, more than the limit of 256") {
		t.Fatalf("ImportImage of 300 layers = %v", err)
	}
	if names := dirNames(t, filepath.Join(s.Dir, "staging")); len(names) != 0 {
		t.Errorf("staging holds %q", names)
	}
}

// envOf is n variables of size bytes each.
func envOf(n, size int) []string {
	env := make([]string, n)
	for i := range env {
		v := fmt.Sprintf("V%d=", i)
		env[i] = v + strings.Repeat("x", max(0, size-len(v)))
	}
	return env
}

// TestImageConfigBombs checks the caps on an image's configuration, at
// import from an image, a docker save archive and a registry.
func TestImageConfigBombs(t *testing.T) {
	layer := testLayer(t, imageEntries...)
	huge := v1.Config{Labels: map[string]string{"junk": strings.Repeat("x", MaxConfigBytes)}}
	for _, tt := range []struct {
		name string
		cfg  v1.Config
		want string // "" means imported
	}{
		{"20,000 variables", v1.Config{Env: envOf(20_000, 10)}, "20000 variables, more than the limit of 1024"},
		{"1025 variables", v1.Config{Env: envOf(1025, 10)}, "more than the limit of 1024"},
		{"1024 variables", v1.Config{Env: envOf(1024, 200)}, ""},
		{"a 33 KiB variable", v1.Config{Env: []string{"PATH=/bin", "BIG=" + strings.Repeat("x", 33<<10)}}, `variable "BIG" is 33796 bytes, over the limit of 32768`},
		{"300 KiB in all", v1.Config{Env: envOf(10, 30<<10)}, "ENV is 307200 bytes, over the limit of 262144"},
		{"a 4 MiB configuration", huge, "over the limit of 4194304"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			img := testImage(t, tt.cfg, layer)
			check := func(t *testing.T, s Store, err error) {
				t.Helper()
				if tt.want == "" {
					if err != nil {
						t.Fatalf("import: %v", err)
					}
					return
				}
				if err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("import = %v, want an error saying %q", err, tt.want)
				}
				if names := dirNames(t, filepath.Join(s.Dir, "images")); len(names) != 0 {
					t.Errorf("images/ holds %q", names)
				}
				if names := dirNames(t, filepath.Join(s.Dir, "staging")); len(names) != 0 {
					t.Errorf("staging holds %q", names)
				}
			}
			t.Run("image", func(t *testing.T) {
				s := newStore(t)
				_, err := s.ImportImage(context.Background(), "img", img, "test", ImportOptions{})
				check(t, s, err)
			})
			t.Run("docker archive", func(t *testing.T) {
				file := filepath.Join(t.TempDir(), "docker.tar")
				tag, _ := name.NewTag("team/bomb:1")
				if err := tarball.WriteToFile(file, tag, img); err != nil {
					t.Fatal(err)
				}
				s := newStore(t)
				_, err := s.ImportFile(context.Background(), "", file, ImportOptions{})
				check(t, s, err)
			})
			t.Run("registry", func(t *testing.T) {
				ref := newRegistry(t, nil) + "/team/bomb:1"
				push(t, ref, img)
				s := newStore(t)
				_, err := s.Pull(context.Background(), ref, ref, ImportOptions{})
				check(t, s, err)
			})
		})
	}
}

// installed imports a small image with an ENV and returns the store and
// the path of its image.json.
func installed(t *testing.T) (Store, string) {
	t.Helper()
	s := newStore(t)
	img, err := s.ImportImage(context.Background(), "img", testImage(t, v1.Config{Env: []string{"A=1"}}, testLayer(t, imageEntries...)), "test", ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return s, filepath.Join(filepath.Dir(img.Root), "image.json")
}

// TestStoreRefusesHugeMetadata checks that an image.json in the cache
// over its cap, or with an ENV over the caps, is refused at lookup with a
// hint to re-import, instead of being read and decoded at every run.
func TestStoreRefusesHugeMetadata(t *testing.T) {
	for _, tt := range []struct {
		name   string
		change func(m map[string]any)
		want   string
	}{
		{"5 MiB", func(m map[string]any) { m["source"] = strings.Repeat("x", 5<<20) }, "over the limit of 4194304"},
		{"20,000 variables", func(m map[string]any) { m["config"] = map[string]any{"env": envOf(20_000, 10)} }, "more than the limit of 1024"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, file := installed(t)
			var m map[string]any
			if err := jsonRead(file, &m); err != nil {
				t.Fatal(err)
			}
			tt.change(m)
			if err := jsonWrite(file, m); err != nil {
				t.Fatal(err)
			}
			_, err := s.Lookup("img")
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "re-import it") {
				t.Fatalf("Lookup = %v, want an error saying %q and to re-import", err, tt.want)
			}
		})
	}
}

// TestStoreCachesMetadata checks that a lookup takes the parsed image.json
// from the cache while the file is the same, and reads it again once it
// changes; and that what a lookup returns is the caller's own.
func TestStoreCachesMetadata(t *testing.T) {
	s, file := installed(t)
	first, err := s.Lookup("img")
	if err != nil {
		t.Fatal(err)
	}
	// Mark the cached copy: a lookup that returns the mark used the cache.
	metadataCache.Lock()
	c, ok := metadataCache.m[file]
	if ok {
		c.img.Source = "from the cache"
		metadataCache.m[file] = c
	}
	metadataCache.Unlock()
	if !ok {
		t.Fatalf("nothing cached for %s", file)
	}
	got, err := s.Lookup("img")
	if err != nil || got.Source != "from the cache" {
		t.Fatalf("second Lookup = %q, %v; want the cached copy", got.Source, err)
	}
	got.Config.Env[0] = "A=changed"
	if again, _ := s.Lookup("img"); again.Config.Env[0] != "A=1" {
		t.Errorf("a caller's change reached the cache: Env %q", again.Config.Env)
	}
	// Rewritten in place, same size: ctime and mtime change.
	var m map[string]any
	if err := jsonRead(file, &m); err != nil {
		t.Fatal(err)
	}
	m["source"] = strings.Repeat("y", len(first.Source))
	if err := jsonWrite(file, m); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Lookup("img"); err != nil || got.Source != m["source"] {
		t.Fatalf("Lookup after a change = %q, %v; want the file's %q", got.Source, err, m["source"])
	}
}

// TestImportCancelled cancels imports halfway, as Ctrl-C does: each stops
// within a read of the cancellation, not at the end of its archive or
// layer, and leaves nothing in staging.
func TestImportCancelled(t *testing.T) {
	var big []tarEntry
	for i := range 64 {
		big = append(big, regEntry(fmt.Sprintf("data/f%d", i), 0o644, strings.Repeat("x", 256<<10)))
	}
	archive := makeTar(t, big...) // 16 MiB
	const bound = 4 << 20         // the extractor's buffer and a file's body
	t.Run("root file system archive", func(t *testing.T) {
		s := newStore(t)
		file := writeFile(t, "big.tar", archive)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var at int64 = -1
		var last int64
		progress := func(done, _ int64) {
			last = done
			if at < 0 && done > 1<<20 {
				at = done
				cancel()
			}
		}
		_, err := s.ImportFile(ctx, "img", file, ImportOptions{Progress: progress})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("ImportFile cancelled = %v, want context.Canceled", err)
		}
		if last-at > bound {
			t.Errorf("read %d bytes after the cancellation, want at most %d", last-at, bound)
		}
		checkNothingLeft(t, s)
	})
	t.Run("image layer", func(t *testing.T) {
		s := newStore(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var read countingReader
		l := cancellingLayer{testLayer(t, big...), &read, cancel}
		_, err := s.ImportImage(ctx, "img", testImage(t, v1.Config{}, l), "test", ImportOptions{})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("ImportImage cancelled = %v, want context.Canceled", err)
		}
		if n := read.n.Load(); n > 1<<20+bound {
			t.Errorf("read %d bytes of the layer, want at most %d after the cancellation at 1 MiB", n, 1<<20+bound)
		}
		checkNothingLeft(t, s)
	})
}

// checkNothingLeft fails unless s has no image, name or staging left.
func checkNothingLeft(t *testing.T, s Store) {
	t.Helper()
	for _, d := range []string{"images", "names", "staging"} {
		if names := dirNames(t, filepath.Join(s.Dir, d)); len(names) != 0 {
			t.Errorf("%s/ holds %q", d, names)
		}
	}
}

// cancellingLayer cancels once 1 MiB of it has been read, counting in read.
type cancellingLayer struct {
	v1.Layer
	read   *countingReader
	cancel func()
}

func (l cancellingLayer) Uncompressed() (io.ReadCloser, error) {
	rc, err := l.Layer.Uncompressed()
	if err != nil {
		return nil, err
	}
	l.read.r = rc
	return struct {
		io.Reader
		io.Closer
	}{readerFunc(func(p []byte) (int, error) {
		n, err := l.read.Read(p)
		if l.read.n.Load() > 1<<20 {
			l.cancel()
		}
		return n, err
	}), rc}, nil
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

func jsonRead(file string, v any) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	return json.Unmarshal(data, v)
}

func jsonWrite(file string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return os.WriteFile(file, data, 0o644)
}
