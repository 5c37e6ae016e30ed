package runtime

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/safe-run/safe-run/agent"
	"github.com/safe-run/safe-run/sandbox"
)

// PoolConfig configures the warm pool: sandboxes started before any call
// needs them — the agent up and, for Python and Node, the interpreter
// started with its preloaded modules imported — each used for exactly one
// run and then destroyed. A call that finds none ready starts cold.
type PoolConfig struct {
	// Size is how many ready sandboxes to keep per language. A language
	// that is absent, or 0, has no pool.
	Size map[string]int
	// Preload lists the modules each language's warm interpreter imports.
	// A language that is absent takes DefaultPreload's list.
	Preload map[string][]string
	// MemoryBytes bounds the memory the pooled sandboxes use together, as
	// their cgroups count it; 0 means DefaultPoolMemory. The pool stops
	// filling before it would pass it.
	MemoryBytes int64
	// CheckpointDir, if set, is where checkpoint images of warm sandboxes
	// are cached, one per image, language, preload list, agent and runsc:
	// refills then restore a checkpoint instead of starting cold. Empty
	// means every refill is a cold start.
	CheckpointDir string
	// OnDemand keeps nothing ready: each run that the pool would serve
	// restores its sandbox from the checkpoint when it comes, instead of
	// starting cold. It is for a process that serves a single run; without
	// a CheckpointDir, or for a language that cannot be checkpointed, runs
	// start cold.
	OnDemand bool
}

// DefaultPreload are the modules warm interpreters import by default.
var DefaultPreload = map[string][]string{
	"python": {"numpy", "pandas", "matplotlib"},
}

// DefaultPoolMemory bounds the memory of all pooled sandboxes by default.
const DefaultPoolMemory = 2 * sandbox.GiB

// refillBackoff bounds the wait after a failed refill, which doubles from
// one second with each failure in a row.
const refillBackoff = 30 * time.Second

// pool keeps ready single-use sandboxes, per language, and refills them
// one at a time: the rate is bounded by one sandbox starting at any moment.
type pool struct {
	rt  *Runtime
	cfg PoolConfig

	mu     sync.Mutex
	langs  map[string]*poolLang
	closed bool
	// starting serialises starts outside the filler (OnDemand), since a
	// language's checkpoint state belongs to one start at a time.
	starting sync.Mutex

	wake   chan struct{}
	ctx    context.Context // ends when the pool closes, cancelling a start
	cancel context.CancelFunc
	done   chan struct{} // closed when the filler has returned
}

// poolLang is one language's part of the pool.
type poolLang struct {
	lang    sandbox.Language
	job     sandbox.Job // the job whose bundle every pooled sandbox has
	preload []string
	size    int
	ready   []*sandboxProc
	memory  int64 // memory of one ready sandbox, as last measured
	fails   int   // refills failed in a row
	ckpt    checkpointState
}

func newPool(rt *Runtime, cfg PoolConfig) (*pool, error) {
	if cfg.MemoryBytes == 0 {
		cfg.MemoryBytes = DefaultPoolMemory
	}
	p := &pool{rt: rt, cfg: cfg, langs: map[string]*poolLang{}, wake: make(chan struct{}, 1), done: make(chan struct{})}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	for _, name := range slices.Sorted(maps.Keys(cfg.Size)) {
		size := cfg.Size[name]
		if size < 0 {
			return nil, fmt.Errorf("pool size for %s is %d; use 0 to disable its pool", name, size)
		}
		if size == 0 {
			continue
		}
		job, lang, err := rt.cfg.Policy.Check(sandbox.Job{Language: name, Code: "pooled"})
		if err != nil {
			return nil, fmt.Errorf("pool for %s: %w", name, err)
		}
		preload, ok := cfg.Preload[name]
		if !ok {
			preload = DefaultPreload[name]
		}
		p.langs[name] = &poolLang{lang: lang, job: job, preload: preload, size: size}
	}
	if cfg.OnDemand {
		close(p.done)
		return p, nil
	}
	go p.fill()
	p.poke()
	return p, nil
}

// poke wakes the filler.
func (p *pool) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// take hands out a ready sandbox for job, or nil if there is none: the
// language has no pool, the job's limits are not those the pooled bundle
// was built with, or the pool is empty. The sandbox is the caller's to
// destroy.
func (p *pool) take(job sandbox.Job) *sandboxProc {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	pl := p.langs[job.Language]
	// A job that names an image of its own runs in a sandbox of that image.
	if pl == nil || p.closed || !sameBundle(job.Limits, pl.job.Limits) || job.Image != pl.job.Image {
		return nil
	}
	if p.cfg.OnDemand {
		p.mu.Unlock()
		defer p.mu.Lock()
		return p.restoreNow(pl)
	}
	for len(pl.ready) > 0 {
		sp := pl.ready[0]
		pl.ready = slices.Delete(pl.ready, 0, 1)
		select {
		case <-sp.exited:
			// It died waiting (killed from outside, or the host ran out
			// of memory): clean up and try the next.
			p.rt.log.Warn("a pooled sandbox died while waiting", "id", sp.id, "language", job.Language)
			go sp.destroy()
		default:
			// The replacement starts when this run is over (see
			// released): started now, it would compete with the run for
			// the CPU.
			markPooled(sp, false, "")
			return sp
		}
	}
	p.poke() // a miss: refill now
	return nil
}

// released tells the pool that a run it served is over, so that its
// replacement can start.
func (p *pool) released() {
	if p != nil {
		p.poke()
	}
}

// restoreNow restores a sandbox for pl from its checkpoint, building the
// image first if needed, or returns nil: only a restore beats a cold start.
func (p *pool) restoreNow(pl *poolLang) *sandboxProc {
	p.starting.Lock()
	defer p.starting.Unlock()
	image := p.checkpoint(pl)
	if image == "" {
		return nil
	}
	sp, err := p.restore(pl, image)
	if err != nil {
		p.restoreFailed(pl, image, err)
		return nil
	}
	return sp
}

// sameBundle says whether a job with limits a gets the same sandbox as one
// with b. The timeout and the output cap travel with each request; all
// other limits are built into the sandbox.
func sameBundle(a, b sandbox.Limits) bool {
	a.Timeout, b.Timeout = 0, 0
	a.OutputBytes, b.OutputBytes = 0, 0
	return a == b
}

// next picks the language to refill: the one furthest below its size whose
// next sandbox fits the memory budget. It returns nil if there is none.
func (p *pool) next() *poolLang {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	var used int64
	for _, pl := range p.langs {
		used += int64(len(pl.ready)) * pl.memory
	}
	var best *poolLang
	for _, name := range slices.Sorted(maps.Keys(p.langs)) {
		pl := p.langs[name]
		missing := pl.size - len(pl.ready)
		if missing <= 0 || used+pl.memory > p.cfg.MemoryBytes {
			continue
		}
		if best == nil || missing > best.size-len(best.ready) {
			best = pl
		}
	}
	return best
}

// fill refills the pool until it closes.
func (p *pool) fill() {
	defer close(p.done)
	for {
		pl := p.next()
		if pl == nil {
			select {
			case <-p.wake:
				continue
			case <-p.ctx.Done():
				return
			}
		}
		sp, err := p.start(pl)
		p.mu.Lock()
		if err != nil {
			pl.fails++
			p.mu.Unlock()
			wait := min(refillBackoff, time.Second<<min(pl.fails-1, 5))
			if p.ctx.Err() == nil {
				p.rt.log.Error("refill the warm pool", "language", pl.lang.Name, "err", err, "retry_in", wait)
			}
			select {
			case <-time.After(wait):
				continue
			case <-p.ctx.Done():
				return
			}
		}
		pl.fails = 0
		if p.closed {
			p.mu.Unlock()
			_ = sp.destroy()
			return
		}
		pl.ready = append(pl.ready, sp)
		markPooled(sp, true, pl.lang.Name)
		p.mu.Unlock()
	}
}

// pooledMarker is a file in the run directory of a sandbox that waits in
// the pool, holding its language, so that operators (and the benchmark)
// can tell it from one that is starting, running or being removed.
const pooledMarker = "pooled"

func markPooled(sp *sandboxProc, pooled bool, lang string) {
	path := filepath.Join(sp.dir, pooledMarker)
	if pooled {
		_ = os.WriteFile(path, []byte(lang+"\n"), 0o600)
	} else {
		_ = os.Remove(path)
	}
}

// start brings up one warm sandbox for pl: restored from its checkpoint
// where that works, started cold otherwise.
func (p *pool) start(pl *poolLang) (*sandboxProc, error) {
	var sp *sandboxProc
	var err error
	if image := p.checkpoint(pl); image != "" {
		if sp, err = p.restore(pl, image); err != nil {
			p.restoreFailed(pl, image, err)
		}
	}
	if sp == nil {
		if sp, err = p.startCold(pl); err != nil {
			return nil, err
		}
	}
	if usage, err := sp.memoryUsage(); err == nil {
		p.mu.Lock()
		pl.memory = usage
		p.mu.Unlock()
	}
	return sp, nil
}

// startCold starts a sandbox, waits for its agent, and warms its
// interpreter.
func (p *pool) startCold(pl *poolLang) (*sandboxProc, error) {
	sp, err := p.rt.startSandbox(pl.job, true, "")
	if err != nil {
		return nil, err
	}
	if err := sp.awaitReady(p.ctx); err != nil {
		_ = sp.destroy()
		return nil, err
	}
	if err := p.warm(sp, pl); err != nil {
		_ = sp.destroy()
		return nil, err
	}
	sp.mark("warm")
	return sp, nil
}

// warm starts the language's interpreter in sp ahead of its run, if the
// agent has a warm driver for it.
func (p *pool) warm(sp *sandboxProc, pl *poolLang) error {
	if !slices.Contains(agent.WarmInterpreters, pl.lang.Interpreter) {
		return nil // the agent alone is up; the program starts with the run
	}
	req := agent.Request{Op: agent.OpWarm, Interpreter: pl.lang.Interpreter, Preload: pl.preload, Timeout: startTimeout}
	return sp.call(p.ctx, req)
}

// call sends a request that runs no program and checks its answer.
func (sp *sandboxProc) call(ctx context.Context, req agent.Request) error {
	exit, end := sp.request(ctx, req, 1<<20, startTimeout+killGrace, nil, nil)
	switch {
	case exit != nil && exit.Error != "":
		return fmt.Errorf("sandbox %s: %s", sp.id, exit.Error)
	case exit != nil:
		return nil
	case end.cancelled:
		return ctx.Err()
	case end.timedOut:
		return fmt.Errorf("sandbox %s did not answer within %s", sp.id, startTimeout)
	case end.err != nil:
		return fmt.Errorf("sandbox %s: %w", sp.id, end.err)
	}
	<-sp.exited
	return fmt.Errorf("sandbox %s ended without answering (runsc exit status %d%s)", sp.id, sp.runscStatus, sp.runscLogTail())
}

// sizes returns the number of ready sandboxes per pooled language.
func (p *pool) sizes() map[string]int {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]int{}
	for name, pl := range p.langs {
		out[name] = len(pl.ready)
	}
	return out
}

// close stops refilling and destroys the ready sandboxes.
func (p *pool) close() {
	if p == nil {
		return
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	var ready []*sandboxProc
	for _, pl := range p.langs {
		ready = append(ready, pl.ready...)
		pl.ready = nil
	}
	p.mu.Unlock()
	p.cancel()
	<-p.done
	var errs []error
	for _, sp := range ready {
		errs = append(errs, sp.destroy())
	}
	if err := errors.Join(errs...); err != nil {
		p.rt.log.Error("destroy pooled sandboxes", "err", err)
	}
}
