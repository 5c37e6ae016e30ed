package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/safe-run/safe-run/mcp"
	"github.com/safe-run/safe-run/sandbox"
)

const runUsage = `Usage: safe-run run [flags] (-c CODE | FILE | -)

Runs the code in a fresh gVisor sandbox with no network (unless --net
names entries of --allow-net), a read-only root and a private /workspace,
then prints the program's output. The exit code
is the program's own, or 124 (timeout), 125 (sandbox error), 126 (out of
memory), 128+N (killed by signal N), 2 (invalid input).

Flags:
`

// fileFlag collects --file HOST[:WORKSPACE_PATH] arguments.
type fileFlag []string

func (f *fileFlag) String() string     { return strings.Join(*f, ",") }
func (f *fileFlag) Set(s string) error { *f = append(*f, s); return nil }

// sizeFlag is a byte size such as 512MiB.
type sizeFlag struct{ n *int64 }

func (s sizeFlag) String() string {
	if s.n == nil || *s.n == 0 {
		return ""
	}
	return sandbox.FormatBytes(*s.n)
}

func (s sizeFlag) Set(v string) error {
	n, err := sandbox.ParseBytes(v)
	if err != nil {
		return err
	}
	if n <= 0 {
		return fmt.Errorf("size must be positive")
	}
	*s.n = n
	return nil
}

func cmdRun(args []string) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	var (
		host    hostFlags
		kube    kubeFlags
		audits  auditFlags
		net     netFlags
		mon     monitorFlags
		asked   listFlag
		pkgs    listFlag
		lang    = fs.String("lang", "", "language: "+strings.Join(sandbox.Policy{}.LanguageNames(), ", ")+" or one of --languages (default: from FILE's extension)")
		code    = fs.String("c", "", "the code to run")
		asJSON  = fs.Bool("json", false, "print the result as one JSON object instead of the program's output")
		stdin   = fs.String("stdin", "", "file to use as the program's standard input (- for safe-run's own)")
		outDir  = fs.String("out", "", "copy the files the program writes to /workspace/out into this directory: new files only, no names beginning with a dot, never through a link")
		outOpts outOptions
		files   fileFlag
		limits  sandbox.Limits
		timeout = fs.Duration("timeout", 0, "wall-clock limit of the program (default "+sandbox.DefaultLimits.Timeout.String()+")")
		warm    = fs.Bool("warm", false, "restore a cached checkpoint of a warm interpreter instead of starting cold (Python, with numpy, pandas and matplotlib imported; built on first use)")
	)
	env := registerWithEnv(fs, host.register, kube.register, audits.register, net.register, mon.register)
	fs.Usage = func() { fmt.Fprint(fs.Output(), runUsage); printSettings(fs, env) }
	fs.BoolVar(&outOpts.overwrite, "out-overwrite", false, "let --out replace existing regular files in DIR")
	fs.BoolVar(&outOpts.allowVCS, "out-allow-vcs", false, "let --out DIR be the root of a version-control checkout (.git, .hg, .svn, ...)")
	fs.Var(&files, "file", "copy HOST_PATH[:WORKSPACE_PATH] into /workspace before the run (repeatable)")
	fs.Var(&asked, "net", "let the run reach these `ENTRY,...` of --allow-net: entries or presets (repeatable; default: no network)")
	fs.Var(&pkgs, "packages", "install these `PKG,...` before the code runs (pip for python, npm for node); each allowed by --allow-packages, with --net reaching the index (repeatable)")
	registerLimits(fs, &limits)
	if code, done := parseFlags(fs, args); done {
		return code
	}
	if err := applySettings(fs, env, os.LookupEnv, ""); err != nil {
		return fail(usageError("%v", err))
	}
	if *timeout < 0 {
		return fail(&sandbox.InputError{Field: "timeout", Msg: "is negative; give a positive duration such as 30s"})
	}
	limits.Timeout = *timeout

	job, err := buildJob(host.languages, *lang, *code, fs.Args(), files, *stdin)
	if err != nil {
		return fail(err)
	}
	job.Limits, job.Network, job.Packages = limits, asked, pkgs
	if *outDir != "" {
		job.OutputDir = "out"
		if err := checkOutDir(*outDir, outOpts); err != nil {
			return fail(err)
		}
	}
	// Check the job before looking for runsc and the image, so a mistake in
	// the input is reported as such.
	policy := sandbox.Policy{Languages: host.languages}
	if err := net.policy(&policy); err != nil {
		return fail(err)
	}
	if _, _, err := policy.Check(job); err != nil {
		return fail(err)
	}
	if _, err := mon.options(); err != nil {
		return fail(err)
	}
	// No log, no run: a run that could not be recorded must not happen.
	logger := newLogger()
	auditLog, err := audits.open(logger)
	if err != nil {
		return fail(err)
	}
	defer closeAuditLog(auditLog, audits.path, logger)
	cfg, err := kube.runtimeConfig(&host)
	if err != nil {
		return fail(err)
	}
	cfg.Engine.Policy.Network, cfg.Engine.Policy.NetworkLimits = policy.Network, policy.NetworkLimits
	cfg.Engine.Policy.Packages, cfg.Engine.Policy.PackageIndex = policy.Packages, policy.PackageIndex
	net.configure(&cfg)
	if err := mon.configure(&cfg); err != nil {
		return fail(err)
	}
	if len(job.Network) > 0 {
		if err := net.checkHost(cfg); err != nil {
			return fail(err)
		}
	}
	if *warm {
		cfg.Engine.Pool = poolConfig{Size: map[string]int{job.Language: 1}, OnDemand: true}
		cfg.Backend.CheckpointDir = checkpointDir(host.cacheDir)
	}
	rt, err := newBackend(cfg)
	if err != nil {
		return fail(err)
	}
	defer closeBackend(rt)
	if !*asJSON {
		job.Stdout, job.Stderr = os.Stdout, os.Stderr
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	runner, _ := audited(newRecorder(auditLog, logger), rt, nil)
	res, err := runner.Run(sandbox.WithClient(ctx, sandbox.Client{Name: "safe-run run", Version: version}), job)
	if err != nil {
		return fail(auditHint(err))
	}
	if h := hint(res.Err); h != "" {
		res.Message += "; " + h
	}
	// Saved first, so that --json tells which files were not.
	var saveErr error
	if *outDir != "" {
		saveErr = saveFiles(*outDir, res.Files, outOpts)
	}
	if *asJSON {
		// File names (and output) may hold bidi overrides and other
		// invisible characters: printed as \u escapes, a terminal shows
		// them and a JSON reader gets the same value.
		data, err := json.MarshalIndent(res, "", "  ")
		if err != nil {
			return fail(err)
		}
		if _, err := os.Stdout.Write(append(mcp.EscapeJSON(data), '\n')); err != nil {
			return fail(err)
		}
	} else {
		printRunSummary(os.Stderr, res)
	}
	// The report is out: a reader of stdout need not wait for the removal
	// of the sandbox, which the deferred closeBackend still waits for.
	endStdout(os.Stdout)
	if saveErr != nil {
		return fail(saveErr)
	}
	return exitCode(res)
}

// printRunSummary tells, after the program's own output, what is not in
// it: a status other than the program's exit, one line of what the
// monitor saw if that was notable, and for a run with a network one line
// of its connections and one naming its denials.
func printRunSummary(w io.Writer, res sandbox.Result) {
	ran := res.Status == sandbox.StatusOK || res.Status == sandbox.StatusError
	if !ran {
		fmt.Fprintf(w, "safe-run: %s: %s\n", res.Status, res.Message)
	}
	if res.Activity.Notable() {
		fmt.Fprintln(w, "safe-run: "+mcp.ActivityLine(res.Activity))
	}
	if res.Network == nil {
		return
	}
	fmt.Fprintln(w, "safe-run: "+mcp.NetworkLine(res.Network))
	if d := mcp.NetworkDenials(res.Message); d != "" && ran {
		fmt.Fprintln(w, "safe-run: "+d)
	}
}

// endStdout ends what a reader of f waits for, once the result is
// written: when f is a pipe or a socket, its descriptor is pointed at
// /dev/null, so that the reader (`safe-run run … | tool`, a caller reading
// to EOF) sees the end while the sandbox is still being removed. The
// process still exits only after the removal, so a caller that waits for
// the exit status (a shell, subprocess.run) waits for it too: cleanup is
// never left to chance. A terminal or a file gains nothing and is left
// alone; so is stderr, where a failed removal is reported.
func endStdout(f *os.File) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return
	}
	if kind := st.Mode & unix.S_IFMT; kind != unix.S_IFIFO && kind != unix.S_IFSOCK {
		return
	}
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return
	}
	defer null.Close()
	_ = unix.Dup3(int(null.Fd()), int(f.Fd()), 0)
}

// closeBackend ends the pool and the sessions and waits (a bounded time)
// for every sandbox to be gone: a warm run's sandbox is removed after its
// result is known, and the process must not exit before.
func closeBackend(rt backend) {
	rt.Close()
	done, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = rt.Wait(done)
}

// registerLimits registers the flags of a run's limits other than its
// timeout (run and check share them).
func registerLimits(fs *flag.FlagSet, limits *sandbox.Limits) {
	fs.Var(sizeFlag{&limits.MemoryBytes}, "memory", "memory limit, e.g. 512MiB (default "+sandbox.FormatBytes(sandbox.DefaultLimits.MemoryBytes)+")")
	fs.IntVar(&limits.Processes, "pids", 0, "most processes and threads inside the sandbox (default "+strconv.Itoa(sandbox.DefaultLimits.Processes)+")")
	fs.Float64Var(&limits.CPUs, "cpus", 0, "CPU limit in cores, e.g. 0.5 (default "+strconv.FormatFloat(sandbox.DefaultLimits.CPUs, 'f', -1, 64)+")")
	fs.Var(sizeFlag{&limits.OutputBytes}, "output-limit", "most bytes kept of stdout and of stderr, each; head and tail are kept (default "+sandbox.FormatBytes(sandbox.DefaultLimits.OutputBytes)+")")
	fs.Var(sizeFlag{&limits.WorkspaceBytes}, "workspace-size", "size of /workspace (default "+sandbox.FormatBytes(sandbox.DefaultLimits.WorkspaceBytes)+")")
}

// exitCode maps a result to safe-run's exit code.
func exitCode(res sandbox.Result) int {
	switch res.Status {
	case sandbox.StatusOK, sandbox.StatusError:
		return res.ExitCode
	case sandbox.StatusTimeout:
		return exitTimeout
	case sandbox.StatusOOM:
		return exitOOM
	case sandbox.StatusPolicyViolation:
		return exitPolicy
	case sandbox.StatusKilled:
		if sig := unix.SignalNum(res.Signal); sig > 0 {
			return 128 + int(sig)
		}
		return 128 + int(syscall.SIGKILL)
	}
	return exitSandboxError
}

// buildJob reads the code and files named on the command line; a FILE's
// extension names its language among langs unless lang does.
func buildJob(langs []sandbox.Language, lang, code string, args []string, files fileFlag, stdinPath string) (sandbox.Job, error) {
	var job sandbox.Job
	switch {
	case code != "" && len(args) > 0:
		return job, usageError("give the code with -c or as FILE, not both")
	case len(args) > 1:
		return job, usageError("give one FILE (or - for standard input); pass data files with --file")
	case code != "":
		job.Code = code
	case len(args) == 0:
		return job, usageError("no code given; use -c CODE, FILE, or - to read standard input")
	case args[0] == "-":
		if stdinPath == "-" {
			return job, usageError("standard input cannot be both the code and the program's input")
		}
		data, err := readCapped(os.Stdin, "standard input")
		if err != nil {
			return job, err
		}
		job.Code = string(data)
	default:
		data, err := readFileCapped(args[0])
		if err != nil {
			return job, err
		}
		job.Code = string(data)
		if lang == "" {
			lang = languageOf(langs, args[0])
		}
	}
	if lang == "" {
		return job, &sandbox.InputError{Field: "language", Msg: "not given; pass --lang " + joinNames(sandbox.Policy{}.LanguageNames(), "or")}
	}
	job.Language = lang
	for _, spec := range files {
		hostPath, wsPath, ok := strings.Cut(spec, ":")
		if !ok {
			wsPath = filepath.Base(hostPath)
		}
		data, err := readFileCapped(hostPath)
		if err != nil {
			return job, err
		}
		fi, _ := os.Stat(hostPath)
		job.Files = append(job.Files, sandbox.File{Path: wsPath, Data: data, Executable: fi != nil && fi.Mode()&0o111 != 0})
	}
	switch stdinPath {
	case "":
	case "-":
		data, err := readCapped(os.Stdin, "standard input")
		if err != nil {
			return job, err
		}
		job.Stdin = data
	default:
		data, err := readFileCapped(stdinPath)
		if err != nil {
			return job, err
		}
		job.Stdin = data
	}
	return job, nil
}

// languageOf guesses a language from a file name's extension: that of the
// first of langs whose code file has it.
func languageOf(langs []sandbox.Language, name string) string {
	l, _ := sandbox.Policy{Languages: langs}.LanguageForFile(name)
	return l.Name
}

// maxInputBytes bounds what the CLI reads into memory for one input; the
// policy's own, smaller limits then apply with clearer messages.
const maxInputBytes = 256 << 20

func readFileCapped(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, usageError("%v", err)
	}
	defer f.Close()
	return readCapped(f, path)
}

func readCapped(r io.Reader, what string) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxInputBytes+1))
	if err != nil {
		return nil, usageError("read %s: %v", what, err)
	}
	if len(data) > maxInputBytes {
		return nil, usageError("%s is larger than %s", what, sandbox.FormatBytes(maxInputBytes))
	}
	return data, nil
}
