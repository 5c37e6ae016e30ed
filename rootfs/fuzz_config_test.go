package rootfs

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
)

// configImage is an image whose configuration blob is raw, whatever it is.
type configImage struct {
	v1.Image
	raw []byte
}

func (c configImage) RawConfigFile() ([]byte, error) { return c.raw, nil }

func (c configImage) ConfigFile() (*v1.ConfigFile, error) {
	return v1.ParseConfigFile(bytes.NewReader(c.raw))
}

// Per-input bounds of FuzzImageConfig: checking a configuration or an
// image.json is one decode of at most a few MiB; more time or memory than
// this is the kind of bomb the caps are for.
const (
	fuzzInputTime  = 10 * time.Second
	fuzzInputAlloc = 64 << 20
)

// FuzzImageConfig feeds arbitrary bytes to the two parsers of image
// metadata: an image's configuration blob, as import checks it, and an
// image.json, as a lookup reads it. Neither may panic, take more than
// fuzzInputTime or allocate more than fuzzInputAlloc plus 64 bytes per input
// byte, and whatever either accepts is within the caps.
func FuzzImageConfig(f *testing.F) {
	f.Add([]byte(`{"os":"linux","config":{"Env":["PATH=/usr/bin","A=b"],"WorkingDir":"/srv"},"rootfs":{"type":"layers","diff_ids":[]}}`))
	f.Add([]byte(`{"config":{"Env":["` + strings.Repeat(`X=y","`, 1100) + `Z=1"]}}`))
	f.Add([]byte(`{"key":"k","root":"/r","config":{"env":["A=1"]},"mountpoints":{"dirs":["/tmp"]}}`))
	f.Add([]byte(`{"rootfs":{"diff_ids":["sha256:` + strings.Repeat("0", 64) + `"]}}`))
	dir := f.TempDir()
	file := filepath.Join(dir, "image.json")
	f.Fuzz(func(t *testing.T, data []byte) {
		done := make(chan struct{})
		defer close(done)
		go func() {
			select {
			case <-done:
			case <-time.After(fuzzInputTime):
				// Another goroutine cannot fail the test: crash, so the
				// fuzzer keeps the input.
				panic("an input of image metadata took over " + fuzzInputTime.String())
			}
		}()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)

		if err := checkImage(configImage{empty.Image, data}, ExtractLimits{}); err == nil {
			cf, _ := v1.ParseConfigFile(bytes.NewReader(data))
			if len(data) > MaxConfigBytes || checkEnv(cf.Config.Env) != nil || len(cf.RootFS.DiffIDs) > DefaultExtractLimits.MaxLayers {
				t.Errorf("checkImage accepted a configuration over the caps (%d bytes, %d variables, %d layers)", len(data), len(cf.Config.Env), len(cf.RootFS.DiffIDs))
			}
		}
		if err := os.WriteFile(file, data, 0o644); err != nil {
			t.Fatal(err)
		}
		metadataCache.Lock()
		delete(metadataCache.m, file)
		metadataCache.Unlock()
		if img, err := readMetadata(file); err == nil && img.Config != nil && checkEnv(img.Config.Env) != nil {
			t.Errorf("readMetadata accepted an ENV over the caps: %d variables", len(img.Config.Env))
		}

		runtime.ReadMemStats(&after)
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > fuzzInputAlloc+64*uint64(len(data)) {
			t.Errorf("an input of %d bytes allocated %d bytes", len(data), alloc)
		}
	})
}
