package runtime

import (
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
)

// A warm sandbox takes a cold start and its preloads to get ready — about
// 1.1 s with pandas inside gVisor — while restoring a checkpoint of one
// takes a fraction of that. So the pool checkpoints one warm sandbox per
// language and restores its refills from that image. Every restored
// sandbox is still used for one run only.

// checkpointState is what the pool knows of a language's checkpoint image.
// One goroutine at a time touches it: the filler, or with OnDemand (which
// has no filler) the run restoring under the pool's starting lock.
type checkpointState struct {
	image    string // the image directory, once built or found
	disabled string // why this language refills cold, once that is decided
	failures int    // restores failed since the image was built
}

// checkpointDone marks a complete checkpoint image. It is written last,
// and an image directory gets its final name only after it, so a build
// that was interrupted is never restored from.
const checkpointDone = "safe-run-checkpoint.json"

// checkpointable says whether sandboxes of lang may be cloned from one
// checkpoint. Restored sandboxes share the memory of the one that was
// checkpointed, random generators included. The Python warm driver
// reseeds those its preloads created (random, numpy's global generator,
// tempfile's names) once the run is known. V8's Math.random and OpenSSL's
// generator inside Node cannot be reseeded from JavaScript, so Node
// sandboxes always start cold; a Bash sandbox has nothing warm to save.
func checkpointable(interpreter string) bool { return interpreter == "python" }

// checkpoint returns the image pooled sandboxes of pl are restored from,
// building it on first use; "" means start them cold.
func (p *pool) checkpoint(pl *poolLang) string {
	if p.cfg.CheckpointDir == "" || pl.ckpt.disabled != "" {
		return ""
	}
	if !checkpointable(pl.lang.Interpreter) {
		pl.ckpt.disabled = "its interpreter's random state cannot be reseeded after a restore"
		return ""
	}
	if pl.ckpt.image != "" {
		return pl.ckpt.image
	}
	start := time.Now()
	image, built, err := p.buildCheckpoint(pl)
	if err != nil {
		if p.ctx.Err() == nil {
			pl.ckpt.disabled = err.Error()
			p.rt.log.Warn("warm pool: no checkpoint; refills start cold", "language", pl.lang.Name, "err", err)
		}
		return ""
	}
	if built {
		p.rt.log.Info("warm pool: checkpoint built", "language", pl.lang.Name, "image", image, "ms", time.Since(start).Milliseconds())
	}
	pl.ckpt.image = image
	return image
}

// restoreFailed forgets an image a restore failed from: it is rebuilt once,
// and after a second failure the language refills cold.
func (p *pool) restoreFailed(pl *poolLang, image string, err error) {
	if p.ctx.Err() != nil {
		return
	}
	pl.ckpt.failures++
	pl.ckpt.image = ""
	p.rt.log.Warn("warm pool: restore failed", "language", pl.lang.Name, "image", image, "err", err)
	if rmErr := os.RemoveAll(image); rmErr != nil {
		p.rt.log.Error("remove checkpoint image", "image", image, "err", rmErr)
	}
	if pl.ckpt.failures >= 2 {
		pl.ckpt.disabled = "restores failed twice: " + err.Error()
	}
}

// restore starts a sandbox from image, once its seal is checked, and
// checks that its agent answers.
func (p *pool) restore(pl *poolLang, image string) (*sandboxProc, error) {
	key, err := sealKey(checkpointKeyPath(p.rt.cfg.StateDir))
	if err != nil {
		return nil, err
	}
	if err := verifyCheckpoint(image, key); err != nil {
		return nil, err
	}
	sp, err := p.rt.startSandbox(pl.job, true, image)
	if err != nil {
		return nil, err
	}
	// The restored agent sent its Ready before the checkpoint. Warming
	// again proves that it answers, and primes the interpreter: restored
	// memory is mapped back page by page as it is first touched, which
	// would otherwise slow the run.
	if err := p.warm(sp, pl); err != nil {
		_ = sp.destroy()
		return nil, fmt.Errorf("restore from %s: %w", image, err)
	}
	sp.mark("restored")
	sp.observeStart()
	now := time.Now()
	_ = os.Chtimes(image, now, now) // in use: not to be pruned
	return sp, nil
}

// buildCheckpoint returns the directory of pl's checkpoint image, and
// whether it had to be built: a warm sandbox started cold, then
// checkpointed (which ends it).
func (p *pool) buildCheckpoint(pl *poolLang) (dir string, built bool, err error) {
	key, err := p.checkpointKey(pl)
	if err != nil {
		return "", false, err
	}
	dir = filepath.Join(p.cfg.CheckpointDir, key)
	if _, err := os.Stat(filepath.Join(dir, checkpointDone)); err == nil {
		return dir, false, nil
	}
	if err := os.MkdirAll(p.cfg.CheckpointDir, 0o700); err != nil {
		return "", false, fmt.Errorf("create checkpoint directory: %w", err)
	}
	p.pruneCheckpoints(p.cfg.CheckpointDir)
	staging, err := os.MkdirTemp(p.cfg.CheckpointDir, key+partialSuffix)
	if err != nil {
		return "", false, fmt.Errorf("create checkpoint directory: %w", err)
	}
	defer os.RemoveAll(staging) // a no-op once renamed
	sp, err := p.startCold(pl)
	if err != nil {
		return "", false, err
	}
	_, ckptErr := p.rt.runsc(p.ctx, sp.runscRoot(), "checkpoint", "--image-path", staging, sp.id)
	if err := sp.destroy(); err != nil {
		p.rt.log.Error("clean up checkpointed sandbox", "id", sp.id, "err", err)
	}
	if ckptErr != nil {
		return "", false, fmt.Errorf("checkpoint a warm %s sandbox: %w", pl.lang.Name, ckptErr)
	}
	meta, _ := json.Marshal(map[string]any{"language": pl.lang.Name, "preload": pl.preload, "created": time.Now().UTC()})
	if err := os.WriteFile(filepath.Join(staging, checkpointDone), meta, 0o600); err != nil {
		return "", false, fmt.Errorf("write checkpoint image: %w", err)
	}
	sealK, err := sealKey(checkpointKeyPath(p.rt.cfg.StateDir))
	if err != nil {
		return "", false, err
	}
	if err := sealCheckpoint(staging, sealK); err != nil {
		return "", false, err
	}
	if err := os.Rename(staging, dir); err != nil {
		if _, statErr := os.Stat(filepath.Join(dir, checkpointDone)); statErr == nil {
			return dir, false, nil // another safe-run built it meanwhile
		}
		return "", false, fmt.Errorf("store checkpoint image: %w", err)
	}
	return dir, true, nil
}

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
func (p *pool) pruneCheckpoints(dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil || !e.IsDir() {
			continue
		}
		age := time.Since(fi.ModTime())
		if strings.Contains(e.Name(), partialSuffix) && age > partialAge || age > unusedAge {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				p.rt.log.Warn("remove old checkpoint image", "image", e.Name(), "err", err)
			}
		}
	}
}

// checkpointKey names pl's image by everything a restore depends on: the
// sandbox's configuration (which restore compares strictly, and which names
// the image's root directory), the language and its preloads, and the
// exact agent and runsc binaries (by file identity).
func (p *pool) checkpointKey(pl *poolLang) (string, error) {
	cfg, err := p.rt.bundleConfig(pl.job, false)
	if err != nil {
		return "", err
	}
	spec, err := bundle.Build(pl.job, cfg)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	enc := json.NewEncoder(h)
	if err := enc.Encode([]any{"v1", spec, pl.lang.Name, pl.lang.Interpreter, pl.preload, p.rt.cfg.Platform}); err != nil {
		return "", err
	}
	for _, f := range []string{p.rt.cfg.Agent, p.rt.cfg.Runsc} {
		id, err := fileIdentity(f)
		if err != nil {
			return "", fmt.Errorf("checkpoint key: %w", err)
		}
		fmt.Fprintln(h, id)
	}
	return pl.lang.Name + "-" + hex.EncodeToString(h.Sum(nil))[:16], nil
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
