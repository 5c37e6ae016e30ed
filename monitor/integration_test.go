package monitor

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/safe-run/safe-run/rootfs"
	"github.com/safe-run/safe-run/sandbox"
)

// runscRun runs argv in a bare bundle of the default image under the real
// runsc (SAFE_RUN_RUNSC), with the monitor's trace session, and returns
// what the monitor saw. It proves the consumer against gVisor's real
// stream, without the rest of safe-run (runtime/gvisor tests the wiring).
func runscRun(t *testing.T, opts Options, argv ...string) (sandbox.Activity, string) {
	t.Helper()
	runsc := os.Getenv("SAFE_RUN_RUNSC")
	img, err := rootfs.Store{}.Lookup(rootfs.DefaultName)
	if runsc == "" || err != nil || os.Geteuid() != 0 {
		if os.Getenv("SAFE_RUN_INTEGRATION") == "1" && os.Geteuid() == 0 {
			t.Fatalf("needs SAFE_RUN_RUNSC (%q) and the default image (%v)", runsc, err)
		}
		t.Skip("integration test: needs root, SAFE_RUN_RUNSC and the default image (SAFE_RUN_INTEGRATION=1 under `make test`)")
	}
	dir := t.TempDir()
	opts.ExpectStart = true
	m, err := Start(filepath.Join(dir, "m.sock"), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	session := filepath.Join(dir, "trace.json")
	if err := os.WriteFile(session, m.SessionConfig(), 0o600); err != nil {
		t.Fatal(err)
	}
	spec := &specs.Spec{
		Version: specs.Version,
		Root:    &specs.Root{Path: img.Root, Readonly: true},
		Process: &specs.Process{
			Args: argv, Cwd: "/tmp",
			Env:  []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp"},
			User: specs.User{UID: 65534, GID: 65534},
		},
		Hostname: "sandbox",
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"size=16m"}},
		},
		Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{
			{Type: specs.PIDNamespace}, {Type: specs.MountNamespace}, {Type: specs.IPCNamespace},
			{Type: specs.UTSNamespace}, {Type: specs.NetworkNamespace},
		}},
	}
	bundleDir := filepath.Join(dir, "bundle")
	data, _ := json.Marshal(spec)
	if err := os.MkdirAll(bundleDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundleDir, "config.json"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	root := filepath.Join(dir, "root")
	id := "mon-" + filepath.Base(dir)
	cmd := exec.CommandContext(ctx, runsc, "--root", root, "--rootless=false", "--network=none", "--platform=systrap",
		"--ignore-cgroups", "--overlay2", "none", "--pod-init-config", session, "run", "--bundle", bundleDir, id)
	out, err := cmd.CombinedOutput()
	exec.Command(runsc, "--root", root, "delete", "--force", id).Run()
	exec.Command("umount", filepath.Join(root, "null-netns")).Run()
	if err != nil {
		t.Logf("runsc run: %v\n%s", err, out)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	return m.Total(), string(out)
}

func TestRealStream(t *testing.T) {
	const program = `
import socket, subprocess
subprocess.run(["sh", "-c", "true"])
open("/proc/self/environ").read()
open("/tmp/out.txt", "w").write("x")
s = socket.socket()
try:
    s.connect(("10.0.0.1", 3333))
except OSError:
    pass
`
	got, out := runscRun(t, Options{}, "python3", "-c", program)
	if got.Lost != "" || got.Dropped != 0 {
		t.Fatalf("lost %q, dropped %d (runsc: %s)", got.Lost, got.Dropped, out)
	}
	var binaries []string
	for _, p := range got.Processes {
		binaries = append(binaries, filepath.Base(p.Binary))
	}
	// The container's own process (python3 here) has no execve point; sh
	// is the one started.
	if !slices.ContainsFunc(binaries, func(b string) bool { return b == "dash" || b == "sh" || b == "bash" }) {
		t.Errorf("no shell among the processes %q: %+v", binaries, got.Processes)
	}
	for _, p := range got.Processes {
		if !p.Exited || p.ExitCode != 0 || p.Parent == 0 || p.SHA256 == "" {
			t.Errorf("process %+v: want exited 0, a parent and a hash", p)
		}
	}
	if got.Clones < 1 {
		t.Errorf("clones %d", got.Clones)
	}
	if !slices.Contains(got.SensitiveReads, "/proc/self/environ") {
		t.Errorf("sensitive reads %q", got.SensitiveReads)
	}
	if len(got.FilesWritten) != 0 {
		t.Errorf("files written outside /workspace and /tmp: %q", got.FilesWritten)
	}
	if !slices.ContainsFunc(got.Network, func(n sandbox.NetworkAttempt) bool {
		return n.Op == "connect" && n.Address == "10.0.0.1:3333" && n.Result != "ok"
	}) {
		t.Errorf("no refused connect to 10.0.0.1:3333 in %+v", got.Network)
	}
	names := hitNames(got)
	for _, want := range []string{"shell-from-python", "sensitive-read", "miner-pool-port"} {
		if !slices.Contains(names, want) {
			t.Errorf("rule %s did not fire: %+v", want, got.Rules)
		}
	}
	if got.Events["container_start"] != 1 {
		t.Errorf("events %v", got.Events)
	}
	t.Logf("activity: %s; events %v", got.Summary(), got.Events)
}

func TestRealStreamQuiet(t *testing.T) {
	got, out := runscRun(t, Options{}, "python3", "-c", "print(sum(range(10)))")
	if got.Lost != "" || len(got.Rules) != 0 || len(got.Processes) != 0 || len(got.Network) != 0 ||
		len(got.FilesWritten) != 0 || len(got.SensitiveReads) != 0 {
		t.Errorf("pure Python is not quiet (runsc: %s): %+v", strings.TrimSpace(out), got)
	}
}
