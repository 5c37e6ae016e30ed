//go:build linux

package agent

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestDrainNowDoesNotWaitForWriters checks that the end of a run takes what
// its pipe holds and closes it while a writer (a background process of the
// program) still holds the pipe open: waiting for its EOF would wait for
// that process.
func TestDrainNowDoesNotWaitForWriters(t *testing.T) {
	r, w, err := pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(w) // held open, as by a background child, until the end
	if _, err := unix.Write(w, []byte("all the program wrote\n")); err != nil {
		t.Fatal(err)
	}
	c := &streamCapture{Capture: Capture{Max: 1 << 20}, send: func(Event) error { return nil }}
	if fd := drainNow(r, make([]byte, 4096), c); fd != -1 {
		t.Errorf("drainNow returned fd %d, want -1 (closed)", fd)
	}
	if got := string(c.Head()); got != "all the program wrote\n" {
		t.Errorf("drained %q", got)
	}
	// Closed: the writer now gets EPIPE.
	if _, err := unix.Write(w, []byte("x")); err != unix.EPIPE {
		t.Errorf("write after the drain: %v, want EPIPE (the read end closed)", err)
	}
}

// TestDrainNowIsBounded checks that a writer that never stops cannot keep
// the drain going: it takes at most what the pipe held.
func TestDrainNowIsBounded(t *testing.T) {
	r, w, err := pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(w)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		buf := make([]byte, 4096)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := unix.Write(w, buf); err != nil {
				return
			}
		}
	}()
	c := &streamCapture{Capture: Capture{Max: 1 << 30}, send: func(Event) error { return nil }}
	drainNow(r, make([]byte, 4096), c)
	if c.Total() > maxDrain {
		t.Errorf("drained %d bytes from an endless writer, more than the bound %d", c.Total(), maxDrain)
	}
}

func TestEmptyDir(t *testing.T) {
	ws := t.TempDir()
	for _, d := range []string{"empty", "full", "full/sub", "deep/er"} {
		if err := os.MkdirAll(filepath.Join(ws, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(ws, "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("empty", filepath.Join(ws, "link")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		dir  string
		want bool
	}{
		{"empty", true},
		{"deep/er", true},
		{"full", false},    // holds a directory
		{"deep", false},    // holds a directory
		{"missing", false}, // the walk decides
		{"file", false},    // not a directory
		{"link", false},    // a link is not followed
		{"../" + filepath.Base(ws), false},
	}
	s := &server{cfg: Config{Workdir: ws}}
	for _, tt := range tests {
		if got := s.emptyDir(tt.dir); got != tt.want {
			t.Errorf("emptyDir(%q) = %v, want %v", tt.dir, got, tt.want)
		}
	}
	// One descriptor of the workspace serves every look.
	fd, err := s.workspace()
	if err != nil || !s.wsOpen {
		t.Fatalf("workspace() = %d, %v after the looks; want it open", fd, err)
	}
	if again, _ := s.workspace(); again != fd {
		t.Errorf("workspace() opened the workspace again: %d, then %d", fd, again)
	}
}

func TestParseReport(t *testing.T) {
	tests := []struct {
		in   string
		fail string
		ok   bool
	}{
		{"fail write \"main.py\": no space\n", "write \"main.py\": no space", true},
		{"junk\nfail x\n", "x", true},
		{"fail x", "", false},   // incomplete
		{"exit 0\n", "", false}, // a forged end is not the driver's word
		{"", "", false},
	}
	for _, tt := range tests {
		fail, ok := parseReport([]byte(tt.in))
		if fail != tt.fail || ok != tt.ok {
			t.Errorf("parseReport(%q) = %q, %v; want %q, %v", tt.in, fail, ok, tt.fail, tt.ok)
		}
	}
}
