// Package agent is the small program that runs as the sandbox's first
// process, and the protocol the host uses to talk to it.
//
// It has a home of its own because both sides of the sandbox boundary use
// it: cmd/safe-run-agent runs Serve inside gVisor, and package engine
// speaks the protocol from the host. Keeping it apart lets the agent binary
// stay small and static, linking nothing of the host side.
//
// The protocol is newline-delimited JSON over the agent's stdin and stdout.
// The agent first sends an Event with Ready set. The host then sends a
// Request; the agent answers with Output events while the program runs and
// one Event with Exit set when it is over. The agent reads a run's output
// pipes only from a few milliseconds into the run, or at its end, so the
// Output events of a short run all come just before its Exit, in the same
// write. In one-shot mode the agent then
// exits; otherwise it waits for the next Request, so a later caller can keep
// one sandbox for many runs.
//
// The agent runs as root inside gVisor (never on the host) with the few
// capabilities of bundle.AgentCapabilities, the program as another,
// unprivileged user that can neither signal nor trace it. Still, the agent
// shares a sandbox with untrusted code and might be subverted by it, so the
// host treats every Event as untrusted input: it bounds sizes, validates
// fields and keeps its own deadline.
package agent

import "time"

// The operations of a Request.
const (
	// OpRun runs Argv as a new process (the default).
	OpRun = ""
	// OpEval runs Code in the session's persistent interpreter of kind
	// Interpreter, which keeps its state from one request to the next.
	OpEval = "eval"
	// OpWrite only writes Files.
	OpWrite = "write"
	// OpRead returns the workspace file Path in Exit.Files.
	OpRead = "read"
	// OpList lists the workspace below Path in Exit.Files, without data.
	OpList = "list"
	// OpWarm starts the persistent interpreter of kind Interpreter ahead of
	// its run, with the modules of Preload imported; the next OpRun hands
	// its Argv and its code file to that interpreter instead of starting a
	// new process. For Bash, Argv is the run's command, started ahead of
	// its script; a run of another command or Env starts cold. Sent again,
	// it primes the interpreter (see WarmInterpreters for what each kind
	// does).
	OpWarm = "warm"
)

// Request asks the agent to do one thing, by default run one program.
type Request struct {
	// Op is one of the Op constants.
	Op string `json:"op,omitempty"`
	// Code and Interpreter are the cell and the interpreter kind of OpEval;
	// Interpreter is also the kind OpWarm starts.
	Code        string `json:"code,omitempty"`
	Interpreter string `json:"interpreter,omitempty"`
	// Preload names the modules OpWarm imports before the run is known.
	Preload []string `json:"preload,omitempty"`
	// Path is the file of OpRead or the directory of OpList, relative to
	// the workspace.
	Path string `json:"path,omitempty"`
	// MaxBytes bounds the file OpRead returns; MaxFiles the entries of OpList.
	MaxBytes int64 `json:"max_bytes,omitempty"`
	MaxFiles int   `json:"max_files,omitempty"`
	// Files are written below Workdir before the program starts.
	Files []File `json:"files,omitempty"`
	// Argv is the program and its arguments; Argv[0] is looked up in PATH.
	Argv []string `json:"argv"`
	// Install, if set, is a program run before Argv (or the OpEval cell)
	// in the workspace, as the program's user and with the same Env, that
	// installs the packages the code needs; its output goes to the result's
	// stderr after a header line. If it fails the code is not run and Exit
	// has InstallFailed set.
	Install []string `json:"install,omitempty"`
	// InstallTimeout is Install's own wall-clock limit, part of Timeout.
	InstallTimeout time.Duration `json:"install_timeout,omitempty"`
	// Env is added to the agent's own environment for this program.
	Env []string `json:"env,omitempty"`
	// Stdin is the program's standard input.
	Stdin []byte `json:"stdin,omitempty"`
	// Timeout is the program's wall-clock limit.
	Timeout time.Duration `json:"timeout"`
	// OutputBytes caps what is kept of stdout and of stderr, each.
	OutputBytes int64 `json:"output_bytes"`
	// Collect, if set, asks for the files the program left in a directory
	// of the workspace.
	Collect *Collect `json:"collect,omitempty"`
}

// Collect says which files to send back after a run, and how much.
type Collect struct {
	// Dir is relative to the workspace, e.g. "out". Its regular files are
	// returned, recursively, in path order; symbolic links are never
	// followed.
	Dir string `json:"dir"`
	// MaxFiles, MaxFileBytes and MaxTotalBytes bound what is returned;
	// files beyond them are listed with Skipped set instead of their data.
	MaxFiles      int   `json:"max_files"`
	MaxFileBytes  int64 `json:"max_file_bytes"`
	MaxTotalBytes int64 `json:"max_total_bytes"`
}

// OutputFile is a file found in the Collect directory.
type OutputFile struct {
	// Path is relative to the Collect directory.
	Path string `json:"path"`
	Size int64  `json:"size"`
	Data []byte `json:"data,omitempty"`
	// Skipped says why Data is absent, e.g. "symbolic link (not followed)".
	Skipped string `json:"skipped,omitempty"`
	// Type is "file", "dir", "symlink" or "other", in OpList and OpRead.
	Type string `json:"type,omitempty"`
}

// File is a file to write into the workspace.
type File struct {
	// Path is relative to the workspace.
	Path string `json:"path"`
	Data []byte `json:"data,omitempty"`
	// Mode is the permission bits, 0644 when zero.
	Mode uint32 `json:"mode,omitempty"`
}

// Event is one message from the agent; exactly one field is set.
type Event struct {
	Ready  *Ready  `json:"ready,omitempty"`
	Output *Output `json:"output,omitempty"`
	Exit   *Exit   `json:"exit,omitempty"`
}

// Ready says the agent is up and waiting for a Request.
type Ready struct {
	// Version is the agent's protocol version.
	Version int `json:"version"`
}

// ProtocolVersion is the Ready.Version of this agent.
const ProtocolVersion = 1

// Stream names an output stream.
type Stream string

// The program's output streams.
const (
	Stdout Stream = "stdout"
	Stderr Stream = "stderr"
)

// Output carries bytes the program wrote, in order, from the head of a
// stream: once a stream has produced half its cap, the rest of it is held
// back and only its tail is sent, in Exit.
type Output struct {
	Stream Stream `json:"stream"`
	Data   []byte `json:"data"`
}

// Exit ends one run.
type Exit struct {
	// Code is the program's exit code, or -1 if a signal killed it.
	Code int `json:"code"`
	// Signal names the signal that killed the program, e.g. "SIGKILL".
	Signal string `json:"signal,omitempty"`
	// TimedOut says the agent killed the program at its timeout.
	TimedOut bool `json:"timed_out,omitempty"`
	// StdoutBytes and StderrBytes count everything the program wrote.
	StdoutBytes int64 `json:"stdout_bytes"`
	StderrBytes int64 `json:"stderr_bytes"`
	// StdoutTail and StderrTail are the ends of the streams that followed
	// the head sent in Output events, at most half the cap each.
	StdoutTail []byte `json:"stdout_tail,omitempty"`
	StderrTail []byte `json:"stderr_tail,omitempty"`
	// Error says why the program could not be run at all, e.g. the
	// interpreter is missing from the image.
	Error string `json:"error,omitempty"`
	// Duration is the program's wall time as the agent measured it.
	Duration time.Duration `json:"duration"`
	// Files are the collected output files, if the request asked for them,
	// or the result of OpRead and OpList. In a session, collected files are
	// those new or changed since the previous request.
	Files []OutputFile `json:"files,omitempty"`
	// InstallFailed says the request's Install step failed (Code, Signal
	// and TimedOut are its) and the code was not run.
	InstallFailed bool `json:"install_failed,omitempty"`
	// StateLost says a session's interpreter had to be killed or died: the
	// next request starts with a fresh one.
	StateLost bool `json:"state_lost,omitempty"`
}
