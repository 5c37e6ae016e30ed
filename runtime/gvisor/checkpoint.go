package gvisor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/safe-run/safe-run/bundle"
	"github.com/safe-run/safe-run/runtime/engine"
)

// Checkpoint images live in the engine's pool checkpoint directory, one
// per key (see checkpointKey), each sealed with this host's key (seal.go):
// an image is restored only if its seal holds.

// checkpointDone marks a complete checkpoint image. It is written last,
// and an image directory gets its final name only after it, so a build
// that was interrupted is never restored from.
const checkpointDone = "safe-run-checkpoint.json"

// imagePath is where the image for spec and tag lives.
func (g *Backend) imagePath(spec engine.StartSpec, tag string) (string, error) {
	if g.cfg.CheckpointDir == "" {
		return "", engine.ErrNoCheckpoints
	}
	key, err := g.checkpointKey(spec, tag)
	if err != nil {
		return "", err
	}
	return filepath.Join(g.cfg.CheckpointDir, key), nil
}

// FindCheckpoint returns the complete image for spec and tag, or "".
func (g *Backend) FindCheckpoint(spec engine.StartSpec, tag string) (string, error) {
	dir, err := g.imagePath(spec, tag)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(dir, checkpointDone)); err == nil {
		return dir, nil
	}
	return "", nil
}

// What a restore of the Python pool's image costs, and the runsc options
// that do not change it, as measured here (2026-12-05, systrap, 2 shared
// CPUs, `bench -cpu -baseline`, restore + prime CPU p50 side by side with
// the same build without the option; noise ±10 ms):
//
//   - The image: 62.8 MB of pages.img, not one of its 15,325 pages zero
//     (so `checkpoint --exclude-committed-zero-pages` has nothing to drop),
//     and a 0.47 MB checkpoint.img. `--compression` is none by default.
//   - `restore --background`: 217 vs 220 ms. This runsc already loads the
//     pages asynchronously ("async loading 62783488 bytes" in its log).
//   - `restore --direct` (O_DIRECT reads of pages.img): 258 vs 217 ms.
//   - `--dcache 64` (fewer cached dentries in the saved kernel): 235 vs
//     241 ms. GOGC=400 in runsc's environment: 232 vs 231 ms.
//   - Where the sentry's CPU goes (a CPU profile of five restores): decoding
//     the kernel state ~34 ms a restore, reading the pages ~30 ms, each
//     task's seccomp cache rebuilt on load ~1.4 ms a task (10 tasks: the
//     agent's 8 threads and Python's 2), installing its own seccomp filter
//     and creating the systrap platform ~6 ms each.
//   - The monitor's trace session passed to restore: --monitor off 224 vs
//     217 ms with it.
//   - `--systrap-disable-fast-path` on every start and restore (2026-12-06;
//     each figure with the fast path off vs on, in turns): restore + prime
//     CPU 680 vs 684 ms; warm MCP print(1) p50 13.3 vs 14.0 ms, 15.5 vs 17.0
//     after 1 s at rest, and 9.4-13.3 vs 11.6-13.1 in three more rounds;
//     pool-on throughput 4-9 % higher (one round); cold runs alike (1.54
//     vs 1.52 × raw). Within this machine's noise, so not adopted. (A first
//     three rounds had given 12 vs 18 ms; that did not repeat.)

// Checkpoint saves sb with `runsc checkpoint` (which ends it) into a
// staging directory, seals it and gives it its final name.
func (g *Backend) Checkpoint(ctx context.Context, sb engine.Sandbox, spec engine.StartSpec, tag string) (string, error) {
	sp, ok := sb.(*sandboxProc)
	if !ok || sp.g != g {
		return "", fmt.Errorf("checkpoint %s: not a sandbox of this backend", sb.ID())
	}
	dir, err := g.imagePath(spec, tag)
	if err != nil {
		return "", err
	}
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return "", fmt.Errorf("create checkpoint directory: %w", err)
	}
	g.pruneCheckpoints(parent)
	staging, err := os.MkdirTemp(parent, filepath.Base(dir)+partialSuffix)
	if err != nil {
		return "", fmt.Errorf("create checkpoint directory: %w", err)
	}
	defer os.RemoveAll(staging) // a no-op once renamed
	if _, err := g.runsc(ctx, sp.runscRoot(), "checkpoint", "--image-path", staging, sp.id); err != nil {
		return "", err
	}
	meta, _ := json.Marshal(map[string]any{"tag": tag, "created": time.Now().UTC()})
	if err := os.WriteFile(filepath.Join(staging, checkpointDone), meta, 0o600); err != nil {
		return "", fmt.Errorf("write checkpoint image: %w", err)
	}
	sealK, err := sealKey(checkpointKeyPath(g.cfg.StateDir))
	if err != nil {
		return "", err
	}
	if err := sealCheckpoint(staging, sealK); err != nil {
		return "", err
	}
	if err := os.Rename(staging, dir); err != nil {
		if _, statErr := os.Stat(filepath.Join(dir, checkpointDone)); statErr == nil {
			return dir, nil // another safe-run built it meanwhile
		}
		return "", fmt.Errorf("store checkpoint image: %w", err)
	}
	return dir, nil
}

// Restore starts a sandbox for spec from image, once its seal is checked.
func (g *Backend) Restore(spec engine.StartSpec, image string) (engine.Sandbox, error) {
	key, err := sealKey(checkpointKeyPath(g.cfg.StateDir))
	if err != nil {
		return nil, err
	}
	if err := verifyCheckpoint(image, key); err != nil {
		return nil, err
	}
	sp, err := g.startSandbox(spec, image)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	_ = os.Chtimes(image, now, now) // in use: not to be pruned
	return sp, nil
}

// Forget removes an image a restore failed from.
func (g *Backend) Forget(image string) error { return os.RemoveAll(image) }

// partialSuffix names image directories still being written.
const partialSuffix = ".partial-"

// Checkpoint images are ~40 MiB and a new agent or runsc binary makes new
// ones, so old ones are pruned whenever one is built: a directory that a
// build which died left half-written, once it is older than partialAge (a
// younger one may still be written), and a complete image no restore has
// used for unusedAge (each restore refreshes its time). A server that still
// needed a pruned image rebuilds it after its first failed restore.
const (
	partialAge = time.Hour
	unusedAge  = 7 * 24 * time.Hour
)

// pruneCheckpoints removes half-written and unused images below dir.
func (g *Backend) pruneCheckpoints(dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil || !e.IsDir() {
			continue
		}
		age := time.Since(fi.ModTime())
		if strings.Contains(e.Name(), partialSuffix) && age > partialAge || age > unusedAge {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				g.log.Warn("remove old checkpoint image", "image", e.Name(), "err", err)
			}
		}
	}
}

// checkpointKey names an image by everything a restore depends on: the
// sandbox's configuration (which restore compares strictly, and which names
// the image's root directory), what the engine warmed in it (tag: the
// language and its preloads), the platform, and the exact agent and runsc
// binaries (by file identity).
func (g *Backend) checkpointKey(spec engine.StartSpec, tag string) (string, error) {
	cfg, err := g.bundleConfig(spec.Job, false)
	if err != nil {
		return "", err
	}
	oci, err := bundle.Build(spec.Job, cfg)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	enc := json.NewEncoder(h)
	if err := enc.Encode([]any{"v2", oci, tag, g.cfg.Platform}); err != nil {
		return "", err
	}
	for _, f := range []string{g.cfg.Agent, g.cfg.Runsc} {
		id, err := fileIdentity(f)
		if err != nil {
			return "", fmt.Errorf("checkpoint key: %w", err)
		}
		fmt.Fprintln(h, id)
	}
	return spec.Job.Language + "-" + hex.EncodeToString(h.Sum(nil))[:16], nil
}

// fileIdentity names the exact file at path by its place and stat: a
// rebuilt or replaced binary gets another. It reads no content — hashing
// runsc's 100 MB would cost a `run --warm` over half a second each time.
func fileIdentity(path string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return "", fmt.Errorf("stat %s: %w", path, err)
	}
	return fmt.Sprintf("%s dev=%d ino=%d size=%d mtime=%d.%09d", path, st.Dev, st.Ino, st.Size, st.Mtim.Sec, st.Mtim.Nsec), nil
}
