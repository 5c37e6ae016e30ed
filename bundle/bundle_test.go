package bundle_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/safe-run/safe-run/bundle"
	"github.com/safe-run/safe-run/sandbox"
	"github.com/safe-run/safe-run/seccomp"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// testConfig is the host configuration of every test bundle.
var testConfig = bundle.Config{
	Rootfs: "/var/cache/safe-run/images/test/rootfs",
	Agent:  "/usr/libexec/safe-run/safe-run-agent",
}

// customLimits are the limits of the second golden file.
var customLimits = sandbox.Limits{
	MemoryBytes:    256 * sandbox.MiB,
	CPUs:           2,
	Processes:      64,
	Timeout:        5 * time.Second,
	OutputBytes:    4 * sandbox.KiB,
	WorkspaceBytes: 8 * sandbox.MiB,
}

// checkedJob returns a Python job with limits, its zero fields filled in by
// the default policy, as the server does before building a bundle.
func checkedJob(t *testing.T, limits sandbox.Limits) sandbox.Job {
	t.Helper()
	job, _, err := sandbox.Policy{}.Check(sandbox.Job{Language: "python", Code: "print(1)", Limits: limits})
	if err != nil {
		t.Fatalf("Policy.Check: %v", err)
	}
	return job
}

func build(t *testing.T, job sandbox.Job, cfg bundle.Config) *specs.Spec {
	t.Helper()
	spec, err := bundle.Build(job, cfg)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	return spec
}

// TestGolden compares the whole configuration with a reviewed copy. The
// seccomp filter is left out of the files: it depends on the architecture
// and is seccomp's own to test; here it is only checked to be the package's
// profile. Run "go test ./bundle -update" to rewrite the files, then review
// the difference before keeping it.
func TestGolden(t *testing.T) {
	imageConfig := testConfig
	imageConfig.Rootfs = "/var/cache/safe-run/images/sha256-0123/rootfs"
	imageConfig.ImageEnv = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "PYTHON_VERSION=3.12.7", "HOME=/root", "LANG=en_US.UTF-8"}
	imageConfig.WorkingDir = "/srv/app"
	for _, tt := range []struct {
		golden string
		limits sandbox.Limits
		cfg    bundle.Config
	}{
		{"python-default.golden.json", sandbox.Limits{}, testConfig},
		{"python-custom.golden.json", customLimits, testConfig},
		// An image's environment and WORKDIR.
		{"python-image.golden.json", sandbox.Limits{}, imageConfig},
	} {
		t.Run(tt.golden, func(t *testing.T) {
			spec := build(t, checkedJob(t, tt.limits), tt.cfg)
			want, err := seccomp.Profile()
			if err != nil {
				t.Fatalf("seccomp.Profile: %v", err)
			}
			if !reflect.DeepEqual(spec.Linux.Seccomp, want) {
				t.Error("Linux.Seccomp is not seccomp.Profile()")
			}
			spec.Linux.Seccomp = nil

			got, err := json.MarshalIndent(spec, "", "\t")
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, '\n')
			path := filepath.Join("testdata", tt.golden)
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			golden, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./bundle -update to create it)", err)
			}
			if !bytes.Equal(got, golden) {
				t.Errorf("configuration differs from %s (run go test ./bundle -update and review the diff):\n%s", path, firstDiff(string(golden), string(got)))
			}
		})
	}
}

// firstDiff describes the first line where want and got differ.
func firstDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := range max(len(w), len(g)) {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			return "line " + strconv.Itoa(i+1) + ":\n\tgolden: " + wl + "\n\tgot:    " + gl
		}
	}
	return "(no line differs)"
}

// TestBuildPosture states the security posture of a sandbox property by
// property, for jobs across the range of limits.
func TestBuildPosture(t *testing.T) {
	t.Setenv("SAFE_RUN_CANARY", "x")
	jobs := []struct {
		name string
		job  sandbox.Job
	}{
		{"default", checkedJob(t, sandbox.Limits{})},
		{"custom", checkedJob(t, customLimits)},
		{"minimum", checkedJob(t, sandbox.MinLimits)},
		{"maximum", checkedJob(t, sandbox.MaxLimits)},
		{"fractional-cpus", checkedJob(t, sandbox.Limits{CPUs: 1.5, Processes: 1000})},
	}
	properties := []struct {
		name  string
		check func(t *testing.T, l sandbox.Limits, spec *specs.Spec)
	}{
		{"root", checkRoot},
		{"user", checkUser},
		{"capabilities", checkCapabilities},
		{"process", checkProcess},
		{"env", checkEnv},
		{"rlimits", checkRlimits},
		{"namespaces", checkNamespaces},
		{"mounts", checkMounts},
		{"workspace", checkWorkspace},
		{"paths", checkPaths},
		{"resources", checkResources},
		{"seccomp", checkSeccomp},
	}
	for _, j := range jobs {
		spec := build(t, j.job, testConfig)
		for _, p := range properties {
			t.Run(j.name+"/"+p.name, func(t *testing.T) {
				p.check(t, j.job.Limits, spec)
			})
		}
	}
}

func checkRoot(t *testing.T, _ sandbox.Limits, spec *specs.Spec) {
	if spec.Root == nil {
		t.Fatal("Root is nil")
	}
	if !spec.Root.Readonly {
		t.Error("Root is writable, want read-only")
	}
	if spec.Root.Path != testConfig.Rootfs {
		t.Errorf("Root.Path = %q, want %q", spec.Root.Path, testConfig.Rootfs)
	}
}

func checkUser(t *testing.T, _ sandbox.Limits, spec *specs.Spec) {
	// The agent runs as root inside gVisor; it starts the program as nobody.
	u := spec.Process.User
	if u.UID != 0 || u.GID != 0 {
		t.Errorf("User = %d:%d, want the agent as 0:0", u.UID, u.GID)
	}
	if len(u.AdditionalGids) > 0 {
		t.Errorf("AdditionalGids = %v, want none", u.AdditionalGids)
	}
	if bundle.UID != 65534 || bundle.GID != 65534 {
		t.Errorf("UID, GID = %d, %d, want 65534, 65534", bundle.UID, bundle.GID)
	}
	args := strings.Join(spec.Process.Args, " ")
	if !strings.Contains(args, "--uid 65534 --gid 65534") {
		t.Errorf("agent args %q do not make it run the program as 65534:65534", args)
	}
}

func checkCapabilities(t *testing.T, _ sandbox.Limits, spec *specs.Spec) {
	c := spec.Process.Capabilities
	// A nil set lets some runtimes apply their defaults; the sets must be
	// given explicitly.
	if c == nil {
		t.Fatal("Capabilities is nil, want every set given")
	}
	want := []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_KILL", "CAP_SETGID", "CAP_SETUID"}
	if !slices.Equal(bundle.AgentCapabilities, want) {
		t.Errorf("AgentCapabilities = %v, want exactly %v", bundle.AgentCapabilities, want)
	}
	for name, set := range map[string][]string{"bounding": c.Bounding, "effective": c.Effective, "permitted": c.Permitted} {
		if !slices.Equal(set, want) {
			t.Errorf("%s capabilities = %v, want the agent's %v", name, set, want)
		}
	}
	// Nothing may pass to the program across its exec.
	for name, set := range map[string][]string{"inheritable": c.Inheritable, "ambient": c.Ambient} {
		if len(set) > 0 {
			t.Errorf("%s capabilities = %v, want none", name, set)
		}
	}
	if !spec.Process.NoNewPrivileges {
		t.Error("NoNewPrivileges = false, want true")
	}
}

func checkProcess(t *testing.T, _ sandbox.Limits, spec *specs.Spec) {
	p := spec.Process
	if p.Cwd != "/workspace" || bundle.Workspace != "/workspace" {
		t.Errorf("Cwd = %q (Workspace %q), want /workspace", p.Cwd, bundle.Workspace)
	}
	if len(p.Args) == 0 || p.Args[0] != bundle.AgentPath {
		t.Errorf("Args = %q, want the agent %q first", p.Args, bundle.AgentPath)
	}
	if p.Terminal {
		t.Error("Terminal = true, want false")
	}
}

func checkEnv(t *testing.T, _ sandbox.Limits, spec *specs.Spec) {
	env := spec.Process.Env
	if os.Getenv("SAFE_RUN_CANARY") != "x" {
		t.Fatal("canary variable is not set in the test process")
	}
	for _, kv := range env {
		if strings.HasPrefix(kv, "SAFE_RUN_CANARY=") {
			t.Errorf("Env contains %q from the host's environment", kv)
		}
		if !slices.Contains(bundle.DefaultEnv, kv) {
			t.Errorf("Env contains %q, which is not in DefaultEnv", kv)
		}
	}
	if !slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "PATH=/") }) {
		t.Errorf("Env = %q, has no PATH", env)
	}
	if !slices.Contains(env, "PYTHONUNBUFFERED=1") {
		t.Errorf("Env = %q, has no PYTHONUNBUFFERED=1", env)
	}
}

func checkRlimits(t *testing.T, l sandbox.Limits, spec *specs.Spec) {
	want := map[string]uint64{
		"RLIMIT_NOFILE": uint64(l.OpenFiles),
		"RLIMIT_NPROC":  uint64(l.Processes),
		"RLIMIT_FSIZE":  uint64(l.FileSizeBytes),
		"RLIMIT_CORE":   0,
	}
	got := map[string]uint64{}
	for _, r := range spec.Process.Rlimits {
		if _, dup := got[r.Type]; dup {
			t.Errorf("%s given twice", r.Type)
		}
		if r.Soft != r.Hard {
			t.Errorf("%s soft %d != hard %d; the program could raise it", r.Type, r.Soft, r.Hard)
		}
		got[r.Type] = r.Hard
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("rlimits = %v, want %v", got, want)
	}
}

func checkNamespaces(t *testing.T, _ sandbox.Limits, spec *specs.Spec) {
	got := map[specs.LinuxNamespaceType]bool{}
	for _, ns := range spec.Linux.Namespaces {
		got[ns.Type] = true
		// A path joins an existing namespace, such as the host's network.
		if ns.Path != "" {
			t.Errorf("%s namespace joins %q, want a new one", ns.Type, ns.Path)
		}
	}
	for _, ns := range []specs.LinuxNamespaceType{
		specs.NetworkNamespace, specs.PIDNamespace, specs.IPCNamespace, specs.UTSNamespace, specs.MountNamespace,
	} {
		if !got[ns] {
			t.Errorf("no %s namespace", ns)
		}
	}
	// gVisor running rootless needs no user namespace in the bundle, and
	// gVisor has no cgroup namespace to give.
	for _, ns := range []specs.LinuxNamespaceType{specs.UserNamespace, specs.CgroupNamespace} {
		if got[ns] {
			t.Errorf("%s namespace present, want none", ns)
		}
	}
}

// mount returns the mount at dest, or stops the test.
func mount(t *testing.T, spec *specs.Spec, dest string) specs.Mount {
	t.Helper()
	var found []specs.Mount
	for _, m := range spec.Mounts {
		if m.Destination == dest {
			found = append(found, m)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d mounts at %s, want 1", len(found), dest)
	}
	return found[0]
}

func checkMounts(t *testing.T, l sandbox.Limits, spec *specs.Spec) {
	for _, tt := range []struct {
		dest, typ string
		options   []string
	}{
		{"/workspace", "tmpfs", []string{"size=" + strconv.FormatInt(l.WorkspaceBytes, 10)}},
		{"/tmp", "tmpfs", []string{"size=" + strconv.FormatInt(l.TmpBytes, 10)}},
		{"/proc", "proc", []string{"noexec"}},
		{"/dev/shm", "tmpfs", []string{"noexec"}},
		{"/dev/net", "tmpfs", []string{"ro", "nodev"}},
		{"/sys", "sysfs", []string{"ro"}},
		{bundle.AgentPath, "bind", []string{"ro"}},
	} {
		m := mount(t, spec, tt.dest)
		if m.Type != tt.typ {
			t.Errorf("%s is of type %q, want %q", tt.dest, m.Type, tt.typ)
		}
		for _, o := range tt.options {
			if !slices.Contains(m.Options, o) {
				t.Errorf("%s options %q lack %q", tt.dest, m.Options, o)
			}
		}
	}
	if m := mount(t, spec, bundle.AgentPath); m.Source != testConfig.Agent {
		t.Errorf("agent mounted from %q, want %q", m.Source, testConfig.Agent)
	}
	for _, m := range spec.Mounts {
		bind := m.Type == "bind" || slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rbind")
		if bind && m.Destination != bundle.AgentPath {
			t.Errorf("bind mount of host %q at %s; only the agent may come from the host", m.Source, m.Destination)
		}
		if !slices.Contains(m.Options, "nosuid") {
			t.Errorf("%s options %q lack nosuid", m.Destination, m.Options)
		}
	}
}

// checkWorkspace checks that the workspace belongs to the program's user.
func checkWorkspace(t *testing.T, _ sandbox.Limits, spec *specs.Spec) {
	m := mount(t, spec, "/workspace")
	if want := "uid=" + strconv.Itoa(bundle.UID); !slices.Contains(m.Options, want) {
		t.Errorf("/workspace options %q lack %q", m.Options, want)
	}
}

func checkPaths(t *testing.T, _ sandbox.Limits, spec *specs.Spec) {
	for _, p := range []string{"/proc/kcore", "/proc/keys"} {
		if !slices.Contains(spec.Linux.MaskedPaths, p) {
			t.Errorf("MaskedPaths = %q, lack %s", spec.Linux.MaskedPaths, p)
		}
	}
	for _, p := range []string{"/proc/sys", "/proc/sysrq-trigger"} {
		if !slices.Contains(spec.Linux.ReadonlyPaths, p) {
			t.Errorf("ReadonlyPaths = %q, lack %s", spec.Linux.ReadonlyPaths, p)
		}
	}
}

func checkResources(t *testing.T, l sandbox.Limits, spec *specs.Spec) {
	r := spec.Linux.Resources
	if r == nil || r.Memory == nil || r.Memory.Limit == nil || r.Memory.Swap == nil || r.Pids == nil || r.CPU == nil ||
		r.CPU.Quota == nil || r.CPU.Period == nil {
		t.Fatalf("Resources incomplete: %+v", r)
	}
	if want := l.MemoryBytes + bundle.MemoryHeadroom; *r.Memory.Limit != want {
		t.Errorf("memory limit = %d, want %d (job) + %d (headroom)", *r.Memory.Limit, l.MemoryBytes, bundle.MemoryHeadroom)
	}
	if *r.Memory.Swap != *r.Memory.Limit {
		t.Errorf("memory+swap limit = %d, want %d (no swap)", *r.Memory.Swap, *r.Memory.Limit)
	}
	if *r.Pids.Limit < bundle.HostPidsFloor || *r.Pids.Limit < int64(l.Processes) {
		t.Errorf("pids limit = %d, want at least %d and at least the job's %d processes", *r.Pids.Limit, bundle.HostPidsFloor, l.Processes)
	}
	if *r.CPU.Period == 0 {
		t.Fatal("CPU period is 0")
	}
	// One microsecond of quota per period is the precision available.
	got := float64(*r.CPU.Quota) / float64(*r.CPU.Period)
	if math.Abs(got-l.CPUs) > 1/float64(*r.CPU.Period) {
		t.Errorf("CPU quota/period = %d/%d = %g, want %g", *r.CPU.Quota, *r.CPU.Period, got, l.CPUs)
	}
}

func checkSeccomp(t *testing.T, _ sandbox.Limits, spec *specs.Spec) {
	s := spec.Linux.Seccomp
	if s == nil {
		t.Fatal("Seccomp is nil")
	}
	if s.DefaultAction != specs.ActErrno || len(s.Syscalls) == 0 {
		t.Errorf("Seccomp default %q with %d rules, want %q and rules", s.DefaultAction, len(s.Syscalls), specs.ActErrno)
	}
}

func TestBuildEnv(t *testing.T) {
	job := checkedJob(t, sandbox.Limits{})
	for _, tt := range []struct {
		name  string
		env   []string
		image []string
		want  []string
	}{
		{"default", nil, nil, bundle.DefaultEnv},
		{"replaced", []string{"PATH=/bin", "A=b"}, nil, []string{"PATH=/bin", "A=b"}},
		{"image over replaced", []string{"PATH=/bin", "A=b"}, []string{"A=c", "HOME=/root", "TMPDIR=/var/tmp", "B=d=e", "novalue", "=x"},
			[]string{"PATH=/bin", "A=c", "B=d=e"}},
		{"image over default", nil, []string{"PATH=/opt/conda/bin:/usr/bin"},
			append([]string{"PATH=/opt/conda/bin:/usr/bin"}, bundle.DefaultEnv[1:]...)},
		{"last of the image wins, in the first one's place", []string{"A=1"}, []string{"B=1", "A=2", "B=2", "A=3"},
			[]string{"A=3", "B=2"}},
		{"first of the base replaced, later ones kept", []string{"A=1", "X", "A=2"}, []string{"A=3", "X=4"},
			[]string{"A=3", "X", "A=2", "X=4"}},
		{"names are whole", []string{"AB=1", "A=2"}, []string{"A=3", "A_B=4"},
			[]string{"AB=1", "A=3", "A_B=4"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig
			cfg.Env, cfg.ImageEnv = tt.env, tt.image
			spec := build(t, job, cfg)
			if !slices.Equal(spec.Process.Env, tt.want) {
				t.Errorf("Env = %q, want %q", spec.Process.Env, tt.want)
			}
		})
	}
}

func TestBuildErrors(t *testing.T) {
	good := checkedJob(t, sandbox.Limits{}).Limits
	with := func(change func(*sandbox.Limits)) sandbox.Limits {
		l := good
		change(&l)
		return l
	}
	for _, tt := range []struct {
		name   string
		cfg    bundle.Config
		limits sandbox.Limits
	}{
		{"relative rootfs", bundle.Config{Rootfs: "images/test/rootfs", Agent: testConfig.Agent}, good},
		{"empty rootfs", bundle.Config{Agent: testConfig.Agent}, good},
		{"relative agent", bundle.Config{Rootfs: testConfig.Rootfs, Agent: "safe-run-agent"}, good},
		{"empty agent", bundle.Config{Rootfs: testConfig.Rootfs}, good},
		{"zero limits", testConfig, sandbox.Limits{}},
		{"zero memory", testConfig, with(func(l *sandbox.Limits) { l.MemoryBytes = 0 })},
		{"negative memory", testConfig, with(func(l *sandbox.Limits) { l.MemoryBytes = -1 })},
		{"zero processes", testConfig, with(func(l *sandbox.Limits) { l.Processes = 0 })},
		{"zero cpus", testConfig, with(func(l *sandbox.Limits) { l.CPUs = 0 })},
		{"zero workspace", testConfig, with(func(l *sandbox.Limits) { l.WorkspaceBytes = 0 })},
		{"zero tmp", testConfig, with(func(l *sandbox.Limits) { l.TmpBytes = 0 })},
		// RLIMIT_NOFILE and RLIMIT_FSIZE come from these: zero would stop
		// every open or write, and -1 would become RLIM_INFINITY.
		{"zero open files", testConfig, with(func(l *sandbox.Limits) { l.OpenFiles = 0 })},
		{"negative open files", testConfig, with(func(l *sandbox.Limits) { l.OpenFiles = -1 })},
		{"zero file size", testConfig, with(func(l *sandbox.Limits) { l.FileSizeBytes = 0 })},
		{"negative file size", testConfig, with(func(l *sandbox.Limits) { l.FileSizeBytes = -1 })},
	} {
		t.Run(tt.name, func(t *testing.T) {
			spec, err := bundle.Build(sandbox.Job{Language: "python", Code: "print(1)", Limits: tt.limits}, tt.cfg)
			if err == nil {
				t.Fatalf("Build succeeded, want an error; rlimits: %+v", spec.Process.Rlimits)
			}
			if spec != nil {
				t.Error("Build returned a spec with its error")
			}
		})
	}
}

func TestMountpoints(t *testing.T) {
	dirs, files := bundle.Mountpoints()
	wantDirs := []string{"/proc", "/dev", "/dev/pts", "/dev/shm", "/dev/mqueue", "/dev/net", "/sys", "/workspace", "/tmp"}
	if !slices.Equal(dirs, wantDirs) {
		t.Errorf("dirs = %q, want %q", dirs, wantDirs)
	}
	if want := []string{bundle.AgentPath}; !slices.Equal(files, want) {
		t.Errorf("files = %q, want %q", files, want)
	}
	// Every mount of a real bundle is over a listed path, of the right kind,
	// since the read-only root cannot gain one at run time.
	for _, name := range []string{"default", "custom"} {
		t.Run(name, func(t *testing.T) {
			limits := sandbox.Limits{}
			if name == "custom" {
				limits = customLimits
			}
			spec := build(t, checkedJob(t, limits), testConfig)
			for _, m := range spec.Mounts {
				list, kind := dirs, "directory"
				if m.Type == "bind" {
					list, kind = files, "file"
				}
				if !slices.Contains(list, m.Destination) {
					t.Errorf("mount at %s (%s) is not a listed %s mountpoint", m.Destination, m.Type, kind)
				}
			}
			if len(spec.Mounts) != len(dirs)+len(files) {
				t.Errorf("%d mounts, %d mountpoints listed", len(spec.Mounts), len(dirs)+len(files))
			}
		})
	}
}

func TestWrite(t *testing.T) {
	spec := build(t, checkedJob(t, customLimits), testConfig)
	for _, tt := range []struct {
		name string
		dir  func(t *testing.T) string
	}{
		{"existing dir", func(t *testing.T) string { return t.TempDir() }},
		{"new dirs", func(t *testing.T) string { return filepath.Join(t.TempDir(), "a", "b") }},
		{"overwrite", func(t *testing.T) string {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"ociVersion": "old", "hostname": "stale"}`), 0o600); err != nil {
				t.Fatal(err)
			}
			return dir
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := tt.dir(t)
			if err := bundle.Write(dir, spec); err != nil {
				t.Fatalf("Write: %v", err)
			}
			path := filepath.Join(dir, "config.json")
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if mode := fi.Mode(); mode != 0o600 {
				t.Errorf("config.json mode = %v, want -rw-------", mode)
			}
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			var got specs.Spec
			if err := json.Unmarshal(data, &got); err != nil {
				t.Fatalf("config.json does not parse: %v", err)
			}
			if !reflect.DeepEqual(&got, spec) {
				t.Error("config.json read back differs from the spec written")
			}
		})
	}
}

func TestWriteNewDirMode(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "bundle")
	if err := bundle.Write(dir, build(t, checkedJob(t, sandbox.Limits{}), testConfig)); err != nil {
		t.Fatalf("Write: %v", err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm != 0o700 {
		t.Errorf("bundle directory mode = %v, want drwx------", fi.Mode())
	}
}

func TestWriteError(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	spec := build(t, checkedJob(t, sandbox.Limits{}), testConfig)
	for _, dir := range []string{file, filepath.Join(file, "sub")} {
		if err := bundle.Write(dir, spec); err == nil {
			t.Errorf("Write(%q) succeeded, want an error: the path is a file", dir)
		}
	}
}

func TestKeepAliveAgentServesManyRequests(t *testing.T) {
	job, _, err := sandbox.Policy{}.Check(sandbox.Job{Language: "python", Code: "1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, keep := range []bool{false, true} {
		cfg := testConfig
		cfg.KeepAlive = keep
		spec, err := bundle.Build(job, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if oneShot := slices.Contains(spec.Process.Args, "--one-shot"); oneShot == keep {
			t.Errorf("KeepAlive %v: agent args %v", keep, spec.Process.Args)
		}
	}
}

func TestWorkdir(t *testing.T) {
	for dir, want := range map[string]string{
		"":                  bundle.Workspace,
		"/":                 bundle.Workspace,
		"relative":          bundle.Workspace,
		"/usr":              bundle.Workspace,
		"/usr/local":        bundle.Workspace,
		"/tmp":              bundle.Workspace,
		"/tmp/work":         bundle.Workspace,
		"/dev":              bundle.Workspace,
		"/proc/self":        bundle.Workspace,
		"/.safe-run":        bundle.Workspace,
		"/srv/app":          "/srv/app",
		"/usr/src/app/":     "/usr/src/app",
		"/home/jovyan":      "/home/jovyan",
		"/workspace":        "/workspace",
		"/srv/../data/work": "/data/work",
	} {
		if got := bundle.Workdir(dir); got != want {
			t.Errorf("Workdir(%q) = %q, want %q", dir, got, want)
		}
	}
}

// TestBuildWorkingDir checks that the workspace, the agent's directory and
// the process's directory all move to an image's WORKDIR together.
func TestBuildWorkingDir(t *testing.T) {
	cfg := testConfig
	cfg.WorkingDir = "/srv/app"
	spec := build(t, checkedJob(t, sandbox.Limits{}), cfg)
	if spec.Process.Cwd != "/srv/app" {
		t.Errorf("Cwd = %q", spec.Process.Cwd)
	}
	if i := slices.Index(spec.Process.Args, "--workdir"); i < 0 || spec.Process.Args[i+1] != "/srv/app" {
		t.Errorf("agent args %q, want --workdir /srv/app", spec.Process.Args)
	}
	var found bool
	for _, m := range spec.Mounts {
		if m.Destination == bundle.Workspace {
			t.Errorf("the workspace is still mounted at %s", bundle.Workspace)
		}
		if m.Destination == "/srv/app" && m.Type == "tmpfs" && slices.Contains(m.Options, "uid=65534") {
			found = true
		}
	}
	if !found {
		t.Errorf("no workspace tmpfs at /srv/app: %+v", spec.Mounts)
	}
}
