//go:build linux

package agent

import (
	"bytes"
	"crypto/rand"
	_ "embed"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The warm drivers pre-start an interpreter for a pooled sandbox; each waits
// on fd 3 (the warm shell on its stdin) for the argv of the one run it
// serves.
var (
	//go:embed drivers/warm.py
	warmPythonDriver string
	//go:embed drivers/warm.js
	warmNodeDriver string
	//go:embed drivers/warm.sh
	warmBashHook string
)

// WarmInterpreters are the interpreter kinds that OpWarm prepares before
// their code is known: Python and Node are started, with their preloads, and
// run the code in that process; Bash starts the run's own command, which
// waits in its start-up file for the script (see warmBash). Other languages
// are pooled too, with nothing warmed.
var WarmInterpreters = []string{"python", "node", "bash"}

func warmArgv(kind string) ([]string, error) {
	switch kind {
	case "python":
		return []string{"python3", "-u", "-c", warmPythonDriver}, nil
	case "node":
		return []string{"node", "-e", warmNodeDriver}, nil
	}
	return nil, fmt.Errorf("no warm interpreter for %q; use one of %s", kind, strings.Join(WarmInterpreters, ", "))
}

// warmProgram is an interpreter started ahead of its run, waiting for the
// message that says what to run.
//
// The agent talks to it in messages on its fd 3, each a line "COMMAND
// LENGTH" followed by LENGTH bytes: "prime" (no bytes) asks it to touch its
// memory and reseed its random generators, "run" carries the run (see
// runMessage). It answers in lines on its fd 4: "ready" once its preloads
// are imported, "primed", and "fail MESSAGE" if it cannot start the run;
// it closes both before the program runs, which then has only its stdio.
// The warm shell (see warmBash) reads its messages on its stdin instead
// and answers on its fd 3 (see commands).
type warmProgram struct {
	// kind is the interpreter: "python", "node" or "bash" (see shell).
	kind string
	// argv and env are the warm shell's command and environment.
	argv, env []string

	pid  int
	done <-chan unix.WaitStatus
	// pidfd becomes readable when the driver exits (-1 where the kernel
	// gives none at fork); comm is its /proc/PID/comm, where an
	// interpreter's driver names its end (see endName), opened ahead so
	// that the end of a run reads it with one system call (-1 for the
	// shell). Inside gVisor a system call costs a few µs once the sandbox
	// is busy and up to 0.1-0.5 ms on one that waited idle in the pool.
	pidfd   int
	comm    int
	cmd     int    // fd 3 of the driver: its commands (blocking); -1 for the shell
	status  int    // fd 4 of the driver (the shell's 3): its answers (non-blocking)
	pending []byte // read from status past the last answer
	stdin   int    // the agent's ends of its stdio (stdin's blocks)
	stdout  int
	stderr  int
}

// warm starts the request's interpreter and waits until it has imported
// the modules to preload. The next OpRun hands its argv to it instead of
// starting a program.
//
// Sent again to a warm sandbox, it primes the interpreter: a sandbox
// restored from a checkpoint maps its memory back page by page as it is
// first touched, and priming pays for that before the run instead of
// during it. The engine primes every sandbox it restores, so priming is
// also where the driver reseeds the random generators that every sandbox
// restored from one checkpoint would otherwise share.
func (s *server) warm(req *Request) *Exit {
	if req.Timeout <= 0 {
		return &Exit{Code: -1, Error: "invalid request: a positive timeout is required"}
	}
	if s.warmed != nil {
		return s.prime(req.Timeout)
	}
	// The look into the output directory at the run's end starts from the
	// workspace: opened now, that is one system call fewer after the run.
	_, _ = s.workspace()
	if req.Interpreter == "bash" {
		if len(req.Argv) == 0 || !hookable(req.Env) {
			return s.warmUpBash(req)
		}
		return s.warmBash(req)
	}
	argv, err := warmArgv(req.Interpreter)
	if err != nil {
		return &Exit{Code: -1, Error: err.Error()}
	}
	w, err := s.startWarm(req.Interpreter, argv, append([]string{"SAFE_RUN_PRELOAD=" + strings.Join(req.Preload, ",")}, req.Env...))
	if err != nil {
		return &Exit{Code: -1, Error: err.Error()}
	}
	if w.comm, err = unix.Open("/proc/"+strconv.Itoa(w.pid)+"/comm", unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
		w.kill()
		return &Exit{Code: -1, Error: fmt.Sprintf("watch the warm %s interpreter: %v", req.Interpreter, err)}
	}
	start := time.Now()
	if err := w.await("ready", req.Timeout); err != nil {
		w.kill()
		return &Exit{Code: -1, Error: fmt.Sprintf("the warm %s interpreter %v", req.Interpreter, err), Duration: time.Since(start)}
	}
	s.warmed = w
	return &Exit{Duration: time.Since(start)}
}

// warmUpBash runs `bash -c :` once, as the program would run, and waits for
// it. A Bash run starts its program cold, as `bash main.sh`: a warm shell
// that sourced the script would differ from it in ways a script can see
// ($-, FUNCNAME, caller, a top-level return, an extra descriptor). But the
// first exec of bash in a sandbox pays for looking up and reading the shell
// and its libraries through the sandbox's file system, which the run's exec
// then finds cached. Nothing of it stays: the shell does nothing and
// exits, and the workspace is untouched.
func (s *server) warmUpBash(req *Request) *Exit {
	start := time.Now()
	devnull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return &Exit{Code: -1, Error: err.Error()}
	}
	null2, _ := dupFile(devnull)
	null3, _ := dupFile(devnull)
	pid, done, err := s.startProgram([]string{"bash", "--norc", "--noprofile", "-c", ":"}, req.Env, []*os.File{devnull, null2, null3})
	if err != nil {
		return &Exit{Code: -1, Error: "warm up bash: " + err.Error()}
	}
	select {
	case <-done:
	case <-time.After(req.Timeout):
		_ = unix.Kill(-pid, unix.SIGKILL)
		<-done
		return &Exit{Code: -1, Error: fmt.Sprintf("warm up bash: no end within %s", req.Timeout), Duration: time.Since(start)}
	}
	return &Exit{Duration: time.Since(start)}
}

// startWarm starts the driver of kind with its five descriptors: stdin,
// stdout, stderr, the command pipe (3) and the status pipe (4). The shell
// (warmBash) has four: its messages come on its stdin, ahead of the run's
// input, and its status pipe is 3. Every descriptor beyond the stdio is one
// more for the hook to close before the script runs, and Bash closes one
// with six system calls (it saves a copy of it first, then closes both).
func (s *server) startWarm(kind string, argv, env []string) (*warmProgram, error) {
	path, err := lookPath(argv[0])
	if err != nil {
		return nil, err
	}
	w := &warmProgram{kind: kind, pidfd: -1, comm: -1, cmd: -1, status: -1, stdin: -1, stdout: -1, stderr: -1}
	var inR, outW, errW, statW int
	var cmd [2]int
	var childFDs []int
	fail := func(err error) (*warmProgram, error) {
		closeFDs(childFDs...)
		w.close()
		return nil, err
	}
	if inR, w.stdin, err = stdinPipe(); err != nil {
		return fail(err)
	}
	childFDs = append(childFDs, inR)
	if w.stdout, outW, err = outputPipe(); err != nil {
		return fail(err)
	}
	childFDs = append(childFDs, outW)
	if w.stderr, errW, err = outputPipe(); err != nil {
		return fail(err)
	}
	childFDs = append(childFDs, errW)
	if !w.shell() {
		if err = unix.Pipe2(cmd[:], unix.O_CLOEXEC); err != nil {
			return fail(err)
		}
		w.cmd = cmd[1]
		childFDs = append(childFDs, cmd[0])
	}
	if w.status, statW, err = pipe(); err != nil {
		return fail(err)
	}
	childFDs = append(childFDs, statW)
	fds := make([]uintptr, len(childFDs))
	for i, fd := range childFDs {
		fds[i] = uintptr(fd)
	}
	w.pid, w.done, err = s.forkExec(path, argv, append(os.Environ(), env...), fds, &w.pidfd)
	if err != nil {
		return fail(fmt.Errorf("start %s: %w", argv[0], err))
	}
	closeFDs(childFDs...)
	return w, nil
}

// warmBash starts the run's own command (req.Argv, `bash main.sh`) with
// drivers/warm.sh as its BASH_ENV: the shell starts, sources the hook, and
// waits in it until the agent has written the script; then the hook
// leaves no trace and the shell opens and runs the script as a cold one
// would. It serves only a run of the same argv and environment.
//
// The hook is a file of the sandbox's temporary directory, removed once
// the shell has read it (it says "ready" after): the shell, running as the
// programs' user, could not reopen a pipe of the agent's through /dev/fd.
func (s *server) warmBash(req *Request) *Exit {
	start := time.Now()
	// The agent writes the run's script (Python and Node drivers write
	// their code file themselves): with the user thread made now, the run
	// does not wait for one. Only here: in a Python sandbox the kept thread
	// is one more task to restore, and a restore with its prime measured
	// 932 against 839 ms of CPU (bench -cpu, 10 each).
	startUserThread(s.cfg.User)
	hook, err := os.CreateTemp("", ".safe-run-warm-*.sh")
	if err != nil {
		return &Exit{Code: -1, Error: "write the warm bash's start-up file: " + err.Error()}
	}
	defer os.Remove(hook.Name())
	_, err = hook.Write(bashHook(req.Argv))
	if cerr := hook.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(hook.Name(), 0o444) // the shell runs as the programs' user
	}
	if err != nil {
		return &Exit{Code: -1, Error: "write the warm bash's start-up file: " + err.Error()}
	}
	w, err := s.startWarm("bash", req.Argv, append(slices.Clip(req.Env), "BASH_ENV="+hook.Name()))
	if err != nil {
		return &Exit{Code: -1, Error: err.Error()}
	}
	w.argv, w.env = slices.Clone(req.Argv), slices.Clone(req.Env)
	if err := w.await("ready", req.Timeout); err != nil {
		w.kill()
		return &Exit{Code: -1, Error: fmt.Sprintf("the warm bash %v", err), Duration: time.Since(start)}
	}
	s.warmed = w
	return &Exit{Duration: time.Since(start)}
}

// bashHook is drivers/warm.sh with its last line: a command whose last
// argument is argv[0], what $_ holds when a shell of argv starts (with no _
// in its environment, see hookable), since the hook's own commands changed
// it.
func bashHook(argv []string) []byte {
	return []byte(warmBashHook + ": '" + strings.ReplaceAll(argv[0], "'", `'\''`) + "'\n")
}

// hookable says whether a run's shell with env can be warmed with a
// start-up file: not when env sets a start-up file of its own or shell
// options, which the hook would run under or disturb, nor when it has _,
// which a cold shell starts with exported and the hook's commands would
// leave unexported.
func hookable(env []string) bool {
	for _, kv := range append(os.Environ(), env...) {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "POSIXLY_CORRECT", "_":
			return false
		}
	}
	return true
}

// shell says w is the run's own Bash, waiting in its start-up file
// (warmBash): it serves only a run of argv with env, and the agent writes
// the script itself.
func (w *warmProgram) shell() bool { return w.kind == "bash" }

// commands is the descriptor w's messages are written to: the shell's
// stdin, whose hook reads each message whole (shellMessageSize) and leaves
// what follows to the script, else the command pipe.
func (w *warmProgram) commands() int {
	if w.shell() {
		return w.stdin
	}
	return w.cmd
}

// kill ends the warm program's process group and closes the agent's ends
// of its descriptors.
func (w *warmProgram) kill() {
	_ = unix.Kill(-w.pid, unix.SIGKILL)
	w.close()
}

// close closes the agent's descriptors of the driver.
func (w *warmProgram) close() {
	closeFDs(w.pidfd, w.comm, w.cmd, w.status, w.stdin, w.stdout, w.stderr)
	w.pidfd, w.comm, w.cmd, w.status, w.stdin, w.stdout, w.stderr = -1, -1, -1, -1, -1, -1, -1
}

// prime asks the warm interpreter to touch its memory and reseed, and the
// agent touches its own.
func (s *server) prime(timeout time.Duration) *Exit {
	start := time.Now()
	w := s.warmed
	if err := writeFull(w.commands(), w.message("prime 0")); err != nil {
		return &Exit{Code: -1, Error: "prime the warm interpreter: " + err.Error()}
	}
	if err := w.await("primed", timeout); err != nil {
		return &Exit{Code: -1, Error: "the warm interpreter " + err.Error()}
	}
	s.rehearseRun(w)
	runtime.GC()
	return &Exit{Duration: time.Since(start)}
}

// primeRequest is a run request as the engine sends one, which the prime
// decodes and drops.
var primeRequest = []byte(`{"files":[{"path":"main.py","data":"cHJpbnQoMSkK","mode":420}],` +
	`"argv":["python3","main.py"],"env":["A=1"],"stdin":"MQ==","timeout":1000000000,` +
	`"output_bytes":1048576,"collect":{"dir":"out","max_files":1,"max_file_bytes":1,"max_total_bytes":1}}`)

// rehearseRun goes through the agent's own part of a warm run, without
// its effects: the restored agent's code and data are mapped back as they
// are first touched, as the interpreter's are, and the run would pay for
// it between the request and the driver's message and between the
// driver's end and the Exit. It decodes a request, reads the driver's name
// as at its end, looks into the workspace as before a collection, and
// encodes the events of a run into nothing.
func (s *server) rehearseRun(w *warmProgram) {
	var req Request
	_ = json.Unmarshal(primeRequest, &req)
	_, _ = driverFile(&req)
	_ = runMessage(&File{Path: "main.py", Data: req.Stdin}, "out", false, req.Argv)
	_, _ = endName(w.comm)
	_ = s.emptyDir(".")
	var discard bytes.Buffer
	enc := json.NewEncoder(&discard)
	c := &streamCapture{Capture: Capture{Max: req.OutputBytes}, stream: Stdout, send: func(ev Event) error { return enc.Encode(ev) }}
	_ = c.add([]byte("1\n"))
	exit := finishCaptures(&Exit{Duration: time.Millisecond}, c, c)
	_ = enc.Encode(Event{Exit: exit})
}

// await reads the driver's next answer and checks that it is want.
func (w *warmProgram) await(want string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	buf := make([]byte, 256)
	for {
		if line, rest, ok := bytes.Cut(w.pending, []byte("\n")); ok {
			w.pending = rest
			if string(line) != want {
				return fmt.Errorf("answered %q, not %q", line, want)
			}
			return nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("did not answer %q within %s", want, timeout)
		}
		fds := []unix.PollFd{{Fd: int32(w.status), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, int(left/time.Millisecond)+1); err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("could not be heard: %w", err)
		}
		if fds[0].Revents == 0 {
			continue
		}
		n, err := unix.Read(w.status, buf)
		if n > 0 {
			w.pending = append(w.pending, buf[:n]...)
			continue
		}
		if n == 0 || !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("exited before it answered %q", want)
		}
	}
}

// driverFile splits off the request's file that a warm driver writes
// itself: the script its argv names, at the top of the workspace, if the
// request has it once.
func driverFile(req *Request) (rest []File, code *File) {
	script := scriptArg(req.Argv)
	if script == "" {
		return req.Files, nil
	}
	script = filepath.Clean(script)
	if strings.Contains(script, "/") || script == "." || script == ".." {
		return req.Files, nil
	}
	at := -1
	for i, f := range req.Files {
		if filepath.Clean(f.Path) == script {
			if at >= 0 {
				return req.Files, nil // twice: the agent writes both, in order
			}
			at = i
		}
	}
	if at < 0 {
		return req.Files, nil
	}
	f := req.Files[at]
	f.Path = script
	rest = append(append(rest, req.Files[:at]...), req.Files[at+1:]...)
	return rest, &f
}

// scriptArg is the script a warm driver runs for argv: its first argument
// that is not an option, as the drivers find it.
func scriptArg(argv []string) string {
	for _, a := range argv[min(1, len(argv)):] {
		if !strings.HasPrefix(a, "-") {
			return a
		}
	}
	return ""
}

// runMessage is the "run" message: the code file (name, octal mode, length
// and bytes; an empty name for none), the output directory to make ("" for
// none), "1" if the user site may hold what the driver's last look at it
// (at the prime) did not (newSite: the agent wrote files or installed
// packages for the run) and "" otherwise, then the run's argv, each field
// ended by a NUL.
func runMessage(code *File, outDir string, newSite bool, argv []string) []byte {
	var p bytes.Buffer
	if code != nil {
		mode := code.Mode & 0o777
		if mode == 0 {
			mode = 0o644
		}
		fmt.Fprintf(&p, "%s\x00%o\x00%d\x00", code.Path, mode, len(code.Data))
		p.Write(code.Data)
	} else {
		p.WriteString("\x00\x00\x000\x00")
	}
	p.WriteString(outDir)
	p.WriteByte(0)
	if newSite {
		p.WriteByte('1')
	}
	p.WriteByte(0)
	for _, a := range argv {
		p.WriteString(a)
		p.WriteByte(0)
	}
	return append(fmt.Appendf(nil, "run %d\n", p.Len()), p.Bytes()...)
}

// writeFull writes all of b to the blocking descriptor fd.
func writeFull(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// launchWarm hands the run to the warm interpreter, which writes code (if
// not nil), makes the output directory and runs argv as a cold start of
// argv would, and returns it as a child to supervise. wrote says the agent
// wrote other files of the request.
func (s *server) launchWarm(req *Request, code *File, wrote bool) (*child, error) {
	w := s.warmed
	s.warmed = nil
	if w.shell() {
		return s.launchShell(w, req)
	}
	outDir := ""
	if req.Collect != nil {
		if !filepath.IsLocal(req.Collect.Dir) {
			w.kill()
			return nil, fmt.Errorf("create %s: path leaves the workspace", req.Collect.Dir)
		}
		outDir = filepath.Clean(req.Collect.Dir)
	}
	c := w.child()
	c.report, c.comm, c.named = w.status, w.comm, true
	if err := c.watchExit(w.pidfd); err != nil {
		w.kill()
		return nil, err
	}
	// If the driver died, the write fails (EPIPE) and its exit tells the
	// rest. The driver reads no further: the end of its command pipe is
	// closed with the run's descriptors, after the run. Its stdin is fed
	// after the message, while the driver writes the code file: closing
	// it first put one system call before the driver's wake-up.
	_ = writeFull(w.cmd, runMessage(code, outDir, wrote || len(req.Install) > 0, req.Argv))
	feedStdin(w.stdin, req.Stdin)
	return c, nil
}

// launchShell lets the warm shell w run its script, which the agent has
// written, and returns it as a child to supervise: from here on it is the
// cold run's shell, ended by its exit.
func (s *server) launchShell(w *warmProgram, req *Request) (*child, error) {
	c := w.child()
	unix.Close(w.status) // the hook closes its end before the script runs
	w.status = -1
	if err := c.watchExit(w.pidfd); err != nil {
		w.kill()
		return nil, err
	}
	// A seed for RANDOM from the kernel, drawn for this run: the shell's
	// own was drawn at its start, which every sandbox restored from one
	// checkpoint would share (Bash sandboxes are not checkpointed today;
	// see engine's checkpointable). If the shell died, the write fails
	// (EPIPE) and its exit tells the rest. Stdin after, in the same pipe:
	// the hook reads the message whole and leaves the rest to the script.
	var seed [4]byte
	_, _ = rand.Read(seed[:])
	_ = writeFull(w.commands(), w.message(fmt.Sprintf("run 0 %d", binary.LittleEndian.Uint32(seed[:])>>1)))
	feedStdin(w.stdin, req.Stdin)
	return c, nil
}

// shellMessageSize is the size of every message to the warm shell, padded
// with spaces before its newline: Bash's read takes a line from a pipe one
// byte per system call (it cannot give back what it read past the line),
// but `read -N` a known count in one. Inside gVisor each system call of a
// sandbox that waited idle costs 45-170 µs, and the run's message
// ("run 0 SEED", up to 16 bytes and the newline) was 17 of them. (Side by
// side, warm `echo 1` p50 19.6 against 19.9 ms, min 15.2 against 18.4:
// within this machine's noise.)
const shellMessageSize = 24

// message is the line text as w reads it: padded to shellMessageSize for
// the warm shell.
func (w *warmProgram) message(text string) []byte {
	if !w.shell() {
		return []byte(text + "\n")
	}
	return fmt.Appendf(nil, "%-*s\n", shellMessageSize-1, text)
}

// child is the run the warm program w becomes: its process, its command
// pipe (closed with the run's other descriptors) and its output. w's stdin
// is fed and closed apart (feedStdin); the caller sets what else the kind
// of driver needs.
func (w *warmProgram) child() *child {
	return &child{pid: w.pid, done: w.done, pidfd: -1, report: -1, comm: -1, cmd: w.cmd, stdout: w.stdout, stderr: w.stderr}
}

// serves says whether the warm program w can take req's run: a warm
// interpreter any run of its kind, except a Node run that brings a
// package.json or installs packages, and the warm shell only a run of the
// command and environment it was started with. Node's loader looked for
// package.json files while the driver warmed up and keeps what it found
// (none), so it would load such a run's main module as CommonJS where a
// cold `node` reads "type": "module" and loads an ES module.
func (w *warmProgram) serves(req *Request) bool {
	switch {
	case w.shell():
		return slices.Equal(w.argv, req.Argv) && slices.Equal(w.env, req.Env)
	case w.kind == "node":
		return len(req.Install) == 0 && !slices.ContainsFunc(req.Files, func(f File) bool {
			return filepath.Base(f.Path) == "package.json"
		})
	}
	return true
}

// discardWarm ends the warm program, which cannot serve the next run.
func (s *server) discardWarm() {
	if w := s.warmed; w != nil {
		s.warmed = nil
		w.kill()
	}
}
