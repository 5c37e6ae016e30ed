package engine

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime"
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
	// Refills bounds how many sandboxes the pool starts at once; 0 means
	// CPUs. Whatever the bound, a refill starts only while runs and other
	// refills leave a CPU free (see CPUs), and refills run at the lowest
	// CPU priority where the backend has priorities (Prioritizer), so that
	// they use idle CPU and never crowd out the runs they serve.
	Refills int
	// CPUs is how many CPUs runs and refills share; 0 means
	// runtime.NumCPU(). A refill starts only while fewer one-shot runs and
	// refills than that are under way.
	CPUs int
	// AwaitRefill, if set, makes a run that finds its language's pool
	// empty while a refill is under way wait up to this long for it,
	// rather than start cold beside it: for a batch, where a refill
	// (usually a restore) is faster than a cold start and the CPU is
	// shared anyway.
	//
	// Without it, such a run takes a refill under way only when the pool
	// expects it to be ready sooner than a cold start would be (from the
	// CPU, where the backend meters it, or the durations it has seen of
	// both; see adoptable), raising it to a run's priority, and starts
	// cold otherwise.
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
	e    *Engine
	cfg  PoolConfig
	cpus int

	mu     sync.Mutex
	langs  map[string]*poolLang
	closed bool
	// running counts the one-shot runs under way (from the moment they
	// have a sandbox, pooled or cold, until their result), which refills
	// leave their CPUs to.
	running int
	// booting counts those of them whose cold sandbox is not yet ready:
	// while any boots, no refill starts (see runStarted).
	booting int
	// arrived and ended are when a run last arrived (or started) and
	// ended, and lull the timer that pokes the filler once the quiet
	// next waits for has come (see refillLull).
	arrived, ended time.Time
	lull           *time.Timer
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
	filling int       // refills under way
	refills []*refill // those of them that have begun starting a sandbox, oldest first
	memory  int64     // memory of one ready sandbox, as last measured
	fails   int       // refills failed in a row
	ckpt    checkpointState
	// refillTook and coldTook are moving averages, zero until measured, of
	// how long a refill took from the start of its sandbox until ready,
	// and a one-shot run's sandbox of this language from its start until
	// its agent answered: what decides whether a run that finds the pool
	// empty waits for a refill under way.
	refillTook, coldTook time.Duration
	// refillCPU is a moving average of the CPU time a refill's sandbox
	// used until ready, where the backend tells it (CPUMeter): how far a
	// refill under way got is the CPU it used against it.
	refillCPU time.Duration
	// coldRunMin and warmRunMin are the shortest runs seen, from the
	// request until the answer, in a cold sandbox and in a pooled one:
	// the least a pooled sandbox saves a run (the interpreter's start),
	// whatever the program.
	coldRunMin, warmRunMin time.Duration
	// coldCPUMin is the least CPU a cold one-shot sandbox used from its
	// start until its answer, and warmRunCPUMin the least a pooled one
	// used from the request until the answer, where the backend tells
	// (CPUMeter): what a cold start costs a run more than a pooled
	// sandbox, in the unit a refill's progress is known in.
	coldCPUMin, warmRunCPUMin time.Duration
	// filled says that the pool has held size sandboxes of pl. Until then
	// a cold run's cost is not recorded: a server's first runs come
	// beside the pool's first fill (a checkpoint built, as many refills
	// as CPUs). Measured: the probe's cold Python run used 1.23 s of CPU,
	// cold runs later 0.65 s; against the probe's, every miss of a burst
	// adopted a refill that had barely begun.
	filled bool
}

// refill is one refill under way, once it starts its sandbox: the
// checkpoint it restores from is known by then, so its duration can be
// predicted from earlier ones.
type refill struct {
	start   time.Time
	claimed bool // a run waits for it
	// started says that its sandbox has started. Before, it has all its
	// work ahead, more than a cold start has, and no run adopts it.
	started bool
	// background says that it runs at a background priority
	// (Prioritizer): how far it got then depends on the CPU runs left it,
	// not on the time it has run, and no run waits for it.
	background bool
	// used reads the CPU time its sandbox used so far (CPUMeter), and
	// raise gives it a run's CPU priority (Prioritizer); each is nil until
	// its sandbox has started, or if the backend cannot.
	used  func() (time.Duration, error)
	raise func()
}

func newPool(e *Engine, cfg PoolConfig) (*pool, error) {
	if cfg.MemoryBytes == 0 {
		cfg.MemoryBytes = DefaultPoolMemory
	}
	p := &pool{e: e, cfg: cfg, langs: map[string]*poolLang{}, wake: make(chan struct{}, 1), done: make(chan struct{}),
		refilled: make(chan struct{}), cpus: cfg.CPUs}
	if p.cpus <= 0 {
		p.cpus = runtime.NumCPU()
	}
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
	refills := cfg.Refills
	if refills <= 0 {
		refills = p.cpus
	}
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
	p.arrived = time.Now()
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
	var claim *refill // the refill this run waits for, without AwaitRefill
	for {
		sp := p.takeReady(pl)
		if sp != nil {
			return sp
		}
		if pl.filling == 0 || p.closed {
			break
		}
		wait := p.cfg.AwaitRefill
		if wait <= 0 {
			if claim == nil || !slices.Contains(pl.refills, claim) {
				now, cpuFree := time.Now(), p.running+1 < p.cpus
				var left, cold time.Duration
				if claim, left, cold = pl.adoptable(now, cpuFree); claim == nil {
					p.e.log.Debug("pool empty: the run starts cold", "language", pl.lang.Name, "refills", len(pl.refills))
					break
				}
				p.e.log.Debug("pool empty: the run waits for a refill", "language", pl.lang.Name, "left", left, "cold", cold,
					"cpu_free", cpuFree, "age", now.Sub(claim.start), "refill_cpu", pl.refillCPU, "cold_cpu_min", pl.coldCPUMin, "warm_run_cpu_min", pl.warmRunCPUMin)
				// It will be ready sooner than a cold start: it becomes
				// this run's, at a run's priority.
				claim.claimed = true
				if claim.raise != nil {
					claim.raise()
					claim.background = false
				}
			}
			wait = startTimeout
		}
		// A refill is under way: wait for it rather than start cold.
		if deadline == nil {
			t := time.NewTimer(wait)
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
	p.poke() // a miss: refill now, or once next allows
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
		markPooled(sp, "")
		foreground(sp)
		// The replacement may start at once if a CPU is free for it (see
		// next); it runs at a low priority, and the run comes first.
		p.poke()
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

// runStarted counts a one-shot run as under way: refills leave it its CPU.
// A cold run also counts as booting until its booted is called: its
// sandbox has no CPU quota until its agent is ready (Sandbox.Ready), and
// runsc's start then uses every CPU it can get, so no refill starts beside
// it (unless runs wait for refills: see next). It returns the call that
// counts it over, which also ends its boot.
func (p *pool) runStarted(cold bool) (booted, over func()) {
	if p == nil {
		return func() {}, func() {}
	}
	p.mu.Lock()
	p.running++
	if cold {
		p.booting++
	}
	p.arrived = time.Now()
	p.mu.Unlock()
	bootDone := !cold
	endBoot := func() bool { // p.mu is held
		if bootDone {
			return false
		}
		bootDone = true
		p.booting--
		return true
	}
	booted = func() {
		p.mu.Lock()
		ended := endBoot()
		p.mu.Unlock()
		if ended {
			p.poke() // next says whether a refill may start now
		}
	}
	return booted, func() {
		p.mu.Lock()
		endBoot()
		p.running--
		p.ended = time.Now()
		p.mu.Unlock()
		p.poke() // a CPU is free: a refill may start
	}
}

// observeCold records how long a one-shot run's sandbox of language took
// from its start until its agent answered.
func (p *pool) observeCold(language string, d time.Duration) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if pl := p.langs[language]; pl != nil && pl.filled {
		pl.coldTook = average(pl.coldTook, d)
	}
}

// observeRun records how long a one-shot run of language took from its
// request until its answer, in a cold sandbox or a pooled one, and the CPU
// its sandbox used (0: not known): a cold one's from its start until the
// answer, a pooled one's from the request.
func (p *pool) observeRun(language string, cold bool, d, cpu time.Duration) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	pl := p.langs[language]
	if pl == nil {
		return
	}
	least, leastCPU := &pl.warmRunMin, &pl.warmRunCPUMin
	if cold && !pl.filled {
		return // see poolLang.filled
	}
	if cold {
		least, leastCPU = &pl.coldRunMin, &pl.coldCPUMin
	}
	lower(least, d)
	if cpu > 0 {
		lower(leastCPU, cpu)
	}
}

// lower sets *least (zero: none yet) to d if d is less.
func lower(least *time.Duration, d time.Duration) {
	if *least == 0 || d < *least {
		*least = d
	}
}

// average moves a moving average avg (zero: none yet) towards d.
func average(avg, d time.Duration) time.Duration {
	if avg == 0 {
		return d
	}
	return (3*avg + d) / 4
}

// adoptable returns the refill under way that a run finding the pool empty
// at now should wait for, or nil if it should start cold: of those no
// other run waits for, the one that has least left to do against what a
// cold start would cost the run, if that is less. Until that cost has
// been measured, runs start cold, as they would without a pool. p.mu is
// held.
//
// Where the backend meters CPU (CPUMeter), both are CPU: what a refill
// uses until ready minus what this one used, against what a cold sandbox
// uses until it answered minus what a pooled run uses. A refill in the
// background gets only the CPU runs leave idle, so its age says nothing
// of its progress (a run that waited for one by its age, measured, took
// 1-2 s where a cold start took 0.3-0.5 s on the same loaded host); and
// comparing its CPU left with a cold start's duration, measured, made
// every miss wait on a loaded host (load 7-12: misses 309 ms against 281
// ms with the pool off), since load stretches durations more than CPU
// (though it adds CPU too: see poolLang.filled).
// Here a restore and its prime use 230-300 ms of CPU and take about as
// long in the foreground; a cold sandbox until it answered print(1) uses
// about 165 ms.
//
// Otherwise, for a refill at a run's priority, both are durations: a
// refill's minus this one's age, against a cold start's (coldTook) plus
// the interpreter start a pooled sandbox saves (coldRunMin minus
// warmRunMin).
//
// A background refill is judged by its CPU only if cpuFree says that a
// CPU would idle beside this run: a restore uses more CPU than a cold
// start (here 230-300 ms against 165), so where runs take every CPU,
// sandboxes made by refills instead of cold starts cost runs CPU
// (measured at concurrency 2, load 20: pool on/off 1.02 against 1.24
// without adoption by CPU).
//
// With the refill, it returns what that has left and what a cold start
// would cost, as remaining says.
func (pl *poolLang) adoptable(now time.Time, cpuFree bool) (best *refill, left, cold time.Duration) {
	var bestShare float64
	for _, r := range pl.refills {
		if r.claimed {
			continue
		}
		l, c, ok := pl.remaining(r, now, cpuFree)
		if !ok || l >= c {
			continue
		}
		if share := float64(l) / float64(c); best == nil || share < bestShare {
			best, bestShare, left, cold = r, share, l, c
		}
	}
	return best, left, cold
}

// remaining estimates what the refill r has left to do at a run's
// priority and what a cold start would cost the run instead, in the same
// unit (CPU, if cpuFree, or time; see adoptable), or says that it cannot.
// p.mu is held.
func (pl *poolLang) remaining(r *refill, now time.Time, cpuFree bool) (left, cold time.Duration, ok bool) {
	if !r.started {
		return 0, 0, false
	}
	if cpuFree && r.used != nil && pl.refillCPU > 0 && pl.coldCPUMin > pl.warmRunCPUMin {
		if used, err := r.used(); err == nil {
			return pl.refillCPU - used, pl.coldCPUMin - pl.warmRunCPUMin, true
		}
	}
	if r.background || pl.refillTook == 0 || pl.coldTook == 0 {
		return 0, 0, false
	}
	cold = pl.coldTook
	if pl.warmRunMin > 0 && pl.coldRunMin > pl.warmRunMin {
		cold += pl.coldRunMin - pl.warmRunMin
	}
	return pl.refillTook - now.Sub(r.start), cold, true
}

// foreground raises sp to the CPU priority of any run, if its backend has
// priorities.
func foreground(sp *box) {
	if f, ok := sp.sb.(Prioritizer); ok {
		f.Foreground()
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
	sp, err := p.restore(pl, image, nil)
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

// refillLull is how long no run must have arrived or ended before a
// refill starts, and refillBeside how long the newest run in flight must
// have run for one to start beside it. Each sandbox serves one run, and a
// restore with its prime uses more CPU than a cold start (here 1.0 s
// against 0.8 s), so a client calling back to back drains any pool, and
// refills made while its calls come only slow them: measured, a cold
// start beside two refills at the lowest CPU weight took 0.6-0.9 s,
// against 0.47 s alone, and with refills held back only during a call's
// first 250 ms, its misses still took 15 % longer than calls without a
// pool. So calls that follow one another within refillLull find the CPUs
// their own, as with no pool; a client that pauses, or a run longer than
// such calls take, lets the pool refill.
const (
	refillLull   = 250 * time.Millisecond
	refillBeside = 2 * time.Second
)

// next picks the language to refill: the one furthest below its size whose
// next sandbox fits the memory budget. It returns nil if there is none, if
// runs and refills under way already take every CPU, or, unless runs wait
// for refills (AwaitRefill), if a cold run boots or the quiet refillLull
// asks for has not come (then it pokes the filler when it comes).
func (p *pool) next() *poolLang {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	var used int64
	busy := p.running
	for _, pl := range p.langs {
		used += int64(len(pl.ready)+pl.filling) * pl.memory
		busy += pl.filling
	}
	if busy >= p.cpus {
		return nil // poked again when a run or a refill ends
	}
	// Where runs wait for refills (AwaitRefill), refills make the runs'
	// sandboxes and start at once; elsewhere they must not slow runs.
	if p.cfg.AwaitRefill <= 0 {
		if p.booting > 0 {
			return nil // poked again when it has booted
		}
		wait := max(time.Until(p.arrived.Add(refillLull)), time.Until(p.ended.Add(refillLull)))
		if p.running > 0 {
			wait = max(wait, time.Until(p.arrived.Add(refillBeside)))
		}
		if wait > 0 {
			if p.lull == nil {
				p.lull = time.AfterFunc(wait, p.poke)
			} else {
				p.lull.Reset(wait)
			}
			return nil
		}
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
			wait := min(refillBackoff, time.Second<<min(pl.fails-1, 5))
			p.mu.Unlock()
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
		p.poke() // its CPU is free for another refill
		if p.closed {
			p.mu.Unlock()
			_ = sp.destroy()
			return
		}
		pl.ready = append(pl.ready, sp)
		if len(pl.ready) >= pl.size {
			pl.filled = true
		}
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
	r := p.begin(pl)
	defer p.end(pl, r, &sp)
	if image != "" {
		if sp, err = p.restore(pl, image, r); err != nil {
			p.ckptMu.Lock()
			p.restoreFailed(pl, image, err)
			p.ckptMu.Unlock()
		}
	}
	if sp == nil {
		if sp, err = p.startCold(pl, r); err != nil {
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

// begin records a refill of pl as starting its sandbox now.
func (p *pool) begin(pl *poolLang) *refill {
	r := &refill{start: time.Now()}
	p.mu.Lock()
	pl.refills = append(pl.refills, r)
	p.mu.Unlock()
	return r
}

// end records the refill r of pl as over, with *sp its sandbox or nil.
func (p *pool) end(pl *poolLang, r *refill, sp **box) {
	took := time.Since(r.start)
	var cpu time.Duration
	if *sp != nil {
		if m, ok := (*sp).sb.(CPUMeter); ok {
			cpu, _ = m.CPUUsed()
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	pl.refills = slices.DeleteFunc(pl.refills, func(o *refill) bool { return o == r })
	if *sp != nil {
		pl.refillTook = average(pl.refillTook, took)
		if cpu > 0 {
			pl.refillCPU = average(pl.refillCPU, cpu)
		}
	}
}

// startRefillBox starts the sandbox of refill r (nil: of a run, or of a
// checkpoint) at the priority r calls for.
func (p *pool) startRefillBox(pl *poolLang, image string, r *refill) (*box, error) {
	spec := p.e.spec(pl.job, false)
	spec.Background = r != nil
	sp, err := p.e.startBox(spec, image)
	if err != nil || r == nil {
		return sp, err
	}
	prio, background := sp.sb.(Prioritizer)
	p.mu.Lock()
	r.started, r.background = true, background
	if background {
		r.raise = prio.Foreground
	}
	if m, ok := sp.sb.(CPUMeter); ok {
		r.used = m.CPUUsed
	}
	p.mu.Unlock()
	return sp, nil
}

// startCold starts a sandbox, waits for its agent, and warms its
// interpreter; r is its refill, if it is one.
func (p *pool) startCold(pl *poolLang, r *refill) (*box, error) {
	sp, err := p.startRefillBox(pl, "", r)
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
	// The run's command, which a warm Bash starts ahead of its script.
	req := agent.Request{Op: agent.OpWarm, Interpreter: pl.lang.Interpreter, Preload: pl.preload, Argv: pl.lang.Command, Env: p.cfg.Env, Timeout: startTimeout}
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
	if p.lull != nil {
		p.lull.Stop()
	}
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
