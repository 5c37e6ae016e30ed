//go:build linux

package agent

import (
	"bufio"
	_ "embed"
	"fmt"
	"os"
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
	argv    *os.File // fd 3 of the driver
	stdin   *os.File
	stdout  *os.File
	stderr  *os.File
	started time.Time
}

// warm starts the request's interpreter and waits until it has imported
// the modules to preload. The next OpRun hands its argv to it instead of
// starting a program.
func (s *server) warm(req *Request) *Exit {
	if s.warmed != nil {
		return &Exit{Code: -1, Error: "invalid request: the sandbox is already warm"}
	}
	if req.Timeout <= 0 {
		return &Exit{Code: -1, Error: "invalid request: a positive timeout is required"}
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
	ready := make(chan bool, 1)
	go func() {
		defer statR.Close()
		line, _ := bufio.NewReader(statR).ReadString('\n')
		ready <- line == "ready\n"
	}()
	w := &warmProgram{pid: pid, done: done, argv: argvW, stdin: inW, stdout: outR, stderr: errR, started: start}
	fail := func(msg string) *Exit {
		_ = unix.Kill(-pid, unix.SIGKILL)
		closeAll(inW, outR, errR, argvW)
		return &Exit{Code: -1, Error: msg, Duration: time.Since(start)}
	}
	timer := time.NewTimer(req.Timeout)
	defer timer.Stop()
	select {
	case ok := <-ready:
		if !ok {
			return fail(fmt.Sprintf("the warm %s interpreter exited before it was ready", req.Interpreter))
		}
	case <-timer.C:
		return fail(fmt.Sprintf("the warm %s interpreter was not ready within %s", req.Interpreter, req.Timeout))
	}
	s.warmed = w
	return &Exit{Duration: time.Since(start)}
}

// launchWarm hands argv to the warm interpreter, which runs it as a cold
// start of argv would, and returns its descriptors as startProgram's
// caller would hold them.
func (s *server) launchWarm(argv []string) (pid int, done <-chan unix.WaitStatus, stdin, stdout, stderr *os.File) {
	w := s.warmed
	s.warmed = nil
	go func() {
		// EOF ends the argv; if the driver died, the write fails and its
		// exit status tells the rest.
		_, _ = w.argv.Write([]byte(strings.Join(argv, "\x00") + "\x00"))
		w.argv.Close()
	}()
	return w.pid, w.done, w.stdin, w.stdout, w.stderr
}
