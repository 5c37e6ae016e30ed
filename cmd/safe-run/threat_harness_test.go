package main

// The harness of the threat suite (threat_test.go): canaries planted on the
// host, listeners the probes try to reach, the two public paths a probe runs
// through (`safe-run run` and the MCP tool run_code), the host-side checks
// made after every case, and the positive controls that run the identical
// probe where the restriction is lifted.
//
// The suite runs as root, as CI's `make test` does, and again as an
// ordinary user (scripts/test-rootless.sh): then safe-run, runsc and
// gVisor's processes are that user on the host, the victims and canaries
// the probes go for are the same user's, the host checks use what that
// user can observe (/proc, not root's cgroups), and the positive controls
// run as that user — the one outside the sandbox the probe must not become.

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/safe-run/safe-run/bundle"
	"github.com/safe-run/safe-run/rootfs"
	"github.com/safe-run/safe-run/runtime/gvisor"
	"github.com/safe-run/safe-run/sandbox"
)

// canaryEnv is set, with a secret value, in the environment of every
// safe-run process the suite starts; no sandbox may ever see it.
const canaryEnv = "SAFE_RUN_THREAT_CANARY"

// threatHarness is the host side of the suite.
type threatHarness struct {
	bin, agent, runsc string
	imageRoot         string
	hashes            map[string]string // path → sha256, taken before the first case

	canaryFile, canaryValue string
	marker                  string // a file name probes try to create outside the sandbox
	hostFiles               map[string]string

	tcp, abstract, ssh          net.Listener
	sshPath                     string
	tcpN, abstractN, sshN       atomic.Int64
	victim, controlVictim       *exec.Cmd
	peer, controlPeer           *exec.Cmd // same-uid processes with the canary in their environment
	runtimeDir, runtimeSock     string    // $XDG_RUNTIME_DIR and a socket the user's services would offer there
	runtimeSockL                net.Listener
	runtimeN                    atomic.Int64
	root                        bool // gvisor.HostRoot(): the suite runs as root, not as an ordinary user
	cliState, tmp               string
	server                      *testServer
	serverPid                   int
	cgroupParents               map[string]string
	idsMu                       sync.Mutex
	ids                         map[string]bool // sandbox IDs seen in the suite's state directories
	stopPolling                 chan struct{}
	pollerDone                  sync.WaitGroup
	serverArgs, cliLimitArgs    []string
	controlPython, controlShell string
}

// newThreatHarness plants the canaries, opens the listeners and starts the
// MCP server the cases share.
func newThreatHarness(t *testing.T) *threatHarness {
	t.Helper()
	bin := binary(t)
	h := &threatHarness{
		bin: bin, tmp: t.TempDir(), ids: map[string]bool{}, stopPolling: make(chan struct{}), root: gvisor.HostRoot(),
		// The same limits on both paths: memory small enough that memory
		// bombs end quickly and large enough for the fill probes (256 MiB
		// tmpfs); processes few enough that a Python fork bomb reaches the
		// process limit before the memory limit.
		serverArgs:   []string{"--memory", "384MiB", "--pids", "64"},
		cliLimitArgs: []string{"--memory", "384MiB", "--pids", "64"},
	}
	h.agent, h.runsc = os.Getenv("SAFE_RUN_AGENT"), os.Getenv("SAFE_RUN_RUNSC")
	if h.agent == "" || h.runsc == "" {
		t.Fatal("SAFE_RUN_AGENT and SAFE_RUN_RUNSC must name the binaries under test")
	}
	img, err := rootfs.Store{Dir: rootfs.DefaultDir()}.Lookup(rootfs.DefaultName)
	if err != nil {
		t.Fatalf("default image: %v", err)
	}
	h.imageRoot = img.Root
	h.hashes = map[string]string{}
	for _, p := range []string{bin, h.agent, h.runsc, filepath.Join(h.imageRoot, "usr/bin/python3.11")} {
		h.hashes[p] = fileHash(t, p)
	}
	h.canaryValue = "canary-" + randomHex(16)
	home, err := os.UserHomeDir()
	if err != nil {
		t.Fatal(err)
	}
	h.canaryFile = filepath.Join(home, ".safe-run-threat-canary-"+randomHex(4))
	if err := os.WriteFile(h.canaryFile, []byte(h.canaryValue+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(h.canaryFile) })
	h.marker = "safe-run-threat-" + randomHex(6)
	h.hostFiles = map[string]string{}
	for _, p := range []string{"/proc/sys/kernel/core_pattern", "/proc/sys/kernel/hostname", "/proc/sys/kernel/panic",
		"/sys/fs/cgroup/memory/release_agent", "/sys/fs/cgroup/pids/release_agent", "/sys/fs/cgroup/cpu/release_agent"} {
		if data, err := os.ReadFile(p); err == nil {
			h.hostFiles[p] = string(data)
		}
	}

	// Listeners on the host's loopback and in its abstract socket namespace,
	// and a socket an ssh-agent would offer: each counts its connections.
	count := func(l net.Listener, n *atomic.Int64) {
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				n.Add(1)
				c.Close()
			}
		}()
	}
	if h.tcp, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	if h.abstract, err = net.Listen("unix", "@"+h.marker); err != nil {
		t.Fatal(err)
	}
	h.sshPath = filepath.Join(h.tmp, "ssh-agent.sock")
	if h.ssh, err = net.Listen("unix", h.sshPath); err != nil {
		t.Fatal(err)
	}
	// A socket in the user's runtime directory, where a desktop session's
	// services (D-Bus, PipeWire, Wayland, gpg-agent) listen and where
	// safe-run keeps its state without root. Root's suite makes one of its
	// own when none is set.
	if h.runtimeDir = os.Getenv("XDG_RUNTIME_DIR"); h.runtimeDir == "" {
		h.runtimeDir = filepath.Join(h.tmp, "xdg-runtime")
		if err := os.Mkdir(h.runtimeDir, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	h.runtimeSock = filepath.Join(h.runtimeDir, "safe-run-threat-"+randomHex(4)+".sock")
	if h.runtimeSockL, err = net.Listen("unix", h.runtimeSock); err != nil {
		t.Fatal(err)
	}
	count(h.tcp, &h.tcpN)
	count(h.abstract, &h.abstractN)
	count(h.ssh, &h.sshN)
	count(h.runtimeSockL, &h.runtimeN)
	t.Cleanup(func() { h.tcp.Close(); h.abstract.Close(); h.ssh.Close(); h.runtimeSockL.Close() })

	if h.controlPython, err = exec.LookPath("python3"); err != nil {
		t.Fatalf("the positive controls need python3 on the host: %v", err)
	}
	h.controlShell = "/bin/bash"

	// Host processes the probes try to signal: one for the sandboxes, one
	// the positive control may kill. And processes of the same uid as
	// safe-run that may be traced and hold the canary in their environment.
	h.victim, h.controlVictim = startVictim(t), startVictim(t)
	h.peer, h.controlPeer = h.startPeer(t), h.startPeer(t)

	if h.cgroupParents = testCgroupParents(t); len(h.cgroupParents) == 0 && h.root {
		t.Fatal("no cgroup parents found")
	}
	h.cliState = filepath.Join(h.tmp, "cli-state")
	h.server = startServerEnv(t, "stdio", h.env(), h.serverArgs...)
	h.serverPid = serverPid(t, h.server.stateDir)
	h.pollIDs(h.cliState, h.server.stateDir)
	t.Cleanup(func() { close(h.stopPolling); h.pollerDone.Wait() })
	return h
}

// env is what every safe-run process of the suite gets besides os.Environ.
func (h *threatHarness) env() []string {
	return []string{canaryEnv + "=" + h.canaryValue, "SSH_AUTH_SOCK=" + h.sshPath}
}

func startVictim(t *testing.T) *exec.Cmd {
	t.Helper()
	return startProcess(t, exec.Command("sleep", "3600"))
}

// peerCode is the program of a host process of the suite's own uid — the
// uid of safe-run, and without root of runsc and gVisor too: it holds the
// canary in its environment and lets any process of its uid trace it, as
// with Yama's ptrace_scope=0, so that only the sandbox stands between a
// probe and it.
const peerCode = `import ctypes, time
ctypes.CDLL(None).prctl(0x59616d61, ctypes.c_ulong(-1), 0, 0, 0)  # PR_SET_PTRACER, PR_SET_PTRACER_ANY
time.sleep(3600)`

func (h *threatHarness) startPeer(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(h.controlPython, "-c", peerCode)
	cmd.Env = append(os.Environ(), h.env()...)
	return startProcess(t, cmd)
}

func startProcess(t *testing.T, cmd *exec.Cmd) *exec.Cmd {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if cmd.Process.Pid < 100 {
		t.Fatalf("victim pid %d could be confused with a sandbox's own pids", cmd.Process.Pid)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-done })
	return cmd
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil && !isZombie(pid) }

func isZombie(pid int) bool {
	fields, ok := procStat(pid)
	return !ok || len(fields) == 0 || fields[0] == "Z" || fields[0] == "X"
}

// procStat returns the fields of /proc/PID/stat that follow the command
// name, which may hold spaces and parentheses: [0] is the state, [1] the
// parent. It reports false if the process is gone.
func procStat(pid int) ([]string, bool) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil, false
	}
	return strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:])), true
}

// testCgroupParents returns where safe-run, started by this test, puts its
// runs' cgroups: root's own cgroups; for an ordinary user the cgroup v2
// delegated to it, or none (the README's last column: no cgroup at all,
// so there is none to check).
func testCgroupParents(t *testing.T) map[string]string {
	t.Helper()
	if !gvisor.HostRoot() {
		layout, err := gvisor.DetectUserCgroups()
		if err != nil {
			t.Logf("runs get no cgroup as uid %d: %v", os.Getuid(), err)
		}
		return layout.Parents
	}
	layout, err := gvisor.DetectCgroups()
	if err != nil {
		t.Fatalf("cgroups: %v", err)
	}
	return layout.Parents
}

// serverPid finds the `safe-run serve` process using stateDir: the one that
// serves. Without root there are two with the same command line — the one
// the client started, and the one it ran again in a user namespace, which
// serves — and the second is the first's child.
func serverPid(t *testing.T, stateDir string) int {
	t.Helper()
	var found []int
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		cmdline, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if len(args) > 2 && args[1] == "serve" && strings.Contains(string(cmdline), "\x00"+stateDir+"\x00") {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			found = append(found, pid)
		}
	}
	if len(found) == 1 {
		return found[0]
	}
	for _, pid := range found {
		if len(found) == 2 && slices.Contains(found, parentPid(pid)) {
			return pid
		}
	}
	t.Fatalf("no single safe-run serve process with state directory %s: %v", stateDir, found)
	return 0
}

// parentPid reads a process's parent from /proc, 0 if it is gone.
func parentPid(pid int) int {
	fields, ok := procStat(pid)
	if !ok || len(fields) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(fields[1])
	return ppid
}

// pollIDs records the names of the run directories that appear in dirs, so
// that the cgroups of runs made through MCP (whose results carry no ID) can
// be checked as well.
func (h *threatHarness) pollIDs(dirs ...string) {
	h.pollerDone.Add(1)
	go func() {
		defer h.pollerDone.Done()
		for {
			select {
			case <-h.stopPolling:
				return
			case <-time.After(5 * time.Millisecond):
			}
			for _, d := range dirs {
				entries, _ := os.ReadDir(d)
				for _, e := range entries {
					if strings.HasPrefix(e.Name(), "safe-run-") {
						h.addID(e.Name())
					}
				}
			}
		}
	}()
}

func (h *threatHarness) addID(id string) {
	h.idsMu.Lock()
	h.ids[id] = true
	h.idsMu.Unlock()
}

func (h *threatHarness) seenIDs() []string {
	h.idsMu.Lock()
	defer h.idsMu.Unlock()
	var out []string
	for id := range h.ids {
		out = append(out, id)
	}
	return out
}

// probeVars are the values substituted into a probe's code.
type probeVars struct {
	pids      []int
	peer      int // a process of the suite's own uid (startPeer)
	hostPaths []string
}

// expand substitutes the harness's values into code. The canary's value is
// never given to a probe: code that printed its own source must not look
// like a leak.
func (h *threatHarness) expand(code string, v probeVars) string {
	pids := make([]string, len(v.pids))
	for i, p := range v.pids {
		pids[i] = strconv.Itoa(p)
	}
	quoted := make([]string, len(v.hostPaths))
	for i, p := range v.hostPaths {
		quoted[i] = strconv.Quote(p)
	}
	return strings.NewReplacer(
		"{{CANARY_FILE}}", h.canaryFile,
		"{{CANARY_ENV}}", canaryEnv,
		"{{MARKER}}", h.marker,
		"{{PIDS}}", "["+strings.Join(pids, ", ")+"]",
		"{{TCP_PORT}}", strconv.Itoa(h.tcp.Addr().(*net.TCPAddr).Port),
		"{{ABSTRACT}}", h.marker,
		"{{SSH_SOCK}}", h.sshPath,
		"{{PEER}}", strconv.Itoa(v.peer),
		"{{RUNTIME_DIR}}", h.runtimeDir,
		"{{RUNTIME_SOCK}}", h.runtimeSock,
		"{{HOME}}", filepath.Dir(h.canaryFile),
		"{{HOST_PATHS}}", "["+strings.Join(quoted, ", ")+"]",
	).Replace(code)
}

// sandboxVars are the values of a probe run in a sandbox: the pids of the
// server (or of this test, for the CLI), and of the victim.
func (h *threatHarness) sandboxVars(serverPid int) probeVars {
	return probeVars{pids: []int{serverPid, h.victim.Process.Pid}, peer: h.peer.Process.Pid, hostPaths: h.hostPaths()}
}

// hostPaths are host paths whose names must never show inside a sandbox.
func (h *threatHarness) hostPaths() []string {
	repo, _ := filepath.Abs(filepath.Dir(filepath.Dir(h.bin)))
	return []string{repo, h.tmp, h.cliState, h.server.stateDir, h.imageRoot, rootfs.DefaultDir(), filepath.Dir(h.canaryFile), h.runtimeDir}
}

// threatRun is what one run through a public path produced.
type threatRun struct {
	via      string // "cli" or "mcp"
	status   sandbox.Status
	exitCode int
	stdout   string
	stderr   string
	message  string
	// everything the caller received, for the canary check
	all     string
	result  sandbox.Result        // CLI only
	mcp     *mcpgo.CallToolResult // MCP only
	mcpOut  map[string]any        // MCP only
	outDir  string                // CLI only: the --out directory
	cliCode int                   // CLI only
	rusage  *syscall.Rusage       // CLI only
}

// runCLI runs code with `safe-run run --json` and the harness's environment.
func (h *threatHarness) runCLI(t *testing.T, lang, code string, timeout time.Duration, args ...string) *threatRun {
	t.Helper()
	r := &threatRun{via: "cli", outDir: filepath.Join(t.TempDir(), "out")}
	argv := []string{"run", "--json", "--state-dir", h.cliState, "--lang", lang, "--timeout", timeout.String(), "--out", r.outDir}
	argv = append(argv, h.cliLimitArgs...)
	argv = append(argv, args...)
	argv = append(argv, "-c", code)
	cmd := exec.Command(h.bin, argv...)
	cmd.Env = append(os.Environ(), h.env()...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("safe-run run: %v", err)
	}
	r.cliCode = cmd.ProcessState.ExitCode()
	r.rusage, _ = cmd.ProcessState.SysUsage().(*syscall.Rusage)
	r.all = out.String() + errOut.String()
	if err := json.Unmarshal(out.Bytes(), &r.result); err != nil {
		t.Fatalf("safe-run run --json printed no result (exit %d): %v\nstdout %.2000s\nstderr %.2000s", r.cliCode, err, out.String(), errOut.String())
	}
	res := r.result
	r.status, r.exitCode, r.stdout, r.stderr, r.message = res.Status, res.ExitCode, res.Stdout, res.Stderr, res.Message
	if res.SandboxID != "" {
		h.addID(res.SandboxID)
	}
	if want := exitCode(res); r.cliCode != want {
		t.Errorf("safe-run run exited %d for status %s, want %d", r.cliCode, res.Status, want)
	}
	return r
}

// runMCP runs code with the MCP tool run_code on the suite's server.
func (h *threatHarness) runMCP(t *testing.T, lang, code string, timeout time.Duration) *threatRun {
	t.Helper()
	return mcpRun(t, h.server, map[string]any{"language": lang, "code": code, "timeout_seconds": timeout.Seconds()})
}

func mcpRun(t *testing.T, ts *testServer, args map[string]any) *threatRun {
	t.Helper()
	res, out := ts.tool(t, "run_code", args)
	r := &threatRun{via: "mcp", mcp: res, mcpOut: out}
	data, _ := json.Marshal(res)
	r.all = string(data)
	status, _ := out["status"].(string)
	r.status = sandbox.Status(status)
	code, _ := out["exit_code"].(float64)
	r.exitCode = int(code)
	r.stdout, _ = out["stdout"].(string)
	r.stderr, _ = out["stderr"].(string)
	r.message, _ = out["message"].(string)
	if status == "" {
		t.Fatalf("run_code returned no result: %s", text(res))
	}
	return r
}

// control runs the identical probe on the host, as the suite's user (root,
// or the ordinary user safe-run then runs as), where none of the sandbox's
// restrictions apply, and returns its output.
func (h *threatHarness) control(t *testing.T, lang, code string) string {
	t.Helper()
	dir := t.TempDir()
	code = h.expand(code, probeVars{pids: []int{h.controlVictim.Process.Pid}, peer: h.controlPeer.Process.Pid, hostPaths: h.hostPaths()})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var cmd *exec.Cmd
	switch lang {
	case "python":
		cmd = exec.CommandContext(ctx, h.controlPython, "-c", code)
	case "bash":
		cmd = exec.CommandContext(ctx, h.controlShell, "-c", code)
	default:
		t.Fatalf("no control for %s", lang)
	}
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), h.env()...)
	cmd.Stdin = nil
	out, _ := cmd.CombinedOutput()
	return string(out)
}

// assertHostClean checks the host after a case: binaries, canaries and
// host files unchanged, no marker created, the victims and the server
// alive, no connection reached the listeners, and nothing of any run of
// the suite left: state, processes, mounts, cgroups.
func (h *threatHarness) assertHostClean(t *testing.T) {
	t.Helper()
	for p, sum := range h.hashes {
		if got := fileHash(t, p); got != sum {
			t.Errorf("%s changed: sha256 %s, was %s", p, got, sum)
		}
	}
	if data, err := os.ReadFile(h.canaryFile); err != nil || string(data) != h.canaryValue+"\n" {
		t.Errorf("canary file %s changed or gone: %q %v", h.canaryFile, data, err)
	}
	for p, was := range h.hostFiles {
		if data, _ := os.ReadFile(p); string(data) != was {
			t.Errorf("%s changed from %q to %q", p, was, data)
		}
	}
	for _, dir := range []string{"/", "/usr", "/etc", "/bin", "/tmp", "/root"} {
		for _, root := range []string{"/", h.imageRoot} {
			p := filepath.Join(root, dir, h.marker)
			if _, err := os.Lstat(p); err == nil {
				t.Errorf("a probe created %s", p)
			}
		}
	}
	for _, dir := range []string{filepath.Dir(h.canaryFile), h.runtimeDir} {
		if _, err := os.Lstat(filepath.Join(dir, h.marker)); err == nil {
			t.Errorf("a probe created %s", filepath.Join(dir, h.marker))
		}
	}
	if !alive(h.victim.Process.Pid) {
		t.Errorf("the victim process %d was killed", h.victim.Process.Pid)
	}
	if !alive(h.peer.Process.Pid) {
		t.Errorf("the same-uid peer process %d was killed", h.peer.Process.Pid)
	}
	if status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", h.peer.Process.Pid)); !bytes.Contains(status, []byte("\nTracerPid:\t0\n")) {
		t.Errorf("the same-uid peer process %d is being traced:\n%s", h.peer.Process.Pid, status)
	}
	if !alive(h.serverPid) {
		t.Fatalf("the MCP server (pid %d) died", h.serverPid)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := h.server.client.Ping(ctx); err != nil {
		t.Errorf("the MCP server does not answer a ping: %v", err)
	}
	for name, n := range map[string]*atomic.Int64{"127.0.0.1 listener": &h.tcpN, "abstract socket": &h.abstractN, "ssh-agent socket": &h.sshN,
		"$XDG_RUNTIME_DIR socket": &h.runtimeN} {
		if c := n.Load(); c != 0 {
			t.Errorf("the host's %s accepted %d connections from sandboxes", name, c)
		}
	}
	h.assertNoLeftovers(t, h.cliState, h.server.stateDir)
}

// assertNoLeftovers waits (a bounded time: killed sandboxes' processes are
// reaped by init, and their cgroups removed after) until the state
// directories are empty and no process, mount or cgroup of any run seen
// is left, and reports what is.
func (h *threatHarness) assertNoLeftovers(t *testing.T, stateDirs ...string) {
	t.Helper()
	assertNoLeftovers(t, h.cgroupParents, h.seenIDs(), stateDirs...)
}

func assertNoLeftovers(t *testing.T, parents map[string]string, ids []string, stateDirs ...string) {
	t.Helper()
	var left []string
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		left = leftovers(parents, ids, stateDirs...)
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, l := range left {
		t.Errorf("left behind after 60s: %s", l)
	}
}

// leftovers lists what runs left below stateDirs and in the cgroups of ids.
// Without root, runsc's mounts live in the mount namespace of the safe-run
// process that made them, and go with its last process: the processes
// checked here.
// A sandbox waiting in a server's warm pool (its run directory holds the
// pool's marker) is not left behind: it belongs to the live server, and
// serves one run only.
func leftovers(parents map[string]string, ids []string, stateDirs ...string) []string {
	var out []string
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	pooled := map[string]bool{}
	for _, dir := range stateDirs {
		for _, e := range stateEntries(dir) {
			if _, err := os.Stat(filepath.Join(dir, e, "pooled")); err == nil {
				pooled[e] = true
			}
		}
	}
	isPooled := func(s string) bool {
		for id := range pooled {
			if strings.Contains(s, id) {
				return true
			}
		}
		return false
	}
	for _, dir := range stateDirs {
		for _, e := range stateEntries(dir) {
			if !pooled[e] {
				out = append(out, "state "+filepath.Join(dir, e))
			}
		}
		for _, p := range sandboxProcesses(dir) {
			cmdline, _ := os.ReadFile(p)
			if !isPooled(string(cmdline)) {
				out = append(out, "process "+p+" "+strings.ReplaceAll(string(cmdline), "\x00", " "))
			}
		}
		for _, l := range strings.Split(string(mounts), "\n") {
			if strings.Contains(l, dir) && !isPooled(l) {
				out = append(out, "mount "+l)
			}
		}
	}
	for _, id := range ids {
		if pooled[id] {
			continue
		}
		for _, parent := range parents {
			if _, err := os.Stat(filepath.Join(parent, id)); err == nil {
				out = append(out, "cgroup "+filepath.Join(parent, id))
			}
		}
	}
	return out
}

func fileHash(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("hash %s: %v", path, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatalf("hash %s: %v", path, err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// runCgroupOf waits until a sandbox of stateDir runs and returns its ID.
// Sandboxes waiting in a warm pool do not count: they run nothing yet.
func runCgroupOf(t *testing.T, stateDir string, within time.Duration) string {
	t.Helper()
	re := regexp.MustCompile(regexp.QuoteMeta(stateDir) + `/(safe-run-[0-9a-f-]{36})`)
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		for _, p := range sandboxProcesses(stateDir) {
			cmdline, _ := os.ReadFile(p)
			m := re.FindStringSubmatch(string(cmdline))
			if m == nil {
				continue
			}
			if _, err := os.Stat(filepath.Join(stateDir, m[1], "pooled")); err != nil {
				return m[1]
			}
		}
	}
	t.Fatalf("no sandbox of %s started within %v", stateDir, within)
	return ""
}

// gvisorWithoutFilter runs code with python3 in gVisor with the bundle
// safe-run would use for it — same image, user, mounts, limits and flags —
// except that the seccomp filter is left out. It is the positive control of
// the seccomp probes: what they see when the filter is not there. It builds
// the bundle in the test; nothing in the product can run without the filter.
// Without root, runsc runs where safe-run would run it: as root of a user
// and mount namespace that maps only the user (hostUserNamespace).
func gvisorWithoutFilter(t *testing.T, h *threatHarness, code string) string {
	t.Helper()
	job, _, err := sandbox.Policy{}.Check(sandbox.Job{Language: "python", Code: code})
	if err != nil {
		t.Fatal(err)
	}
	spec, err := bundle.Build(job, bundle.Config{Rootfs: h.imageRoot, Agent: h.agent})
	if err != nil {
		t.Fatal(err)
	}
	spec.Linux.Seccomp = nil
	spec.Process.User = specs.User{UID: bundle.UID, GID: bundle.GID}
	spec.Process.Capabilities = &specs.LinuxCapabilities{}
	spec.Process.Args = []string{"/usr/bin/python3", "-c", code}
	spec.Process.Cwd = "/tmp"
	dir := t.TempDir()
	bundleDir, root := filepath.Join(dir, "bundle"), filepath.Join(dir, "runsc")
	if err := bundle.Write(bundleDir, spec); err != nil {
		t.Fatal(err)
	}
	id := "safe-run-control-" + randomHex(6)
	outPath := filepath.Join(dir, "out")
	outFile, err := os.Create(outPath)
	if err != nil {
		t.Fatal(err)
	}
	defer outFile.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	runsc := []string{h.runsc, "--root", root, "--network", "none", "--ignore-cgroups", "--overlay2", "none"}
	run := append(slices.Clip(runsc), "run", "--bundle", bundleDir, id)
	del := append(slices.Clip(runsc), "delete", "--force", id)
	var cmd *exec.Cmd
	if h.root {
		cmd = exec.CommandContext(ctx, run[0], run[1:]...)
	} else {
		// Both commands in one namespace, whose mounts (runsc's null network
		// namespace) go with it.
		script := `"$@"; status=$?; ` + shellQuote(del) + ` 2>/dev/null; exit $status`
		cmd = hostUserNamespace(ctx, append([]string{"/bin/sh", "-c", script, "sh"}, run...)...)
	}
	cmd.Stdout, cmd.Stderr = outFile, outFile
	runErr := cmd.Run()
	if h.root {
		_ = exec.Command(del[0], del[1:]...).Run()
		for unix.Unmount(filepath.Join(root, "null-netns"), unix.MNT_DETACH) == nil {
		}
	}
	out, _ := os.ReadFile(outPath)
	if runErr != nil && len(out) == 0 {
		t.Fatalf("runsc without the filter: %v", runErr)
	}
	return string(out)
}

// hostUserNamespace runs args as root of a new user namespace that maps
// only the calling user, with a mount namespace of its own: what safe-run
// does for itself when an ordinary user starts it. With extra flags of
// unshare(1) before "--", e.g. "--net" for a network namespace of its own.
func hostUserNamespace(ctx context.Context, args ...string) *exec.Cmd {
	flags := []string{"--user", "--map-root-user", "--mount"}
	if i := slices.Index(args, "--"); i >= 0 {
		flags, args = append(flags, args[:i]...), args[i+1:]
	}
	return exec.CommandContext(ctx, "unshare", append(append(flags, "--"), args...)...)
}

// shellQuote quotes args for /bin/sh.
func shellQuote(args []string) string {
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(quoted, " ")
}

// rss reads a process's resident and peak resident memory, in bytes.
func rss(pid int) (vmRSS, vmHWM int64) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1, -1
	}
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(fields[1], 10, 64)
		switch fields[0] {
		case "VmRSS:":
			vmRSS = kb << 10
		case "VmHWM:":
			vmHWM = kb << 10
		}
	}
	return vmRSS, vmHWM
}
