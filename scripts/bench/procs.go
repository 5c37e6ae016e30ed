package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/mark3labs/mcp-go/client"
	mcpgo "github.com/mark3labs/mcp-go/mcp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/safe-run/safe-run/bundle"
	"github.com/safe-run/safe-run/sandbox"
)

// rawRunsc runs python3 directly as the sandbox's process, in a bundle
// built by the same code as safe-run's, with the same runsc flags: gVisor
// alone, without the agent, the cgroup or the shim.
type rawRunsc struct {
	o           options
	dir, bundle string
}

func newRawRunsc(o options, root string) (*rawRunsc, error) {
	dir, err := os.MkdirTemp("", "safe-run-bench-")
	if err != nil {
		return nil, err
	}
	r := &rawRunsc{o: o, dir: dir, bundle: filepath.Join(dir, "bundle")}
	job, _, err := sandbox.Policy{}.Check(sandbox.Job{Language: "python", Code: "x"})
	if err != nil {
		return nil, err
	}
	spec, err := bundle.Build(job, bundle.Config{Rootfs: root, Agent: o.agent})
	if err != nil {
		return nil, err
	}
	spec.Process.User = specs.User{UID: bundle.UID, GID: bundle.GID}
	spec.Process.Capabilities = &specs.LinuxCapabilities{}
	spec.Process.Args = []string{"python3", "-c", "import sys; exec(sys.argv[1])", ""}
	return r, bundle.Write(r.bundle, spec)
}

func (r *rawRunsc) run(code string) error { return r.runIn(nil, code) }

// runIn runs code in a new sandbox; with cg, runsc and everything it
// starts run in that cgroup.
func (r *rawRunsc) runIn(cg *cpuCgroup, code string) error {
	// Each run gets its own bundle copy (the code is in its argv) and root.
	id := "bench-" + uuid.NewString()[:8]
	dir := filepath.Join(r.dir, id)
	spec, err := readSpec(filepath.Join(r.bundle, "config.json"))
	if err != nil {
		return err
	}
	spec.Process.Args[len(spec.Process.Args)-1] = code
	if err := bundle.Write(filepath.Join(dir, "bundle"), spec); err != nil {
		return err
	}
	defer func() {
		_ = unix.Unmount(filepath.Join(dir, "root", "null-netns"), unix.MNT_DETACH)
		_ = os.RemoveAll(dir)
	}()
	cmd := cg.command(r.o.runsc, "--root", filepath.Join(dir, "root"), "--platform", "systrap", "--network", "none",
		"--oci-seccomp", "--ignore-cgroups", "--overlay2", "none", "run", "--bundle", filepath.Join(dir, "bundle"), id)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("runsc run: %w: %s", err, out)
	}
	return nil
}

func (r *rawRunsc) close() { _ = os.RemoveAll(r.dir) }

func readSpec(path string) (*specs.Spec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var s specs.Spec
	return &s, json.Unmarshal(data, &s)
}

// coldRun is one `safe-run run` of a Python program; with cg, safe-run
// and everything it starts run in that cgroup.
func coldRun(o options, cg *cpuCgroup, code string) error {
	if out, err := cg.command(o.bin, "run", "--lang", "python", "-c", code).CombinedOutput(); err != nil {
		return fmt.Errorf("safe-run run: %w: %s", err, out)
	}
	return nil
}

// server is a `safe-run serve` over stdio with a client.
type server struct {
	c        *client.Client
	stateDir string
	size     int // sandboxes in its pool when it is full
	idle     time.Duration
}

// startServer starts `safe-run serve` with a pool of size sandboxes in
// all (0 for --pool=) and the extra args; with cg, the server and
// everything it starts run in that cgroup.
func startServer(o options, cg *cpuCgroup, size int, args ...string) (*server, error) {
	dir, err := os.MkdirTemp("", "safe-run-bench-state-")
	if err != nil {
		return nil, err
	}
	s := &server{stateDir: dir, size: size, idle: o.idle}
	// Every build compared runs the same runsc (-runsc): what differs is
	// safe-run, and a baseline directory need not hold a runsc of its own.
	all := append([]string{"serve", "--state-dir", dir, "--runsc", o.runsc, "--log-level", "error", "--max-concurrent", "4"}, args...)
	name, all := cg.wrap(o.bin, all...)
	if s.c, err = client.NewStdioMCPClient(name, nil, all...); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var init mcpgo.InitializeRequest
	init.Params.ClientInfo = mcpgo.Implementation{Name: "safe-run-bench", Version: "1"}
	if _, err := s.c.Initialize(ctx, init); err != nil {
		s.close()
		return nil, fmt.Errorf("initialize %s: %w", o.bin, err)
	}
	return s, nil
}

// call runs a Python program through run_code.
func (s *server) call(code string) error { return s.callLang("python", code) }

// callLang runs code in language through run_code and checks that it
// succeeded.
func (s *server) callLang(language, code string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var req mcpgo.CallToolRequest
	req.Params.Name = "run_code"
	req.Params.Arguments = map[string]any{"language": language, "code": code}
	res, err := s.c.CallTool(ctx, req)
	if err != nil {
		return err
	}
	if res.IsError {
		return fmt.Errorf("run_code failed: %v", res.Content)
	}
	return nil
}

// timed waits until the pool is full and then for s.idle (-idle), and
// times one call alone: a client's calls come seconds apart, the pool
// refills between, and the machine rests before the next. Called the moment
// a refill ends, a call finds the CPUs awake, which one after a rest does
// not: warm print(1) p50 13.3-14.0 ms that way against 15.5-17.0 ms after 1 s
// at rest, the same two builds a few minutes apart (2026-12-06).
func (s *server) timed(language, code string) (time.Duration, error) {
	if err := s.waitFull(); err != nil {
		return 0, err
	}
	time.Sleep(s.idle)
	start := time.Now()
	err := s.callLang(language, code)
	return time.Since(start), err
}

// waitFull waits until the pool is full: every sandbox it holds waits in
// it, ready, and no other is starting or being torn down.
func (s *server) waitFull() error {
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		entries, _ := os.ReadDir(s.stateDir)
		if len(entries) == s.size && len(s.pooled()) == s.size {
			return nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	return fmt.Errorf("the pool did not fill within 3 minutes")
}

// pooled lists the sandboxes waiting in the pool: their run directories
// hold the runtime's "pooled" marker.
func (s *server) pooled() []string {
	found, _ := filepath.Glob(filepath.Join(s.stateDir, "*", "pooled"))
	var ids []string
	for _, f := range found {
		ids = append(ids, filepath.Base(filepath.Dir(f)))
	}
	return ids
}

// language is what the pooled sandbox id waits to run.
func (s *server) language(id string) string {
	lang, _ := os.ReadFile(filepath.Join(s.stateDir, id, "pooled"))
	return strings.TrimSpace(string(lang))
}

// close stops the server and waits until it removed its sandboxes; a
// second close does nothing.
func (s *server) close() {
	if s.c == nil {
		return
	}
	s.c.Close()
	s.c = nil
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if entries, _ := os.ReadDir(s.stateDir); len(entries) == 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = os.RemoveAll(s.stateDir)
}

// command is exec.Command(name, args...) run in cg (nil: where the bench runs).
func (cg *cpuCgroup) command(name string, args ...string) *exec.Cmd {
	name, args = cg.wrap(name, args...)
	return exec.Command(name, args...)
}
