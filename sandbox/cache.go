package sandbox

import (
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/json"
	"slices"
	"sync"
	"time"
)

// ResultCache is a Runner that answers a job identical to an earlier one —
// same language, code, files, stdin, limits, output directory and image —
// with the earlier result, marked Cached, for TTL after it was produced.
// Only results of programs that ran to their end (ok and error) are kept:
// a timeout, an OOM or a sandbox error may not happen again. It is opt-in,
// since code may read the clock or random numbers, and it never applies to
// sessions, whose calls depend on the state before them.
//
// The zero value is not usable; set Runner and TTL.
type ResultCache struct {
	// Runner runs the jobs that miss.
	Runner Runner
	// TTL is how long a result is reused.
	TTL time.Duration
	// MaxBytes bounds the output and files kept, in all; 0 means 64 MiB.
	// The oldest results go first.
	MaxBytes int64

	mu      sync.Mutex
	entries map[[32]byte]*list.Element
	order   list.List // of *cacheEntry, oldest first
	size    int64
}

type cacheEntry struct {
	key     [32]byte
	res     Result
	size    int64
	expires time.Time
}

// Run returns the cached result of an identical job, or runs job.
func (c *ResultCache) Run(ctx context.Context, job Job) (Result, error) {
	key, ok := cacheKey(job)
	if !ok {
		return c.Runner.Run(ctx, job)
	}
	if res, hit := c.lookup(key); hit {
		// A live reader sees the output the run would have streamed.
		if job.Stdout != nil {
			_, _ = job.Stdout.Write([]byte(res.Stdout))
		}
		if job.Stderr != nil {
			_, _ = job.Stderr.Write([]byte(res.Stderr))
		}
		return res, nil
	}
	res, err := c.Runner.Run(ctx, job)
	if err == nil && (res.Status == StatusOK || res.Status == StatusError) {
		c.store(key, res)
	}
	return res, err
}

// Policy is the policy of the runner behind the cache.
func (c *ResultCache) Policy() Policy { return c.Runner.Policy() }

// cacheKey hashes everything of job that decides its result; the live
// writers do not. A job with a network or packages is never cached: its
// result depends on what the hosts it reaches answer now, and a repeat
// must reach them again (and be recorded doing so).
func cacheKey(job Job) ([32]byte, bool) {
	if len(job.Network) > 0 || len(job.Packages) > 0 {
		return [32]byte{}, false
	}
	job.Stdout, job.Stderr = nil, nil
	b, err := json.Marshal(job)
	if err != nil {
		return [32]byte{}, false
	}
	return sha256.Sum256(b), true
}

func (c *ResultCache) lookup(key [32]byte) (Result, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.entries[key]
	if !ok {
		return Result{}, false
	}
	e := el.Value.(*cacheEntry)
	if time.Now().After(e.expires) {
		c.remove(el)
		return Result{}, false
	}
	res := e.res
	res.Files = slices.Clone(res.Files)
	res.Cached = true
	return res, true
}

func (c *ResultCache) store(key [32]byte, res Result) {
	size := int64(len(res.Stdout) + len(res.Stderr))
	for _, f := range res.Files {
		size += int64(len(f.Data))
	}
	limit := c.MaxBytes
	if limit == 0 {
		limit = 64 << 20
	}
	if size > limit {
		return
	}
	res.Files = slices.Clone(res.Files)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries == nil {
		c.entries = map[[32]byte]*list.Element{}
	}
	if el, ok := c.entries[key]; ok {
		c.remove(el)
	}
	for c.size+size > limit {
		c.remove(c.order.Front())
	}
	c.entries[key] = c.order.PushBack(&cacheEntry{key: key, res: res, size: size, expires: time.Now().Add(c.TTL)})
	c.size += size
}

func (c *ResultCache) remove(el *list.Element) {
	e := c.order.Remove(el).(*cacheEntry)
	delete(c.entries, e.key)
	c.size -= e.size
}
