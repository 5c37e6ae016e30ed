package gvisor

// Behaviour monitoring (package monitor) of a sandbox: how runsc's trace
// sessions behave, as measured here with the runsc of go.mod's gVisor
// (2026-12-02, systrap, `--network none --ignore-cgroups --overlay2 none`),
// and so why the backend does what it does.
//
//   - `runsc --pod-init-config FILE run` reads FILE ({"trace_session": ...})
//     in the runsc process safe-run starts, before it creates the sandbox:
//     that process connects to the remote sink's socket, does the
//     handshake, and donates the connected descriptor to the sentry
//     (--sink-fds). The socket path is therefore resolved on the host, in
//     safe-run's own mount namespace, before any chroot: it can live in the
//     run's private state directory and need not be visible in the sandbox.
//     The peer's SO_PEERCRED is runsc's (uid 0, or 0 of safe-run's user
//     namespace without root).
//   - A session the sentry refuses (an unknown point or field, e.g.
//     context field "thread_group_id") does NOT fail the run: runsc logs
//     "unable to configure event session" at warning level in its boot log
//     and the sandbox runs unmonitored, its socket connected but silent.
//     The backend therefore has the monitor check that the stream of a
//     fresh run carries its container/start point (Options.ExpectStart).
//   - The stream ends (EOF) when the sandbox ends; `runsc checkpoint` ends it
//     too (the sandbox exits).
//   - `runsc restore` restores no session: the restored sandbox is silent,
//     `runsc trace list` shows none, and `runsc trace create` then succeeds
//     without --force. Passing --pod-init-config again on restore installs
//     the session at the sentry's boot, before the saved kernel resumes:
//     events flow from the first instruction the restored program runs. A
//     restored run sends no container/start (its container started before
//     the checkpoint). `runsc trace create --config FILE` after a restore
//     also works (its own process connects) but leaves a window in which
//     the restored program runs unmonitored, and costs a runsc process:
//     30-70 ms measured. So Restore passes --pod-init-config like Start.
//   - Cost, 5 runs each of `python3 -c pass` with process, clone, exit,
//     connect and openat points on: `runsc run` 0.23-0.28 s without a
//     session, 0.24-0.29 s with one; `restore` of a python checkpoint
//     0.10-0.15 s without, 0.14-0.17 s with (the connect and handshake,
//     done by runsc before the sandbox boots). In the warm pool restores
//     happen at refill, off the hot path of the run that takes the sandbox.
//   - Without root (uid 65534 as root of its own user namespace with a mount
//     namespace, as safe-run runs itself): run, checkpoint and restore with
//     a session behave the same; the socket is the user's, in the user's
//     state directory.

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/safe-run/safe-run/monitor"
	"github.com/safe-run/safe-run/runtime/engine"
	"github.com/safe-run/safe-run/sandbox"
)

// The run directory's files of a monitored sandbox.
const (
	monitorSocket  = "m.sock"     // the remote sink's socket, served by the Monitor
	monitorSession = "trace.json" // runsc's --pod-init-config

	// monitorSockDirPrefix names the socket's own directory in the
	// temporary directory, where the run directory's path is too long.
	monitorSockDirPrefix = "safe-run-mon-"
)

// maxSocketPath is the longest path a Unix socket can be bound to (sun_path
// holds 108 bytes with the terminating NUL).
const maxSocketPath = 107

var _ engine.ActivityReporter = (*sandboxProc)(nil)

// sandboxMonitor is the behaviour monitor of one sandbox.
type sandboxMonitor struct {
	m       *monitor.Monitor
	session string // the session file, for runsc's --pod-init-config
	sockDir string // the socket's own directory where the run's is too deep, else ""
}

// startMonitor serves the sandbox's trace stream and writes the session
// runsc is started with, when the backend monitors (Config.Monitor).
func (p *sandboxProc) startMonitor() error {
	opts := p.g.cfg.Monitor
	if opts.Level == "" || opts.Level == monitor.LevelOff {
		return nil
	}
	sm := &sandboxMonitor{session: filepath.Join(p.dir, monitorSession)}
	sock := filepath.Join(p.dir, monitorSocket)
	if len(sock) > maxSocketPath {
		// A deep state directory: the socket goes to a private directory
		// of its own in the temporary directory (only runsc, as this user,
		// connects; the monitor makes the socket 0600 too).
		dir, err := os.MkdirTemp("", monitorSockDirPrefix+"*")
		if err != nil {
			return fmt.Errorf("create the monitor's socket directory: %w", err)
		}
		sm.sockDir, sock = dir, filepath.Join(dir, monitorSocket)
		if len(sock) > maxSocketPath {
			_ = os.Remove(dir)
			return fmt.Errorf("the monitor's socket %s is longer than the %d bytes a Unix socket path may have: set TMPDIR or the state directory to a shorter path, or --monitor=off", sock, maxSocketPath)
		}
		// The run directory links to it, so that the reaper of a
		// safe-run process that died finds it (removeMonitorSockDir).
		if err := os.Symlink(sock, filepath.Join(p.dir, monitorSocket)); err != nil {
			_ = os.Remove(dir)
			return fmt.Errorf("link the monitor's socket into the run directory: %w", err)
		}
	}
	p.mon = sm // closeMonitor removes what was made, whatever fails next
	opts.Log = p.log
	// A fresh sandbox's stream must carry container/start (a session the
	// sentry refused is silent); a restored one sends none.
	opts.ExpectStart = p.restore == ""
	opts.OnKill = func(hit sandbox.RuleHit) {
		// The hit is in the Activity; the engine makes the run's status
		// of it.
		p.log.Warn("a monitoring rule ends the run", "rule", hit.Rule, "event", hit.Event)
		// Not on the monitor's goroutine: Kill waits for runsc.
		go p.Kill()
	}
	m, err := monitor.Start(sock, opts)
	if err != nil {
		return fmt.Errorf("start the sandbox's monitor: %w", err)
	}
	sm.m = m
	if err := os.WriteFile(sm.session, m.SessionConfig(), 0o600); err != nil {
		return fmt.Errorf("write the trace session: %w", err)
	}
	return nil
}

// runscMonitorArgs are runsc's global flags for the sandbox's trace
// session: on run and on restore alike (a checkpoint keeps no session).
func (p *sandboxProc) runscMonitorArgs() []string {
	if p.mon == nil || p.mon.m == nil {
		return nil
	}
	return []string{"--pod-init-config", p.mon.session}
}

// TakeActivity returns what the sandbox did since the previous call, or
// nil if it is not monitored. It need not wait for the sandbox to exit
// (final changes nothing here): the sentry writes a point to the socket in
// the system call that makes it, so a program's points are in the socket
// before the agent sees the program end, and Take reads what the socket
// holds before it answers.
func (p *sandboxProc) TakeActivity(final bool) *sandbox.Activity {
	if p.mon == nil || p.mon.m == nil {
		return nil
	}
	a := p.mon.m.Take()
	return &a
}

// TotalActivity returns everything the sandbox did in its life, or nil if
// it is not monitored.
func (p *sandboxProc) TotalActivity() *sandbox.Activity {
	if p.mon == nil || p.mon.m == nil {
		return nil
	}
	a := p.mon.m.Total()
	return &a
}

// closeMonitor stops serving the sandbox's stream; runsc has exited.
func (p *sandboxProc) closeMonitor() {
	if p.mon == nil {
		return
	}
	if p.mon.m != nil {
		if err := p.mon.m.Close(); err != nil {
			p.log.Warn("close the sandbox's monitor", "err", err)
		}
	}
	if p.mon.sockDir != "" {
		if err := os.RemoveAll(p.mon.sockDir); err != nil {
			p.log.Warn("remove the monitor's socket directory", "err", err)
		}
	}
}

// removeMonitorSockDir removes the monitor's own socket directory that the
// run directory dir links to (see startMonitor), if there is one. It
// removes only a directory of this user named as startMonitor names them.
func removeMonitorSockDir(dir string) error {
	target, err := os.Readlink(filepath.Join(dir, monitorSocket))
	if err != nil {
		return nil // the socket is in dir itself, or there is none
	}
	sockDir := filepath.Dir(target)
	if filepath.Base(target) != monitorSocket || !strings.HasPrefix(filepath.Base(sockDir), monitorSockDirPrefix) {
		return fmt.Errorf("the monitor's socket link %s points to %s, not to a directory safe-run made: left alone", filepath.Join(dir, monitorSocket), target)
	}
	fi, err := os.Lstat(sockDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // the run closed its monitor
	}
	if err != nil {
		return fmt.Errorf("remove the monitor's socket directory: %w", err)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !fi.IsDir() || !ok || int(st.Uid) != os.Getuid() {
		return fmt.Errorf("the monitor's socket directory %s is not a directory of this user: left alone", sockDir)
	}
	if err := os.RemoveAll(sockDir); err != nil {
		return fmt.Errorf("remove the monitor's socket directory: %w", err)
	}
	return nil
}
