package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// A warm sandbox takes a cold start and its preloads to get ready — about
// 1.1 s with pandas inside gVisor — while restoring a checkpoint of one
// takes a fraction of that. So where the backend can (Checkpointer), the
// pool checkpoints one warm sandbox per language and restores its refills
// from that image. Every restored sandbox is still used for one run only.

// checkpointState is what the pool knows of a language's checkpoint image.
// One goroutine at a time touches it: a filler, under the pool's ckptMu
// (there are PoolConfig.Refills of them), or with OnDemand (which has no
// filler) the run restoring under the pool's starting lock.
type checkpointState struct {
	image    string // the image, once built or found
	disabled string // why this language refills cold, once that is decided
	failures int    // restores failed since the image was built
}

// checkpointable says whether sandboxes of lang may be cloned from one
// checkpoint. Restored sandboxes share the memory of the one that was
// checkpointed, random generators included. The Python warm driver
// reseeds those its preloads created (random, numpy's global generator,
// tempfile's names) once the run is known. V8's Math.random and OpenSSL's
// generator inside Node cannot be reseeded from JavaScript, so Node
// sandboxes always start cold; a Bash sandbox has nothing warm to save.
func checkpointable(interpreter string) bool { return interpreter == "python" }

// checkpointer returns the backend's checkpoint capability, or nil for a
// backend without it.
func (p *pool) checkpointer() Checkpointer {
	c, _ := p.e.cfg.Backend.(Checkpointer)
	return c
}

// tag names what a warm sandbox of pl holds beyond its start spec: the
// language, its preloads and the interpreter's environment. The backend
// keys images by all of them.
func (pl *poolLang) tag(env []string) string {
	parts := []any{pl.lang.Name, pl.lang.Interpreter, pl.preload}
	if len(env) > 0 { // no Env keeps the tags of images built before it existed
		parts = append(parts, env)
	}
	tag, _ := json.Marshal(parts)
	return string(tag)
}

// checkpoint returns the image pooled sandboxes of pl are restored from,
// building it on first use; "" means start them cold.
func (p *pool) checkpoint(pl *poolLang) string {
	c := p.checkpointer()
	if c == nil || pl.ckpt.disabled != "" {
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
	image, built, err := p.buildCheckpoint(c, pl)
	if errors.Is(err, ErrNoCheckpoints) {
		pl.ckpt.disabled = err.Error()
		return ""
	}
	if err != nil {
		if p.ctx.Err() == nil {
			pl.ckpt.disabled = err.Error()
			p.e.log.Warn("warm pool: no checkpoint; refills start cold", "language", pl.lang.Name, "err", err)
		}
		return ""
	}
	if built {
		p.e.log.Info("warm pool: checkpoint built", "language", pl.lang.Name, "image", image, "ms", time.Since(start).Milliseconds())
	}
	pl.ckpt.image = image
	return image
}

// buildCheckpoint returns pl's checkpoint image, and whether it had to be
// built: a warm sandbox started cold, then checkpointed (which ends it).
func (p *pool) buildCheckpoint(c Checkpointer, pl *poolLang) (image string, built bool, err error) {
	spec := p.e.spec(pl.job, false)
	if image, err = c.FindCheckpoint(spec, pl.tag(p.cfg.Env)); err != nil || image != "" {
		return image, false, err
	}
	sp, err := p.startCold(pl, nil)
	if err != nil {
		return "", false, err
	}
	image, ckptErr := c.Checkpoint(p.ctx, sp.sb, spec, pl.tag(p.cfg.Env))
	if err := sp.destroy(); err != nil {
		sp.log.Error("clean up checkpointed sandbox", "err", err)
	}
	if ckptErr != nil {
		return "", false, fmt.Errorf("checkpoint a warm %s sandbox: %w", pl.lang.Name, ckptErr)
	}
	return image, true, nil
}

// restoreFailed forgets an image a restore failed from: it is rebuilt once,
// and after a second failure the language refills cold.
func (p *pool) restoreFailed(pl *poolLang, image string, err error) {
	if p.ctx.Err() != nil {
		return
	}
	pl.ckpt.failures++
	pl.ckpt.image = ""
	p.e.log.Warn("warm pool: restore failed", "language", pl.lang.Name, "image", image, "err", err)
	if rmErr := p.checkpointer().Forget(image); rmErr != nil {
		p.e.log.Error("remove checkpoint image", "image", image, "err", rmErr)
	}
	if pl.ckpt.failures >= 2 {
		pl.ckpt.disabled = "restores failed twice: " + err.Error()
	}
}

// restore starts a sandbox from image and checks that its agent answers;
// r is its refill, if it is one.
func (p *pool) restore(pl *poolLang, image string, r *refill) (*box, error) {
	sp, err := p.startRefillBox(pl, image, r)
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
	if err := sp.sb.Ready(); err != nil {
		_ = sp.destroy()
		return nil, fmt.Errorf("restore from %s: %w", image, err)
	}
	sp.mark("restored")
	if observe := p.e.cfg.ObserveStart; observe != nil {
		observe(time.Since(sp.start))
	}
	return sp, nil
}
