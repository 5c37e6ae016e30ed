package gvisor

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
)

// TestReapSparesRunsBeingCreated: a safe-run process that starts (and so
// reaps the state directory) while another creates a run directory must
// not take that directory for a dead process's leftover. It used to: the
// directory exists unlocked between its creation and its lock, and the
// reaper removed it or held its lock, failing the other's run ("lock run
// directory: no such file or directory", "resource temporarily
// unavailable"), as the benchmark's concurrent cold runs showed.
func TestReapSparesRunsBeingCreated(t *testing.T) {
	stateDir := t.TempDir()
	reaper := &Backend{cfg: Config{StateDir: stateDir}, log: slog.New(slog.DiscardHandler)}
	const runs = 400
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if reaped, err := reaper.reapStale(); err != nil || len(reaped) > 0 {
				t.Errorf("reaped %v (err %v) while every run directory belonged to a live run", reaped, err)
			}
		}
	}()
	for i := range runs {
		dir := filepath.Join(stateDir, fmt.Sprintf("safe-run-%d", i))
		lock, err := createRunDir(dir)
		if err != nil {
			t.Errorf("run %d: %v", i, err)
			continue
		}
		if err := removeRunDir(reaper, dir, filepath.Base(dir)); err != nil {
			t.Errorf("run %d: %v", i, err)
		}
		lock.Close()
	}
	close(stop)
	wg.Wait()
}
