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
//     The backend therefore counts on the monitor's own check that the
//     stream carries the container/start point of a fresh run.
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
