//go:build linux

package agent_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/safe-run/safe-run/agent"
)

func TestServeInstall(t *testing.T) {
	tests := []struct {
		name           string
		install        []string
		installTimeout time.Duration
		wantFailed     bool
		wantCode       int
		wantTimedOut   bool
		wantStderr     []string
		wantStdout     string // the program's alone; empty when it must not run
	}{
		{
			name:       "ok",
			install:    []string{"sh", "-c", "echo fetched; echo warning >&2; echo $PKG > installed"},
			wantStderr: []string{agent.InstallHeader + "sh -c", "fetched\n", "warning\n"},
			wantStdout: "tinypkg\nran\n",
		},
		{
			name:       "fails",
			install:    []string{"sh", "-c", "echo no such package >&2; exit 3"},
			wantFailed: true, wantCode: 3,
			wantStderr: []string{"no such package\n", "installing packages failed (exit code 3); the code was not run"},
		},
		{
			name:           "timeout",
			install:        []string{"sh", "-c", "echo started; sleep 30"},
			installTimeout: 300 * time.Millisecond,
			wantFailed:     true, wantCode: -1, wantTimedOut: true,
			wantStderr: []string{"started\n", "installing packages failed (no end within 300ms)"},
		},
		{
			name:       "missing installer",
			install:    []string{"no-such-installer"},
			wantFailed: true, wantCode: -1,
			wantStderr: []string{"installing packages failed (no-such-installer: not found"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			req := sh("cat installed; echo ran > ran; echo ran")
			req.Install, req.InstallTimeout, req.Env = tt.install, tt.installTimeout, []string{"PKG=tinypkg"}
			r := serveOne(t, dir, req)
			e := r.exit
			if e.InstallFailed != tt.wantFailed || e.Code != tt.wantCode || e.TimedOut != tt.wantTimedOut || e.Error != "" {
				t.Errorf("exit = %+v, want InstallFailed %v, code %d, timed out %v", e, tt.wantFailed, tt.wantCode, tt.wantTimedOut)
			}
			for _, w := range tt.wantStderr {
				if !strings.Contains(errOut(r), w) {
					t.Errorf("stderr %q lacks %q", errOut(r), w)
				}
			}
			if out(r) != tt.wantStdout {
				t.Errorf("stdout %q, want %q (the install writes only to stderr)", out(r), tt.wantStdout)
			}
			_, err := os.Stat(filepath.Join(dir, "ran"))
			if ran := err == nil; ran == tt.wantFailed {
				t.Errorf("the code ran: %v, want %v", ran, !tt.wantFailed)
			}
		})
	}
}

// TestEvalSeesPackagesInstalledLater: the session's interpreter started
// before the install made the user site, and imports from it all the same.
func TestEvalSeesPackagesInstalledLater(t *testing.T) {
	needInterpreter(t, "python3")
	home := t.TempDir()
	env := []string{"HOME=" + home, "PYTHONUSERBASE=" + filepath.Join(home, ".local")}
	first := eval("python", "x = 1")
	first.Env = env
	second := eval("python", "import newmod\nprint(newmod.v, x)")
	second.Env = env
	second.Install = []string{"sh", "-c", `d=$(python3 -m site --user-site) && mkdir -p "$d" && echo "v = 'installed'" > "$d/newmod.py"`}
	runs := evalSession(t, first, second)
	if got := out(runs[1]); got != "installed 1\n" {
		t.Errorf("cell after the install printed %q (stderr %q), want %q", got, errOut(runs[1]), "installed 1\n")
	}
}

func TestEvalInstallFailsCellNotRun(t *testing.T) {
	needInterpreter(t, "python3")
	req := eval("python", "print('ran')")
	req.Install = []string{"sh", "-c", "exit 2"}
	runs := evalSession(t, req, eval("python", "print('next')"))
	if e := runs[0].exit; !e.InstallFailed || e.Code != 2 || out(runs[0]) != "" {
		t.Errorf("failed install: exit %+v, stdout %q; want InstallFailed, code 2, no output", e, out(runs[0]))
	}
	if got := out(runs[1]); got != "next\n" {
		t.Errorf("next cell printed %q, want the session to go on", got)
	}
}
