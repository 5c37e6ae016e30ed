//go:build linux

package agent

import (
	"bufio"
	_ "embed"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The warm drivers pre-start an interpreter for a pooled sandbox; each waits
// on fd 3 for the argv of the one run it serves.
var (
	//go:embed drivers/warm.py
	warmPythonDriver string
	//go:embed drivers/warm.js
	warmNodeDriver string
)

// WarmInterpreters are the interpreter kinds that can be started before
// their code is known. Other languages are pooled too, but their program
// starts with the run.
var WarmInterpreters = []string{"python", "node"}

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
// argv that says what to run.
type warmProgram struct {
	pid     int
	done    <-chan unix.WaitStatus
	argv    *os.File // fd 3 of the driver: its commands
	status  *bufio.Reader
	statusF *os.File // fd 4 of the driver: its answers
	stdin   *os.File
	stdout  *os.File
	stderr  *os.File
	started time.Time
}

// warm starts the request's interpreter and waits until it has imported
// the modules to preload. The next OpRun hands its argv to it instead of
// starting a program.
//
// Sent again to a warm sandbox, it primes the interpreter: a sandbox
// restored from a checkpoint maps its memory back page by page as it is
// first touched, and priming pays for that before the run instead of
// during it.
func (s *server) warm(req *Request) *Exit {
	if req.Timeout <= 0 {
		return &Exit{Code: -1, Error: "invalid request: a positive timeout is required"}
	}
	if s.warmed != nil {
		return s.prime(req.Timeout)
	}
	argv, err := warmArgv(req.Interpreter)
	if err != nil {
		return &Exit{Code: -1, Error: err.Error()}
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		return &Exit{Code: -1, Error: err.Error()}
	}
	outR, outW, _ := os.Pipe()
	errR, errW, _ := os.Pipe()
	argvR, argvW, _ := os.Pipe()
	statR, statW, _ := os.Pipe()
	env := append([]string{"SAFE_RUN_PRELOAD=" + strings.Join(req.Preload, ",")}, req.Env...)
	start := time.Now()
	pid, done, err := s.startProgram(argv, env, []*os.File{inR, outW, errW, argvR, statW})
	if err != nil {
		closeAll(inW, outR, errR, argvW, statR)
		return &Exit{Code: -1, Error: err.Error()}
	}
	w := &warmProgram{pid: pid, done: done, argv: argvW, status: bufio.NewReader(statR), statusF: statR,
		stdin: inW, stdout: outR, stderr: errR, started: start}
	if err := w.await("ready", req.Timeout); err != nil {
		_ = unix.Kill(-pid, unix.SIGKILL)
		closeAll(inW, outR, errR, argvW, statR)
		return &Exit{Code: -1, Error: fmt.Sprintf("the warm %s interpreter %v", req.Interpreter, err), Duration: time.Since(start)}
	}
	s.warmed = w
	return &Exit{Duration: time.Since(start)}
}

// prime asks the warm interpreter to touch its memory, and the agent
// touches its own.
func (s *server) prime(timeout time.Duration) *Exit {
	start := time.Now()
	w := s.warmed
	if _, err := w.argv.Write([]byte("prime\n")); err != nil {
		return &Exit{Code: -1, Error: "prime the warm interpreter: " + err.Error()}
	}
	if err := w.await("primed", timeout); err != nil {
		return &Exit{Code: -1, Error: "the warm interpreter " + err.Error()}
	}
	runtime.GC()
	return &Exit{Duration: time.Since(start)}
}

// await reads the driver's next answer and checks that it is want.
func (w *warmProgram) await(want string, timeout time.Duration) error {
	got := make(chan string, 1)
	go func() {
		line, _ := w.status.ReadString('\n')
		got <- line
	}()
	select {
	case line := <-got:
		if line != want+"\n" {
			return fmt.Errorf("exited before it answered %q", want)
		}
		return nil
	case <-time.After(timeout):
		// The reader goroutine ends when the interpreter is killed.
		return fmt.Errorf("did not answer %q within %s", want, timeout)
	}
}

// launchWarm hands argv to the warm interpreter, which runs it as a cold
// start of argv would, and returns its descriptors as startProgram's
// caller would hold them.
func (s *server) launchWarm(argv []string) (pid int, done <-chan unix.WaitStatus, stdin, stdout, stderr *os.File) {
	w := s.warmed
	s.warmed = nil
	w.statusF.Close()
	go func() {
		// EOF ends the argv; if the driver died, the write fails and its
		// exit status tells the rest.
		_, _ = w.argv.Write([]byte("run\n" + strings.Join(argv, "\x00") + "\x00"))
		w.argv.Close()
	}()
	return w.pid, w.done, w.stdin, w.stdout, w.stderr
}
