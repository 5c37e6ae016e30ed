//go:build linux

package agent

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Inside gVisor every wake-up of a task costs 0.3–0.8 ms, while a system
// call that does not block costs microseconds. So the agent watches a run
// from one goroutine, the one that read the request, blocking in poll(2) on
// every descriptor that can end or feed the run: the warm driver's status,
// a pidfd that becomes readable when the program exits, and the output
// pipes. A goroutine per pipe and the reaper's channel would each add a
// hop between threads (the main goroutine is locked to the first thread,
// see cmd/safe-run-agent), and so a wake-up, to every event.

// lazyOutput is how long after its start a run's output pipes are watched
// only for their end (a warm driver's, see endName) and not for data: a
// program that ends within it (most warm runs) has its output read once,
// at its end, instead of waking the agent for each write and once more at
// the end of the window. A program that writes more than a pipe holds
// (outputPipeSize) in that time waits at most this long for the agent to
// start reading. 5 ms was too short: on a loaded host a warm print(1)
// takes longer, and the window's end was one more wake-up in its path.
const lazyOutput = 25 * time.Millisecond

// outputPipeSize is the capacity asked for the output pipes (Linux's
// default limit for an unprivileged process, and gVisor's), so that a
// program rarely waits for the agent to read during lazyOutput.
const outputPipeSize = 1 << 20

// child is a program the agent started and watches.
type child struct {
	pid  int
	done <-chan unix.WaitStatus // from the reaper; see exited
	// pidfd becomes readable when the program exits; where the kernel
	// gives none, a pipe that exitPipe writes to stands in for it.
	pidfd int
	// report is the warm driver's status descriptor, on which it writes
	// "fail MESSAGE" if it cannot start the program, and then exits; it
	// closes it before the program runs. It is read once the driver has
	// exited, not watched: watching it would wake the agent when the
	// driver closes it, in the middle of the run. -1 for a program
	// started cold.
	report int
	// named says the program is a warm driver, which ends by naming its
	// process "srexit:CODE" (see endName) and then closing its stdio;
	// comm is its /proc/PID/comm.
	named bool
	comm  int
	// cmd is the agent's end of a warm driver's command pipe, kept open
	// until the run's end: closing it is one more system call before the
	// run, and the driver reads nothing more. -1 for none.
	cmd int
	// stdout and stderr are the non-blocking read ends of its output
	// pipes; -1 once they ended.
	stdout, stderr int
	// ended holds the descriptors of pipes that ended during the run,
	// closed with the others by close: each close inside gVisor is one more
	// system call between the run's end and its Exit (see supervise).
	ended []int
}

// supervised says how a run ended.
type supervised struct {
	ws     unix.WaitStatus
	exited bool // ws is the program's status
	// named says the driver named its exit code, reported, before exiting.
	named    bool
	reported int
	// failed is why the driver could not start the program, if it said so.
	failed   string
	timedOut bool
	took     time.Duration // from the start to the end of the program
}

// supervise watches c until it ends or timeout passes, feeding its output to
// the captures, then kills what the run left (killRun), takes what is
// already in its pipes without waiting for anyone to close them, and closes
// them. A warm driver that exits after a "fail" report ends the run with
// that failure; otherwise its exit, or its end by name, does.
func (s *server) supervise(c *child, timeout time.Duration, stdout, stderr *streamCapture) supervised {
	start := time.Now()
	deadline := start.Add(timeout)
	eager := start.Add(lazyOutput)
	var res supervised
	buf := make([]byte, 32<<10)
	fds := make([]unix.PollFd, 0, 4)
	for {
		now := time.Now()
		if !now.Before(deadline) {
			res.timedOut = true
			break
		}
		wake := deadline
		fds = fds[:0]
		if c.pidfd >= 0 {
			fds = append(fds, unix.PollFd{Fd: int32(c.pidfd), Events: unix.POLLIN})
		}
		events := int16(unix.POLLIN)
		if now.Before(eager) {
			wake = eager
			// Only the pipes' hang-up, which poll always reports: a warm
			// driver's end.
			events = 0
		}
		if events != 0 || c.named {
			pipes := []int{c.stdout, c.stderr}
			if events == 0 && c.stdout >= 0 {
				// A warm driver closes stdout last: its hang-up alone
				// wakes the agent, which then finds stderr's end
				// without waiting again (see readAvailable below).
				pipes = pipes[:1]
			}
			for _, fd := range pipes {
				if fd >= 0 {
					fds = append(fds, unix.PollFd{Fd: int32(fd), Events: events})
				}
			}
		}
		ms := int((wake.Sub(now) + time.Millisecond - 1) / time.Millisecond)
		if _, err := unix.Poll(fds, ms); err != nil && !errors.Is(err, unix.EINTR) {
			// Not expected; fall back to waiting for the exit alone.
			res.ws, res.exited = c.wait(deadline)
			res.timedOut = !res.exited
			break
		}
		ended, held := false, false
		for _, p := range fds {
			if p.Revents == 0 {
				continue
			}
			switch int(p.Fd) {
			case c.pidfd:
				if ws, ok := c.reap(); ok {
					res.ws, res.exited, ended = ws, true, true
					res.took = time.Since(start)
				} else {
					time.Sleep(50 * time.Microsecond) // exited, not yet a zombie
				}
			case c.stdout:
				if events != 0 {
					c.stdout = readInto(c.stdout, buf, stdout, c.end)
					break
				}
				// Its hang-up, in the lazy window: most likely the run's
				// end. What the pipes hold goes with the Exit, in one
				// write, unless the run goes on (see releaseEvents).
				s.holdEvents()
				held = true
				c.stdout = readAvailable(c.stdout, buf, stdout, c.end)
			case c.stderr:
				c.stderr = readInto(c.stderr, buf, stderr, c.end)
			}
		}
		if !ended && c.named && c.stdout < 0 && c.stderr >= 0 {
			c.stderr = readAvailable(c.stderr, buf, stderr, c.end)
		}
		if !ended && c.named && c.stdout < 0 && c.stderr < 0 {
			c.named = false // asked once: the pipes cannot open again
			if code, ok := endName(c.comm); ok {
				res.named, res.reported, ended = true, code, true
				res.took = time.Since(start)
			}
		}
		if ended {
			break
		}
		if held {
			_ = s.releaseEvents() // a failed write shows at the Exit's
		}
	}
	if res.exited && c.report >= 0 {
		// The driver wrote its failure, if any, before it exited.
		if fail, ok := parseReport(readReport(c.report, buf)); ok {
			res.failed = fail
		}
	}
	if res.timedOut {
		s.killRun(c.pid) // and again below, as for any run
		// As a cold run reports it: killed by SIGKILL at the timeout.
		res.ws, res.exited = c.wait(time.Time{})
		res.took = time.Since(start)
	}
	s.holdEvents()
	if !res.timedOut && drainedAll(c, buf, stdout, stderr) {
		// Nothing holds the pipes any more: no process of the run can add
		// to its output, so its Exit need not wait for the kill of what the
		// run left (a SIGKILL of a process with numpy loaded takes 2-4 ms
		// inside gVisor). Serve kills it right after sending the Exit, and
		// anything that must see the run's processes gone first (the
		// collection of a non-empty output directory) kills it before.
		// Its descriptors are closed then too, for the same reason: inside
		// gVisor, the four to six closes of a warm run's end took 0.3-0.6
		// ms before its Exit.
		s.pendingKill, s.pendingClose = c.pid, c
		return res
	}
	// Whatever the program left running goes now, or its pipes never
	// close; then what it wrote up to its end is taken.
	s.killRun(c.pid)
	c.stdout = drainNow(c.stdout, buf, stdout)
	c.stderr = drainNow(c.stderr, buf, stderr)
	c.close()
	return res
}

// drainedAll reads what c's pipes hold without waiting and says whether
// both reached their end: every writer closed them.
func drainedAll(c *child, buf []byte, stdout, stderr *streamCapture) bool {
	eof := true
	for _, p := range []struct {
		fd *int
		c  *streamCapture
	}{{&c.stdout, stdout}, {&c.stderr, stderr}} {
		for *p.fd >= 0 {
			n, err := unix.Read(*p.fd, buf)
			if n > 0 {
				_ = p.c.add(buf[:n])
				continue
			}
			if n == 0 && err == nil {
				*p.fd = c.end(*p.fd)
				break
			}
			if !errors.Is(err, unix.EINTR) {
				eof = false // EAGAIN: someone still holds it open
				break
			}
		}
	}
	return eof
}

// killPending kills what the last run left and closes its descriptors,
// if both were put off until after its Exit (see supervise).
func (s *server) killPending() {
	if s.pendingKill != 0 {
		s.killRun(s.pendingKill)
		s.pendingKill = 0
	}
	if s.pendingClose != nil {
		s.pendingClose.close()
		s.pendingClose = nil
	}
}

// endName reads the exit code a warm driver put in its process's name
// ("srexit:CODE", set with PR_SET_NAME) once its program was over, before
// it closed its stdio: the exit of an interpreter with numpy loaded takes
// 10-15 ms inside gVisor that nobody needs to wait for. The name is the
// one channel from the driver that needs no descriptor the program could
// see; a program can set it too, and so end its own run early, as it could
// by exiting.
//
// comm is the process's /proc/PID/comm, opened when the driver started:
// one pread from its start reads the name as it is now (the kernel, and
// gVisor, make it anew for a read at an offset other than the last read's
// end), where opening, reading and closing it took three system calls at
// the end of every warm run.
func endName(comm int) (code int, ok bool) {
	if comm < 0 {
		return 0, false
	}
	var b [64]byte // a name is at most 16 bytes
	n, err := unix.Pread(comm, b[:], 0)
	if err != nil || n <= 0 {
		return 0, false
	}
	name, found := bytes.CutPrefix(bytes.TrimSpace(b[:n]), []byte("srexit:"))
	if !found {
		return 0, false
	}
	code, err = strconv.Atoi(string(name))
	if err != nil || code < 0 || code > 255 {
		return 0, false
	}
	return code, true
}

// maxReport bounds what the agent reads of a driver's status descriptor
// during a run.
const maxReport = 4 << 10

// parseReport finds the driver's "fail MESSAGE" (it could not start the
// program) in what it wrote on its status descriptor during a run.
func parseReport(b []byte) (fail string, ok bool) {
	for {
		line, rest, found := bytes.Cut(b, []byte("\n"))
		if !found {
			return "", false
		}
		if msg, isFail := bytes.CutPrefix(line, []byte("fail ")); isFail {
			return string(msg), true
		}
		b = rest
	}
}

// readReport reads what the exited driver left on its status descriptor,
// without waiting: at most maxReport bytes, since a driver's failure is one
// short line.
func readReport(fd int, buf []byte) []byte {
	var b []byte
	for len(b) <= maxReport {
		n, err := unix.Read(fd, buf)
		if n > 0 {
			b = append(b, buf[:n]...)
			continue
		}
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	return b
}

// readInto reads once from fd into c and, at fd's end, hands it to end
// and returns what end returns.
func readInto(fd int, buf []byte, c *streamCapture, end func(int) int) int {
	n, err := unix.Read(fd, buf)
	if n > 0 {
		_ = c.add(buf[:n])
	}
	if n == 0 || (err != nil && !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EINTR)) {
		return end(fd)
	}
	return fd
}

// readAvailable reads what the pipe fd holds without waiting, and hands it
// to end at its end (as readInto): a warm driver closes stderr before
// stdout, so when stdout has ended, stderr's end is usually already there.
// It reads at most maxDrain bytes, so that a process that keeps writing
// cannot hold the agent here; what it leaves, the poll loop takes.
func readAvailable(fd int, buf []byte, c *streamCapture, end func(int) int) int {
	for read := 0; fd >= 0 && read < maxDrain; {
		n, err := unix.Read(fd, buf)
		switch {
		case n > 0:
			_ = c.add(buf[:n])
			read += n
		case errors.Is(err, unix.EINTR):
		case errors.Is(err, unix.EAGAIN):
			return fd // someone still holds it open
		default: // its end, or a pipe that cannot be read
			return end(fd)
		}
	}
	return fd
}

// maxDrain bounds what drainNow reads: more than any pipe holds (Linux
// and gVisor cap pipe sizes at 1 MiB by default), so all that the program
// wrote before its end, and no more from a process that keeps writing.
const maxDrain = 1<<20 + 64<<10

// drainNow reads what is in the pipe fd without waiting for more, and
// closes it: a background process of the program that still holds the
// pipe open, and escaped the kill, must not delay the run's end.
func drainNow(fd int, buf []byte, c *streamCapture) int {
	read := 0
	for fd >= 0 {
		n, err := unix.Read(fd, buf[:min(len(buf), maxDrain-read)])
		if n > 0 {
			_ = c.add(buf[:n])
			if read += n; read < maxDrain {
				continue
			}
		}
		if errors.Is(err, unix.EINTR) {
			continue
		}
		unix.Close(fd)
		fd = -1
	}
	return fd
}

// reap takes the program's status once its pidfd said it exited: it
// reaps the program itself unless the reaper got there first.
func (c *child) reap() (unix.WaitStatus, bool) {
	r := sharedReaper()
	r.mu.Lock()
	var ws unix.WaitStatus
	pid, err := unix.Wait4(c.pid, &ws, unix.WNOHANG, nil)
	if pid == c.pid && err == nil {
		delete(r.waiting, c.pid)
		r.mu.Unlock()
		return ws, true
	}
	r.mu.Unlock()
	select {
	case ws := <-c.done:
		return ws, true
	default:
		// Readable pidfd but no zombie yet; poll again.
		return 0, false
	}
}

// wait waits for the program's exit until deadline (zero: no limit).
func (c *child) wait(deadline time.Time) (unix.WaitStatus, bool) {
	for {
		if c.pidfd >= 0 {
			ms := -1
			if !deadline.IsZero() {
				if ms = int(time.Until(deadline) / time.Millisecond); ms <= 0 {
					return 0, false
				}
			}
			fds := []unix.PollFd{{Fd: int32(c.pidfd), Events: unix.POLLIN}}
			if _, err := unix.Poll(fds, ms); err != nil && !errors.Is(err, unix.EINTR) {
				c.closePidfd()
				continue
			}
			if fds[0].Revents != 0 {
				if ws, ok := c.reap(); ok {
					return ws, true
				}
				time.Sleep(100 * time.Microsecond)
			}
			continue
		}
		var timeout <-chan time.Time
		if !deadline.IsZero() {
			t := time.NewTimer(time.Until(deadline))
			defer t.Stop()
			timeout = t.C
		}
		select {
		case ws := <-c.done:
			return ws, true
		case <-timeout:
			return 0, false
		}
	}
}

func (c *child) closePidfd() {
	if c.pidfd >= 0 {
		unix.Close(c.pidfd)
		c.pidfd = -1
	}
}

// end keeps fd, a pipe of c's that ended, to be closed with the others
// (see ended), and returns -1, the value of a pipe no longer read.
func (c *child) end(fd int) int {
	c.ended = append(c.ended, fd)
	return -1
}

// close closes every descriptor of c still open.
func (c *child) close() {
	c.closePidfd()
	for _, fd := range []*int{&c.report, &c.comm, &c.cmd, &c.stdout, &c.stderr} {
		if *fd >= 0 {
			unix.Close(*fd)
			*fd = -1
		}
	}
	closeFDs(c.ended...)
	c.ended = nil
}

// pipe returns a pipe whose read end, the agent's, does not block; the
// write end, the program's, does.
func pipe() (r, w int, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return -1, -1, err
	}
	if err := unix.SetNonblock(p[0], true); err != nil {
		unix.Close(p[0])
		unix.Close(p[1])
		return -1, -1, err
	}
	return p[0], p[1], nil
}

// outputPipe is a pipe for a program's stdout or stderr: pipe's, with room
// for outputPipeSize bytes where the kernel grants it.
func outputPipe() (r, w int, err error) {
	if r, w, err = pipe(); err == nil {
		_, _ = unix.FcntlInt(uintptr(r), unix.F_SETPIPE_SZ, outputPipeSize) // best effort: 64 KiB is correct, only slower
	}
	return r, w, err
}

// forkExec starts path as the program: in the workspace, in a process group
// of its own, as the programs' user, with fds as its descriptors 0, 1, 2,
// .... It uses syscall.ForkExec rather than os.StartProcess, whose first
// call in a process probes the kernel's pidfd support (about 3 ms inside
// gVisor), and asks the kernel for a pidfd when pidfd is non-nil. The
// reaper is told of the pid before it can reap it.
func (s *server) forkExec(path string, argv, env []string, fds []uintptr, pidfd *int) (pid int, done <-chan unix.WaitStatus, err error) {
	attr := &syscall.ProcAttr{
		Dir:   s.cfg.Workdir,
		Env:   env,
		Files: fds,
		Sys:   &syscall.SysProcAttr{Setpgid: true, Credential: s.cfg.User, PidFD: pidfd},
	}
	s.reaper.mu.Lock() // hold reaping until the pid is registered
	defer s.reaper.mu.Unlock()
	pid, err = syscall.ForkExec(path, argv, attr)
	if err != nil && pidfd != nil && (errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS)) {
		// A kernel without CLONE_PIDFD: the reaper alone reports the exit.
		*pidfd = -1
		attr.Sys.PidFD = nil
		pid, err = syscall.ForkExec(path, argv, attr)
	}
	if err != nil {
		return 0, nil, err
	}
	return pid, s.reaper.expectLocked(pid), nil
}

// exitPipe stands in for a pidfd where the kernel has none: a pipe that
// becomes readable once the reaper has reported the program's exit, and
// the channel that then holds its status.
func exitPipe(done <-chan unix.WaitStatus) (fd int, status <-chan unix.WaitStatus, err error) {
	r, w, err := pipe()
	if err != nil {
		return -1, nil, err
	}
	ch := make(chan unix.WaitStatus, 1)
	go func() {
		ch <- <-done
		unix.Close(w)
	}()
	return r, ch, nil
}

// watchExit gives c a descriptor that becomes readable when it exits:
// pidfd if it is one, else a pidfd opened now, else exitPipe's.
func (c *child) watchExit(pidfd int) error {
	if pidfd < 0 {
		pidfd, _ = unix.PidfdOpen(c.pid, 0)
	}
	if pidfd >= 0 {
		c.pidfd = pidfd
		return nil
	}
	fd, status, err := exitPipe(c.done)
	if err != nil {
		return fmt.Errorf("watch the program's exit: %w", err)
	}
	c.pidfd, c.done = fd, status
	return nil
}
