//go:build linux

package agent

import (
	"bufio"
	"bytes"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The drivers are the persistent interpreters of sessions, one per
// language kind; each reads cells from fd 3 and reports on fd 4.
var (
	//go:embed drivers/python.py
	pythonDriver string
	//go:embed drivers/node.js
	nodeDriver string
	//go:embed drivers/bash.sh
	bashDriver string
)

// Interpreters are the kinds of persistent interpreter a session can keep.
var Interpreters = []string{"python", "node", "bash"}

func driverArgv(kind string) ([]string, error) {
	switch kind {
	case "python":
		return []string{"python3", "-u", "-c", pythonDriver}, nil
	case "node":
		// The REPL's own rewriting gives top-level await; it is internal.
		return []string{"node", "--expose-internals", "-e", nodeDriver}, nil
	case "bash":
		return []string{"bash", "--norc", "--noprofile", "-c", bashDriver, "session"}, nil
	}
	return nil, fmt.Errorf("no persistent interpreter for %q; use one of %s", kind, strings.Join(Interpreters, ", "))
}

// InterruptGrace is how long a cell that passed its timeout gets to stop
// after SIGINT before the interpreter, and its state, are killed.
const InterruptGrace = 2 * time.Second

// interpreter is a running driver.
type interpreter struct {
	kind     string
	pid      int
	marker   []byte
	commands *os.File      // fd 3 of the driver
	statuses <-chan string // lines from fd 4; closed when the driver exits
	stdout   <-chan []byte // chunks; closed at EOF
	stderr   <-chan []byte
	done     <-chan unix.WaitStatus
	carry    [2][]byte // output read past a cell's end marker, for the next cell
}

// fileStamp tells whether an output file changed since it was returned.
type fileStamp struct {
	size  int64
	mtime time.Time
}

func (s *server) startInterpreter(kind string, env []string) (*interpreter, error) {
	argv, err := driverArgv(kind)
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, 16)
	_, _ = rand.Read(nonce)
	// Control characters and a random part: no program prints it by chance.
	marker := "\x1esafe-run-cell-end-" + hex.EncodeToString(nonce) + "\x1e"

	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, err
	}
	outR, outW, _ := os.Pipe()
	errR, errW, _ := os.Pipe()
	cmdR, cmdW, _ := os.Pipe()
	statR, statW, _ := os.Pipe()
	pid, done, err := s.startProgram(argv, append([]string{"SAFE_RUN_MARKER=" + marker}, env...), []*os.File{devnull, outW, errW, cmdR, statW})
	if err != nil {
		closeAll(outR, errR, cmdW, statR)
		return nil, fmt.Errorf("start the %s interpreter: %w", kind, err)
	}
	it := &interpreter{
		kind: kind, pid: pid, marker: []byte(marker), commands: cmdW, done: done,
		stdout: chunks(outR), stderr: chunks(errR),
	}
	statuses := make(chan string, 1)
	go func() {
		defer close(statuses)
		defer statR.Close()
		sc := bufio.NewScanner(statR)
		for sc.Scan() {
			statuses <- sc.Text()
		}
	}()
	it.statuses = statuses
	return it, nil
}

// chunks reads f until EOF, handing over what it reads.
func chunks(f *os.File) <-chan []byte {
	ch := make(chan []byte, 16)
	go func() {
		defer close(ch)
		defer f.Close()
		buf := make([]byte, 32<<10)
		for {
			n, err := f.Read(buf)
			if n > 0 {
				ch <- bytes.Clone(buf[:n])
			}
			if err != nil {
				return
			}
		}
	}()
	return ch
}

// stop kills the interpreter and everything the program started.
func (s *server) stopInterpreter() {
	it := s.interp
	if it == nil {
		return
	}
	s.interp = nil
	it.commands.Close()
	_ = unix.Kill(-it.pid, unix.SIGKILL)
	s.killStrays()
	select {
	case <-it.done:
	case <-time.After(5 * time.Second):
	}
}

// killStrays kills every process in the sandbox but the agent. Only the
// sandbox's init may do so: anywhere else kill(-1) would reach the host.
func (s *server) killStrays() {
	if os.Getpid() == 1 {
		_ = unix.Kill(-1, unix.SIGKILL)
	}
}

// eval runs one cell in the session's interpreter, starting it if needed.
func (s *server) eval(req *Request) *Exit {
	exit := &Exit{}
	if s.interp != nil && s.interp.kind != req.Interpreter {
		s.stopInterpreter()
	}
	if s.interp == nil {
		it, err := s.startInterpreter(req.Interpreter, req.Env)
		if err != nil {
			return &Exit{Code: -1, Error: err.Error()}
		}
		s.interp = it
	}
	it := s.interp
	if strings.IndexByte(req.Code, 0) >= 0 || bytes.IndexByte(req.Stdin, 0) >= 0 {
		return &Exit{Code: -1, Error: "code and stdin of a session call cannot contain NUL bytes"}
	}
	stdout := &streamCapture{Capture: Capture{Max: req.OutputBytes}, stream: Stdout, send: s.send}
	stderr := &streamCapture{Capture: Capture{Max: req.OutputBytes}, stream: Stderr, send: s.send}
	if exit := s.install(req, stderr); exit != nil {
		return finishCaptures(exit, stdout, stderr)
	}
	start := time.Now()
	go func() {
		// A cell larger than the pipe waits for the driver to read it.
		msg := append(append(append([]byte(req.Code), 0), req.Stdin...), 0)
		_, _ = it.commands.Write(msg)
	}()

	streams := [2]*cellStream{
		{capture: stdout, in: it.stdout, pending: it.carry[0]},
		{capture: stderr, in: it.stderr, pending: it.carry[1]},
	}
	for _, st := range streams {
		st.marker = it.marker
	}
	var status string
	statusSeen := false
	deadline := time.NewTimer(req.Timeout)
	defer deadline.Stop()
	interrupted := false
	for !(statusSeen && streams[0].ended && streams[1].ended) {
		for _, st := range streams {
			st.flushPending()
		}
		if statusSeen && streams[0].ended && streams[1].ended {
			break
		}
		select {
		case b, ok := <-streams[0].inOrNil():
			streams[0].take(b, ok)
		case b, ok := <-streams[1].inOrNil():
			streams[1].take(b, ok)
		case line, ok := <-it.statuses:
			if ok {
				status, statusSeen = line, true
			} else {
				it.statuses = nil
			}
		case ws := <-it.done:
			// The interpreter died in the cell: its state is gone.
			it.done = nil
			s.drainAfterDeath(streams)
			s.interp = nil
			it.commands.Close()
			s.killStrays()
			exit.StateLost = true
			if ws.Signaled() {
				exit.Code, exit.Signal = -1, unix.SignalName(ws.Signal())
			} else {
				exit.Code = ws.ExitStatus()
				if exit.Code == 0 {
					exit.Code = 1 // it left mid-cell: not a success
				}
			}
			if interrupted {
				exit.TimedOut = true
			}
			return s.finishCell(exit, req, streams, start)
		case <-deadline.C:
			exit.TimedOut = true
			if !interrupted {
				// Ask first: Python raises KeyboardInterrupt, Node's vm
				// throws, and the session's state survives.
				interrupted = true
				_ = unix.Kill(it.pid, unix.SIGINT)
				deadline.Reset(InterruptGrace)
				continue
			}
			s.stopInterpreter()
			exit.StateLost = true
			exit.Code = -1
			return s.finishCell(exit, req, streams, start)
		}
	}
	it.carry[0], it.carry[1] = streams[0].pending, streams[1].pending
	switch {
	case status == "ok":
		exit.Code = 0
	case status == "interrupted":
		exit.Code, exit.TimedOut = 1, true
	case strings.HasPrefix(status, "exit "):
		exit.Code, _ = strconv.Atoi(strings.TrimPrefix(status, "exit "))
	default:
		exit.Code = 1
	}
	return s.finishCell(exit, req, streams, start)
}

func (s *server) finishCell(exit *Exit, req *Request, streams [2]*cellStream, start time.Time) *Exit {
	exit.Duration = time.Since(start)
	exit.StdoutBytes, exit.StdoutTail = streams[0].capture.Total(), streams[0].capture.Tail()
	exit.StderrBytes, exit.StderrTail = streams[1].capture.Total(), streams[1].capture.Tail()
	if req.Collect != nil {
		if s.seen == nil {
			s.seen = map[string]fileStamp{}
		}
		exit.Files = collectChanged(s.cfg.Workdir, req.Collect, s.cfg.User, s.seen)
	}
	return exit
}

// drainAfterDeath takes what the dead interpreter left in its pipes.
func (s *server) drainAfterDeath(streams [2]*cellStream) {
	timeout := time.After(500 * time.Millisecond)
	for _, st := range streams {
		for !st.closed {
			select {
			case b, ok := <-st.in:
				st.take(b, ok)
			case <-timeout:
				return
			}
		}
		st.flushPending()
	}
}

// cellStream splits an interpreter's output stream at cell end markers.
type cellStream struct {
	capture *streamCapture
	in      <-chan []byte
	marker  []byte
	pending []byte // read but not yet given to the capture
	ended   bool   // the marker of this cell was seen
	closed  bool
}

func (c *cellStream) inOrNil() <-chan []byte {
	if c.ended || c.closed {
		return nil
	}
	return c.in
}

func (c *cellStream) take(b []byte, ok bool) {
	if !ok {
		c.closed, c.ended = true, true
		return
	}
	c.pending = append(c.pending, b...)
}

// flushPending gives the capture everything before the marker, holding back
// a tail that could be the start of one.
func (c *cellStream) flushPending() {
	if c.ended && !c.closed {
		return
	}
	if i := bytes.Index(c.pending, c.marker); i >= 0 {
		c.capture.add(c.pending[:i])
		c.pending = bytes.Clone(c.pending[i+len(c.marker):])
		c.ended = true
		return
	}
	keep := len(c.marker) - 1
	if c.closed {
		keep = 0
	}
	if n := len(c.pending) - keep; n > 0 {
		c.capture.add(c.pending[:n])
		c.pending = bytes.Clone(c.pending[n:])
	}
}

// collectChanged collects, as user, the files of c.Dir that are new or
// changed since seen was last updated, and updates it.
func collectChanged(workdir string, c *Collect, user *syscall.Credential, seen map[string]fileStamp) []OutputFile {
	var out []OutputFile
	for _, f := range collectStamped(workdir, c, user) {
		if old, ok := seen[f.Path]; ok && old == f.stamp {
			continue
		}
		seen[f.Path] = f.stamp
		out = append(out, f.OutputFile)
	}
	return out
}

// readFile returns one workspace file, within max bytes, read as user.
func readFile(workdir, name string, max int64, user *syscall.Credential) *Exit {
	var exit *Exit
	err := inWorkspace(workdir, user, func(ws *os.File) error {
		f, err := openBeneath(ws, name, unix.O_RDONLY|unix.O_NONBLOCK, 0)
		switch {
		case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR):
			return fmt.Errorf("%s: no such file in the workspace", name)
		case err != nil:
			return explain(name, err)
		}
		defer f.Close()
		if fi, err := f.Stat(); err == nil && fi.IsDir() {
			return fmt.Errorf("%s is a directory; list it instead", name)
		}
		data, size, skipped := readRegular(f, max, max)
		if skipped != "" {
			return fmt.Errorf("%s (%d bytes): %s", name, size, skipped)
		}
		exit = &Exit{Files: []OutputFile{{Path: name, Size: size, Data: data, Type: "file"}}}
		return nil
	})
	if err != nil {
		return &Exit{Code: 1, Error: err.Error()}
	}
	return exit
}

// listFiles lists the workspace below dir, recursively, without following
// links, up to max entries, as user.
func listFiles(workdir, dir string, max int, user *syscall.Credential) *Exit {
	var out []OutputFile
	err := inWorkspace(workdir, user, func(ws *os.File) error {
		d, err := openDirBeneath(ws, dir)
		if err != nil {
			if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) {
				return explain(dir, err)
			}
			return fmt.Errorf("%s: no such directory in the workspace", dir)
		}
		defer d.Close()
		return walkBeneath(d, dir, func(e *entry) error {
			if len(out) >= max {
				return fs.SkipAll
			}
			f := OutputFile{Path: e.rel, Type: "other"}
			switch {
			case e.isDir():
				f.Type = "dir"
			case e.isLink():
				f.Type = "symlink"
			case e.isRegular():
				f.Type, f.Size = "file", e.st.Size
			}
			out = append(out, f)
			return nil
		})
	})
	if err != nil && !errors.Is(err, fs.SkipAll) {
		return &Exit{Code: 1, Error: err.Error()}
	}
	return &Exit{Files: out}
}
