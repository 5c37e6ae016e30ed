package gvisor

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// TestCgroupUsage reads a run's OOM kills and peak memory from fake cgroup
// directories laid out as v2 and v1 kernels lay them out, so that the v2
// path (which this host, hybrid v1, cannot exercise live) is covered too.
func TestCgroupUsage(t *testing.T) {
	const v2Events = "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n"
	const v1Control = "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n"
	for _, tc := range []struct {
		name      string
		v2        bool
		files     map[string]string
		wantKills uint64
		wantPeak  int64
		wantErr   bool
	}{
		{name: "v2", v2: true, files: map[string]string{"memory.events": v2Events, "memory.peak": "73400320\n"},
			wantKills: 2, wantPeak: 73400320},
		{name: "v2 no kills", v2: true, files: map[string]string{"memory.events": "low 0\noom 0\noom_kill 0\n", "memory.peak": "1024\n"},
			wantKills: 0, wantPeak: 1024},
		// Linux before 5.19 has no memory.peak: the count still decides.
		{name: "v2 without memory.peak", v2: true, files: map[string]string{"memory.events": v2Events}, wantKills: 2},
		{name: "v2 without memory.events", v2: true, files: map[string]string{"memory.peak": "1\n"}, wantErr: true},
		{name: "v2 events without oom_kill", v2: true, files: map[string]string{"memory.events": "oom 1\n"}, wantErr: true},
		{name: "v1", files: map[string]string{"memory.oom_control": v1Control, "memory.max_usage_in_bytes": "52428800\n"},
			wantKills: 1, wantPeak: 52428800},
		{name: "v1 garbled count", files: map[string]string{"memory.oom_control": "oom_kill x\n"}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, data := range tc.files {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			cg := &runCgroup{paths: map[string]string{"memory": dir, "pids": t.TempDir()}}
			if tc.v2 {
				cg.paths = map[string]string{"": dir}
			}
			kills, peak, err := cg.usage()
			if (err != nil) != tc.wantErr {
				t.Fatalf("usage: err %v, want error %v", err, tc.wantErr)
			}
			if kills != tc.wantKills || peak != tc.wantPeak {
				t.Errorf("usage: %d OOM kills, peak %d; want %d, %d", kills, peak, tc.wantKills, tc.wantPeak)
			}
		})
	}
}

// TestCgroupMemoryNow reads the memory in use from v2's memory.current and
// v1's memory.usage_in_bytes.
func TestCgroupMemoryNow(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		v2         bool
	}{{"v2", "memory.current", true}, {"v1", "memory.usage_in_bytes", false}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, tc.file), []byte("31457280\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			cg := &runCgroup{paths: map[string]string{"memory": dir}}
			if tc.v2 {
				cg.paths = map[string]string{"": dir}
			}
			if n, err := cg.memoryUsage(); err != nil || n != 31457280 {
				t.Errorf("memoryUsage = %d, %v; want 31457280", n, err)
			}
		})
	}
	if _, err := (&runCgroup{}).memoryUsage(); err == nil {
		t.Error("memoryUsage without a cgroup: no error")
	}
}

// TestCgroupBackground: a refill's cgroup gets the lowest CPU weight, and
// the default one back when a run takes it (v1 cpu.shares, v2 cpu.weight).
func TestCgroupBackground(t *testing.T) {
	for _, tc := range []struct {
		name, file, low, normal string
		v2                      bool
	}{{"v2", "cpu.weight", "1", "100", true}, {"v1", "cpu.shares", "2", "1024", false}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cg := &runCgroup{paths: map[string]string{"cpu": dir, "memory": t.TempDir()}}
			if tc.v2 {
				cg.paths = map[string]string{"": dir}
			}
			for _, step := range []struct {
				background bool
				want       string
			}{{true, tc.low}, {false, tc.normal}} {
				if err := cg.setBackground(step.background); err != nil {
					t.Fatal(err)
				}
				if data, _ := os.ReadFile(filepath.Join(dir, tc.file)); string(data) != step.want {
					t.Errorf("background %v: %s = %q, want %q", step.background, tc.file, data, step.want)
				}
			}
		})
	}
	if err := (&runCgroup{}).setBackground(true); err != nil {
		t.Errorf("without a cgroup: %v", err)
	}
}

// hostCgroups returns where this host puts runs' cgroups, skipping tb
// unless it runs as root on a host where they can be created.
func hostCgroups(tb testing.TB) CgroupLayout {
	tb.Helper()
	if !HostRoot() {
		tb.Skip("needs root to create a cgroup")
	}
	layout, err := DetectCgroups()
	if err != nil {
		tb.Skip(err)
	}
	return layout
}

// BenchmarkCgroupUsage compares the end-of-run usage read through the
// cgroup manager's GetStats (as it was) with the two files read directly,
// on a real cgroup of this host (root only).
func BenchmarkCgroupUsage(b *testing.B) {
	layout := hostCgroups(b)
	limit := int64(256 << 20)
	cg, err := newRunCgroup(layout, "safe-run-bench-usage", &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit}})
	if err != nil {
		b.Fatal(err)
	}
	defer cg.destroy()
	b.Run("GetStats", func(b *testing.B) {
		for b.Loop() {
			if _, err := cg.mgr.OOMKillCount(); err != nil {
				b.Fatal(err)
			}
			if _, err := cg.mgr.GetStats(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("direct", func(b *testing.B) {
		for b.Loop() {
			if _, _, err := cg.usage(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestCgroupCPUUsed reads the CPU a run used from v2's cpu.stat
// (microseconds) and v1's cpuacct.usage (nanoseconds).
func TestCgroupCPUUsed(t *testing.T) {
	for _, tc := range []struct {
		name, file, data string
		v2, wantErr      bool
	}{
		{name: "v2", file: "cpu.stat", data: "usage_usec 231500\nuser_usec 150000\nsystem_usec 81500\n", v2: true},
		{name: "v2 without usage_usec", file: "cpu.stat", data: "user_usec 1\n", v2: true, wantErr: true},
		{name: "v1", file: "cpuacct.usage", data: "231500000\n"},
		{name: "v1 garbled", file: "cpuacct.usage", data: "x\n", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, tc.file), []byte(tc.data), 0o600); err != nil {
				t.Fatal(err)
			}
			cg := &runCgroup{paths: map[string]string{"cpuacct": dir, "memory": t.TempDir()}}
			if tc.v2 {
				cg.paths = map[string]string{"": dir}
			}
			d, err := cg.cpuUsed()
			if (err != nil) != tc.wantErr {
				t.Fatalf("cpuUsed: err %v, want error %v", err, tc.wantErr)
			}
			if !tc.wantErr && d != 231500*time.Microsecond {
				t.Errorf("cpuUsed = %v, want 231.5ms", d)
			}
		})
	}
	if _, err := (&runCgroup{}).cpuUsed(); err == nil {
		t.Error("cpuUsed without a cgroup: no error")
	}
}

// TestCgroupLimitCPU: the CPU limit held back at creation is written once,
// in each kernel's format (v2 cpu.max, v1 the CFS period and quota).
func TestCgroupLimitCPU(t *testing.T) {
	quota, unlimited, period := int64(50000), int64(-1), uint64(100000)
	for _, tc := range []struct {
		name string
		v2   bool
		cpu  *specs.LinuxCPU
		want map[string]string // file: content; "" for a file not written
	}{
		{"v2", true, &specs.LinuxCPU{Quota: &quota, Period: &period}, map[string]string{"cpu.max": "50000 100000"}},
		{"v2 unlimited", true, &specs.LinuxCPU{Quota: &unlimited, Period: &period}, map[string]string{"cpu.max": "max 100000"}},
		{"v2 quota only", true, &specs.LinuxCPU{Quota: &quota}, map[string]string{"cpu.max": "50000"}},
		{"v2 none held", true, nil, map[string]string{"cpu.max": ""}},
		{"v2 empty", true, &specs.LinuxCPU{}, map[string]string{"cpu.max": ""}},
		{"v1", false, &specs.LinuxCPU{Quota: &quota, Period: &period},
			map[string]string{"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "50000"}},
		{"v1 quota only", false, &specs.LinuxCPU{Quota: &quota},
			map[string]string{"cpu.cfs_period_us": "", "cpu.cfs_quota_us": "50000"}},
		{"v1 none held", false, nil, map[string]string{"cpu.cfs_period_us": "", "cpu.cfs_quota_us": ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cg := &runCgroup{paths: map[string]string{"cpu": dir, "memory": t.TempDir()}, heldCPU: tc.cpu}
			if tc.v2 {
				cg.paths = map[string]string{"": dir}
			}
			if err := cg.limitCPU(); err != nil {
				t.Fatal(err)
			}
			for file, want := range tc.want {
				data, err := os.ReadFile(filepath.Join(dir, file))
				if want == "" {
					if err == nil {
						t.Errorf("%s written (%q), want it left alone", file, data)
					}
					continue
				}
				if string(data) != want {
					t.Errorf("%s = %q (%v), want %q", file, data, err, want)
				}
				_ = os.Remove(filepath.Join(dir, file))
			}
			// Once: a second call writes nothing.
			if err := cg.limitCPU(); err != nil {
				t.Fatal(err)
			}
			for file := range tc.want {
				if data, err := os.ReadFile(filepath.Join(dir, file)); err == nil {
					t.Errorf("second call wrote %s = %q", file, data)
				}
			}
		})
	}
	if err := (&runCgroup{}).limitCPU(); err != nil {
		t.Errorf("without a cgroup: %v", err)
	}
}

// TestCgroupHoldCPU creates a real run cgroup on this host (root only): its
// other limits are in place at once, its CPU quota only after limitCPU.
func TestCgroupHoldCPU(t *testing.T) {
	layout := hostCgroups(t)
	memory, quota, period := int64(256<<20), int64(50000), uint64(100000)
	res := &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &memory}, CPU: &specs.LinuxCPU{Quota: &quota, Period: &period}}
	cg, err := newRunCgroup(layout, "safe-run-test-cpu-"+strconv.Itoa(os.Getpid()), res)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := cg.destroy(); err != nil {
			t.Error(err)
		}
	}()
	// read returns the first field of a file of the cgroup (v2 name, v1 name).
	read := func(v2, v1 string) string {
		t.Helper()
		path := filepath.Join(cg.paths["cpu"], v1)
		if dir := cg.paths[""]; dir != "" {
			path = filepath.Join(dir, v2)
		} else if v1 == "memory.limit_in_bytes" {
			path = filepath.Join(cg.paths["memory"], v1)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Fields(string(data))[0]
	}
	if got := read("memory.max", "memory.limit_in_bytes"); got != strconv.FormatInt(memory, 10) {
		t.Errorf("memory limit %s at creation, want %d", got, memory)
	}
	if got := read("cpu.max", "cpu.cfs_quota_us"); got != "max" && got != "-1" {
		t.Errorf("CPU quota %s at creation, want none", got)
	}
	if err := cg.limitCPU(); err != nil {
		t.Fatal(err)
	}
	if got := read("cpu.max", "cpu.cfs_quota_us"); got != strconv.FormatInt(quota, 10) {
		t.Errorf("CPU quota %s after limitCPU, want %d", got, quota)
	}
}
