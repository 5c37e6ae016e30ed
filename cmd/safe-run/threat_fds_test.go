package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// TestThreatInheritedFiles: a descriptor the caller leaks into safe-run
// (a supervisor, a client, a socket) must not reach what safe-run starts —
// runsc, the network helper that parses the sandbox's frames, the agent.
func TestThreatInheritedFiles(t *testing.T) {
	bin := binary(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	leak, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(int(r.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "run", "--lang", "python", "--allow-net", "leak.test", "--net", "leak.test",
		"-c", "import time; time.sleep(3)")
	cmd.ExtraFiles = []*os.File{r} // fd 3 of safe-run, not close-on-exec
	cmd.Env = append(os.Environ(), "SAFE_RUN_STATE_DIR="+t.TempDir())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	holders := map[string]bool{}
	seen := 0
	for deadline := time.Now().Add(2500 * time.Millisecond); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		procs, _ := filepath.Glob("/proc/[0-9]*")
		for _, p := range procs {
			pid := filepath.Base(p)
			if pid == strconv.Itoa(os.Getpid()) || pid == strconv.Itoa(cmd.Process.Pid) {
				continue
			}
			comm, _ := os.ReadFile(p + "/comm")
			if c := string(comm); c == "runsc\n" || c == "safe-run-net\n" || c == "exe\n" {
				seen++
			}
			fds, _ := filepath.Glob(p + "/fd/*")
			for _, fd := range fds {
				if l, _ := os.Readlink(fd); l == leak {
					holders[pid+" "+string(comm)] = true
				}
			}
		}
	}
	if err := <-done; err != nil {
		t.Fatalf("safe-run run: %v", err)
	}
	if seen == 0 {
		t.Fatal("no runsc or network helper process was seen while the run lasted: the check saw nothing")
	}
	if len(holders) > 0 {
		t.Errorf("the descriptor leaked into safe-run reached its children: %v", holders)
	}
}
