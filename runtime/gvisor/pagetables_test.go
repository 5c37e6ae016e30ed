package gvisor

import (
	"testing"
	"time"

	"github.com/safe-run/safe-run/bundle"
	"github.com/safe-run/safe-run/sandbox"
)

// TestPageTablesCountTowardMemory touches one byte per GiB of a 48 TiB
// sparse mapping: 192 MiB of memory, under the 256 MiB limit, but the
// systrap stubs that mirror the program's address space hold about twice
// that in host page tables. The run must end out of memory — by the cgroup
// as root, by the memory watch (which adds the page tables) without one —
// where it used to end ok with 485 MiB of page tables nobody counted.
func TestPageTablesCountTowardMemory(t *testing.T) {
	rt := newTestRuntime(t, sandbox.Policy{})
	res := mustRun(t, rt, sandbox.Job{Language: "python", Code: `
import mmap
GiB = 1 << 30
size = 48 * 1024 * GiB
m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x4000)  # MAP_NORESERVE
for i, off in enumerate(range(0, size, GiB)):
    m[off] = 1
    if i % 8192 == 0:
        print(i, "GiB touched", flush=True)
print("touched all", flush=True)`,
		Limits: sandbox.Limits{MemoryBytes: 256 * sandbox.MiB, Timeout: 120 * time.Second}})
	wantStatus(t, res, sandbox.StatusOOM)
	if limit := int64(256*sandbox.MiB) + bundle.MemoryHeadroom; res.MemoryPeakBytes < limit*3/4 {
		t.Errorf("memory peak %d MiB, want near the %d MiB the sandbox may use", res.MemoryPeakBytes>>20, limit>>20)
	}
	t.Logf("out of memory after %q; peak %.1f MiB", lastLine([]byte(res.Stdout)), float64(res.MemoryPeakBytes)/(1<<20))
	assertNothingLeft(t, rt, []string{res.SandboxID})
}
