//go:build linux

package agent

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// InstallHeader starts the line the agent writes to stderr before an
// install step's output, so the reader tells it from the program's.
const InstallHeader = "[safe-run] installing packages: "

// install runs req.Install, its stdout and stderr both into stderr (the
// program's stdout stays the program's alone). It returns nil when the
// install succeeded, else the Exit that ends the request.
func (s *server) install(req *Request, stderr *streamCapture) *Exit {
	if len(req.Install) == 0 {
		return nil
	}
	timeout := req.InstallTimeout
	if timeout <= 0 || timeout > req.Timeout {
		timeout = req.Timeout
	}
	_ = stderr.add([]byte(InstallHeader + strings.Join(req.Install, " ") + "\n"))
	start := time.Now()
	errR, errW, err := os.Pipe()
	if err != nil {
		return &Exit{Code: -1, Error: err.Error()}
	}
	inR, err := os.Open(os.DevNull)
	if err != nil {
		closeAll(errR, errW)
		return &Exit{Code: -1, Error: err.Error()}
	}
	errW2, err := dupFile(errW)
	if err != nil {
		closeAll(errR, errW, inR)
		return &Exit{Code: -1, Error: err.Error()}
	}
	pid, done, err := s.startProgram(req.Install, req.Env, []*os.File{inR, errW, errW2})
	if err != nil {
		errR.Close()
		_ = stderr.add([]byte(fmt.Sprintf("[safe-run] installing packages failed (%v); the code was not run\n", err)))
		return &Exit{Code: -1, InstallFailed: true}
	}
	var readers sync.WaitGroup
	readers.Add(1)
	go func() { defer readers.Done(); stderr.drain(errR) }()
	exit := &Exit{}
	var ws unix.WaitStatus
	timer := time.NewTimer(timeout)
	select {
	case ws = <-done:
		timer.Stop()
	case <-timer.C:
		exit.TimedOut = true
		_ = unix.Kill(-pid, unix.SIGKILL)
		ws = <-done
	}
	// What the install left running goes now (its group), or it would hold
	// the pipe and race the code.
	_ = unix.Kill(-pid, unix.SIGKILL)
	waitOrClose(&readers, 200*time.Millisecond, errR)
	switch {
	case exit.TimedOut:
		exit.Code = -1
	case ws.Signaled():
		exit.Code = -1
		exit.Signal = unix.SignalName(ws.Signal())
	default:
		exit.Code = ws.ExitStatus()
	}
	if exit.Code == 0 && !exit.TimedOut {
		// The install's time is part of the request's: the code gets the rest.
		req.Timeout -= time.Since(start)
		if req.Timeout <= 0 {
			req.Timeout = time.Millisecond
		}
		return nil
	}
	exit.InstallFailed = true
	exit.Duration = time.Since(start)
	_ = stderr.add([]byte(fmt.Sprintf("[safe-run] installing packages failed (%s); the code was not run\n", installEnd(exit, timeout))))
	return exit
}

// installEnd says in a few words how a failed install ended.
func installEnd(exit *Exit, timeout time.Duration) string {
	switch {
	case exit.TimedOut:
		return fmt.Sprintf("no end within %s", timeout)
	case exit.Signal != "":
		return "killed by " + exit.Signal
	}
	return fmt.Sprintf("exit code %d", exit.Code)
}

func dupFile(f *os.File) (*os.File, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("install: dup: %w", err)
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}
