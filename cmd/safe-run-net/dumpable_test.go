package main

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/safe-run/safe-run/egress"
	"github.com/safe-run/safe-run/netstack/netstacktest"
)

// TestHelperNotDumpable: once locked down the helper is not dumpable, so
// that no other process of its uid (65534, shared with other daemons and
// with every other sandbox's helper) can ptrace it or open its /proc
// files: it holds the sandbox's link and writes its records. The kernel
// shows a non-dumpable process's /proc/PID files as root's.
func TestHelperNotDumpable(t *testing.T) {
	bin := helperBin(t)
	fds, err := netstacktest.Socketpair()
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[1])
	link := os.NewFile(uintptr(fds[0]), "link")
	evR, evW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.ExtraFiles = []*os.File{link, evW}
	if os.Getuid() == 0 {
		// As the backend starts it when it is root (the built copy's
		// directory opened for 65534).
		if os.Getenv("SAFE_RUN_NET_HELPER") == "" {
			os.Chmod(filepath.Dir(bin), 0o755)
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	link.Close()
	evW.Close()
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	cfg, _ := json.Marshal(egress.HelperConfig{Link: "packet", MTU: 1500})
	stdin.Write(append(cfg, '\n'))
	line, err := bufio.NewReader(evR).ReadString('\n')
	if err != nil || !strings.Contains(line, `"ready":true`) {
		t.Fatalf("first event %q, %v; want ready", line, err)
	}
	var st unix.Stat_t
	if err := unix.Stat("/proc/"+strconv.Itoa(cmd.Process.Pid)+"/mem", &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != 0 {
		t.Fatalf("the locked-down helper's /proc files belong to uid %d: it is dumpable (any process of its uid can ptrace it)", st.Uid)
	}
}
