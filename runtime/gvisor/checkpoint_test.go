package gvisor

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestPruneCheckpoints checks which images a build removes: half-written
// ones older than an hour and complete ones unused for a week, nothing else.
func TestPruneCheckpoints(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		age  time.Duration
		kept bool
	}{
		{"python-aaaa" + partialSuffix + "1", 2 * time.Hour, false},
		{"python-aaaa" + partialSuffix + "2", time.Minute, true},
		{"python-bbbb", 8 * 24 * time.Hour, false},
		{"python-cccc", 6 * 24 * time.Hour, true},
	} {
		path := filepath.Join(dir, tc.name)
		if err := os.MkdirAll(filepath.Join(path, "sub"), 0o700); err != nil {
			t.Fatal(err)
		}
		then := time.Now().Add(-tc.age)
		if err := os.Chtimes(path, then, then); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_, err := os.Stat(path)
			if kept := err == nil; kept != tc.kept {
				t.Errorf("%s (%s old): kept = %v, want %v", tc.name, tc.age, kept, tc.kept)
			}
		})
	}
	(&Backend{log: slog.Default()}).pruneCheckpoints(dir)
}
