package sandbox_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/safe-run/safe-run/sandbox"
)

// countingRunner answers every job with status and counts the runs.
type countingRunner struct {
	runs   int
	status sandbox.Status
	policy sandbox.Policy
}

func (r *countingRunner) Run(_ context.Context, job sandbox.Job) (sandbox.Result, error) {
	r.runs++
	return sandbox.Result{Status: r.status, Stdout: "run " + strings.Repeat("x", r.runs) + " of " + job.Code}, nil
}

func (r *countingRunner) Policy() sandbox.Policy { return r.policy }

// The cache describes the runner behind it: its policy is that runner's.
func TestResultCachePolicyIsTheRunners(t *testing.T) {
	inner := &countingRunner{policy: sandbox.Policy{MaxCodeBytes: 123, Images: []string{"alpine:3"}}}
	got := (&sandbox.ResultCache{Runner: inner, TTL: time.Hour}).Policy()
	if got.MaxCodeBytes != 123 || len(got.Images) != 1 || got.Images[0] != "alpine:3" {
		t.Errorf("cache policy %+v, want the runner's %+v", got, inner.policy)
	}
}

func TestResultCacheHitAndMiss(t *testing.T) {
	inner := &countingRunner{status: sandbox.StatusOK}
	c := &sandbox.ResultCache{Runner: inner, TTL: time.Hour}
	job := sandbox.Job{Language: "python", Code: "print(1)", Files: []sandbox.File{{Path: "a", Data: []byte("1")}}}
	first, _ := c.Run(context.Background(), job)
	var live bytes.Buffer
	again := job
	again.Stdout = &live // live writers are not part of the job's identity
	second, _ := c.Run(context.Background(), again)
	if inner.runs != 1 || first.Cached || !second.Cached || second.Stdout != first.Stdout {
		t.Fatalf("runs %d; first %+v; second %+v", inner.runs, first, second)
	}
	if live.String() != first.Stdout {
		t.Errorf("a hit wrote %q to the live writer, want %q", live.String(), first.Stdout)
	}
	for _, changed := range []sandbox.Job{
		{Language: "bash", Code: job.Code, Files: job.Files},
		{Language: "python", Code: "print(2)", Files: job.Files},
		{Language: "python", Code: job.Code, Files: []sandbox.File{{Path: "a", Data: []byte("2")}}},
		{Language: "python", Code: job.Code, Files: job.Files, Stdin: []byte("in")},
		{Language: "python", Code: job.Code, Files: job.Files, Limits: sandbox.Limits{MemoryBytes: sandbox.GiB}},
		{Language: "python", Code: job.Code, Files: job.Files, OutputDir: "out"},
	} {
		before := inner.runs
		res, _ := c.Run(context.Background(), changed)
		if inner.runs != before+1 || res.Cached {
			t.Errorf("%+v: answered from the cache of a different job", changed)
		}
	}
}

func TestResultCacheKeepsOnlyFinishedRuns(t *testing.T) {
	for _, tc := range []struct {
		status sandbox.Status
		cached bool
	}{
		{sandbox.StatusOK, true}, {sandbox.StatusError, true},
		{sandbox.StatusTimeout, false}, {sandbox.StatusOOM, false},
		{sandbox.StatusKilled, false}, {sandbox.StatusSandboxError, false},
	} {
		inner := &countingRunner{status: tc.status}
		c := &sandbox.ResultCache{Runner: inner, TTL: time.Hour}
		job := sandbox.Job{Language: "bash", Code: "x"}
		c.Run(context.Background(), job)
		res, _ := c.Run(context.Background(), job)
		if res.Cached != tc.cached || (inner.runs == 1) != tc.cached {
			t.Errorf("%s: cached %v after %d runs, want cached %v", tc.status, res.Cached, inner.runs, tc.cached)
		}
	}
}

func TestResultCacheExpires(t *testing.T) {
	inner := &countingRunner{status: sandbox.StatusOK}
	c := &sandbox.ResultCache{Runner: inner, TTL: 20 * time.Millisecond}
	job := sandbox.Job{Language: "bash", Code: "x"}
	c.Run(context.Background(), job)
	time.Sleep(40 * time.Millisecond)
	if res, _ := c.Run(context.Background(), job); res.Cached || inner.runs != 2 {
		t.Fatalf("an expired result was reused: %+v after %d runs", res, inner.runs)
	}
}

func TestResultCacheEvictsOldest(t *testing.T) {
	inner := &countingRunner{status: sandbox.StatusOK}
	// Each result is about 10 bytes: room for two.
	c := &sandbox.ResultCache{Runner: inner, TTL: time.Hour, MaxBytes: 25}
	for _, code := range []string{"a", "b", "c"} {
		c.Run(context.Background(), sandbox.Job{Language: "bash", Code: code})
	}
	runs := inner.runs
	if res, _ := c.Run(context.Background(), sandbox.Job{Language: "bash", Code: "c"}); !res.Cached {
		t.Error("the newest result was evicted")
	}
	if res, _ := c.Run(context.Background(), sandbox.Job{Language: "bash", Code: "a"}); res.Cached {
		t.Error("the oldest result was kept beyond MaxBytes")
	}
	if inner.runs != runs+1 {
		t.Errorf("runs = %d, want %d", inner.runs, runs+1)
	}
}

// A job with a network or packages runs every time: what it reaches may
// answer differently now, and each run's connections must be its own.
func TestResultCacheSkipsNetworkedJobs(t *testing.T) {
	for _, job := range []sandbox.Job{
		{Language: "python", Code: "print(1)", Network: []string{"pypi.org"}},
		{Language: "python", Code: "print(1)", Network: []string{"pypi.org"}, Packages: []string{"requests"}},
		{Language: "python", Code: "print(1)", Packages: []string{"requests"}},
	} {
		inner := &countingRunner{status: sandbox.StatusOK}
		c := &sandbox.ResultCache{Runner: inner, TTL: time.Hour}
		first, _ := c.Run(context.Background(), job)
		second, _ := c.Run(context.Background(), job)
		if inner.runs != 2 || first.Cached || second.Cached {
			t.Errorf("job network %v packages %v: %d runs, cached %v/%v; want 2 runs, none cached", job.Network, job.Packages, inner.runs, first.Cached, second.Cached)
		}
	}
}
