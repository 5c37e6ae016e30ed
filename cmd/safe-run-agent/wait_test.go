package main

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestWaitEndsOnSIGTERM runs --wait's loop in a child (this test binary,
// re-executed) and checks that it exits on SIGTERM, as a Pod's pid 1 must
// for the Pod to end without waiting out its grace period, and not before.
func TestWaitEndsOnSIGTERM(t *testing.T) {
	if os.Getenv("SAFE_RUN_AGENT_WAIT_CHILD") == "1" {
		waitForTerm()
		os.Exit(0)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestWaitEndsOnSIGTERM$")
	cmd.Env = append(os.Environ(), "SAFE_RUN_AGENT_WAIT_CHILD=1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	time.Sleep(200 * time.Millisecond)
	_ = cmd.Process.Signal(syscall.SIGCHLD) // no orphan to reap: it keeps waiting
	select {
	case err := <-done:
		t.Fatalf("--wait ended before SIGTERM: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("--wait ended with %v on SIGTERM, want exit 0", err)
		}
	case <-time.After(5 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("--wait did not end on SIGTERM")
	}
}
