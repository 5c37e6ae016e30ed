//go:build linux

package agent_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/safe-run/safe-run/agent"
)

// Serve reaps every child of its process (it is an init), and each call
// starts a reaper that outlives it. So every test runs Serve in a process of
// its own: the test binary re-executed with helperEnv set, talking the
// protocol over its stdin and stdout exactly as cmd/safe-run-agent does.
const (
	helperEnv  = "SAFE_RUN_AGENT_TEST_HELPER" // "serve" or "serve-repeat"
	workdirEnv = "SAFE_RUN_AGENT_TEST_WORKDIR"
	oneShotEnv = "SAFE_RUN_AGENT_TEST_ONESHOT"
)

// deadline bounds every Serve process. It is not a timing assertion: a
// healthy Serve in these tests returns in well under a second.
const deadline = 10 * time.Second

func TestMain(m *testing.M) {
	mode := os.Getenv(helperEnv)
	if mode == "" {
		os.Exit(m.Run())
	}
	cfg := agent.Config{Workdir: os.Getenv(workdirEnv), OneShot: os.Getenv(oneShotEnv) == "1"}
	for _, k := range []string{helperEnv, workdirEnv, oneShotEnv} {
		os.Unsetenv(k)
	}
	switch mode {
	case "serve":
		if err := agent.Serve(os.Stdin, os.Stdout, cfg); err != nil {
			fmt.Fprintln(os.Stderr, "Serve:", err)
			os.Exit(1)
		}
	case "serve-repeat":
		os.Exit(serveRepeat(cfg))
	default:
		fmt.Fprintln(os.Stderr, "unknown helper mode", mode)
		os.Exit(2)
	}
	os.Exit(0)
}

// serveRepeat calls Serve several times in this one process, each time with
// one request, and reports on stderr what each call answered.
func serveRepeat(cfg agent.Config) int {
	req, err := json.Marshal(agent.Request{Argv: []string{"sh", "-c", "exit 5"}, Timeout: 5 * time.Second, OutputBytes: 1024})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for i := range 10 {
		var out bytes.Buffer
		if err := agent.Serve(bytes.NewReader(req), &out, cfg); err != nil {
			fmt.Fprintf(os.Stderr, "call %d: Serve: %v\n", i, err)
			return 1
		}
		if !bytes.Contains(out.Bytes(), []byte(`{"exit":{"code":5,`)) {
			fmt.Fprintf(os.Stderr, "call %d: no exit with code 5 in %q\n", i, out.Bytes())
			return 1
		}
		fmt.Fprintf(os.Stderr, "call %d: ok\n", i)
	}
	return 0
}

// session is what one Serve process did.
type session struct {
	events []agent.Event
	err    error  // how the process ended; nil if Serve returned nil
	stderr string // the process's stderr
}

// runHelper runs the helper in mode with input as its stdin, failing the test
// if it does not end within deadline.
func runHelper(t *testing.T, mode string, cfg agent.Config, input []byte) session {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, workdirEnv+"="+cfg.Workdir)
	if cfg.OneShot {
		cmd.Env = append(cmd.Env, oneShotEnv+"=1")
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(input), &stdout, &stderr
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		t.Fatalf("start helper: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var s session
	select {
	case s.err = <-done:
	case <-time.After(deadline):
		cmd.Process.Kill()
		<-done
		t.Fatalf("Serve did not return within %v\nevents so far:\n%s\nstderr:\n%s", deadline, stdout.Bytes(), stderr.Bytes())
	}
	s.stderr = stderr.String()
	dec := json.NewDecoder(&stdout)
	for {
		var ev agent.Event
		if err := dec.Decode(&ev); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatalf("decode event %d: %v", len(s.events), err)
			}
			break
		}
		n := 0
		for _, set := range []bool{ev.Ready != nil, ev.Output != nil, ev.Exit != nil} {
			if set {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("event %d has %d fields set, want exactly one: %+v", len(s.events), n, ev)
		}
		s.events = append(s.events, ev)
	}
	return s
}

// serve runs Serve in its own process on the given requests.
func serve(t *testing.T, cfg agent.Config, reqs ...agent.Request) session {
	t.Helper()
	var in bytes.Buffer
	enc := json.NewEncoder(&in)
	for _, r := range reqs {
		if err := enc.Encode(r); err != nil {
			t.Fatal(err)
		}
	}
	return runHelper(t, "serve", cfg, in.Bytes())
}

// run is the answer to one request.
type run struct {
	outputs        []agent.Output
	stdout, stderr []byte // the Output events' data, per stream
	exit           *agent.Exit
}

// runs checks that s starts with exactly one Ready event of this protocol
// version, and returns the runs that follow it. Every Output must belong to
// a run that ends with an Exit.
func (s session) runs(t *testing.T) []run {
	t.Helper()
	if len(s.events) == 0 || s.events[0].Ready == nil {
		t.Fatalf("first event is not Ready; events: %s", dump(s.events))
	}
	if v := s.events[0].Ready.Version; v != agent.ProtocolVersion {
		t.Errorf("Ready.Version = %d, want %d", v, agent.ProtocolVersion)
	}
	var runs []run
	var cur run
	for i, ev := range s.events[1:] {
		switch {
		case ev.Ready != nil:
			t.Fatalf("event %d is a second Ready", i+1)
		case ev.Output != nil:
			o := *ev.Output
			cur.outputs = append(cur.outputs, o)
			switch o.Stream {
			case agent.Stdout:
				cur.stdout = append(cur.stdout, o.Data...)
			case agent.Stderr:
				cur.stderr = append(cur.stderr, o.Data...)
			default:
				t.Errorf("event %d: Output for unknown stream %q", i+1, o.Stream)
			}
		case ev.Exit != nil:
			cur.exit = ev.Exit
			runs = append(runs, cur)
			cur = run{}
		}
	}
	if len(cur.outputs) > 0 {
		t.Fatalf("%d Output events after the last Exit", len(cur.outputs))
	}
	return runs
}

func dump(events []agent.Event) string {
	b, _ := json.MarshalIndent(events, "", "  ")
	return string(b)
}

// serveOne runs Serve in one-shot mode on req in dir, and returns its one
// run. Serve must return nil.
func serveOne(t *testing.T, dir string, req agent.Request) run {
	t.Helper()
	s := serve(t, agent.Config{Workdir: dir, OneShot: true}, req)
	if s.err != nil {
		t.Fatalf("Serve failed: %v\nstderr:\n%s", s.err, s.stderr)
	}
	runs := s.runs(t)
	if len(runs) != 1 {
		t.Fatalf("got %d runs, want 1; events: %s", len(runs), dump(s.events))
	}
	return runs[0]
}

// sh returns a request running script with sh, within generous limits.
func sh(script string) agent.Request {
	return agent.Request{Argv: []string{"sh", "-c", script}, Timeout: 5 * time.Second, OutputBytes: 1 << 20}
}

func TestServeReady(t *testing.T) {
	for _, oneShot := range []bool{false, true} {
		t.Run(fmt.Sprintf("one-shot %v", oneShot), func(t *testing.T) {
			s := serve(t, agent.Config{Workdir: t.TempDir(), OneShot: oneShot})
			if s.err != nil {
				t.Fatalf("Serve with no requests failed: %v\nstderr:\n%s", s.err, s.stderr)
			}
			if runs := s.runs(t); len(runs) != 0 {
				t.Errorf("got %d runs without a request", len(runs))
			}
			if len(s.events) != 1 {
				t.Errorf("got %d events, want only Ready: %s", len(s.events), dump(s.events))
			}
		})
	}
}

func TestServeExit(t *testing.T) {
	tests := []struct {
		name           string
		req            agent.Request
		code           int
		stdout, stderr string
	}{
		{"exit code and output", sh("echo out; echo err >&2; exit 3"), 3, "out\n", "err\n"},
		{"success", agent.Request{Argv: []string{"true"}, Timeout: 5 * time.Second, OutputBytes: 1024}, 0, "", ""},
		{"exit code 255", sh("exit 255"), 255, "", ""},
		{"arguments passed verbatim", agent.Request{
			Argv:    []string{"sh", "-c", `printf '%s|' "$@"`, "sh", "a b", "", "*", "$HOME"},
			Timeout: 5 * time.Second, OutputBytes: 1024,
		}, 0, "a b||*|$HOME|", ""},
		{"environment added", func() agent.Request {
			r := sh(`printf %s "$SAFE_RUN_TEST_VAR"`)
			r.Env = []string{"SAFE_RUN_TEST_VAR=hello world"}
			return r
		}(), 0, "hello world", ""},
		{"interleaved streams", sh("echo 1; echo 2 >&2; echo 3; echo 4 >&2; exit 1"), 1, "1\n3\n", "2\n4\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := serveOne(t, t.TempDir(), tt.req)
			e := r.exit
			if e.Code != tt.code || e.Signal != "" || e.TimedOut || e.Error != "" {
				t.Errorf("Exit = code %d, signal %q, timed out %v, error %q; want code %d only",
					e.Code, e.Signal, e.TimedOut, e.Error, tt.code)
			}
			if string(r.stdout) != tt.stdout || string(r.stderr) != tt.stderr {
				t.Errorf("output = %q, %q; want %q, %q", r.stdout, r.stderr, tt.stdout, tt.stderr)
			}
			if e.StdoutBytes != int64(len(tt.stdout)) || e.StderrBytes != int64(len(tt.stderr)) {
				t.Errorf("StdoutBytes, StderrBytes = %d, %d; want %d, %d", e.StdoutBytes, e.StderrBytes, len(tt.stdout), len(tt.stderr))
			}
			if len(e.StdoutTail) != 0 || len(e.StderrTail) != 0 {
				t.Errorf("output within the cap left tails %q, %q", e.StdoutTail, e.StderrTail)
			}
			if e.Duration <= 0 {
				t.Errorf("Duration = %v, want it set", e.Duration)
			}
		})
	}
}

func TestServeWorkdir(t *testing.T) {
	dir := t.TempDir()
	r := serveOne(t, dir, sh("pwd -P"))
	want, err := filepath.EvalSymlinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSuffix(string(r.stdout), "\n"); got != want {
		t.Errorf("program ran in %q, want the workdir %q", got, want)
	}
}

func TestServeFiles(t *testing.T) {
	dir := t.TempDir()
	// An existing file is replaced, content and mode.
	if err := os.WriteFile(filepath.Join(dir, "existing.txt"), []byte("old and longer content"), 0o600); err != nil {
		t.Fatal(err)
	}
	files := []struct {
		file agent.File
		mode os.FileMode
	}{
		{agent.File{Path: "main.sh", Data: []byte("echo main\n")}, 0o644},
		{agent.File{Path: "bin/tool", Data: []byte("#!/bin/sh\necho tool \"$@\"\n"), Mode: 0o755}, 0o755},
		{agent.File{Path: "data/deep/er/x.csv", Data: []byte("a,b\n1,2\n")}, 0o644},
		{agent.File{Path: "data/y.csv", Data: []byte("y")}, 0o644},
		{agent.File{Path: "secret", Data: []byte("s"), Mode: 0o600}, 0o600},
		{agent.File{Path: "setuid", Data: []byte("u"), Mode: 0o4755}, 0o755},
		{agent.File{Path: "empty"}, 0o644},
		{agent.File{Path: "existing.txt", Data: []byte("new")}, 0o644},
		{agent.File{Path: "bin/../top.txt", Data: []byte("cleaned")}, 0o644},
	}
	req := agent.Request{Argv: []string{"bin/tool", "ran"}, Timeout: 5 * time.Second, OutputBytes: 1024}
	for _, f := range files {
		req.Files = append(req.Files, f.file)
	}
	r := serveOne(t, dir, req)
	if r.exit.Error != "" || r.exit.Code != 0 {
		t.Fatalf("Exit = %+v, want success", r.exit)
	}
	if got := string(r.stdout); got != "tool ran\n" {
		t.Errorf("bin/tool printed %q, want %q", got, "tool ran\n")
	}
	for _, f := range files {
		t.Run(f.file.Path, func(t *testing.T) {
			name := filepath.Join(dir, filepath.Clean(f.file.Path))
			fi, err := os.Stat(name)
			if err != nil {
				t.Fatal(err)
			}
			if !fi.Mode().IsRegular() {
				t.Fatalf("mode %v, want a regular file", fi.Mode())
			}
			if fi.Mode().Perm() != f.mode || fi.Mode()&(os.ModeSetuid|os.ModeSetgid|os.ModeSticky) != 0 {
				t.Errorf("mode %v, want %v", fi.Mode(), f.mode)
			}
			data, err := os.ReadFile(name)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(data, f.file.Data) {
				t.Errorf("content %q, want %q", data, f.file.Data)
			}
		})
	}
	for _, d := range []string{"bin", "data", "data/deep", "data/deep/er"} {
		if fi, err := os.Stat(filepath.Join(dir, d)); err != nil || !fi.IsDir() {
			t.Errorf("%s is not a directory: %v", d, err)
		}
	}
}

func TestServeRejectsEscapingPaths(t *testing.T) {
	parent := t.TempDir()
	escaped := filepath.Join(parent, "escaped.txt")
	tests := []struct {
		name string
		path string
	}{
		{"parent directory", "../escaped.txt"},
		{"parent directory after a name", "a/../../escaped.txt"},
		{"absolute path", escaped},
		{"symlink out of the workspace", "link/escaped.txt"},
		{"empty path", ""},
		{"workspace itself", "."},
		{"parent itself", ".."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir, err := os.MkdirTemp(parent, "ws")
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(parent, filepath.Join(dir, "link")); err != nil {
				t.Fatal(err)
			}
			req := sh("echo program ran")
			req.Files = []agent.File{{Path: "ok.txt", Data: []byte("ok")}, {Path: tt.path, Data: []byte("escaped")}}
			r := serveOne(t, dir, req)
			if r.exit.Code != -1 || !strings.Contains(r.exit.Error, fmt.Sprintf("write %q", tt.path)) {
				t.Errorf("Exit = code %d, error %q; want code -1 and an error about writing %q", r.exit.Code, r.exit.Error, tt.path)
			}
			if len(r.outputs) != 0 {
				t.Errorf("the program ran despite the bad file: %q", r.stdout)
			}
			if _, err := os.Lstat(escaped); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("a file was written outside the workspace: %v", err)
				os.Remove(escaped)
			}
		})
	}
}

// TestServeWritesDottedNames checks that names which merely start with dots
// are written: only a ".." component leaves the workspace, and the sandbox
// package's CheckPath accepts all of these.
func TestServeWritesDottedNames(t *testing.T) {
	for _, path := range []string{".hidden", "a/..b", "...", "..data", "..d/f.txt"} {
		t.Run(path, func(t *testing.T) {
			dir := t.TempDir()
			req := agent.Request{Argv: []string{"cat", path}, Timeout: 5 * time.Second, OutputBytes: 1024}
			req.Files = []agent.File{{Path: path, Data: []byte("content of " + path)}}
			r := serveOne(t, dir, req)
			if r.exit.Error != "" || r.exit.Code != 0 {
				t.Fatalf("Exit = code %d, error %q; want the file written and read", r.exit.Code, r.exit.Error)
			}
			if got, want := string(r.stdout), "content of "+path; got != want {
				t.Errorf("cat printed %q, want %q", got, want)
			}
		})
	}
}

func TestServeSignal(t *testing.T) {
	for _, sig := range []string{"SEGV", "KILL", "TERM", "ABRT"} {
		t.Run(sig, func(t *testing.T) {
			r := serveOne(t, t.TempDir(), sh("echo before; kill -"+sig+" $$; echo after"))
			e := r.exit
			if e.Signal != "SIG"+sig || e.Code != -1 || e.TimedOut || e.Error != "" {
				t.Errorf("Exit = code %d, signal %q, timed out %v, error %q; want code -1, signal %q",
					e.Code, e.Signal, e.TimedOut, e.Error, "SIG"+sig)
			}
			if string(r.stdout) != "before\n" {
				t.Errorf("stdout = %q, want %q", r.stdout, "before\n")
			}
		})
	}
}

func TestServeTimeout(t *testing.T) {
	tests := []struct {
		name   string
		req    agent.Request
		stdout string
	}{
		{"sleep", agent.Request{Argv: []string{"sleep", "5"}, Timeout: 200 * time.Millisecond, OutputBytes: 1024}, ""},
		{"output before the timeout is kept", agent.Request{Argv: []string{"sh", "-c", "echo started; sleep 5; echo late"}, Timeout: 200 * time.Millisecond, OutputBytes: 1024}, "started\n"},
		{"ignores SIGTERM", agent.Request{Argv: []string{"sh", "-c", "trap '' TERM; sleep 5"}, Timeout: 200 * time.Millisecond, OutputBytes: 1024}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := serveOne(t, t.TempDir(), tt.req)
			e := r.exit
			if !e.TimedOut || e.Code != -1 || e.Signal != "SIGKILL" || e.Error != "" {
				t.Errorf("Exit = code %d, signal %q, timed out %v, error %q; want timed out, code -1, SIGKILL",
					e.Code, e.Signal, e.TimedOut, e.Error)
			}
			if string(r.stdout) != tt.stdout {
				t.Errorf("stdout = %q, want %q", r.stdout, tt.stdout)
			}
		})
	}
}

func TestServeOutputCap(t *testing.T) {
	tests := []struct {
		name  string
		cap   int64
		n     int
		head  int // bytes sent in Output events, per stream
		tail  int // bytes in the Exit's tail, per stream
		empty bool
	}{
		{"nothing", 1000, 0, 0, 0, true},
		{"within the head", 1000, 300, 300, 0, false},
		{"exactly the head", 1000, 500, 500, 0, false},
		{"into the tail", 1000, 700, 500, 200, false},
		{"exactly the cap", 1000, 1000, 500, 500, false},
		{"over the cap", 1000, 10_000, 500, 500, false},
		{"odd cap", 1001, 10_000, 501, 500, false},
		{"far over the cap, many reads", 4096, 3 << 20, 2048, 2048, false},
		{"zero cap keeps nothing", 0, 5000, 0, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data := randBytes(uint64(tt.n), tt.n)
			req := sh("cat big.bin; cat big.bin >&2")
			req.OutputBytes = tt.cap
			req.Files = []agent.File{{Path: "big.bin", Data: data}}
			r := serveOne(t, t.TempDir(), req)
			e := r.exit
			if e.Code != 0 || e.Error != "" {
				t.Fatalf("Exit = code %d, error %q; want success", e.Code, e.Error)
			}
			for _, s := range []struct {
				name  string
				head  []byte
				tail  []byte
				total int64
			}{
				{"stdout", r.stdout, e.StdoutTail, e.StdoutBytes},
				{"stderr", r.stderr, e.StderrTail, e.StderrBytes},
			} {
				if s.total != int64(tt.n) {
					t.Errorf("%s: Exit counts %d bytes, want %d", s.name, s.total, tt.n)
				}
				if !bytes.Equal(s.head, data[:tt.head]) {
					t.Errorf("%s: Output events carry %d bytes, want the first %d written", s.name, len(s.head), tt.head)
				}
				if !bytes.Equal(s.tail, data[tt.n-tt.tail:]) {
					t.Errorf("%s: Exit tail is %d bytes, want the last %d written", s.name, len(s.tail), tt.tail)
				}
			}
			for i, o := range r.outputs {
				if len(o.Data) == 0 {
					t.Errorf("Output event %d is empty", i)
				}
			}
			if tt.empty && len(r.outputs) != 0 {
				t.Errorf("got %d Output events, want none", len(r.outputs))
			}
		})
	}
}

func TestServeStdin(t *testing.T) {
	big := randBytes(1, 300_000)
	tests := []struct {
		name  string
		argv  []string
		stdin []byte
		want  []byte
	}{
		{"cat echoes stdin", []string{"cat"}, []byte("hello\nworld\n"), []byte("hello\nworld\n")},
		{"larger than a pipe buffer", []string{"cat"}, big, big},
		{"no stdin reads as end of file", []string{"cat"}, nil, nil},
		{"stdin counted", []string{"sh", "-c", "wc -c | tr -d ' '"}, bytes.Repeat([]byte("x"), 123_456), []byte("123456\n")},
		{"program that ignores stdin", []string{"true"}, randBytes(2, 1<<20), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := agent.Request{Argv: tt.argv, Stdin: tt.stdin, Timeout: 5 * time.Second, OutputBytes: 1 << 20}
			r := serveOne(t, t.TempDir(), req)
			e := r.exit
			if e.Code != 0 || e.TimedOut || e.Error != "" {
				t.Errorf("Exit = code %d, timed out %v, error %q; want success", e.Code, e.TimedOut, e.Error)
			}
			if !bytes.Equal(r.stdout, tt.want) {
				t.Errorf("stdout is %d bytes %.20q…, want %d bytes %.20q…", len(r.stdout), r.stdout, len(tt.want), tt.want)
			}
		})
	}
}

func TestServeCannotRun(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "plain.sh"), []byte("echo hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		req  agent.Request
		want string // substring of Exit.Error
	}{
		{"missing program", agent.Request{Argv: []string{"safe-run-no-such-program"}, Timeout: 5 * time.Second}, "not found"},
		{"missing program by path", agent.Request{Argv: []string{"/nonexistent/safe-run-no-such-program"}, Timeout: 5 * time.Second}, "no such file"},
		{"program that is a directory in PATH", agent.Request{Argv: []string{"."}, Timeout: 5 * time.Second}, "not found"},
		{"file without execute permission", agent.Request{Argv: []string{"./plain.sh"}, Timeout: 5 * time.Second}, "permission denied"},
		{"no argv", agent.Request{Timeout: 5 * time.Second}, "argv"},
		{"empty argv", agent.Request{Argv: []string{}, Timeout: 5 * time.Second}, "argv"},
		{"zero timeout", agent.Request{Argv: []string{"true"}}, "positive timeout"},
		{"negative timeout", agent.Request{Argv: []string{"true"}, Timeout: -time.Second}, "positive timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := serveOne(t, dir, tt.req)
			e := r.exit
			if e.Code != -1 || !strings.Contains(e.Error, tt.want) {
				t.Errorf("Exit = code %d, error %q; want code -1 and an error containing %q", e.Code, e.Error, tt.want)
			}
			if len(r.outputs) != 0 {
				t.Errorf("got Output events from a program that did not run: %+v", r.outputs)
			}
		})
	}
}

// TestServeBackgroundChild checks that processes the program leaves behind,
// holding its output pipes open, do not keep Serve from answering.
func TestServeBackgroundChild(t *testing.T) {
	t.Run("in the program's process group", func(t *testing.T) {
		r := serveOne(t, t.TempDir(), sh("sleep 30 & echo $!"))
		pid, err := strconv.Atoi(strings.TrimSpace(string(r.stdout)))
		if err != nil {
			t.Fatalf("stdout %q is not the background pid", r.stdout)
		}
		defer killSleep(t, pid)
		if r.exit.Code != 0 || r.exit.Error != "" {
			t.Errorf("Exit = %+v, want code 0", r.exit)
		}
		// The agent kills the program's group at the end of the run. The
		// kill is asynchronous, so allow the process a while to die.
		for end := time.Now().Add(5 * time.Second); running(pid); {
			if time.Now().After(end) {
				t.Fatalf("background process %d in the program's group outlived the run", pid)
			}
			time.Sleep(10 * time.Millisecond)
		}
	})

	t.Run("in the program's process group, its stdio elsewhere", func(t *testing.T) {
		// Nothing holds the pipes: the agent answers first and kills after.
		r := serveOne(t, t.TempDir(), sh("sleep 30 </dev/null >/dev/null 2>&1 & echo $!"))
		pid, err := strconv.Atoi(strings.TrimSpace(string(r.stdout)))
		if err != nil {
			t.Fatalf("stdout %q is not the background pid", r.stdout)
		}
		defer killSleep(t, pid)
		for end := time.Now().Add(5 * time.Second); running(pid); {
			if time.Now().After(end) {
				t.Fatalf("background process %d in the program's group outlived the run", pid)
			}
			time.Sleep(10 * time.Millisecond)
		}
	})

	t.Run("in a session of its own", func(t *testing.T) {
		if _, err := exec.LookPath("setsid"); err != nil {
			t.Skip("setsid is not installed")
		}
		// Not being the sandbox's init, the agent cannot kill a process
		// that left the program's group; it must stop waiting for its
		// output anyway. The program waits until the child has left its
		// group, and the test kills the child afterwards.
		script := `setsid sh -c 'echo $$ >pid.tmp && mv pid.tmp pid && exec sleep 30' &
			while [ ! -s pid ]; do sleep 0.01; done
			cat pid`
		r := serveOne(t, t.TempDir(), sh(script))
		pid, err := strconv.Atoi(strings.TrimSpace(string(r.stdout)))
		if err != nil {
			t.Fatalf("stdout %q is not the escaped pid; exit %+v", r.stdout, r.exit)
		}
		if !running(pid) {
			t.Fatalf("the escaped process %d is not running; the test did not leave a process holding the pipes", pid)
		}
		killSleep(t, pid)
		if r.exit.Code != 0 || r.exit.Error != "" {
			t.Errorf("Exit = %+v, want code 0", r.exit)
		}
	})
}

// running reports whether pid is a live process (not a zombie).
func running(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 || i+2 >= len(stat) {
		return false
	}
	state := stat[i+2]
	return state != 'Z' && state != 'X'
}

// killSleep kills pid if it is still a "sleep 30" the test started.
func killSleep(t *testing.T, pid int) {
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err == nil && bytes.Equal(cmdline, []byte("sleep\x0030\x00")) {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Logf("kill leftover sleep %d: %v", pid, err)
		}
	}
}

func TestServeRequestsInSequence(t *testing.T) {
	dir := t.TempDir()
	first := agent.Request{
		Files:   []agent.File{{Path: "a.txt", Data: []byte("from the first request\n")}},
		Argv:    []string{"cat", "a.txt"},
		Timeout: 5 * time.Second, OutputBytes: 1024,
	}
	second := sh("cat a.txt; echo second >&2; exit 7")
	cannotRun := agent.Request{Argv: []string{"safe-run-no-such-program"}, Timeout: 5 * time.Second}
	last := sh("echo last")

	s := serve(t, agent.Config{Workdir: dir}, first, second, cannotRun, last)
	if s.err != nil {
		t.Fatalf("Serve failed: %v\nstderr:\n%s", s.err, s.stderr)
	}
	runs := s.runs(t)
	if len(runs) != 4 {
		t.Fatalf("got %d runs, want 4; events: %s", len(runs), dump(s.events))
	}
	want := []struct {
		code           int
		stdout, stderr string
		error          bool
	}{
		{0, "from the first request\n", "", false},
		{7, "from the first request\n", "second\n", false},
		{-1, "", "", true},
		{0, "last\n", "", false},
	}
	for i, w := range want {
		r := runs[i]
		if r.exit.Code != w.code || (r.exit.Error != "") != w.error || string(r.stdout) != w.stdout || string(r.stderr) != w.stderr {
			t.Errorf("run %d: code %d, error %q, output %q, %q; want code %d, error %v, output %q, %q",
				i, r.exit.Code, r.exit.Error, r.stdout, r.stderr, w.code, w.error, w.stdout, w.stderr)
		}
	}
}

func TestServeOneShot(t *testing.T) {
	dir := t.TempDir()
	first := sh("echo first")
	second := sh("echo second")
	second.Files = []agent.File{{Path: "second.txt"}}
	s := serve(t, agent.Config{Workdir: dir, OneShot: true}, first, second)
	if s.err != nil {
		t.Fatalf("Serve failed: %v\nstderr:\n%s", s.err, s.stderr)
	}
	runs := s.runs(t)
	if len(runs) != 1 || string(runs[0].stdout) != "first\n" {
		t.Fatalf("got %d runs, want only the first; events: %s", len(runs), dump(s.events))
	}
	if _, err := os.Stat(filepath.Join(dir, "second.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the second request's file was written: %v", err)
	}
}

func TestServeMalformedRequest(t *testing.T) {
	valid, err := json.Marshal(sh("echo ok"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		input string
		runs  int
	}{
		{"not JSON", "{not json\n", 0},
		{"wrong type", `{"argv": "sh"}` + "\n", 0},
		{"garbage after a request", string(valid) + "\n]\n", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := runHelper(t, "serve", agent.Config{Workdir: t.TempDir()}, []byte(tt.input))
			if s.err == nil {
				t.Errorf("Serve returned nil on a malformed request")
			}
			if !strings.Contains(s.stderr, "read request") {
				t.Errorf("Serve's error = %q, want it to mention reading the request", s.stderr)
			}
			if runs := s.runs(t); len(runs) != tt.runs {
				t.Errorf("got %d runs, want %d", len(runs), tt.runs)
			}
		})
	}
}

// TestServeRepeatedInOneProcess calls Serve several times, one after the
// other, in one process. Each call must answer its request; none may lose
// the exit status of its program to the reaper of an earlier call.
func TestServeRepeatedInOneProcess(t *testing.T) {
	s := runHelper(t, "serve-repeat", agent.Config{Workdir: t.TempDir(), OneShot: true}, nil)
	if s.err != nil {
		t.Fatalf("repeated Serve failed: %v\n%s", s.err, s.stderr)
	}
}
