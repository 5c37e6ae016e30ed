package engine

import (
	"context"
	"errors"
	"fmt"
	"maps"
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
	// OnDemand keeps nothing ready: each run that the pool would serve
	// restores its sandbox from the checkpoint when it comes, instead of
	// starting cold. It is for a process that serves a single run; with a
	// backend that keeps no checkpoints (see Checkpointer), or for a
	// language that cannot be checkpointed, runs start cold.
	//
	// Otherwise refills restore the backend's checkpoint of a warm sandbox
	// where it keeps one, and start cold where it does not.
	OnDemand bool
	// Env is the environment every pooled interpreter starts with (see
	// sandbox.Job.Env): some of it, such as PYTHONHASHSEED, is fixed when an
	// interpreter starts, so only jobs with this same Env are served.
	Env []string
	// Refills is how many sandboxes the pool starts at once; 0 means one.
	// A server keeps one, so that refills never crowd out the runs they
	// serve; a batch of runs (safe-run check) that keeps several workers
	// busy needs as many refills in flight to keep up.
	Refills int
	// AwaitRefill, if set, makes a run that finds its language's pool
	// empty while a refill is under way wait up to this long for it,
	// rather than start cold beside it: for a batch, where a refill
	// (usually a restore) is faster than a cold start and the CPU is
	// shared anyway.
	AwaitRefill time.Duration
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
// PoolConfig.Refills at a time (one by default): the rate is bounded by
// that many sandboxes starting at any moment.
type pool struct {
	e   *Engine
	cfg PoolConfig

	mu     sync.Mutex
	langs  map[string]*poolLang
	closed bool
	// starting serialises starts outside the filler (OnDemand), since a
	// language's checkpoint state belongs to one start at a time.
	starting sync.Mutex

	// ckptMu serialises the use of checkpoint state by parallel refills.
	ckptMu sync.Mutex
	// refilled is closed, and replaced, each time a sandbox is added to
	// the pool, for runs waiting on a refill (AwaitRefill). Guarded by mu.
	refilled chan struct{}

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
	ready   []*box
	filling int   // refills under way
	memory  int64 // memory of one ready sandbox, as last measured
	fails   int   // refills failed in a row
	ckpt    checkpointState
}

func newPool(e *Engine, cfg PoolConfig) (*pool, error) {
	if cfg.MemoryBytes == 0 {
		cfg.MemoryBytes = DefaultPoolMemory
	}
	p := &pool{e: e, cfg: cfg, langs: map[string]*poolLang{}, wake: make(chan struct{}, 1), done: make(chan struct{}),
		refilled: make(chan struct{})}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	for _, name := range slices.Sorted(maps.Keys(cfg.Size)) {
		size := cfg.Size[name]
		if size < 0 {
			return nil, &sandbox.InputError{Field: "pool", Msg: fmt.Sprintf("the size for %s is %d, below 0", name, size)}
		}
		if size == 0 {
			continue
		}
		job, lang, err := e.cfg.Policy.Check(sandbox.Job{Language: name, Code: "pooled"})
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
	refills := max(1, cfg.Refills)
	var fillers sync.WaitGroup
	for range refills {
		fillers.Add(1)
		go func() { defer fillers.Done(); p.fill() }()
	}
	go func() { fillers.Wait(); close(p.done) }()
	for range refills {
		p.poke()
	}
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
func (p *pool) take(job sandbox.Job) *box {
	if p == nil || len(job.Network) > 0 {
		return nil // pooled sandboxes have no network
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	pl := p.langs[job.Language]
	// A job that names an image of its own runs in a sandbox of that image.
	if pl == nil || p.closed || !sameBundle(job.Limits, pl.job.Limits) || job.Image != pl.job.Image || !slices.Equal(job.Env, p.cfg.Env) {
		return nil
	}
	if p.cfg.OnDemand {
		p.mu.Unlock()
		defer p.mu.Lock()
		return p.restoreNow(pl)
	}
	var deadline <-chan time.Time
	for {
		sp := p.takeReady(pl)
		if sp != nil {
			return sp
		}
		if p.cfg.AwaitRefill <= 0 || pl.filling == 0 || p.closed {
			break
		}
		// A refill is under way: wait for it rather than start cold.
		if deadline == nil {
			t := time.NewTimer(p.cfg.AwaitRefill)
			defer t.Stop()
			deadline = t.C
		}
		refilled := p.refilled
		p.mu.Unlock()
		select {
		case <-refilled:
			p.mu.Lock()
			continue
		case <-deadline:
			p.mu.Lock()
		}
		break
	}
	p.poke() // a miss: refill now
	return nil
}

// takeReady takes the first ready sandbox of pl that is still alive, or
// returns nil. p.mu is held.
func (p *pool) takeReady(pl *poolLang) *box {
	for len(pl.ready) > 0 {
		sp := pl.ready[0]
		pl.ready = slices.Delete(pl.ready, 0, 1)
		if sp.exited() || sp.requireStatus(statusReady) != nil {
			// It died waiting (killed from outside, or the host ran out
			// of memory): clean up and try the next.
			sp.log.Warn("a pooled sandbox died while waiting", "language", pl.lang.Name)
			go sp.destroy()
			continue
		}
		// The replacement starts when this run is over (see released):
		// started now, it would compete with the run for the CPU.
		markPooled(sp, "")
		return sp
	}
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
func (p *pool) restoreNow(pl *poolLang) *box {
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
		used += int64(len(pl.ready)+pl.filling) * pl.memory
	}
	var best *poolLang
	for _, name := range slices.Sorted(maps.Keys(p.langs)) {
		pl := p.langs[name]
		missing := pl.size - len(pl.ready) - pl.filling
		if missing <= 0 || used+pl.memory > p.cfg.MemoryBytes {
			continue
		}
		if best == nil || missing > best.size-len(best.ready)-best.filling {
			best = pl
		}
	}
	if best != nil {
		best.filling++ // until fill adds it, or gives up
	}
	return best
}

// fill refills the pool until it closes; Refills of them run at once.
func (p *pool) fill() {
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
		pl.filling--
		if err != nil {
			pl.fails++
			p.mu.Unlock()
			wait := min(refillBackoff, time.Second<<min(pl.fails-1, 5))
			if p.ctx.Err() == nil {
				p.e.log.Error("refill the warm pool", "language", pl.lang.Name, "err", err, "retry_in", wait)
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
		markPooled(sp, pl.lang.Name)
		close(p.refilled)
		p.refilled = make(chan struct{})
		p.mu.Unlock()
	}
}

// markPooled marks sp on the host as waiting in lang's pool, or, for "",
// as taken from it, if its backend can.
func markPooled(sp *box, lang string) {
	if m, ok := sp.sb.(PoolMarker); ok {
		m.MarkPooled(lang)
	}
}

// start brings up one warm sandbox for pl: restored from its checkpoint
// where that works, started cold otherwise.
func (p *pool) start(pl *poolLang) (*box, error) {
	var sp *box
	var err error
	p.ckptMu.Lock()
	image := p.checkpoint(pl)
	p.ckptMu.Unlock()
	if image != "" {
		if sp, err = p.restore(pl, image); err != nil {
			p.ckptMu.Lock()
			p.restoreFailed(pl, image, err)
			p.ckptMu.Unlock()
		}
	}
	if sp == nil {
		if sp, err = p.startCold(pl); err != nil {
			return nil, err
		}
	}
	if usage, err := sp.sb.MemoryNow(); err == nil {
		p.mu.Lock()
		pl.memory = usage
		p.mu.Unlock()
	}
	return sp, nil
}

// startCold starts a sandbox, waits for its agent, and warms its
// interpreter.
func (p *pool) startCold(pl *poolLang) (*box, error) {
	sp, err := p.e.startBox(p.e.spec(pl.job, false), "")
	if err != nil {
		return nil, err
	}
	if err := sp.awaitReady(p.ctx, nil); err != nil {
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
func (p *pool) warm(sp *box, pl *poolLang) error {
	if !slices.Contains(agent.WarmInterpreters, pl.lang.Interpreter) {
		return nil // the agent alone is up; the program starts with the run
	}
	req := agent.Request{Op: agent.OpWarm, Interpreter: pl.lang.Interpreter, Preload: pl.preload, Env: p.cfg.Env, Timeout: startTimeout}
	return sp.call(p.ctx, req)
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
	var ready []*box
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
		p.e.log.Error("destroy pooled sandboxes", "err", err)
	}
}
