// Package sandbox defines what a run is (Job), what it produces (Result),
// the Runner and Sessions interfaces the engine implements, and the error
// classes every layer speaks.
//
// It has a home of its own so that the CLI, the MCP layer, the audit
// decorator and the engine speak this vocabulary rather than one another's:
// the engine (runtime/engine) implements Runner over any backend, and the
// callers never learn which. It holds data and validation only; nothing
// here starts a process.
package sandbox

import (
	"context"
	"io"

	"github.com/safe-run/safe-run/egress"
)

// Runner runs jobs in sandboxes. Implementations are safe for concurrent use.
//
// Run returns an error only when the job never ran because it was invalid
// (an *InputError) or the backend is unusable; a run that went wrong in the
// sandbox is a Result with a non-ok Status.
type Runner interface {
	Run(ctx context.Context, job Job) (Result, error)
	// Policy is the policy Run checks jobs against: its languages, images
	// and limits. Callers that describe or pre-check jobs (the MCP tools)
	// read it here rather than keep a copy that could disagree.
	Policy() Policy
}

// Job is one piece of code to run, with what it needs and what it may use.
type Job struct {
	// Language names an entry of the runner's language table, e.g. "python".
	Language string
	// Image names the image to run in instead of the language's own; the
	// policy must allow it (see Policy.Images).
	Image string
	// Code is the program text. It is written to the language's file in the
	// workspace and run from there.
	Code string
	// Files are placed in the workspace before the code runs.
	Files []File
	// Stdin is the program's standard input; empty means /dev/null-like EOF.
	Stdin []byte
	// Env is added to the program's environment, as KEY=VALUE entries. In a
	// session it takes effect when the session's interpreter starts.
	Env []string
	// Limits bound the run; zero fields take the policy's defaults.
	Limits Limits
	// OutputDir, if set, is a directory of the workspace (e.g. "out") whose
	// files come back in Result.Files, within the policy's output file caps.
	OutputDir string
	// Network lists what the job may reach: allowlist entries and presets
	// (see package egress), each within the policy's Network. Empty means
	// no network at all. Policy.Check replaces it with the canonical
	// entries of the policy's list that it selects.
	Network []string
	// Packages are installed into the sandbox before the code runs, e.g.
	// "requests==2.32.3"; each must be allowed by Policy.Packages, and the
	// job's network must reach the language's package index.
	Packages []string

	// Stdout and Stderr, when set, receive the program's output while it
	// runs, capped exactly as the Result's copy is. They are for live
	// display only; the Result always carries the output as well.
	Stdout io.Writer
	Stderr io.Writer
}

// File is one file placed in the workspace before a run.
type File struct {
	// Path is relative to the workspace, e.g. "data/input.csv".
	Path string
	// Data is the file's content.
	Data []byte
	// Executable marks the file mode 0755 instead of 0644.
	Executable bool
}

// Status is the outcome class of a run.
type Status string

// The statuses a run can end with.
const (
	// StatusOK means the program exited with code 0.
	StatusOK Status = "ok"
	// StatusError means the program exited with a non-zero code.
	StatusError Status = "error"
	// StatusTimeout means the wall-clock limit passed and the run was killed.
	StatusTimeout Status = "timeout"
	// StatusOOM means the run hit its memory limit and was killed.
	StatusOOM Status = "oom"
	// StatusKilled means the program died from a signal, or the caller
	// cancelled the run.
	StatusKilled Status = "killed"
	// StatusSandboxError means the sandbox itself failed; it is never the
	// user's code's fault.
	StatusSandboxError Status = "sandbox_error"
	// StatusPolicyViolation means a behaviour monitoring rule whose action
	// is kill fired, and the run was stopped; the message names the rule.
	StatusPolicyViolation Status = "policy_violation"
)

// Result is what a run produced. Its JSON form is the `--json` output of the
// CLI and the structured content of the MCP tool.
type Result struct {
	Status Status `json:"status"`
	// Err is the error behind a sandbox_error, for the edges to classify
	// (Class) and to add the hint that fits their audience; Message holds
	// its text.
	Err error `json:"-"`
	// ExitCode is the program's exit code, or -1 when it has none (it was
	// killed, timed out, ran out of memory, or the sandbox failed).
	ExitCode int `json:"exit_code"`
	// Signal names the signal that killed the program, e.g. "SIGSEGV".
	Signal string `json:"signal,omitempty"`
	Stdout string `json:"stdout"`
	Stderr string `json:"stderr"`
	// StdoutTruncated reports that the middle of stdout was dropped to stay
	// within the output cap; the head and the tail are kept.
	StdoutTruncated bool `json:"stdout_truncated"`
	StderrTruncated bool `json:"stderr_truncated"`
	// StdoutBytes and StderrBytes count everything the program wrote,
	// including what the cap dropped.
	StdoutBytes int64 `json:"stdout_bytes"`
	StderrBytes int64 `json:"stderr_bytes"`
	// DurationMS is the wall time of the whole run, sandbox start included.
	DurationMS int64 `json:"duration_ms"`
	// MemoryPeakBytes is the sandbox's peak memory as its cgroup reports it
	// (gVisor's own overhead included); 0 when unknown.
	MemoryPeakBytes int64 `json:"memory_peak_bytes,omitempty"`
	// Message explains a non-ok status in one line, e.g. which limit was hit.
	Message string `json:"message,omitempty"`
	// SandboxID identifies the sandbox in logs.
	SandboxID string `json:"sandbox_id,omitempty"`
	// Files are the files found in the job's OutputDir; in a session, those
	// new or changed since the previous call.
	Files []OutputFile `json:"files,omitempty"`
	// StateLost says a session's interpreter or sandbox had to be restarted:
	// variables and imports are gone (files in /workspace survive unless
	// the whole sandbox was).
	StateLost bool `json:"state_lost,omitempty"`
	// Cached says the result is an earlier run's, of an identical job (see
	// ResultCache); nothing ran for this call.
	Cached bool `json:"cached,omitempty"`
	// Network is what the run's network saw; nil for a run without one.
	Network *egress.Report `json:"network,omitempty"`
	// Activity is what the run did inside the sandbox (processes, network
	// attempts, files written, rules fired), from gVisor's trace points;
	// nil when the run was not monitored.
	Activity *Activity `json:"activity,omitempty"`
}

// OutputFile is a file the program left in the job's OutputDir.
type OutputFile struct {
	// Path is relative to the OutputDir, e.g. "plot.png".
	Path string `json:"path"`
	// Size is the file's size in bytes.
	Size int64 `json:"size"`
	// Data is the content; nil when Skipped says why it was not returned.
	Data []byte `json:"-"`
	// Skipped says why the content was not returned: a symbolic link (never
	// followed), not a regular file, or over a size cap.
	Skipped string `json:"skipped,omitempty"`
	// Type is "file", "dir", "symlink" or "other" in file listings.
	Type string `json:"type,omitempty"`
}
