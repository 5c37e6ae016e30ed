package main

import (
	"flag"
	"time"

	"github.com/safe-run/safe-run/sandbox"
)

// httpLimits are the limits of the HTTP server itself: how long clients
// may take, how many connections they may hold, how many bytes of results
// may wait for them (see README, "HTTP server limits").
type httpLimits struct {
	readTimeout, writeTimeout, idleTimeout time.Duration
	maxConnections                         int
	maxResponse, maxInFlight               int64
}

func (l *httpLimits) register(fs *flag.FlagSet) {
	fs.DurationVar(&l.readTimeout, "read-timeout", time.Minute, "longest an HTTP request body may take to arrive")
	fs.DurationVar(&l.writeTimeout, "write-timeout", 30*time.Second, "close an HTTP connection whose client takes no part of its response for this long")
	fs.DurationVar(&l.idleTimeout, "idle-timeout", 30*time.Second, "close a kept-alive HTTP connection idle this long")
	fs.IntVar(&l.maxConnections, "max-connections", 64, "most HTTP connections open at once; more are answered 503")
	l.maxResponse, l.maxInFlight = 64*sandbox.MiB, 128*sandbox.MiB
	fs.Var(sizeFlag{&l.maxResponse}, "max-response", "largest run_code result as JSON (a `size`); files that would take it over are not returned")
	fs.Var(sizeFlag{&l.maxInFlight}, "max-responses-in-flight", "most bytes of results held for HTTP clients still reading them (a `size`); a result that finds no room within 10s is refused")
}

func (l *httpLimits) check() error {
	switch {
	case l.readTimeout <= 0 || l.writeTimeout <= 0 || l.idleTimeout <= 0:
		return usageError("--read-timeout, --write-timeout and --idle-timeout must be greater than 0")
	case l.maxConnections < 1:
		return usageError("--max-connections must be at least 1")
	case l.maxResponse < 64*sandbox.KiB:
		return usageError("--max-response %s is too small; give at least 64KiB", sandbox.FormatBytes(l.maxResponse))
	case l.maxInFlight < l.maxResponse:
		return usageError("--max-responses-in-flight %s is less than --max-response %s; a largest result could never be sent", sandbox.FormatBytes(l.maxInFlight), sandbox.FormatBytes(l.maxResponse))
	}
	return nil
}

// memoryBound is the server's memory the README states for HTTP: a base,
// the results in flight (each held about twice while written: the result
// and its JSON, plus growth), and the runs in progress, each of which
// holds its output while it arrives from the agent and is decoded (or
// waits for room among the results in flight). The Go runtime is told to
// collect harder as it nears seven eighths of it (memoryTarget); that is
// a target, not a cap.
func memoryBound(l httpLimits, maxConcurrent int, outputLimit, cacheBytes int64) int64 {
	perRun := 4 * (sandbox.DefaultOutputFiles.MaxTotalBytes + 2*outputLimit)
	return 96*sandbox.MiB + 3*l.maxInFlight + int64(maxConcurrent)*perRun + cacheBytes
}

// memoryTarget is the soft memory limit the Go runtime gets: below the
// bound, for what the runtime holds besides the heap.
func memoryTarget(bound int64) int64 { return bound - bound/8 }
