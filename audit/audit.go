// Package audit keeps safe-run's audit log: one JSON line per run and per
// session event, each line carrying the SHA-256 of the line before it, so
// that Verify detects a line that was edited, dropped or moved.
//
// It has a home of its own because the log and its chain are a noun that
// belongs to neither side of it: the MCP layer only knows what happened and
// the command only wires things together, while the chain's rules — how a
// line is hashed, how the chain continues across process restarts, rotated
// files and concurrent writers, and how it is checked — must be the same for
// every writer and for the verifier. The records themselves are made in one
// place too, Runner, a decorator of the runner and sessions that both the
// server and the CLI wrap around their backend.
package audit

import (
	"crypto/sha256"
	"encoding/hex"
	"time"

	"github.com/safe-run/safe-run/egress"
	"github.com/safe-run/safe-run/sandbox"
)

// The events of a Record.
const (
	// EventRun is one run of code, in a fresh sandbox or in a session.
	EventRun = "run"
	// EventSessionEnd is the end of a session, however it ended; Message
	// says why (closed, idle timeout, maximum lifetime, server shutting
	// down).
	EventSessionEnd = "session_end"
	// EventPruned says that rotated files were deleted (Options.MaxFiles)
	// and that the chain now starts at record FirstSeq.
	EventPruned = "audit_pruned"
)

// Record is one line of the audit log. Seq and Prev are set by Log.Append;
// the rest by the caller.
type Record struct {
	// Seq numbers the records of a chain from 1, across rotated files.
	Seq uint64 `json:"seq"`
	// Prev is the hex SHA-256 of the previous line (without its newline),
	// empty for the first record of a chain.
	Prev string    `json:"prev"`
	Time time.Time `json:"time"`
	// Event is EventRun or the name of a session tool, e.g. create_session.
	Event string `json:"event"`
	// RequestID is the JSON-RPC id of the MCP request.
	RequestID string `json:"request_id,omitempty"`
	// SessionID is the safe-run session the event belongs to.
	SessionID     string `json:"session_id,omitempty"`
	ClientName    string `json:"client_name,omitempty"`
	ClientVersion string `json:"client_version,omitempty"`
	Language      string `json:"language,omitempty"`
	// Image is the image a run asked for; empty for its language's own.
	Image string `json:"image,omitempty"`
	// CodeSHA256 is the hex SHA-256 of the code. Append computes it from
	// Code, which it then keeps only if the log was opened with IncludeCode.
	CodeSHA256 string `json:"code_sha256,omitempty"`
	Code       string `json:"code,omitempty"`
	// Path is the workspace path of a file operation.
	Path   string  `json:"path,omitempty"`
	Limits *Limits `json:"limits,omitempty"`
	// Status is a run's sandbox.Status, or "ok", "error" or "refused" for
	// other events and for runs the runner refused.
	Status          string `json:"status"`
	ExitCode        *int   `json:"exit_code,omitempty"`
	DurationMS      int64  `json:"duration_ms"`
	MemoryPeakBytes int64  `json:"memory_peak_bytes,omitempty"`
	// OutputBytes counts everything the program wrote to stdout and
	// stderr, including what the output cap dropped.
	OutputBytes int64 `json:"output_bytes,omitempty"`
	// Message says why a status is not ok.
	Message string `json:"message,omitempty"`
	// Cached says the call got an earlier identical run's result from the
	// result cache: nothing ran for it.
	Cached bool `json:"cached,omitempty"`
	// NetworkAsked is what a run or session asked to reach (its network
	// argument), as canonical entries once the policy accepted it.
	NetworkAsked []string `json:"network_asked,omitempty"`
	// Packages are what a run or session asked to install.
	Packages []string `json:"packages,omitempty"`
	// Network is what a run's network saw: its connections and
	// denials, up to MaxNetworkRecords of them.
	Network *egress.Report `json:"network,omitempty"`
	// Activity is what a run did inside its sandbox (or, in a
	// session_end record, the session's whole tree), as the behaviour
	// monitor saw it, bounded as MaxActivityProcesses and the caps below
	// say; nil when the run was not monitored.
	Activity *sandbox.Activity `json:"activity,omitempty"`
	// FirstSeq and FirstPrev, in an EventPruned record, are the number and
	// prev of the oldest record kept: Verify accepts a chain that starts
	// there only if the last such record says so.
	FirstSeq  uint64 `json:"first_seq,omitempty"`
	FirstPrev string `json:"first_prev,omitempty"`
}

// Limits are the limits a run had, in the units of the CLI and the tools.
type Limits struct {
	TimeoutMS      int64   `json:"timeout_ms"`
	MemoryBytes    int64   `json:"memory_bytes"`
	Processes      int     `json:"processes"`
	CPUs           float64 `json:"cpus"`
	OutputBytes    int64   `json:"output_bytes"`
	WorkspaceBytes int64   `json:"workspace_bytes"`
}

// LimitsOf converts a job's limits.
func LimitsOf(l sandbox.Limits) *Limits {
	return &Limits{TimeoutMS: l.Timeout.Milliseconds(), MemoryBytes: l.MemoryBytes, Processes: l.Processes,
		CPUs: l.CPUs, OutputBytes: l.OutputBytes, WorkspaceBytes: l.WorkspaceBytes}
}

// RunRecord describes a finished run of job with result res.
func RunRecord(job sandbox.Job, res sandbox.Result) Record {
	code := res.ExitCode
	return Record{
		Event: EventRun, Language: job.Language, Image: job.Image, Code: job.Code, Limits: LimitsOf(job.Limits),
		Status: string(res.Status), ExitCode: &code, DurationMS: res.DurationMS,
		MemoryPeakBytes: res.MemoryPeakBytes, OutputBytes: res.StdoutBytes + res.StderrBytes, Message: res.Message,
		Cached: res.Cached, NetworkAsked: job.Network, Packages: job.Packages, Network: res.Network,
		Activity: res.Activity,
	}
}

// hashLine is the chain's link to line, which excludes its newline.
func hashLine(line []byte) string {
	sum := sha256.Sum256(line)
	return hex.EncodeToString(sum[:])
}

// HashCode is the hex SHA-256 of code, as in Record.CodeSHA256.
func HashCode(code string) string {
	sum := sha256.Sum256([]byte(code))
	return hex.EncodeToString(sum[:])
}
