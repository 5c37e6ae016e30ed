package sandbox

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Byte sizes used by limits.
const (
	KiB int64 = 1 << 10
	MiB int64 = 1 << 20
	GiB int64 = 1 << 30
)

// Limits bound one run. A zero field means "the policy's default".
type Limits struct {
	// Timeout is the wall-clock limit of the program, start-up excluded.
	Timeout time.Duration `json:"timeout"`
	// MemoryBytes caps the memory of everything in the sandbox (processes,
	// tmpfs contents). The host adds headroom for gVisor itself.
	MemoryBytes int64 `json:"memory_bytes"`
	// Processes caps processes and threads inside (RLIMIT_NPROC).
	Processes int `json:"processes"`
	// CPUs caps CPU time as a number of cores, e.g. 1.5.
	CPUs float64 `json:"cpus"`
	// OutputBytes caps what is kept of stdout and of stderr, each.
	OutputBytes int64 `json:"output_bytes"`
	// WorkspaceBytes is the size of the /workspace tmpfs.
	WorkspaceBytes int64 `json:"workspace_bytes"`
	// TmpBytes is the size of the /tmp tmpfs.
	TmpBytes int64 `json:"tmp_bytes"`
	// FileSizeBytes caps any single file the program writes (RLIMIT_FSIZE).
	FileSizeBytes int64 `json:"file_size_bytes"`
	// OpenFiles caps open file descriptors per process (RLIMIT_NOFILE).
	OpenFiles int `json:"open_files"`
}

// DefaultLimits are the limits of a run that asks for nothing.
var DefaultLimits = Limits{
	Timeout:        30 * time.Second,
	MemoryBytes:    512 * MiB,
	Processes:      128,
	CPUs:           1,
	OutputBytes:    1 * MiB,
	WorkspaceBytes: 256 * MiB,
	TmpBytes:       256 * MiB,
	FileSizeBytes:  256 * MiB,
	OpenFiles:      1024,
}

// MaxLimits are the largest limits a job may ask for by default.
var MaxLimits = Limits{
	Timeout:        1 * time.Hour,
	MemoryBytes:    16 * GiB,
	Processes:      4096,
	CPUs:           64,
	OutputBytes:    64 * MiB,
	WorkspaceBytes: 8 * GiB,
	TmpBytes:       8 * GiB,
	FileSizeBytes:  8 * GiB,
	OpenFiles:      65536,
}

// TimeoutCeiling is the longest timeout any policy may allow, however it
// is configured: a sandbox is for a task, not a service, and a timeout
// nobody would wait for is no bound.
const TimeoutCeiling = 24 * time.Hour

// MinLimits are the smallest limits with which a run can still start: below
// them the interpreter itself would fail, and the user would be misled.
var MinLimits = Limits{
	Timeout:        10 * time.Millisecond,
	MemoryBytes:    64 * MiB,
	Processes:      8,
	CPUs:           0.05,
	OutputBytes:    1 * KiB,
	WorkspaceBytes: 1 * MiB,
	TmpBytes:       1 * MiB,
	FileSizeBytes:  1 * MiB,
	OpenFiles:      64,
}

// withDefaults returns l with every zero field taken from def.
func (l Limits) withDefaults(def Limits) Limits {
	if l.Timeout == 0 {
		l.Timeout = def.Timeout
	}
	if l.MemoryBytes == 0 {
		l.MemoryBytes = def.MemoryBytes
	}
	if l.Processes == 0 {
		l.Processes = def.Processes
	}
	if l.CPUs == 0 {
		l.CPUs = def.CPUs
	}
	if l.OutputBytes == 0 {
		l.OutputBytes = def.OutputBytes
	}
	if l.WorkspaceBytes == 0 {
		l.WorkspaceBytes = def.WorkspaceBytes
	}
	if l.TmpBytes == 0 {
		l.TmpBytes = def.TmpBytes
	}
	if l.FileSizeBytes == 0 {
		l.FileSizeBytes = def.FileSizeBytes
	}
	if l.OpenFiles == 0 {
		l.OpenFiles = def.OpenFiles
	}
	return l
}

// check reports the first limit of l outside [lo, hi], naming it by the
// field names callers use (see InputError.Field).
func (l Limits) check(lo, hi Limits) error {
	type bound struct {
		field     string
		v, lo, hi float64
		show      func(float64) string
	}
	dur := func(f float64) string { return time.Duration(f).String() }
	size := func(f float64) string { return FormatBytes(int64(f)) }
	num := func(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }
	for _, b := range []bound{
		{"timeout", float64(l.Timeout), float64(lo.Timeout), float64(hi.Timeout), dur},
		{"memory", float64(l.MemoryBytes), float64(lo.MemoryBytes), float64(hi.MemoryBytes), size},
		{"processes", float64(l.Processes), float64(lo.Processes), float64(hi.Processes), num},
		{"cpus", l.CPUs, lo.CPUs, hi.CPUs, num},
		{"output", float64(l.OutputBytes), float64(lo.OutputBytes), float64(hi.OutputBytes), size},
		{"workspace", float64(l.WorkspaceBytes), float64(lo.WorkspaceBytes), float64(hi.WorkspaceBytes), size},
		{"tmp", float64(l.TmpBytes), float64(lo.TmpBytes), float64(hi.TmpBytes), size},
		{"file_size", float64(l.FileSizeBytes), float64(lo.FileSizeBytes), float64(hi.FileSizeBytes), size},
		{"open_files", float64(l.OpenFiles), float64(lo.OpenFiles), float64(hi.OpenFiles), num},
	} {
		if math.IsNaN(b.v) || b.v < b.lo || b.v > b.hi {
			return &InputError{Field: b.field, Msg: fmt.Sprintf("%s is out of range; use a value from %s to %s",
				b.show(b.v), b.show(b.lo), b.show(b.hi))}
		}
	}
	return nil
}

// units maps size suffixes to multipliers. Single letters are binary, as in
// Docker's `--memory 512m`.
var units = map[string]int64{
	"": 1, "b": 1,
	"k": KiB, "kib": KiB, "kb": 1000,
	"m": MiB, "mib": MiB, "mb": 1000 * 1000,
	"g": GiB, "gib": GiB, "gb": 1000 * 1000 * 1000,
	"t": 1 << 40, "tib": 1 << 40, "tb": 1000 * 1000 * 1000 * 1000,
}

// ParseBytes parses a size such as "512MiB", "1g", "1.5GiB" or "1048576".
func ParseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := strings.IndexFunc(t, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	num, unit := t, ""
	if i >= 0 {
		num, unit = t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	}
	mult, ok := units[unit]
	if num == "" || !ok {
		return 0, fmt.Errorf("invalid size %q; write a number with an optional unit, e.g. 512MiB or 2GiB", s)
	}
	if !strings.Contains(num, ".") {
		// Whole numbers are exact, up to the largest int64.
		n, err := strconv.ParseInt(num, 10, 64)
		if err != nil || n > math.MaxInt64/mult {
			return 0, fmt.Errorf("size %q is too large", s)
		}
		return n * mult, nil
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, fmt.Errorf("invalid size %q; write a number with an optional unit, e.g. 512MiB or 2GiB", s)
	}
	v := f * float64(mult)
	if v >= math.MaxInt64 {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return int64(v), nil
}

// FormatBytes renders n in the largest binary unit it reaches, with at most
// two decimals: 536870912 → "512MiB", 1610612736 → "1.5GiB".
func FormatBytes(n int64) string {
	for _, u := range []struct {
		size int64
		name string
	}{{GiB, "GiB"}, {MiB, "MiB"}, {KiB, "KiB"}} {
		if n >= u.size {
			f := math.Round(float64(n)/float64(u.size)*100) / 100
			return strconv.FormatFloat(f, 'f', -1, 64) + u.name
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}
