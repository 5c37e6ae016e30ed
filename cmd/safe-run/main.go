// Command safe-run runs untrusted Python, Node and Bash code in gVisor
// sandboxes, from the command line (safe-run run) or as an MCP server.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/safe-run/safe-run/rootfs"
	"github.com/safe-run/safe-run/sandbox"
	"golang.org/x/sys/unix"
)

// Exit codes of safe-run itself. A run's own exit code passes through; these
// mark outcomes that are not the program's (see README, "Exit codes").
const (
	exitUsage        = 2   // bad flags or an invalid job
	exitTimeout      = 124 // the program hit its time limit
	exitSandboxError = 125 // safe-run or the sandbox failed, or is not set up
	exitOOM          = 126 // the program hit its memory limit
	exitPolicy       = 123 // a monitoring rule stopped the run (docs/monitor.md)
)

// command is one subcommand, in a file of its own.
type command struct {
	name    string
	summary string
	run     func(args []string) int
}

var commands []command

func init() {
	commands = []command{
		{"run", "run code in a sandbox and print its output", cmdRun},
		{"check", "run the code blocks of Markdown documents as tests, in sandboxes", cmdCheck},
		{"serve", "serve the Model Context Protocol over stdio or Streamable HTTP", cmdServe},
		{"doctor", "check that this host can run sandboxes, and say how to fix what is missing", cmdDoctor},
		{"image", "manage images: pull, import, build, ls, rm", cmdImage},
		{"audit", "verify the hash chain of an audit log", cmdAudit},
		{"version", "print version information", cmdVersion},
	}
}

func main() {
	shimMain() // never returns when this process is the cgroup shim
	// Before the user namespace's re-exec, which would inherit them too.
	closeInheritedFiles()
	survivePipeClosures()
	enterUserNamespace(os.Args[1:])
	os.Exit(dispatch(os.Args[1:]))
}

// survivePipeClosures makes a write to a closed stdout or stderr fail with
// EPIPE instead of killing the process by SIGPIPE, Go's default for those
// two descriptors. A client that closes its ends first (an MCP client that
// shuts its server down, `safe-run run … | head`) would otherwise kill
// safe-run at its next log line, in the middle of removing its sandboxes,
// and leave their mounts and cgroups behind. A handler, not SIG_IGN: an
// ignored signal would stay ignored in the programs safe-run execs.
func survivePipeClosures() {
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
}

// closeInheritedFiles marks every descriptor above stderr that this process
// inherited close-on-exec: whatever a supervisor or a client leaked into
// safe-run must not reach the processes it starts (runsc, the network
// helper that parses the sandbox's frames, the agent). The descriptors
// stay open here; those safe-run passes on are added explicitly.
func closeInheritedFiles() {
	_ = unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
}

// enterUserNamespace makes a safe-run started by an ordinary user continue
// as root of a user namespace of its own, for the commands that start
// sandboxes; doctor only if it can, so that it can explain why not. The
// user's own directories, which root's defaults would replace inside, are
// passed on.
func enterUserNamespace(args []string) {
	if os.Geteuid() == 0 || len(args) == 0 {
		return
	}
	switch args[0] {
	case "run", "serve", "check":
	case "doctor":
		// doctor --unit reads a system service's cgroup as the user it is,
		// whose uid a namespace of its own would show as root.
		if userNamespaceCheck() != nil || slices.ContainsFunc(args[1:], isUnitFlag) {
			return
		}
	default:
		return
	}
	var env []string
	for name, def := range map[string]string{envName("cache-dir"): rootfs.DefaultDir(), envName("state-dir"): defaultStateDir()} {
		if os.Getenv(name) == "" {
			env = append(env, name+"="+def)
		}
	}
	// The user's cache passed on is their default, not a choice: images missing
	// there may still come from the system cache.
	if os.Getenv(envName("cache-dir")) == "" {
		env = append(env, defaultCacheEnv+"=1")
	} else {
		env = append(env, defaultCacheEnv+"=")
	}
	userNamespaceMain(env...)
}

// isUnitFlag reports whether arg is doctor's --unit flag.
func isUnitFlag(arg string) bool {
	name, _, _ := strings.Cut(strings.TrimLeft(arg, "-"), "=")
	return strings.HasPrefix(arg, "-") && name == "unit"
}

func dispatch(args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(os.Stderr)
		if len(args) == 0 {
			return exitUsage
		}
		return 0
	}
	for _, c := range commands {
		if c.name == args[0] {
			return c.run(args[1:])
		}
	}
	fmt.Fprintf(os.Stderr, "safe-run: unknown command %q; run `safe-run help` for the list\n", args[0])
	return exitUsage
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "safe-run runs untrusted code in gVisor sandboxes.")
	fmt.Fprintln(w, "\nUsage: safe-run COMMAND [flags]\n\nCommands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun `safe-run COMMAND -h` for a command's flags.")
}

// parseFlags parses args into fs. On -h it prints the flags to stdout; on a
// mistake, one line to stderr. done says the command should return code.
func parseFlags(fs *flag.FlagSet, args []string) (code int, done bool) {
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	switch {
	case err == nil:
		return 0, false
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(os.Stdout)
		fs.Usage()
		return 0, true
	}
	fmt.Fprintf(os.Stderr, "safe-run %s: %v; see `safe-run %s -h`\n", fs.Name(), err, fs.Name())
	return exitUsage, true
}

// fail prints err as one line and returns the exit code that fits it.
func fail(err error) int {
	fmt.Fprintln(os.Stderr, "safe-run:", oneLine(err.Error()))
	if sandbox.Class(err) == sandbox.ErrInvalid || errors.Is(err, errUsage) {
		return exitUsage
	}
	return exitSandboxError
}

var errUsage = errors.New("usage")

// usageError is a flag or argument mistake.
func usageError(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errUsage}, args...)...)
}

func oneLine(s string) string {
	s = strings.TrimPrefix(s, errUsage.Error()+": ")
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " ")), " ")
}

// newLogger logs to stderr (stdout carries program output or MCP) at the
// level named by SAFE_RUN_LOG_LEVEL (serve's --log-level), warn by default.
func newLogger() *slog.Logger {
	return newLoggerAt(parseLevel(os.Getenv(envName("log-level")), slog.LevelWarn))
}

func newLoggerAt(level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// parseLevel reads a level name such as "debug" or "info"; def otherwise.
func parseLevel(name string, def slog.Level) slog.Level {
	level := def
	if name != "" && level.UnmarshalText([]byte(name)) != nil {
		return def
	}
	return level
}
