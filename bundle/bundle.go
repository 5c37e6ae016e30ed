// Package bundle turns a Job into the OCI runtime configuration (config.json)
// of its sandbox. It is pure data: it builds the document in one place and
// writes it, and starts nothing, so the whole security posture of a sandbox
// can be read, and tested, as one value.
package bundle

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/safe-run/safe-run/sandbox"
	"github.com/safe-run/safe-run/seccomp"
)

// Paths inside the sandbox.
const (
	// AgentPath is where the agent binary is mounted, read-only.
	AgentPath = "/.safe-run/agent"
	// Workspace is the program's working directory, a size-capped tmpfs.
	Workspace = "/workspace"
)

// UID and GID of the sandboxed program and everything it starts: the
// conventional "nobody", with no capabilities.
const (
	UID = 65534
	GID = 65534
)

// AgentCapabilities are all the agent holds. The agent is the sandbox's
// first process and runs as root inside gVisor (never on the host), so that
// the program, a different user, can neither signal nor inspect it, and a
// fork bomb exhausting the program's process limit cannot starve it. It
// needs to write the job's files and hand them to the program's user
// (CHOWN, DAC_OVERRIDE, FOWNER), start the program as that user (SETUID,
// SETGID), and kill whatever the program leaves behind (KILL). The program
// loses them all when the agent switches to its user.
var AgentCapabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_KILL", "CAP_SETGID", "CAP_SETUID",
}

// MemoryHeadroom is added to a job's memory limit for gVisor's own use
// (the sentry, the gofer, page tables), measured at 50–60 MiB here, so
// that a job gets the memory it asked for.
const MemoryHeadroom = 96 * sandbox.MiB

// HostPidsFloor is the smallest host-side pids limit. On the host every
// sandboxed task costs gVisor about three threads and gVisor needs dozens
// of its own, so the real process cap is RLIMIT_NPROC inside the sandbox and
// the host limit is only a backstop: 64 crashed the sandbox at start.
const HostPidsFloor = 512

// DefaultEnv is the environment of every sandboxed program. Nothing of the
// server's own environment reaches the sandbox.
var DefaultEnv = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME=/tmp",
	"TMPDIR=/tmp",
	"LANG=C.UTF-8",
	"PYTHONUNBUFFERED=1",        // output arrives as written, so a timeout keeps it
	"PYTHONDONTWRITEBYTECODE=1", // the root is read-only anyway
	"MPLBACKEND=Agg",
	"MPLCONFIGDIR=/tmp/.matplotlib",
}

// Config is what the bundle needs to know about the host.
type Config struct {
	// Rootfs is the host path of the image's root directory.
	Rootfs string
	// Agent is the host path of the safe-run-agent binary.
	Agent string
	// Env replaces DefaultEnv when set.
	Env []string
	// ImageEnv is the image's own environment, e.g. its PATH. Its
	// variables override the others, except HOME and TMPDIR, which name
	// the sandbox's writable places.
	ImageEnv []string
	// WorkingDir is the image's WORKDIR. The workspace is mounted there
	// instead of at Workspace, so that code runs where the image expects;
	// see Workdir for the directories it cannot be.
	WorkingDir string
	// KeepAlive makes the agent serve requests until its input ends, for a
	// session, instead of exactly one.
	KeepAlive bool
	// Network, if set, gives the sandbox a network: its namespace, and the
	// files that point its programs at the host's resolver and CAs.
	Network *Network
}

// Network is what a networked sandbox's bundle needs of the host.
type Network struct {
	// NetNS is the host path of the sandbox's network namespace (a bind
	// mount of it), which runsc joins.
	NetNS string
	// ResolvConf is a host file bound read-only over ResolvConfPath.
	ResolvConf string
	// CABundle, if set, is a host file bound read-only over CABundlePath
	// (the image's CAs plus the operator's), also named by
	// NODE_EXTRA_CA_CERTS, because Node trusts only its own list otherwise.
	CABundle string
}

// Paths a networked sandbox gets files bound over (they must exist in the
// image, whose root is read-only).
const (
	ResolvConfPath = "/etc/resolv.conf"
	CABundlePath   = "/etc/ssl/certs/ca-certificates.crt"
)

// Build returns the runtime configuration for job, whose limits must be
// complete (see sandbox.Policy.Check).
func Build(job sandbox.Job, cfg Config) (*specs.Spec, error) {
	if !filepath.IsAbs(cfg.Rootfs) || !filepath.IsAbs(cfg.Agent) {
		return nil, fmt.Errorf("build bundle: rootfs %q and agent %q must be absolute paths", cfg.Rootfs, cfg.Agent)
	}
	l := job.Limits
	if l.MemoryBytes <= 0 || l.Processes <= 0 || l.CPUs <= 0 || l.WorkspaceBytes <= 0 || l.TmpBytes <= 0 ||
		l.OpenFiles <= 0 || l.FileSizeBytes <= 0 {
		return nil, fmt.Errorf("build bundle: limits are incomplete: %+v", l)
	}
	env := environment(cfg)
	workdir := Workdir(cfg.WorkingDir)
	ms := mounts(l, cfg.Agent, workdir)
	netns := specs.LinuxNamespace{Type: specs.NetworkNamespace}
	if n := cfg.Network; n != nil {
		if !filepath.IsAbs(n.NetNS) || !filepath.IsAbs(n.ResolvConf) || (n.CABundle != "" && !filepath.IsAbs(n.CABundle)) {
			return nil, fmt.Errorf("build bundle: network files %+v must be absolute paths", *n)
		}
		netns.Path = n.NetNS
		ms = append(ms, specs.Mount{Destination: ResolvConfPath, Type: "bind", Source: n.ResolvConf, Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"}})
		if n.CABundle != "" {
			ms = append(ms, specs.Mount{Destination: CABundlePath, Type: "bind", Source: n.CABundle, Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"}})
			env = append(env, "NODE_EXTRA_CA_CERTS="+CABundlePath)
		}
	}
	filter, err := seccomp.Profile()
	if err != nil {
		return nil, fmt.Errorf("build bundle: %w", err)
	}
	memory := l.MemoryBytes + MemoryHeadroom
	pids := max(HostPidsFloor, 8*int64(l.Processes))
	period := uint64(100_000)
	quota := int64(math.Round(l.CPUs * float64(period)))
	swappiness := uint64(0)

	return &specs.Spec{
		Version: specs.Version,
		Root:    &specs.Root{Path: cfg.Rootfs, Readonly: true},
		Process: &specs.Process{
			User: specs.User{UID: 0, GID: 0},
			Args: agentArgs(workdir, cfg.KeepAlive),
			Env:  env,
			Cwd:  workdir,
			// Nothing inheritable or ambient: the program, started by the
			// agent as another user, ends up with no capability at all.
			Capabilities: &specs.LinuxCapabilities{
				Bounding:  slices.Clone(AgentCapabilities),
				Effective: slices.Clone(AgentCapabilities),
				Permitted: slices.Clone(AgentCapabilities),
			},
			NoNewPrivileges: true,
			Rlimits: []specs.POSIXRlimit{
				{Type: "RLIMIT_NOFILE", Hard: uint64(l.OpenFiles), Soft: uint64(l.OpenFiles)},
				{Type: "RLIMIT_NPROC", Hard: uint64(l.Processes), Soft: uint64(l.Processes)},
				{Type: "RLIMIT_FSIZE", Hard: uint64(l.FileSizeBytes), Soft: uint64(l.FileSizeBytes)},
				{Type: "RLIMIT_CORE", Hard: 0, Soft: 0},
			},
		},
		Hostname: "sandbox",
		Mounts:   ms,
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace},
				netns,
				{Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace},
				{Type: specs.MountNamespace},
			},
			// The host applies these to the cgroup it creates for the run.
			Resources: &specs.LinuxResources{
				Memory: &specs.LinuxMemory{Limit: &memory, Swap: &memory, Swappiness: &swappiness},
				Pids:   &specs.LinuxPids{Limit: &pids},
				CPU:    &specs.LinuxCPU{Quota: &quota, Period: &period},
			},
			Seccomp:       filter,
			MaskedPaths:   slices.Clone(maskedPaths),
			ReadonlyPaths: slices.Clone(readonlyPaths),
		},
	}, nil
}

// environment is the sandbox's environment: the base one with the image's
// variables over it. An image variable replaces the base's first of that
// name, or is appended; a later one of the image's replaces an earlier. An
// index of names keeps this linear in the entries: an image may list
// hundreds.
func environment(cfg Config) []string {
	env := slices.Clone(cfg.Env)
	if env == nil {
		env = slices.Clone(DefaultEnv)
	}
	at := make(map[string]int, len(env)+len(cfg.ImageEnv))
	for i, kv := range env {
		if name, _, ok := strings.Cut(kv, "="); ok {
			if _, seen := at[name]; !seen {
				at[name] = i
			}
		}
	}
	for _, kv := range cfg.ImageEnv {
		name, _, ok := strings.Cut(kv, "=")
		if !ok || name == "" || name == "HOME" || name == "TMPDIR" {
			continue
		}
		if i, seen := at[name]; seen {
			env[i] = kv
		} else {
			at[name] = len(env)
			env = append(env, kv)
		}
	}
	return env
}

// systemDirs are directories a workspace mounted over would hide the
// system of: an image whose WORKDIR is one of them runs in Workspace.
var systemDirs = []string{"/bin", "/boot", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/root", "/run", "/sbin", "/usr", "/usr/bin", "/usr/lib", "/usr/lib64", "/usr/local", "/usr/local/bin", "/usr/local/lib", "/usr/sbin", "/usr/share", "/var"}

// Workdir is where the workspace is mounted and code runs for an image
// whose WORKDIR is imageDir: there, unless it is empty, relative, the root,
// a system directory, or in conflict with another of the sandbox's mounts;
// then Workspace.
func Workdir(imageDir string) string {
	dir := path.Clean(imageDir)
	if imageDir == "" || !path.IsAbs(dir) || dir == "/" || slices.Contains(systemDirs, dir) {
		return Workspace
	}
	for _, m := range mounts(sandbox.Limits{}, "/", Workspace) {
		if m.Destination == Workspace {
			continue
		}
		if dir == m.Destination || strings.HasPrefix(dir, m.Destination+"/") || strings.HasPrefix(m.Destination, dir+"/") {
			return Workspace
		}
	}
	return dir
}

func agentArgs(workdir string, keepAlive bool) []string {
	args := []string{AgentPath, "--workdir", workdir, "--uid", strconv.Itoa(UID), "--gid", strconv.Itoa(GID)}
	if !keepAlive {
		args = append(args, "--one-shot")
	}
	return args
}

func mounts(l sandbox.Limits, agent, workdir string) []specs.Mount {
	size := func(n int64) string { return "size=" + strconv.FormatInt(n, 10) }
	return []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", size(64 * sandbox.MiB)}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		// gVisor always offers /dev/net/tun; an empty read-only tmpfs hides it.
		{Destination: "/dev/net", Type: "tmpfs", Source: "tmpfs", Options: []string{"ro", "nosuid", "noexec", "nodev", "mode=0555", "size=4k"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		// The workspace belongs to the program's user, as a home would.
		{Destination: workdir, Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=0755",
			"uid=" + strconv.Itoa(UID), "gid=" + strconv.Itoa(GID), size(l.WorkspaceBytes)}},
		{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777", size(l.TmpBytes)}},
		{Destination: AgentPath, Type: "bind", Source: agent, Options: []string{"bind", "ro", "nosuid", "nodev"}},
	}
}

// Mountpoints lists the paths the sandbox mounts over, which must exist in
// every image because the root is read-only: directories, and files (the
// agent).
func Mountpoints() (dirs, files []string) {
	for _, m := range mounts(sandbox.Limits{}, "/", Workspace) {
		if m.Type == "bind" {
			files = append(files, m.Destination)
		} else {
			dirs = append(dirs, m.Destination)
		}
	}
	return dirs, files
}

// maskedPaths and readonlyPaths are Docker's defaults: kernel interfaces a
// container has no business reading or writing.
var (
	maskedPaths = []string{
		"/proc/asound", "/proc/acpi", "/proc/interrupts", "/proc/kcore", "/proc/keys",
		"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug",
		"/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap",
	}
	readonlyPaths = []string{
		"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
	}
)

// Write creates dir and writes spec to dir/config.json.
func Write(dir string, spec *specs.Spec) error {
	data, err := json.MarshalIndent(spec, "", "\t")
	if err != nil {
		return fmt.Errorf("write bundle: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("write bundle: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), data, 0o600); err != nil {
		return fmt.Errorf("write bundle: %w", err)
	}
	return nil
}
