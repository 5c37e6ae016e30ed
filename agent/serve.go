//go:build linux

package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Config says how the agent serves requests.
type Config struct {
	// Workdir is where files are written and programs run.
	Workdir string
	// OneShot makes Serve return after the first request that runs a
	// program; requests that only prepare the sandbox (OpWarm, OpWrite)
	// come before it. At the end of that run
	// every other process in the sandbox is killed, so nothing the program
	// started outlives it.
	OneShot bool
	// User, if set, is the user programs run as, and the user the agent's
	// own file operations in the workspace run as (on a thread kept for
	// them; see asUser), so files written are the program's and no race the
	// program wins against them gains it anything. The agent itself then
	// needs the capabilities to switch to it, and its main goroutine must
	// keep the first thread (runtime.LockOSThread in init); the program is
	// left with none.
	User *syscall.Credential
}

// Serve answers requests read from r with events written to w until r ends
// (or after its run in one-shot mode). It must run as the sandbox's
// first process: it reaps orphaned processes, as init does.
func Serve(r io.Reader, w io.Writer, cfg Config) error {
	s := &server{cfg: cfg, w: w, reaper: sharedReaper()}
	s.enc = json.NewEncoder(&s.buf)
	if err := s.send(Event{Ready: &Ready{Version: ProtocolVersion}}); err != nil {
		return err
	}
	dec := json.NewDecoder(r)
	for {
		var req Request
		if err := dec.Decode(&req); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("read request: %w", err)
		}
		exit := s.handle(&req)
		err := s.send(Event{Exit: exit})
		s.killPending()
		if err != nil {
			return err
		}
		if cfg.OneShot && req.Op == OpRun {
			return nil
		}
	}
}

type server struct {
	cfg  Config
	mu   sync.Mutex // serialises writes to w, and guards buf and hold
	w    io.Writer
	buf  bytes.Buffer  // encoded events not yet written
	enc  *json.Encoder // encodes to buf
	hold bool          // keep Output events in buf until the Exit

	reaper *reaper
	interp *interpreter // the session's interpreter, once started
	warmed *warmProgram // the interpreter OpWarm started, until OpRun takes it
	// pendingKill is the process group of a run whose kill waits until
	// its Exit is sent; 0 for none. pendingClose is the run whose
	// descriptors wait to be closed then; nil for none.
	pendingKill  int
	pendingClose *child
	seen         map[string]fileStamp // output files returned so far in this session
	// ws is the workspace, open once wsOpen (see workspace).
	ws     int
	wsOpen bool
}

func (s *server) send(ev Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.enc.Encode(ev); err != nil {
		s.buf.Reset()
		return fmt.Errorf("send event: %w", err)
	}
	if s.hold && ev.Exit == nil {
		return nil
	}
	s.hold = false
	_, err := s.w.Write(s.buf.Bytes())
	s.buf.Reset()
	if err != nil {
		return fmt.Errorf("send event: %w", err)
	}
	return nil
}

// holdEvents keeps the Output events sent from now on until the Exit that
// follows them, so that the end of a run reaches the host in one write.
func (s *server) holdEvents() {
	s.mu.Lock()
	s.hold = true
	s.mu.Unlock()
}

// releaseEvents sends the Output events held since holdEvents, and sends
// the next ones as they come.
func (s *server) releaseEvents() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hold = false
	if s.buf.Len() == 0 {
		return nil
	}
	_, err := s.w.Write(s.buf.Bytes())
	s.buf.Reset()
	if err != nil {
		return fmt.Errorf("send event: %w", err)
	}
	return nil
}

// handle carries out one request.
func (s *server) handle(req *Request) *Exit {
	switch req.Op {
	case OpRun:
		return s.run(req)
	case OpEval:
		if err := s.prepare(req); err != nil {
			return &Exit{Code: -1, Error: err.Error()}
		}
		if req.Timeout <= 0 {
			return &Exit{Code: -1, Error: "invalid request: a positive timeout is required"}
		}
		return s.eval(req)
	case OpWrite:
		if err := writeFiles(s.cfg.Workdir, req.Files, s.cfg.User); err != nil {
			return &Exit{Code: 1, Error: err.Error()}
		}
		return &Exit{}
	case OpWarm:
		return s.warm(req)
	case OpRead:
		return readFile(s.cfg.Workdir, filepath.Clean(req.Path), req.MaxBytes, s.cfg.User)
	case OpList:
		return listFiles(s.cfg.Workdir, filepath.Clean(req.Path), req.MaxFiles, s.cfg.User)
	}
	return &Exit{Code: -1, Error: fmt.Sprintf("unknown operation %q", req.Op)}
}

// prepare writes the request's files and creates its output directory.
func (s *server) prepare(req *Request) error {
	if err := writeFiles(s.cfg.Workdir, req.Files, s.cfg.User); err != nil {
		return err
	}
	if req.Collect != nil {
		// The output directory exists from the start, so that programs can
		// write to it without creating it.
		return makeDir(s.cfg.Workdir, req.Collect.Dir, s.cfg.User)
	}
	return nil
}

// run runs one request's program to completion and describes how it ended.
func (s *server) run(req *Request) *Exit {
	// A warm driver writes the code file itself, as the program's user,
	// and makes the output directory: no file operation of the agent's
	// (each a hand-over to and from the user thread, see asUser) on the
	// way to the run.
	if s.warmed != nil && !s.warmed.serves(req) {
		s.discardWarm()
	}
	files, code := req.Files, (*File)(nil)
	if s.warmed != nil && !s.warmed.shell() {
		files, code = driverFile(req)
	}
	outDir := ""
	if req.Collect != nil && (s.warmed == nil || s.warmed.shell()) {
		// The output directory exists from the start, so that programs can
		// write to it without creating it.
		outDir = req.Collect.Dir
	}
	if err := prepareFiles(s.cfg.Workdir, files, outDir, s.cfg.User); err != nil {
		return &Exit{Code: -1, Error: err.Error()}
	}
	if len(req.Argv) == 0 || req.Timeout <= 0 {
		return &Exit{Code: -1, Error: "invalid request: argv and a positive timeout are required"}
	}
	stdout := &streamCapture{Capture: Capture{Max: req.OutputBytes}, stream: Stdout, send: s.send}
	stderr := &streamCapture{Capture: Capture{Max: req.OutputBytes}, stream: Stderr, send: s.send}
	if exit := s.install(req, stderr); exit != nil {
		return finishCaptures(exit, stdout, stderr)
	}
	var c *child
	var err error
	if s.warmed != nil {
		c, err = s.launchWarm(req, code, len(files) > 0)
	} else {
		c, err = s.launch(req)
	}
	if err != nil {
		return &Exit{Code: -1, Error: err.Error()}
	}
	res := s.supervise(c, req.Timeout, stdout, stderr)
	exit := &Exit{Duration: res.took, TimedOut: res.timedOut}
	switch {
	case res.failed != "":
		return &Exit{Code: -1, Error: res.failed}
	case res.exited && res.ws.Signaled():
		exit.Code = -1
		exit.Signal = unix.SignalName(res.ws.Signal())
	case res.exited:
		exit.Code = res.ws.ExitStatus()
	case res.named:
		exit.Code = res.reported
	default:
		exit.Code = -1 // not seen to end: killed at its timeout
	}
	finishCaptures(exit, stdout, stderr)
	if req.Collect != nil && !s.emptyDir(req.Collect.Dir) {
		s.killPending() // the files as the run left them, as it ended
		exit.Files = collect(s.cfg.Workdir, req.Collect, s.cfg.User)
	}
	return exit
}

// finishCaptures puts the totals and tails of the streams in exit.
func finishCaptures(exit *Exit, stdout, stderr *streamCapture) *Exit {
	exit.StdoutBytes, exit.StdoutTail = stdout.Total(), stdout.Tail()
	exit.StderrBytes, exit.StderrTail = stderr.Total(), stderr.Tail()
	return exit
}

// launch starts the request's program and hands it its stdin.
func (s *server) launch(req *Request) (*child, error) {
	path, err := lookPath(req.Argv[0])
	if err != nil {
		return nil, err
	}
	c := &child{pidfd: -1, report: -1, comm: -1, cmd: -1, stdout: -1, stderr: -1}
	var inR, outW, errW int
	inR, inW, err := stdinPipe()
	if err != nil {
		return nil, err
	}
	if c.stdout, outW, err = outputPipe(); err != nil {
		closeFDs(inR, inW)
		return nil, err
	}
	if c.stderr, errW, err = outputPipe(); err != nil {
		closeFDs(inR, inW, outW)
		c.close()
		return nil, err
	}
	pidfd := -1
	c.pid, c.done, err = s.forkExec(path, req.Argv, append(os.Environ(), req.Env...), []uintptr{uintptr(inR), uintptr(outW), uintptr(errW)}, &pidfd)
	closeFDs(inR, outW, errW)
	if err != nil {
		closeFDs(inW)
		c.close()
		return nil, fmt.Errorf("start %s: %w", req.Argv[0], err)
	}
	feedStdin(inW, req.Stdin)
	if err := c.watchExit(pidfd); err != nil {
		s.killRun(c.pid)
		c.close()
		return nil, err
	}
	return c, nil
}

// stdinPipe returns a pipe for a program's stdin; both ends block. The
// agent's end stays off Go's poller: closing it, all a run without input
// does with it, is then one system call, not two.
func stdinPipe() (r, w int, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return -1, -1, err
	}
	return p[0], p[1], nil
}

// feedStdin writes data to the program's stdin and closes it: at once if it
// fits the pipe, which needs no other goroutine, else in the background,
// where the write may hold a thread until the program reads or exits.
func feedStdin(w int, data []byte) {
	if len(data) <= 16<<10 {
		if len(data) > 0 {
			_ = writeFull(w, data) // EPIPE if the program is gone: nobody to read it
		}
		unix.Close(w)
		return
	}
	go func() {
		// The program may exit without reading its input; EPIPE ends this.
		_ = writeFull(w, data)
		unix.Close(w)
	}()
}

func closeFDs(fds ...int) {
	for _, fd := range fds {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

// startProgram starts argv (argv[0] looked up in PATH) in the workspace,
// in a process group of its own and as the programs' user, with files as
// its descriptors 0, 1, 2, ...; it closes them in the agent. The reaper
// reports the program's end on done.
func (s *server) startProgram(argv, env []string, files []*os.File) (pid int, done <-chan unix.WaitStatus, err error) {
	defer closeAll(files...)
	path, err := lookPath(argv[0])
	if err != nil {
		return 0, nil, err
	}
	fds := make([]uintptr, len(files))
	for i, f := range files {
		fds[i] = f.Fd()
	}
	pid, done, err = s.forkExec(path, argv, append(os.Environ(), env...), fds, nil)
	if err != nil {
		return 0, nil, fmt.Errorf("start %s: %w", argv[0], err)
	}
	return pid, done, nil
}

// killRun kills the program's process group and, in one-shot mode, every
// process in the sandbox but the agent (see killStrays), since programs can
// leave their group.
func (s *server) killRun(pid int) {
	_ = unix.Kill(-pid, unix.SIGKILL)
	if s.cfg.OneShot {
		s.killStrays()
	}
}

// waitOrClose waits for the readers to reach EOF; if a process that escaped
// the kill still holds the pipes, it stops waiting after d and closes them.
func waitOrClose(wg *sync.WaitGroup, d time.Duration, files ...*os.File) {
	ch := make(chan struct{})
	go func() { wg.Wait(); close(ch) }()
	select {
	case <-ch:
	case <-time.After(d):
		closeAll(files...)
		<-ch
	}
}

func closeAll(files ...*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// streamCapture sends the head of a stream as it arrives and keeps its tail.
type streamCapture struct {
	Capture
	stream Stream
	send   func(Event) error
}

func (c *streamCapture) drain(r *os.File) {
	defer r.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 && c.add(buf[:n]) != nil {
			return
		}
		if err != nil {
			return
		}
	}
}

// add records p and sends what of it joined the head.
func (c *streamCapture) add(p []byte) error {
	before := len(c.Head())
	c.Write(p)
	if grown := c.Head()[before:]; len(grown) > 0 {
		return c.send(Event{Output: &Output{Stream: c.stream, Data: bytes.Clone(grown)}})
	}
	return nil
}

// writeFiles writes files below workdir as user (see asUser), so that they
// and the directories made for them are the program's, refusing any path
// that leaves the workspace or goes through a symbolic link.
func writeFiles(workdir string, files []File, user *syscall.Credential) error {
	return prepareFiles(workdir, files, "", user)
}

// prepareFiles writes files (see writeFiles), then creates the directory
// outDir unless it is "", all in one call of asUser: each hands the work to
// the user thread and back, two wake-ups inside gVisor.
func prepareFiles(workdir string, files []File, outDir string, user *syscall.Credential) error {
	if len(files) == 0 && outDir == "" {
		return nil
	}
	if outDir != "" && !filepath.IsLocal(outDir) {
		return fmt.Errorf("create %s: path leaves the workspace", outDir)
	}
	return inWorkspace(workdir, user, func(ws *os.File) error {
		for _, f := range files {
			name := filepath.Clean(f.Path)
			if filepath.IsAbs(name) || name == "." || name == ".." || strings.HasPrefix(name, "../") {
				return fmt.Errorf("write %q: path leaves the workspace", f.Path)
			}
			mode := os.FileMode(f.Mode & 0o777)
			if mode == 0 {
				mode = 0o644
			}
			dir, err := mkdirAll(ws, filepath.Dir(name))
			if err != nil {
				return fmt.Errorf("write %q: %w", f.Path, err)
			}
			err = writeFile(dir, filepath.Base(name), f.Data, mode)
			closeDir(dir, ws)
			if err != nil {
				return fmt.Errorf("write %q: %w", f.Path, explain(name, err))
			}
		}
		if outDir == "" {
			return nil
		}
		if err := mkdirBeneath(ws, filepath.Clean(outDir)); err != nil {
			return fmt.Errorf("create %s: %w", outDir, err)
		}
		return nil
	})
}

// makeDir creates dir (relative) below workdir, as user.
func makeDir(workdir, dir string, user *syscall.Credential) error {
	return prepareFiles(workdir, nil, dir, user)
}

// mkdirAll creates dir and its missing parents below ws, one component at a
// time, each made and then opened from its parent's open directory, and
// returns it open: for ".", ws itself, which the caller must not close
// (see closeDir).
func mkdirAll(ws *os.File, dir string) (*os.File, error) {
	if dir == "." {
		return ws, nil
	}
	cur := ws
	done := ""
	for _, name := range strings.Split(dir, "/") {
		done = path.Join(done, name)
		// mkdirat never follows a link at its last component, and the
		// open that follows refuses one.
		err := unix.Mkdirat(int(cur.Fd()), name, 0o755)
		var next *os.File
		if err == nil || errors.Is(err, unix.EEXIST) {
			next, err = openDirBeneath(cur, name)
		}
		if cur != ws {
			cur.Close()
		}
		if err != nil {
			return nil, explain(done, err)
		}
		cur = next
	}
	return cur, nil
}

// writeFile writes one file in dir with exactly mode (no umask). A FIFO or
// device the program left there is not opened for long: the open does not
// block, and anything but a regular file is refused. Raw descriptors: see
// openFdBeneath.
func writeFile(dir *os.File, name string, data []byte, mode os.FileMode) error {
	fd, err := openFdBeneath(int(dir.Fd()), name, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_NONBLOCK, uint32(mode))
	if errors.Is(err, unix.ENXIO) { // a FIFO nobody reads
		return fmt.Errorf("not a regular file")
	}
	if err != nil {
		return err
	}
	if err := fillFile(fd, data, mode); err != nil {
		unix.Close(fd)
		return err
	}
	return unix.Close(fd)
}

// fillFile writes data to the open file fd, which must be a regular file,
// and gives it exactly mode.
func fillFile(fd int, data []byte, mode os.FileMode) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("not a regular file")
	}
	for rest := data; len(rest) > 0; {
		n, err := unix.Write(fd, rest)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return io.ErrShortWrite
		}
		rest = rest[n:]
	}
	return unix.Fchmod(fd, uint32(mode))
}

// mkdirBeneath makes sure dir (and its parents) is a directory below ws, as
// mkdirAll does, without opening it when it is made: only one that was
// there already is opened, to refuse a link.
func mkdirBeneath(ws *os.File, dir string) error {
	parent, err := mkdirAll(ws, filepath.Dir(dir))
	if err != nil {
		return err
	}
	defer closeDir(parent, ws)
	err = unix.Mkdirat(int(parent.Fd()), filepath.Base(dir), 0o755)
	if errors.Is(err, unix.EEXIST) {
		var d *os.File
		if d, err = openDirBeneath(parent, filepath.Base(dir)); err == nil {
			d.Close()
		}
	}
	if err != nil {
		return explain(dir, err)
	}
	return nil
}

// closeDir closes a directory mkdirAll returned, unless it is ws.
func closeDir(dir, ws *os.File) {
	if dir != ws {
		dir.Close()
	}
}

// lookPath finds argv0 in PATH as the program's environment would.
func lookPath(argv0 string) (string, error) {
	if strings.Contains(argv0, "/") {
		return argv0, nil
	}
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		p := filepath.Join(dir, argv0)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: not found in this image's PATH", argv0)
}

// reaper waits for every child of the agent, as an init process must:
// orphans of the program become the agent's children, and unreaped they
// would count against the process limit. It hands the status of the
// processes the agent started to whoever expects them.
type reaper struct {
	mu      sync.Mutex
	waiting map[int]chan unix.WaitStatus
}

// sharedReaper returns the process's one reaper: there can be only one
// waiter for any child, however many times Serve is called.
var sharedReaper = sync.OnceValue(func() *reaper {
	r := &reaper{waiting: make(map[int]chan unix.WaitStatus)}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, unix.SIGCHLD)
	go func() {
		for range sig {
			r.reap()
		}
	}()
	return r
})

// expectLocked registers pid; r.mu must be held, so that a fast exit cannot
// be reaped before it is registered.
func (r *reaper) expectLocked(pid int) <-chan unix.WaitStatus {
	ch := make(chan unix.WaitStatus, 1)
	r.waiting[pid] = ch
	return ch
}

func (r *reaper) reap() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
		if ch, ok := r.waiting[pid]; ok {
			ch <- ws
			delete(r.waiting, pid)
		}
	}
}
