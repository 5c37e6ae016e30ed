package gvisor

import (
	"log/slog"
	"path/filepath"
	"testing"
)

// TestDestroyTwice: destroying a sandbox twice is harmless, and counts it
// gone once (it used to panic: negative WaitGroup counter).
func TestDestroyTwice(t *testing.T) {
	g := &Backend{cfg: Config{StateDir: t.TempDir()}, log: slog.Default()}
	p := &sandboxProc{g: g, id: "safe-run-destroy-twice", log: g.log, mark: func(string) {}}
	p.dir = filepath.Join(g.cfg.StateDir, p.id)
	g.live.Add(1)
	g.liveN.Add(1)
	for i := range 2 {
		if err := p.Destroy(); err != nil {
			t.Errorf("destroy %d: %v", i+1, err)
		}
	}
	if n := g.Live(); n != 0 {
		t.Errorf("%d live sandboxes after destroying the only one, want 0", n)
	}
}
