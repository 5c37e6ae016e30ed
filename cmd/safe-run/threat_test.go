package main

// The threat suite: every case of the threat catalogue (T1–T30) run as
// untrusted code through both public paths — `safe-run run` and the MCP tool
// run_code — with the host checked after each case (threat_harness_test.go),
// and, for the probes that matter most, a positive control: the identical
// probe run where the restriction is lifted must report what it looks for,
// so that a probe that silently stopped detecting is noticed.
//
// A probe prints "LEAK ..." for anything it reaches that it must not, and
// "PROBE-RAN" when it got to its end. `make test-security` runs the suite as
// root; scripts/test-rootless.sh runs it again as an ordinary user, where
// every case applies, each checking what docs/rootless.md's "Without root"
// promises for the limits (see threat_harness_test.go for the host side).
// T31–T33 are the threats an ordinary user's safe-run adds: runsc and
// gVisor run as that user, beside the user's own processes, files and
// sockets.

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/safe-run/safe-run/sandbox"
)

// pyPrelude starts every Python probe.
const pyPrelude = `import os, sys, errno, ctypes
def err(e):
    return errno.errorcode.get(getattr(e, "errno", None) or 0, type(e).__name__)
def leak(*a):
    print("LEAK", *a, flush=True)
def ran():
    print("PROBE-RAN", flush=True)
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sc(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    e = ctypes.get_errno() if r < 0 else 0
    return r, errno.errorcode.get(e, str(e))
`

// shPrelude starts every Bash probe.
const shPrelude = `leak() { echo "LEAK $*"; }
`

// bashForkBomb is the classic bash fork bomb, written so that it ends itself
// a few seconds after it has met the process limit: it prints the limit's
// EAGAIN to stderr and "held at the limit", then exits 3 with the bomb still
// running. Once the bomb runs no fork succeeds, so the shell watches with
// builtins alone: it reads the bomb's errors from a file and naps with
// `read -t` on a pipe nobody writes to.
const bashForkBomb = `echo started
exec 3< <(sleep 600)
nap() { read -t 0.05 -u 3; }
bomb() { bomb | bomb & }
bomb 2>bomb.err
limited() {
    local line
    while IFS= read -r line; do
        [[ $line == *"Resource temporarily unavailable"* ]] && { printf '%s\n' "$line" >&2; return 0; }
    done <bomb.err
    return 1
}
until limited; do nap; done
end=$((SECONDS + 3)); until ((SECONDS >= end)); do nap; done
echo "held at the limit"; exit 3
`

// forkBombTimeout only stops a fork bomb that never meets the process limit
// (the cases then fail): a bomb that meets it ends itself long before.
const forkBombTimeout = 60 * time.Second

// seccompCall is one system call the filter must deny, with arguments that
// make it harmless — and answer something other than EPERM — wherever it is
// allowed (see TestSeccompDeniedFamilies for the controls).
type seccompCall struct{ name, args string }

// deniedCalls are the denied families, on x86-64. `child` is a process of
// the probe's own, `local` and `remote` are iovecs.
var deniedCalls = []seccompCall{
	{"ptrace", "101, 16, child, 0, 0"}, // PTRACE_ATTACH to our own child
	{"process_vm_readv", "310, child, ctypes.addressof(local), 1, ctypes.addressof(remote), 1, 0"}, // read the child's memory
	{"keyctl", "250, 0, -3, 0"},                        // KEYCTL_GET_KEYRING_ID of the session keyring, no create
	{"add_key", "248, 0, 0, 0, 0, -2"},                 // NULL type
	{"request_key", "249, 0, 0, 0, 0"},                 // NULL type
	{"bpf", "321, 9999, 0, 0"},                         // unknown command
	{"perf_event_open", "298, 0, 0, -1, -1, 0"},        // NULL attr
	{"userfaultfd", "323, 0xffff"},                     // invalid flags
	{"io_uring_setup", "425, 0, 0"},                    // zero entries, NULL params
	{"mount", "165, 0, 0, 0, 0, 0"},                    // NULL everything
	{"umount2", "166, 0, 0"},                           // NULL target
	{"unshare", "272, 0"},                              // no flags: a no-op where allowed
	{"setns", "308, -1, 0"},                            // bad fd
	{"kexec_load", "246, 0, 0, 0, 0xdeadbeef"},         // invalid flags
	{"init_module", "175, 0, 0, 0"},                    // NULL image
	{"finit_module", "313, -1, 0, 0"},                  // bad fd
	{"socket(AF_PACKET)", "41, 17, 3, 0"},              // SOCK_RAW
	{"socket(AF_NETLINK, NETFILTER)", "41, 16, 3, 12"}, // SOCK_RAW, NETLINK_NETFILTER
	{"socket(AF_NETLINK, ROUTE)", "41, 16, 3, 0"},
	{"socket(AF_VSOCK)", "41, 40, 1, 0"},     // SOCK_STREAM
	{"socket(AF_ALG)", "41, 38, 5, 0"},       // SOCK_SEQPACKET
	{"socket(AF_KEY)", "41, 15, 3, 2"},       // PF_KEY_V2
	{"socket(AF_BLUETOOTH)", "41, 31, 3, 0"}, // SOCK_RAW
}

// syscallProbe is a Python probe that makes the named calls of deniedCalls
// (all of them if none are named) and prints "call NAME RESULT ERRNO" for
// each; a call that is not refused with EPERM or ENOSYS is a leak.
func syscallProbe(names ...string) string {
	var b strings.Builder
	b.WriteString(pyPrelude)
	b.WriteString(`import time
child = os.fork()
if child == 0:
    time.sleep(60)
    os._exit(0)
buf = ctypes.create_string_buffer(8)
local = (ctypes.c_ulong * 2)(ctypes.addressof(buf), 8)
remote = (ctypes.c_ulong * 2)(0x10000, 8)
calls = [
`)
	for _, c := range deniedCalls {
		if len(names) == 0 || slices.Contains(names, c.name) {
			fmt.Fprintf(&b, "    (%q, (%s)),\n", c.name, c.args)
		}
	}
	b.WriteString(`]
for name, args in calls:
    r, e = sc(*args)
    if name.startswith("socket") and r >= 0:
        os.close(r)
    print("call", name, r, e, flush=True)
    if e not in ("EPERM", "ENOSYS"):
        leak(name, "answered", r, e)
os.kill(child, 9)
os.waitpid(child, 0)
ran()
`)
	return b.String()
}

// threatCase is one row of the suite.
type threatCase struct {
	id, name string
	lang     string
	code     string // with the harness's {{PLACEHOLDERS}}
	args     []string
	timeout  time.Duration
	// status is the expected status; statuses, if set, the acceptable ones.
	status   sandbox.Status
	statuses []sandbox.Status
	want     []string // in stdout
	// check makes further checks of the result.
	check func(t *testing.T, h *threatHarness, r *threatRun)
	// during runs on the host while the run is in progress, given the state
	// directory of the path the run takes.
	during func(t *testing.T, h *threatHarness, stateDir string)
	// control runs the identical probe on the host as the suite's user,
	// where it must print LEAK; controlCheck checks more of what it did.
	control      bool
	controlCheck func(t *testing.T, h *threatHarness, out string)
	// only restricts the case to one path ("cli" or "mcp"), for a reason
	// given in its name.
	only string
}

func threatCases() []threatCase {
	ok := sandbox.StatusOK
	return []threatCase{
		{id: "T1", name: "write to /usr, /etc and /", lang: "python", status: ok,
			want: []string{"denied /usr/", "EROFS"},
			code: pyPrelude + `
for d in ["/", "/usr", "/etc", "/bin", "/workspace/.."]:
    p = os.path.join(d, "{{MARKER}}")
    try:
        with open(p, "w") as f:
            f.write("x")
        leak("wrote", p)
    except OSError as e:
        print("denied", p, err(e))
for p in ["/etc/passwd", "/usr/bin/python3"]:
    try:
        os.close(os.open(p, os.O_WRONLY | os.O_APPEND))
        leak("opened for writing", p)
    except OSError as e:
        print("denied", p, err(e))
for f, a in [(os.mkdir, ("/usr/{{MARKER}}",)), (os.chmod, ("/etc/passwd", 0o666)), (os.rename, ("/etc/hostname", "/etc/{{MARKER}}"))]:
    try:
        f(*a)
        leak(f.__name__, a)
    except OSError as e:
        print("denied", f.__name__, err(e))
ran()`},

		{id: "T2", name: "read host secrets", lang: "python", status: ok, control: true,
			want: []string{"denied {{CANARY_FILE}}", "denied /etc/shadow"},
			code: pyPrelude + `
for p in ["{{CANARY_FILE}}", "/etc/shadow", "/etc/gshadow", "/root/.ssh/id_rsa", "/root/.bash_history"]:
    try:
        leak("read", p, open(p).read()[:200])
    except OSError as e:
        print("denied", p, err(e))
for d in ["/root", "/home", os.path.dirname("{{CANARY_FILE}}")]:
    try:
        names = os.listdir(d)
        if os.path.basename("{{CANARY_FILE}}") in names:
            leak("canary listed in", d)
        print("list", d, names[:20])
    except OSError as e:
        print("denied", d, err(e))
ran()`},

		{id: "T3", name: "environment, /proc/self/environ, /proc/1/environ", lang: "python", status: ok, control: true,
			want: []string{"denied /proc/1/environ"},
			code: pyPrelude + `
allowed = {"PATH", "HOME", "TMPDIR", "LANG", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "MPLBACKEND", "MPLCONFIGDIR", "PWD", "SHLVL", "_", "LC_CTYPE"}
print("env", sorted(os.environ))
if set(os.environ) - allowed:
    leak("variables beyond the allowlist", sorted(set(os.environ) - allowed))
if "{{CANARY_ENV}}" in os.environ:
    leak("canary variable", os.environ["{{CANARY_ENV}}"])
import glob
for p in ["/proc/self/environ", "/proc/1/environ"] + glob.glob("/proc/[0-9]*/environ"):
    try:
        data = open(p, "rb").read()
        if b"{{CANARY_ENV}}" in data or b"SSH_AUTH_SOCK" in data:
            leak("server variables in", p, data.replace(b"\0", b" ")[:300])
        print("read", p, len(data))
    except OSError as e:
        print("denied", p, err(e))
ran()`},

		{id: "T4", name: "symlinks to host paths asked back as output files", lang: "python", status: ok,
			code: pyPrelude + `
os.makedirs("out/sub", exist_ok=True)
for name, target in [("canary", "{{CANARY_FILE}}"), ("passwd", "/etc/passwd"), ("root", "/"), ("up", ".."), ("sub/shadow", "/etc/shadow"), ("self", "/proc/self/environ")]:
    os.symlink(target, "out/" + name)
open("out/plain.txt", "w").write("plain\n")
ran()`,
			check: func(t *testing.T, h *threatHarness, r *threatRun) {
				links := []string{"canary", "passwd", "root", "up", "sub/shadow", "self"}
				if strings.Contains(r.all, "root:x:0:0") || strings.Contains(r.all, base64.StdEncoding.EncodeToString([]byte("root:x:0:0"))) {
					t.Errorf("the content of a linked file came back: %.500s", r.all)
				}
				switch r.via {
				case "cli":
					returned := map[string]string{}
					for _, f := range r.result.Files {
						returned[f.Path] = f.Skipped
						if f.Skipped == "" && f.Path != "plain.txt" {
							t.Errorf("%s came back with %d bytes", f.Path, len(f.Data))
						}
					}
					for _, l := range links {
						if s, ok := returned[l]; ok && !strings.Contains(s, "link") {
							t.Errorf("%s: skipped %q, want a note that links are not followed", l, s)
						}
					}
					// On the host, only the regular file was written.
					filepath.Walk(r.outDir, func(p string, fi os.FileInfo, err error) error {
						if err == nil && !fi.IsDir() && (fi.Mode()&os.ModeSymlink != 0 || filepath.Base(p) != "plain.txt") {
							t.Errorf("--out wrote %s (%v) on the host", p, fi.Mode())
						}
						return nil
					})
					if data, err := os.ReadFile(filepath.Join(r.outDir, "plain.txt")); err != nil || string(data) != "plain\n" {
						t.Errorf("plain.txt: %q %v — the control file should come back", data, err)
					}
				case "mcp":
					files, _ := r.mcpOut["files"].([]any)
					var plain bool
					for _, f := range files {
						m, _ := f.(map[string]any)
						if m["path"] == "plain.txt" && m["returned"] == true {
							plain = true
						} else if m["returned"] == true {
							t.Errorf("%v came back", m)
						}
					}
					if !plain {
						t.Errorf("plain.txt did not come back (files %v) — the control file should", files)
					}
				}
			}},

		{id: "T5", name: "open /proc/self/exe and /proc/1/exe for writing", lang: "python", status: ok,
			want: []string{"denied /proc/self/exe", "denied /proc/1/exe"},
			code: pyPrelude + `
for p in ["/proc/self/exe", "/proc/1/exe", "/.safe-run/agent", "/usr/bin/python3.11", "/proc/1/root/.safe-run/agent"]:
    for flags in [os.O_WRONLY, os.O_RDWR, os.O_WRONLY | os.O_APPEND]:
        try:
            os.close(os.open(p, flags))
            leak("opened for writing", p, flags)
        except OSError as e:
            print("denied", p, flags, err(e))
ran()`},

		{id: "T6", name: "file descriptors and cwd", lang: "python", status: ok, control: true,
			want: []string{"cwd /workspace /workspace /", "denied /proc/1/fd"},
			code: pyPrelude + `
host = {{HOST_PATHS}}
def hostly(s):
    return any(s == h or s.startswith(h + "/") for h in host)
fds = sorted(int(f) for f in os.listdir("/proc/self/fd"))
for fd in fds:
    try:
        target = os.readlink("/proc/self/fd/%d" % fd)
    except OSError:
        continue
    print("fd", fd, target)
    if hostly(target):
        leak("fd", fd, "is", target)
if len(fds) > 4:
    leak("descriptors beyond stdio", fds)
for p in ["/proc/1/fd", "/proc/1/cwd", "/proc/1/root", "/proc/1/mem"]:
    try:
        leak("reached the agent's", p, os.listdir(p) if p.endswith("fd") else os.readlink(p))
    except OSError as e:
        print("denied", p, err(e))
cwd, cwdlink, root = os.getcwd(), os.readlink("/proc/self/cwd"), os.readlink("/proc/self/root")
print("cwd", cwd, cwdlink, root)
for s in (cwd, cwdlink, root):
    if hostly(s):
        leak("host path", s)
ran()`},

		{id: "T7", name: "mount, umount, unshare -Ur, setns", lang: "bash", status: ok,
			want: []string{"Operation not permitted"},
			code: shPrelude + `
unshare -Ur true 2>&1 && leak "unshare -Ur"
unshare -m true 2>&1 && leak "unshare -m"
unshare -n true 2>&1 && leak "unshare -n"
mount -t tmpfs none /tmp 2>&1 && leak "mount tmpfs"
mount --bind /workspace /tmp 2>&1 && leak "bind mount"
umount /proc 2>&1 && leak "umount /proc"
umount -l /workspace 2>&1 && leak "umount /workspace"
nsenter -t 1 -m true 2>&1 && leak "nsenter"
python3 -c '
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open("/proc/self/ns/net", os.O_RDONLY)
r = libc.setns(fd, 0)
print("setns", r, os.strerror(ctypes.get_errno()))
if r == 0: print("LEAK setns")'
grep -c . /proc/self/mountinfo
echo PROBE-RAN`},

		{id: "T8", name: "mknod and devices", lang: "python", status: ok, control: true,
			want: []string{"denied mknod", "denied /dev/mem", "denied /dev/net/tun", "fuse mount -1 EPERM"},
			code: pyPrelude + `
import stat
allowed = {"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty", "/dev/ptmx", "/dev/pts/ptmx"}
nodes = []
for d, dirs, files in os.walk("/dev"):
    for n in files + dirs:
        p = os.path.join(d, n)
        st = os.lstat(p)
        if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            nodes.append(p)
print("device nodes", sorted(nodes))
# gVisor always offers /dev/fuse, and nothing in a bundle can remove it (a
# bind mount over it would make runsc create the mount point in the shared
# image). It is inert unless a FUSE file system can be mounted: check that.
inert = {"/dev/fuse"}
for p in nodes:
    if p not in allowed and p not in inert:
        leak("device node", p)
if "/dev/fuse" in nodes:
    fd = os.open("/dev/fuse", os.O_RDWR)
    r = libc.mount(b"fuse", b"/workspace", b"fuse.probe", 0, b"fd=%d,rootmode=40000,user_id=65534,group_id=65534" % fd)
    print("fuse mount", r, errno.errorcode.get(ctypes.get_errno()))
    if r == 0:
        leak("mounted a FUSE file system")
for p in ["/dev/mem", "/dev/kmem", "/dev/port", "/dev/kmsg", "/dev/kvm", "/dev/sda", "/dev/vda", "/dev/nvme0n1", "/dev/loop0", "/dev/net/tun"]:
    try:
        os.close(os.open(p, os.O_RDONLY))
        leak("opened", p)
    except OSError as e:
        print("denied", p, err(e))
for name, dev in [("mem-node", (1, 1)), ("sda-node", (8, 0))]:
    try:
        os.mknod(name, 0o600 | stat.S_IFCHR, os.makedev(*dev))
        leak("mknod", name)
    except OSError as e:
        print("denied mknod", name, err(e))
ran()`},

		{id: "T9", name: "capabilities, uid and setuid", lang: "python", status: ok, control: true,
			want: []string{"denied setuid", "uids 65534 65534 65534"},
			code: pyPrelude + `
import stat, subprocess
fields = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
for k in ["CapInh", "CapPrm", "CapEff", "CapAmb"]:
    if int(fields[k].strip(), 16) != 0:
        leak(k, fields[k].strip())
if fields["NoNewPrivs"].strip() != "1":
    leak("NoNewPrivs", fields["NoNewPrivs"].strip())
print("uids", *os.getresuid(), "gids", *os.getresgid())
if set(os.getresuid()) != {65534} or set(os.getresgid()) != {65534} or os.getgroups() not in ([], [65534]):
    leak("ids", os.getresuid(), os.getresgid(), os.getgroups())
for f, a in [(os.setuid, 0), (os.setgid, 0), (os.seteuid, 0), (os.setgroups, [0])]:
    try:
        f(a)
        leak(f.__name__, a)
    except OSError as e:
        print("denied", f.__name__, err(e))
found = []
for top in ["/usr", "/bin", "/sbin", "/lib", "/opt"]:
    for d, dirs, files in os.walk(top):
        for n in files:
            try:
                m = os.lstat(os.path.join(d, n)).st_mode
            except OSError:
                continue
            if stat.S_ISREG(m) and m & (stat.S_ISUID | stat.S_ISGID):
                found.append(os.path.join(d, n))
if found:
    leak("setuid or setgid files", found[:20])
for cmd in (["su", "-c", "id -u"], ["sudo", "-n", "id", "-u"]):
    try:
        out = subprocess.run(cmd, capture_output=True, timeout=10, stdin=subprocess.DEVNULL).stdout.strip()
        if out == b"0":
            leak("became root with", cmd[0])
    except (OSError, subprocess.TimeoutExpired) as e:
        print("no", cmd[0], err(e))
ran()`},

		{id: "T10", name: "read /proc/kcore, /proc/keys and other kernel files", lang: "python", status: ok, control: true,
			code: pyPrelude + `
for p in ["/proc/kcore", "/proc/keys", "/proc/key-users", "/proc/kallsyms", "/proc/sched_debug", "/proc/timer_list", "/sys/firmware/dmi/tables/DMI", "/sys/kernel/security/lsm"]:
    try:
        data = open(p, "rb").read(64)
        if data:
            leak("read", p, data[:16])
        else:
            print("empty", p)
    except OSError as e:
        print("denied", p, err(e))
ran()`},

		// No host control: written on the host as root, these would change it.
		{id: "T10", name: "write /proc/sysrq-trigger and /proc/sys/kernel/*", lang: "python", status: ok,
			want: []string{"denied /proc/sysrq-trigger", "denied /proc/sys/kernel/core_pattern"},
			code: pyPrelude + `
for p, v in [("/proc/sysrq-trigger", "h"), ("/proc/sys/kernel/core_pattern", "|/tmp/x"), ("/proc/sys/kernel/hostname", "pwned"),
             ("/proc/sys/kernel/panic", "1"), ("/proc/sys/vm/drop_caches", "3"), ("/proc/sys/kernel/modprobe", "/tmp/x")]:
    try:
        with open(p, "w") as f:
            f.write(v)
        leak("wrote", p)
    except OSError as e:
        print("denied", p, err(e))
ran()`},

		{id: "T11", name: "cgroup writes and release_agent", lang: "python", status: ok,
			code: pyPrelude + `
try:
    print("cgroupfs", os.listdir("/sys/fs/cgroup"))
except OSError as e:
    print("no cgroupfs", err(e))
for p in ["/sys/fs/cgroup/release_agent", "/sys/fs/cgroup/memory/release_agent", "/sys/fs/cgroup/notify_on_release",
          "/sys/fs/cgroup/cgroup.procs", "/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/pids/pids.max", "/sys/fs/cgroup/cgroup.subtree_control"]:
    try:
        with open(p, "w") as f:
            f.write("/tmp/x")
        leak("wrote", p)
    except OSError as e:
        print("denied", p, err(e))
try:
    os.mkdir("/sys/fs/cgroup/{{MARKER}}")
    leak("mkdir in cgroupfs")
except OSError as e:
    print("denied mkdir", err(e))
r = libc.mount(b"cgroup", b"/tmp", b"cgroup", 0, b"memory")
print("mount cgroup", r, errno.errorcode.get(ctypes.get_errno()))
if r == 0:
    leak("mounted a cgroup hierarchy")
ran()`},

		{id: "T12", name: "signal host processes by pid", lang: "python", status: ok, control: true,
			want: []string{"denied", "ESRCH"},
			code: pyPrelude + `
import signal
for pid in {{PIDS}}:
    try:
        os.kill(pid, signal.SIGKILL)
        leak("killed", pid)
    except OSError as e:
        print("denied", pid, err(e))
ran()`,
			controlCheck: func(t *testing.T, h *threatHarness, out string) {
				waitUntil(t, 10*time.Second, func() bool { return !alive(h.controlVictim.Process.Pid) })
			}},

		// No host control: kill -9 -1 as root on the host kills everything.
		{id: "T12", name: "kill -9 -1", lang: "bash", status: ok,
			want: []string{"kill returned"},
			code: `kill -9 -1; echo "kill returned $?"; sleep 0.5; echo PROBE-RAN`},

		{id: "T13", name: "ptrace and process_vm_readv", lang: "python", status: ok,
			want: []string{"call ptrace -1 EPERM", "call process_vm_readv -1 EPERM"},
			code: syscallProbe("ptrace", "process_vm_readv")},

		{id: "T14", name: "outbound TCP and UDP, DNS", lang: "python", status: ok,
			want: []string{"tcp 1.1.1.1 ENETUNREACH", "dns"},
			code: pyPrelude + `
import socket
for host, port in [("1.1.1.1", 53), ("8.8.8.8", 443), ("10.0.0.1", 80), ("172.17.0.1", 2375), ("192.168.1.1", 80), ("169.254.169.254", 80)]:
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((host, port))
        leak("connected to", host, port)
    except OSError as e:
        print("tcp", host, err(e))
    finally:
        s.close()
for host in ["8.8.8.8", "10.0.0.1"]:
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.settimeout(2)
    try:
        u.sendto(b"x", (host, 53))
        leak("udp reply from", host, u.recvfrom(100))
    except OSError as e:
        print("udp", host, err(e))
try:
    leak("resolved", socket.getaddrinfo("example.com", 80))
except OSError as e:
    print("dns", e)
routes = open("/proc/net/route").read().splitlines()[1:]
if routes:
    leak("routes", routes)
ran()`,
			check: func(t *testing.T, h *threatHarness, r *threatRun) {
				assertConnectAttempts(t, r, "1.1.1.1:53", "8.8.8.8:443", "10.0.0.1:80", "172.17.0.1:2375", "192.168.1.1:80", "169.254.169.254:80")
			}},

		{id: "T15", name: "the host's 127.0.0.1 and abstract unix sockets", lang: "python", status: ok, control: true,
			want: []string{"tcp ECONNREFUSED", "abstract ECONNREFUSED"},
			code: pyPrelude + `
import socket
s = socket.socket()
s.settimeout(3)
try:
    s.connect(("127.0.0.1", {{TCP_PORT}}))
    leak("connected to 127.0.0.1:{{TCP_PORT}}")
except OSError as e:
    print("tcp", err(e))
u = socket.socket(socket.AF_UNIX)
u.settimeout(3)
try:
    u.connect("\0{{ABSTRACT}}")
    leak("connected to the abstract socket")
except OSError as e:
    print("abstract", err(e))
ran()`,
			controlCheck: func(t *testing.T, h *threatHarness, out string) {
				waitUntil(t, 10*time.Second, func() bool { return h.tcpN.Load() > 0 && h.abstractN.Load() > 0 })
			}},

		{id: "T16", name: "raw, packet, netlink, vsock, AF_ALG sockets", lang: "python", status: ok,
			want: []string{"call socket(AF_PACKET) -1 EPERM", "raw EPERM"},
			code: strings.Replace(syscallProbe("socket(AF_PACKET)", "socket(AF_NETLINK, NETFILTER)", "socket(AF_NETLINK, ROUTE)",
				"socket(AF_VSOCK)", "socket(AF_ALG)", "socket(AF_KEY)"), "\nran()\n", `
import socket
try:
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    leak("raw socket")
except OSError as e:
    print("raw", err(e))
ran()
`, 1)},

		{id: "T17", name: "bpf, perf_event_open, userfaultfd, io_uring, keyctl, kexec, modules", lang: "python", status: ok,
			want: []string{"call bpf -1 EPERM", "call keyctl -1 EPERM", "call io_uring_setup -1 EPERM"},
			code: syscallProbe("bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "keyctl", "add_key", "request_key",
				"kexec_load", "init_module", "finit_module")},

		{id: "T18", name: "docker, ssh-agent, dbus and X11 sockets", lang: "python", status: ok, control: true,
			code: pyPrelude + `
import socket, stat
cands = ["/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock", "/run/podman/podman.sock",
         "/run/dbus/system_bus_socket", "/var/run/dbus/system_bus_socket", "/tmp/.X11-unix/X0", "/run/user/0/bus",
         "/run/systemd/private", "/run/systemd/journal/socket", "{{SSH_SOCK}}"]
if os.environ.get("SSH_AUTH_SOCK"):
    cands.append(os.environ["SSH_AUTH_SOCK"])
for top in ["/run", "/var/run", "/tmp", "/root", "/home", "/workspace"]:
    for d, dirs, files in os.walk(top):
        for n in files:
            p = os.path.join(d, n)
            try:
                if stat.S_ISSOCK(os.lstat(p).st_mode):
                    cands.append(p)
            except OSError:
                pass
for p in cands + ["\0/tmp/.X11-unix/X0", "\0/org/freedesktop/systemd1/notify"]:
    u = socket.socket(socket.AF_UNIX)
    u.settimeout(2)
    try:
        u.connect(p)
        leak("connected to", repr(p))
    except OSError as e:
        print("unreachable", repr(p), err(e))
    finally:
        u.close()
ran()`,
			controlCheck: func(t *testing.T, h *threatHarness, out string) {
				waitUntil(t, 10*time.Second, func() bool { return h.sshN.Load() > 0 })
			}},

		// The fork bombs end themselves once they have met the process
		// limit and held it a few seconds, so the timeout is only a
		// backstop: how long a bomb takes to reach the limit depends on
		// the machine (1.3-2.6 s here, over 10 s on a busy CI runner), and
		// a run that must meet the limit before a short timeout fails on a
		// slow machine for no fault of the sandbox. The program exits 3
		// with its bomb still running, so the run also shows that the
		// program's exit ends the run however many processes it left
		// holding its output, and assertHostClean that none is left.
		{id: "T19", name: "bash fork bomb", lang: "bash", timeout: forkBombTimeout, status: sandbox.StatusError,
			code: bashForkBomb,
			want: []string{"started", "held at the limit"},
			check: func(t *testing.T, h *threatHarness, r *threatRun) {
				if !strings.Contains(r.stderr, "Resource temporarily unavailable") {
					t.Errorf("no sign of the process limit (EAGAIN) in stderr: %.1000s", r.stderr)
				}
				assertCloneStorm(t, r)
			},
			during: hostResponsive},

		// A cold interpreter (the CLI) reaches the process limit. A warm
		// one from the server's pool has numpy and pandas loaded, and its
		// forks together may reach the memory limit first: then the run
		// ends as oom. Either way the timeout is never what stops it.
		{id: "T19", name: "python fork bomb", lang: "python", timeout: forkBombTimeout,
			statuses: []sandbox.Status{sandbox.StatusError, sandbox.StatusOOM},
			want:     []string{"started"},
			check: func(t *testing.T, h *threatHarness, r *threatRun) {
				eagain := strings.Contains(r.stdout, "fork failed EAGAIN")
				if (r.via == "cli" || r.status == sandbox.StatusError) && !(eagain && strings.Contains(r.stdout, "held at the limit")) {
					t.Errorf("%s ended as %s without holding the process limit (EAGAIN)", r.via, r.status)
				}
				assertCloneStorm(t, r)
			},
			code: pyPrelude + `
import time
print("started", flush=True)
reached = None
while True:
    try:
        if os.fork() == 0:
            while True:
                try:
                    os.fork()
                except OSError:
                    time.sleep(0.01)
    except OSError as e:
        if reached is None:
            print("fork failed", err(e), flush=True)
            reached = time.monotonic()
        elif time.monotonic() - reached > 3:
            print("held at the limit", flush=True)
            os._exit(3)
        time.sleep(0.01)`,
			during: hostResponsive},

		{id: "T20", name: "thread bomb", lang: "python", status: ok,
			want: []string{"thread limit reached"},
			code: pyPrelude + `
import threading, time
n = 0
try:
    while True:
        threading.Thread(target=time.sleep, args=(120,), daemon=True).start()
        n += 1
except RuntimeError as e:
    print("thread limit reached after", n, "threads:", e, flush=True)
if n > 64:
    leak("started", n, "threads, over the limit of 64")
ran()
os._exit(0)`,
			during: hostResponsive},

		{id: "T21", name: "memory bomb: bytearray", lang: "python", status: sandbox.StatusOOM, check: wantMemoryMessage,
			code: `chunks = []
while True:
    chunks.append(bytearray(b"\1" * (16 << 20)))`},
		{id: "T21", name: "memory bomb: list growth", lang: "python", status: sandbox.StatusOOM, check: wantMemoryMessage,
			code: `l = []
while True:
    l.append([object() for _ in range(100000)])`},
		{id: "T21", name: "memory bomb: node Buffer loop", lang: "node", status: sandbox.StatusOOM, check: wantMemoryMessage,
			code: `const a = []; for (;;) a.push(Buffer.alloc(16 << 20, 1));`},

		{id: "T22", name: "fill /tmp, /dev/shm and the workspace", lang: "python", status: ok, timeout: 60 * time.Second,
			want: []string{"fill /tmp ENOSPC", "fill /dev/shm ENOSPC", "fill /workspace ENOSPC"},
			code: pyPrelude + `
# Files of at most 64 MiB each, so that the file size limit (256 MiB) is
# not what stops the filling.
caps = {"/tmp": 256, "/dev/shm": 64, "/workspace": 256}
for d, cap in caps.items():
    n, paths = 0, []
    try:
        while True:
            paths.append(os.path.join(d, "fill%d" % len(paths)))
            fd = os.open(paths[-1], os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                for _ in range(64):
                    n += os.write(fd, b"\1" * (1 << 20))
            finally:
                os.close(fd)
    except OSError as e:
        print("fill", d, err(e), n >> 20, "MiB", flush=True)
    for p in paths:
        if os.path.exists(p):
            os.remove(p)
    if n > cap << 20:
        leak(d, "took", n, "bytes, over its", cap, "MiB")
ran()`,
			check: wantPeakWithinLimit},

		{id: "T22", name: "a million tiny files", lang: "python", timeout: 30 * time.Second,
			statuses: []sandbox.Status{sandbox.StatusOK, sandbox.StatusOOM, sandbox.StatusTimeout},
			code: pyPrelude + `
n = 0
try:
    for n in range(1, 1000001):
        open("/tmp/f%d" % n, "w").close()
        if n % 20000 == 0:
            print("files", n, flush=True)
except OSError as e:
    print("stopped after", n, "files:", err(e), flush=True)
ran()`,
			check: wantPeakWithinLimit},

		{id: "T23", name: "1 GiB of print", lang: "python", status: ok, timeout: 120 * time.Second,
			code: `import sys
chunk = "x" * 1048575 + "\n"
for _ in range(1024):
    sys.stdout.write(chunk)
print("PROBE-RAN")`,
			check: func(t *testing.T, h *threatHarness, r *threatRun) {
				wantTruncatedOutput(t, r, 1<<30)
				if r.via == "mcp" {
					if vmRSS, _ := rss(h.serverPid); vmRSS > 200<<20 {
						t.Errorf("after a 1 GiB flood the server's RSS is %d MiB", vmRSS>>20)
					}
				}
			}},
		{id: "T23", name: "yes until the timeout", lang: "bash", timeout: 3 * time.Second, status: sandbox.StatusTimeout,
			code: `yes`,
			check: func(t *testing.T, h *threatHarness, r *threatRun) {
				if !strings.HasPrefix(r.stdout, "y\ny\ny\n") {
					t.Errorf("the output before the timeout was not kept: %.100q", r.stdout)
				}
				wantTruncatedOutput(t, r, 0)
			}},
		{id: "T23", name: "invalid UTF-8, NUL and ANSI escapes", lang: "python", status: ok,
			code: `import sys
sys.stdout.buffer.write(b"bad \xff\xfe\xc3\x28 nul \x00 ansi \x1b[31mred\x1b[0m \x1b]0;title\x07 \x1b[2J end\n")
sys.stderr.buffer.write(b"\xff" * 100000 + b"\n")
print("PROBE-RAN")`,
			check: func(t *testing.T, h *threatHarness, r *threatRun) {
				// The result was decoded as JSON by the caller; what it holds
				// must be text.
				if !strings.Contains(r.stdout, "bad ") || !strings.Contains(r.stdout, " end") {
					t.Errorf("stdout %q", r.stdout)
				}
				if !strings.ContainsRune(r.stdout, '\uFFFD') {
					t.Errorf("invalid UTF-8 was not replaced: %q", r.stdout)
				}
			}},

		{id: "T24", name: "busy loop on every core", lang: "bash", timeout: 5 * time.Second, status: sandbox.StatusTimeout,
			args:   []string{"--cpus", "0.5"},
			want:   []string{"started"},
			code:   `for i in 1 2 3 4; do ( while :; do :; done ) & done; echo started; wait`,
			during: cpuBusyLoops},

		{id: "T25", name: "exhaust file descriptors", lang: "python", status: ok,
			want: []string{"open failed EMFILE"},
			code: pyPrelude + `
fds = []
try:
    while True:
        fds.append(os.open("/dev/null", os.O_RDONLY))
except OSError as e:
    print("open failed", err(e), "after", len(fds), flush=True)
if len(fds) > 1024:
    leak(len(fds), "descriptors, over the limit of 1024")
ran()`},

		{id: "T28", name: "seccomp state and a denied harmless call", lang: "python", status: ok, control: true,
			want: []string{"Seccomp 2", "call unshare -1 EPERM"},
			code: strings.Replace(syscallProbe("unshare"), "\nran()\n", `
mode = [l.split()[1] for l in open("/proc/self/status") if l.startswith("Seccomp:")][0]
print("Seccomp", mode)
if mode != "2":
    leak("no seccomp filter")
ran()
`, 1)},

		{id: "T29", name: "huge single file: sparse and dense", lang: "python", status: ok, timeout: 60 * time.Second,
			args: []string{"--workspace-size", "1GiB"},
			want: []string{"sparse EFBIG", "truncate EFBIG"},
			code: pyPrelude + `
fd = os.open("big", os.O_WRONLY | os.O_CREAT, 0o600)
os.lseek(fd, 300 << 20, 0)
try:
    os.write(fd, b"x")
    leak("wrote at 300 MiB")
except OSError as e:
    print("sparse", err(e))
try:
    os.ftruncate(fd, 300 << 20)
    leak("truncated to 300 MiB")
except OSError as e:
    print("truncate", err(e))
os.lseek(fd, 0, 0)
n = 0
try:
    while True:
        w = os.write(fd, b"\1" * (1 << 20))
        if w == 0:
            break
        n += w
except OSError as e:
    print("dense", err(e), n, flush=True)
os.close(fd)
os.remove("big")
if n > 256 << 20:
    leak("wrote", n, "bytes")
ran()`,
			check: func(t *testing.T, h *threatHarness, r *threatRun) {
				// The CLI's workspace is larger than the file size limit, so the
				// limit itself stops the write; over MCP the workspace (256 MiB)
				// fills up just before it.
				want := "dense EFBIG 268435456"
				if r.via == "mcp" {
					want = "dense ENOSPC"
				}
				if !strings.Contains(r.stdout, want) {
					t.Errorf("stdout lacks %q:\n%s", want, r.stdout)
				}
			}},
		{id: "T29", name: "SIGXFSZ for a program that does not ignore it", lang: "bash", status: ok,
			want: []string{"dd status 153"},
			code: `dd if=/dev/zero of=big bs=1 count=1 seek=300M 2>/dev/null; echo "dd status $?"; rm -f big; echo PROBE-RAN`},

		// Without root, runsc and gVisor's processes are the user's on the
		// host, like the peer: the kernel would let them signal it, trace it
		// and read its /proc files. The sandbox must not.
		{id: "T31", name: "signal, trace and read a host process of the same uid", lang: "python", status: ok, control: true,
			want: []string{"signal 0 ESRCH", "ptrace EPERM", "denied /proc/{{PEER}}/environ"},
			code: pyPrelude + `
import signal
pid = {{PEER}}
for f, secret in [("environ", b"{{CANARY_ENV}}"), ("cmdline", b"PR_SET_PTRACER_ANY"), ("maps", b"")]:
    p = "/proc/%d/%s" % (pid, f)
    try:
        data = open(p, "rb").read()
        if secret in data:
            leak("read the peer's", p, len(data), "bytes")
        print("read", p, len(data))
    except OSError as e:
        print("denied", p, err(e))
r, e = sc(101, 0x4206, pid, 0, 0)  # PTRACE_SEIZE: the tracee runs on, and is let go when we exit
if r == 0:
    leak("traced the peer", pid)
print("ptrace", e)
for sig in (0, signal.SIGSTOP, signal.SIGKILL):
    try:
        os.kill(pid, sig)
        leak("sent signal", sig, "to the peer", pid)
    except OSError as e:
        print("signal", int(sig), err(e))
ran()`,
			controlCheck: func(t *testing.T, h *threatHarness, out string) {
				for _, w := range []string{"LEAK read the peer's /proc/" + strconv.Itoa(h.controlPeer.Process.Pid) + "/environ", "LEAK traced the peer", "LEAK sent signal 9"} {
					if !strings.Contains(out, w) {
						t.Errorf("the control did not report %q", w)
					}
				}
				waitUntil(t, 10*time.Second, func() bool { return !alive(h.controlPeer.Process.Pid) })
			}},

		{id: "T32", name: "sockets and state in the user's $XDG_RUNTIME_DIR", lang: "python", status: ok, control: true,
			want: []string{"connect ENOENT", "denied {{RUNTIME_DIR}} ENOENT"},
			code: pyPrelude + `
import socket
u = socket.socket(socket.AF_UNIX)
u.settimeout(3)
try:
    u.connect("{{RUNTIME_SOCK}}")
    leak("connected to {{RUNTIME_SOCK}}")
except OSError as e:
    print("connect", err(e))
for d in ["{{RUNTIME_DIR}}", "{{RUNTIME_DIR}}/safe-run"]:
    try:
        leak("listed", d, os.listdir(d)[:20])
    except OSError as e:
        print("denied", d, err(e))
ran()`,
			controlCheck: func(t *testing.T, h *threatHarness, out string) {
				waitUntil(t, 10*time.Second, func() bool { return h.runtimeN.Load() > 0 })
			}},

		// The canary is the user's own mode-600 file: the user's processes
		// may read it, the sandbox's may not, not even through /proc.
		{id: "T33", name: "the user's own files in $HOME", lang: "python", status: ok, control: true,
			want: []string{"denied {{CANARY_FILE}} E", "denied write {{HOME}}"},
			code: pyPrelude + `
name = os.path.basename("{{CANARY_FILE}}")
for p in ["{{CANARY_FILE}}", "/proc/self/root{{CANARY_FILE}}", "/proc/1/root{{CANARY_FILE}}", "/proc/1/cwd/" + name]:
    try:
        leak("read", p, open(p).read()[:100])
    except OSError as e:
        print("denied", p, err(e))
for d in ["{{HOME}}", os.path.dirname("{{HOME}}")]:
    try:
        names = os.listdir(d)
        if name in names:
            leak("canary listed in", d)
        print("list", d, names[:20])
    except OSError as e:
        print("denied list", d, err(e))
p = os.path.join("{{HOME}}", "{{MARKER}}")
try:
    open(p, "w").write("x")
    os.remove(p)
    leak("wrote", p)
except OSError as e:
    print("denied write", p, err(e))
ran()`,
			controlCheck: func(t *testing.T, h *threatHarness, out string) {
				if !strings.Contains(out, "LEAK read "+h.canaryFile) {
					t.Errorf("the control did not read the canary")
				}
			}},
	}
}

func TestThreats(t *testing.T) {
	h := newThreatHarness(t)
	for _, tc := range threatCases() {
		t.Run(tc.id+" "+tc.name, func(t *testing.T) {
			for _, via := range []string{"cli", "mcp"} {
				if tc.only != "" && tc.only != via {
					continue
				}
				t.Run(via, func(t *testing.T) {
					r := h.runCase(t, tc, via)
					h.checkRun(t, tc, r)
					h.assertHostClean(t)
				})
			}
			if tc.control {
				t.Run("control", func(t *testing.T) {
					out := h.control(t, tc.lang, tc.code)
					t.Logf("on the host:\n%s", out)
					if !strings.Contains(out, "LEAK") {
						t.Errorf("with the restriction lifted the probe reports nothing; it cannot detect a breach:\n%s", out)
					}
					if tc.controlCheck != nil {
						tc.controlCheck(t, h, out)
					}
				})
				h.tcpN.Store(0)
				h.abstractN.Store(0)
				h.sshN.Store(0)
				h.runtimeN.Store(0)
			}
		})
	}
}

// runCase runs a case through one path, with its during hook alongside.
func (h *threatHarness) runCase(t *testing.T, tc threatCase, via string) *threatRun {
	t.Helper()
	timeout := tc.timeout
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	pid, stateDir := os.Getpid(), h.cliState
	if via == "mcp" {
		pid, stateDir = h.serverPid, h.server.stateDir
	}
	code := h.expand(tc.code, h.sandboxVars(pid))
	var wg sync.WaitGroup
	if tc.during != nil {
		wg.Add(1)
		go func() { defer wg.Done(); tc.during(t, h, stateDir) }()
	}
	var r *threatRun
	if via == "cli" {
		r = h.runCLI(t, tc.lang, code, timeout, tc.args...)
	} else {
		r = h.runMCP(t, tc.lang, code, timeout)
	}
	wg.Wait()
	return r
}

// checkRun makes the checks every case shares, then the case's own.
func (h *threatHarness) checkRun(t *testing.T, tc threatCase, r *threatRun) {
	t.Helper()
	statuses := tc.statuses
	if len(statuses) == 0 {
		statuses = []sandbox.Status{tc.status}
	}
	if !slices.Contains(statuses, r.status) {
		t.Errorf("status %s (%s), want %v", r.status, r.message, statuses)
	}
	if strings.Contains(r.stdout, "LEAK") || strings.Contains(r.stderr, "LEAK") {
		t.Errorf("the probe reached what it must not:\n%s", grepLines(r.stdout+"\n"+r.stderr, "LEAK"))
	}
	if strings.Contains(r.all, h.canaryValue) {
		t.Errorf("the canary's secret value reached the caller")
	}
	if r.status == sandbox.StatusOK && (strings.Contains(tc.code, "ran()") || strings.Contains(tc.code, "PROBE-RAN")) && !strings.Contains(r.stdout, "PROBE-RAN") {
		t.Errorf("the probe did not get to its end")
	}
	for _, w := range tc.want {
		if w = h.expand(w, probeVars{peer: h.peer.Process.Pid}); !strings.Contains(r.stdout, w) {
			t.Errorf("stdout lacks %q", w)
		}
	}
	if tc.check != nil {
		tc.check(t, h, r)
	}
	// What the probe saw, for the record (go test -v).
	t.Logf("%s: status %s; stdout head: %.400q", r.via, r.status, r.stdout)
	if t.Failed() {
		t.Logf("%s: status %s, message %q\nstdout:\n%.1500q\nstderr:\n%.1000q", r.via, r.status, r.message, r.stdout, r.stderr)
	}
}

func grepLines(text, sub string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func wantMemoryMessage(t *testing.T, h *threatHarness, r *threatRun) {
	if !strings.Contains(r.message, "memory limit of 384MiB") {
		t.Errorf("message %q does not name the memory limit", r.message)
	}
	wantPeakWithinLimit(t, h, r)
}

// wantPeakWithinLimit checks the peak memory the run's cgroup saw against
// the limit plus gVisor's headroom. Without a cgroup (the README's last
// column) the peak is the largest size of gVisor's memory file safe-run
// read while it polled: at most the limit plus what the program allocated
// in one 50 ms poll, which the same headroom bounds.
func wantPeakWithinLimit(t *testing.T, h *threatHarness, r *threatRun) {
	peak := r.result.MemoryPeakBytes
	if r.via == "mcp" {
		p, _ := r.mcpOut["memory_peak_bytes"].(float64)
		peak = int64(p)
	}
	// The kernel may force a charge or two past the limit (kernel memory),
	// so the peak may pass it by a page or so, never by a megabyte.
	limit := int64(384+96)<<20 + 1<<20
	if len(h.cgroupParents) == 0 {
		// No cgroup: safe-run's poll enforces the limit plus headroom on
		// the sentry's memory file and heap, and the peak may pass it by
		// what the sandbox adds before the next poll sees it (README,
		// "Without root"). The fast allocations stop at the memory file's
		// own bound, far below; what grows the heap is slow (file
		// metadata: about 8 MiB/s), so a few polls' worth.
		limit += 8 << 20
	}
	if peak <= 0 || peak > limit {
		t.Errorf("memory peak %d bytes, want within (0, %d]", peak, limit)
	}
	t.Logf("memory peak %.1f MiB, at most %d MiB allowed", float64(peak)/(1<<20), limit>>20)
}

// wantTruncatedOutput checks a flood's result: truncated, within the cap,
// with the true size counted (CLI) when total is known.
func wantTruncatedOutput(t *testing.T, r *threatRun, total int64) {
	truncated := r.result.StdoutTruncated
	if r.via == "mcp" {
		truncated, _ = r.mcpOut["stdout_truncated"].(bool)
	}
	if !truncated || len(r.stdout) > 1<<20+200 {
		t.Errorf("stdout of %d bytes, truncated %v; want it cut to the 1 MiB cap", len(r.stdout), truncated)
	}
	if r.via == "cli" && r.result.StdoutBytes < total {
		t.Errorf("stdout_bytes %d, want at least %d", r.result.StdoutBytes, total)
	}
	if total > 0 && !strings.HasSuffix(r.stdout, "PROBE-RAN\n") {
		t.Errorf("the tail of the output was not kept: %q", r.stdout[max(0, len(r.stdout)-100):])
	}
}

// hostResponsive checks, while a bomb runs, that the host still starts
// processes promptly.
func hostResponsive(t *testing.T, h *threatHarness, stateDir string) {
	runCgroupOf(t, stateDir, 30*time.Second)
	time.Sleep(time.Second)
	hostStartsProcesses(t)
}

func hostStartsProcesses(t *testing.T) {
	for range 3 {
		start := time.Now()
		if err := exec.Command("/bin/true").Run(); err != nil {
			t.Errorf("the host cannot start a process during the bomb: %v", err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("starting /bin/true on the host took %v during the bomb", d)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// cpuBusyLoops checks T24 while it runs: the sandbox busy with the most CPU
// of the state directory's — the probe's — holds its CPU quota where there
// is one, and the host keeps starting processes. Without root and without
// a delegated cgroup there is no quota (docs/rootless.md, "Without root", the
// `--cpus` row: not capped): the use is measured and logged, and the run
// must still end at its timeout (the case's status).
func cpuBusyLoops(t *testing.T, h *threatHarness, stateDir string) {
	cpus := 1.0 // the server's default
	if stateDir == h.cliState {
		cpus = 0.5
	}
	runCgroupOf(t, stateDir, 30*time.Second)
	time.Sleep(time.Second) // let the loops start
	var ids []string
	for _, e := range stateEntries(stateDir) {
		if _, err := os.Stat(filepath.Join(stateDir, e, "pooled")); err != nil {
			ids = append(ids, e)
		}
	}
	u0, t0 := map[string]int64{}, time.Now()
	for _, id := range ids {
		u0[id] = h.cpuUsage(stateDir, id)
	}
	time.Sleep(2 * time.Second)
	elapsed := time.Since(t0)
	busy, rate := "", -1.0
	for _, id := range ids {
		if r := float64(h.cpuUsage(stateDir, id)-u0[id]) / float64(elapsed.Nanoseconds()); r > rate {
			busy, rate = id, r
		}
	}
	t.Logf("4 busy loops used %.2f CPUs under a limit of %g", rate, cpus)
	if rate < 0.02 {
		t.Errorf("found no busy sandbox among %v (best %.3f CPUs): the probe measured nothing", ids, rate)
	}
	var quota, period int
	switch {
	case h.cgroupParents["cpu"] != "":
		data, _ := os.ReadFile(filepath.Join(h.cgroupParents["cpu"], busy, "cpu.cfs_quota_us"))
		quota, _ = strconv.Atoi(strings.TrimSpace(string(data)))
		period = 100000
	case h.cgroupParents[""] != "":
		data, _ := os.ReadFile(filepath.Join(h.cgroupParents[""], busy, "cpu.max"))
		if f := strings.Fields(string(data)); len(f) == 2 {
			quota, _ = strconv.Atoi(f[0])
			period, _ = strconv.Atoi(f[1])
		}
	default:
		t.Logf("no CPU quota to check: as uid %d without a delegated cgroup, CPU is not capped (docs/rootless.md, \"Without root\", row --cpus)", os.Getuid())
	}
	if period != 0 || h.root {
		if want := int(cpus * float64(period)); period == 0 || quota != want {
			t.Errorf("CPU quota of %s: %d per %d µs, want %d", busy, quota, period, want)
		}
		if rate > cpus*1.25+0.05 {
			t.Errorf("4 busy loops used %.2f CPUs, over the limit of %g", rate, cpus)
		}
	}
	hostStartsProcesses(t)
}

// cpuUsage reads the CPU time a run of stateDir has used, in nanoseconds:
// from its cgroup, or without one from /proc, as the sum of the user and
// system time of its host processes (runsc, the gofer, gVisor's sentry and
// the stubs the program runs in).
func (h *threatHarness) cpuUsage(stateDir, id string) int64 {
	switch {
	case h.cgroupParents["cpuacct"] != "":
		data, _ := os.ReadFile(filepath.Join(h.cgroupParents["cpuacct"], id, "cpuacct.usage"))
		n, _ := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
		return n
	case h.cgroupParents[""] != "":
		data, _ := os.ReadFile(filepath.Join(h.cgroupParents[""], id, "cpu.stat"))
		for _, l := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(l, "usage_usec "); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				return n * 1000
			}
		}
		return 0
	}
	// gVisor's systrap platform runs the program in stub processes below
	// the sentry, with no command line of their own: the run's processes
	// are those naming its directory and all their descendants. Reaped
	// children count through their parent's cutime and cstime.
	const clockTick = 100 // USER_HZ, what /proc counts times in on Linux
	var ticks int64
	seen := map[int]bool{}
	var add func(pid int)
	add = func(pid int) {
		if seen[pid] {
			return
		}
		seen[pid] = true
		if f, ok := procStat(pid); ok {
			// utime, stime, cutime and cstime are the 12th to 15th fields
			// after the command.
			for i := 11; i <= 14 && i < len(f); i++ {
				n, _ := strconv.ParseInt(f[i], 10, 64)
				ticks += n
			}
		}
		tasks, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/children")
		for _, t := range tasks {
			data, _ := os.ReadFile(t)
			for _, c := range strings.Fields(string(data)) {
				if child, err := strconv.Atoi(c); err == nil {
					add(child)
				}
			}
		}
	}
	for _, p := range sandboxProcesses(stateDir) {
		if cmdline, _ := os.ReadFile(p); strings.Contains(string(cmdline), id) {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			add(pid)
		}
	}
	return ticks * int64(time.Second) / clockTick
}

// TestThreatsAcrossRuns covers what one run leaves for the next (T26) and
// what two runs at once can do to each other (T27), through both paths.
func TestThreatsAcrossRuns(t *testing.T) {
	h := newThreatHarness(t)
	run := func(t *testing.T, via, code string, timeout time.Duration) *threatRun {
		t.Helper()
		pid := os.Getpid()
		if via == "mcp" {
			pid = h.serverPid
		}
		code = h.expand(code, h.sandboxVars(pid))
		if via == "cli" {
			return h.runCLI(t, "python", code, timeout)
		}
		return h.runMCP(t, "python", code, timeout)
	}
	for _, via := range []string{"cli", "mcp"} {
		t.Run("T26 nothing persists between runs/"+via, func(t *testing.T) {
			// The planting run finds what it planted: the checker can see it.
			first := run(t, via, persistPlant+persistCheck, 30*time.Second)
			if first.status != sandbox.StatusOK || strings.Count(first.stdout, "FOUND") != persistArtifacts {
				t.Fatalf("the planting run does not find its own %d artifacts: %s\n%s%s", persistArtifacts, first.status, first.stdout, first.stderr)
			}
			second := run(t, via, persistCheck, 30*time.Second)
			if second.status != sandbox.StatusOK || strings.Contains(second.stdout, "FOUND") || !strings.Contains(second.stdout, "PROBE-RAN") {
				t.Errorf("the next run found what the previous left: %s\n%s%s", second.status, second.stdout, second.stderr)
			}
			h.assertHostClean(t)
		})
		t.Run("T27 two runs at once cannot reach each other/"+via, func(t *testing.T) {
			stateDir := h.cliState
			if via == "mcp" {
				stateDir = h.server.stateDir
			}
			var first *threatRun
			done := make(chan struct{})
			go func() {
				defer close(done)
				first = run(t, via, neighbourPlant, 60*time.Second)
			}()
			runCgroupOf(t, stateDir, 30*time.Second)
			time.Sleep(2 * time.Second) // the first program has planted by now
			second := run(t, via, pyPrelude+neighbourProbe+"\nprobe()\nran()\n", 30*time.Second)
			<-done
			if first.status != sandbox.StatusOK || !strings.Contains(first.stdout, "FOUND process") || !strings.Contains(first.stdout, "FOUND file") ||
				!strings.Contains(first.stdout, "victim alive") {
				t.Errorf("the first run (which probes itself as a control) did not find its own process and file, or lost its victim:\n%s%s", first.stdout, first.stderr)
			}
			if second.status != sandbox.StatusOK || strings.Contains(second.stdout, "FOUND") || !strings.Contains(second.stdout, "PROBE-RAN") {
				t.Errorf("the second run reached the first:\n%s%s", second.stdout, second.stderr)
			}
			h.assertHostClean(t)
		})
	}
}

// persistPlant leaves files, SysV IPC objects and a POSIX message queue.
const persistPlant = pyPrelude + `
for p in ["/tmp/persist", "/workspace/persist", "/dev/shm/persist"]:
    open(p, "w").write("left")
libc.shmget.restype = libc.msgget.restype = libc.semget.restype = ctypes.c_int
print("shmget", libc.shmget(0x5afe0026, 4096, 0o1666))
print("msgget", libc.msgget(0x5afe0026, 0o1666))
print("semget", libc.semget(0x5afe0026, 1, 0o1666))
libc.mq_open.restype = ctypes.c_int
print("mq_open", libc.mq_open(b"/safe-run-persist", os.O_CREAT | os.O_RDWR, 0o666, None), errno.errorcode.get(ctypes.get_errno()))
`

// persistCheck prints FOUND for each artifact of persistPlant it sees.
const persistCheck = `
import os, ctypes
libc = ctypes.CDLL(None, use_errno=True)
for p in ["/tmp/persist", "/workspace/persist", "/dev/shm/persist"]:
    if os.path.exists(p):
        print("FOUND", p)
libc.shmget.restype = libc.msgget.restype = libc.semget.restype = libc.mq_open.restype = ctypes.c_int
if libc.shmget(0x5afe0026, 0, 0) >= 0:
    print("FOUND shm")
if libc.msgget(0x5afe0026, 0) >= 0:
    print("FOUND msg")
if libc.semget(0x5afe0026, 0, 0) >= 0:
    print("FOUND sem")
if libc.mq_open(b"/safe-run-persist", os.O_RDONLY) >= 0:
    print("FOUND mqueue")
print("PROBE-RAN")
`

// persistArtifacts is how many things persistPlant leaves.
const persistArtifacts = 7

// neighbourProbe looks for another run's process and files, and tries to
// signal and read them. It prints FOUND for each.
const neighbourProbe = `
import glob, signal
def probe():
    for p in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            cmd = open(p, "rb").read()
        except OSError:
            continue
        if b"t27-victim" in cmd and b"glob" not in cmd:
            pid = int(p.split("/")[2])
            print("FOUND process", pid, cmd.replace(b"\0", b" ")[:80], flush=True)
    for top in ["/workspace", "/tmp", "/dev/shm"]:
        for d, dirs, files in os.walk(top):
            for n in files:
                if n == "t27-secret":
                    print("FOUND file", os.path.join(d, n), open(os.path.join(d, n)).read(), flush=True)
`

// neighbourPlant starts a victim process and a secret file, probes itself
// (the control: the probe sees them here), and waits while a second run
// probes; its victim must survive.
const neighbourPlant = pyPrelude + neighbourProbe + `
import subprocess, time
open("/workspace/t27-secret", "w").write("secret of the first run")
victim = subprocess.Popen(["python3", "-c", "import time; time.sleep(30)", "t27-victim"])
time.sleep(0.5)
probe()
time.sleep(8)
print("victim alive" if victim.poll() is None else "victim dead", flush=True)
victim.kill()
ran()
`

// TestThreatSessions covers sessions: links are not followed by the file
// tools (T4), state stays within its own session (T26), and two sessions
// cannot reach each other (T27).
func TestThreatSessions(t *testing.T) {
	h := newThreatHarness(t)
	ts := h.server
	create := func() string {
		res, info := ts.tool(t, "create_session", map[string]any{"language": "python"})
		id, _ := info["session_id"].(string)
		if res.IsError || id == "" {
			t.Fatalf("create_session: %s", text(res))
		}
		return id
	}
	cell := func(id, code string) *threatRun {
		return mcpRun(t, ts, map[string]any{"language": "python", "session_id": id, "code": h.expand(code, h.sandboxVars(h.serverPid)), "timeout_seconds": 30})
	}
	a, b := create(), create()

	t.Run("T4 file tools do not follow links", func(t *testing.T) {
		cell(a, `import os
os.symlink("{{CANARY_FILE}}", "canary")
os.symlink("/etc/passwd", "passwd")
os.symlink("/", "root")`)
		for _, p := range []string{"canary", "passwd", "root/etc/passwd"} {
			res, _ := ts.tool(t, "read_file", map[string]any{"session_id": a, "path": p})
			if !res.IsError || strings.Contains(text(res), "root:x:0:0") || strings.Contains(text(res), h.canaryValue) {
				t.Errorf("read_file %s: %s", p, text(res))
			}
		}
		res, _ := ts.tool(t, "write_file", map[string]any{"session_id": a, "path": "passwd", "content": "overwritten"})
		check := cell(a, `print(open("/etc/passwd").read()[:10], os.path.islink("passwd"))`)
		if strings.Contains(check.stdout, "overwritten") {
			t.Errorf("write_file followed a link: %s / %s", text(res), check.stdout)
		}
		if res, _ := ts.tool(t, "list_files", map[string]any{"session_id": a}); !strings.Contains(text(res), "canary") {
			t.Errorf("list_files does not list the links: %s", text(res))
		}
	})
	t.Run("T26 state stays in its own session", func(t *testing.T) {
		if r := cell(a, persistPlant+persistCheck); strings.Count(r.stdout, "FOUND") != persistArtifacts {
			t.Fatalf("the planting session does not find its own artifacts:\n%s%s", r.stdout, r.stderr)
		}
		if r := cell(a, persistCheck); strings.Count(r.stdout, "FOUND") != persistArtifacts {
			t.Errorf("a later call of the same session lost its state:\n%s%s", r.stdout, r.stderr)
		}
		if r := cell(b, persistCheck); strings.Contains(r.stdout, "FOUND") || !strings.Contains(r.stdout, "PROBE-RAN") {
			t.Errorf("another session sees the first one's state:\n%s%s", r.stdout, r.stderr)
		}
	})
	t.Run("T27 sessions cannot reach each other", func(t *testing.T) {
		r := cell(a, pyPrelude+neighbourProbe+`
import subprocess, time
open("/workspace/t27-secret", "w").write("secret of session a")
victim = subprocess.Popen(["python3", "-c", "import time; time.sleep(300)", "t27-victim"])
time.sleep(0.5)
probe()`)
		if !strings.Contains(r.stdout, "FOUND process") || !strings.Contains(r.stdout, "FOUND file") {
			t.Fatalf("session a does not find its own process and file (control):\n%s%s", r.stdout, r.stderr)
		}
		r = cell(b, pyPrelude+neighbourProbe+"\nprobe()\nran()\n")
		if strings.Contains(r.stdout, "FOUND") || !strings.Contains(r.stdout, "PROBE-RAN") {
			t.Errorf("session b reached session a:\n%s%s", r.stdout, r.stderr)
		}
		if r := cell(a, `print("victim", victim.poll())`); !strings.Contains(r.stdout, "victim None") {
			t.Errorf("session a's victim did not survive: %s%s", r.stdout, r.stderr)
		}
	})
	for _, id := range []string{a, b} {
		if res, _ := ts.tool(t, "close_session", map[string]any{"session_id": id}); res.IsError {
			t.Errorf("close_session: %s", text(res))
		}
	}
	h.assertHostClean(t)
}

// TestSeccompDeniedFamilies runs every denied family (deniedCalls) in the
// sandbox, where each must be refused with EPERM — the filter's answer —
// and, as positive controls, in gVisor without the filter and on the host
// as the suite's user: for each call at least one of them must answer
// otherwise, so the probe would notice the filter missing. An ordinary
// user's kernel refuses many of these calls itself, so without root the
// host control runs twice: as the user, and as root of a user namespace
// with a network namespace of its own (where, e.g., packet sockets open).
func TestSeccompDeniedFamilies(t *testing.T) {
	h := newThreatHarness(t)
	probe := syscallProbe()
	parse := func(out string) map[string]string {
		got := map[string]string{}
		for _, l := range strings.Split(out, "\n") {
			if rest, ok := strings.CutPrefix(l, "call "); ok {
				fields := strings.Fields(rest)
				name := strings.Join(fields[:len(fields)-2], " ")
				got[name] = fields[len(fields)-1]
			}
		}
		return got
	}
	sandboxed := h.runCLI(t, "python", probe, 30*time.Second)
	viaMCP := h.runMCP(t, "python", probe, 30*time.Second)
	type control struct{ name, out string }
	controls := []control{{"gVisor without filter", gvisorWithoutFilter(t, h, probe)}}
	if h.root {
		controls = append(controls, control{"host as root", h.control(t, "python", probe)})
	} else {
		controls = append(controls, control{fmt.Sprintf("host as uid %d", os.Getuid()), h.control(t, "python", probe)})
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := hostUserNamespace(ctx, "--net", "--", h.controlPython, "-c", h.expand(probe, probeVars{}))
		cmd.Dir = t.TempDir()
		out, _ := cmd.CombinedOutput()
		controls = append(controls, control{"host, root of a user+net namespace", string(out)})
	}
	inSandbox, inMCP := parse(sandboxed.stdout), parse(viaMCP.stdout)
	answers := make([]map[string]string, len(controls))
	header := fmt.Sprintf("%-32s %-8s %-8s", "call", "cli", "mcp")
	for i, c := range controls {
		answers[i] = parse(c.out)
		header += fmt.Sprintf(" %-24s", c.name)
	}
	t.Log(header)
	for _, c := range deniedCalls {
		row := fmt.Sprintf("%-32s %-8s %-8s", c.name, inSandbox[c.name], inMCP[c.name])
		detects := false
		for i, ctl := range controls {
			got := answers[i][c.name]
			row += fmt.Sprintf(" %-24s", got)
			if got == "" {
				t.Errorf("%s: the control %q did not make the call", c.name, ctl.name)
			}
			detects = detects || (got != "" && got != "EPERM")
		}
		t.Log(row)
		if inSandbox[c.name] != "EPERM" || inMCP[c.name] != "EPERM" {
			t.Errorf("%s: answered %s (CLI) and %s (MCP) in the sandbox, want EPERM", c.name, inSandbox[c.name], inMCP[c.name])
		}
		if !detects {
			t.Errorf("%s: EPERM in every control too, so the probe cannot tell the filter from its absence", c.name)
		}
	}
	if t.Failed() {
		t.Logf("sandbox:\n%s%s", sandboxed.stdout, sandboxed.stderr)
		for _, c := range controls {
			t.Logf("%s:\n%s", c.name, c.out)
		}
	}
	h.assertHostClean(t)
}

// TestThreatRequestAbuse sends malformed and oversized requests (T30) to
// both paths: each gets one clear error naming the problem, and the server
// keeps serving.
func TestThreatRequestAbuse(t *testing.T) {
	h := newThreatHarness(t)
	ts := h.server
	big := strings.Repeat("#", 100<<20)
	many := make([]any, 3000)
	for i := range many {
		many[i] = map[string]any{"path": fmt.Sprintf("f%d.txt", i), "content": "x"}
	}
	for _, tc := range []struct {
		name string
		args map[string]any
		want string
	}{
		{"unknown language", map[string]any{"language": "cobol", "code": "x"}, `"cobol" is not available`},
		{"empty code", map[string]any{"language": "python", "code": ""}, "is empty"},
		{"100 MB of code", map[string]any{"language": "python", "code": big}, "over the 1MiB limit"},
		{"NUL bytes", map[string]any{"language": "python", "code": "print(1)\x00"}, "NUL byte"},
		{"negative timeout", map[string]any{"language": "bash", "code": "true", "timeout_seconds": -5}, `"timeout_seconds" must be greater than 0`},
		{"huge timeout", map[string]any{"language": "bash", "code": "true", "timeout_seconds": 1e12}, `"timeout_seconds" must be greater than 0 and at most`},
		{"file name with ..", map[string]any{"language": "bash", "code": "true", "files": []any{map[string]any{"path": "a/../../etc/x", "content": "x"}}}, "leaves the workspace"},
		{"absolute file name", map[string]any{"language": "bash", "code": "true", "files": []any{map[string]any{"path": "/etc/passwd", "content": "x"}}}, "is absolute"},
		{"file over the code", map[string]any{"language": "bash", "code": "true", "files": []any{map[string]any{"path": "main.sh", "content": "x"}}}, "where the code is written"},
		{"thousands of files", map[string]any{"language": "bash", "code": "true", "files": many}, "3000 files given, the limit is 256"},
	} {
		t.Run("mcp/"+tc.name, func(t *testing.T) {
			res, _ := ts.tool(t, "run_code", tc.args)
			if !res.IsError || !strings.Contains(text(res), tc.want) {
				t.Errorf("isError %v, %.300s; want a tool error containing %q", res.IsError, text(res), tc.want)
			}
			if r := h.runMCP(t, "bash", "echo still serving", 30*time.Second); r.stdout != "still serving\n" {
				t.Errorf("the server stopped serving: %+v", r)
			}
		})
	}
	t.Run("mcp/session file tools", func(t *testing.T) {
		_, info := ts.tool(t, "create_session", map[string]any{"language": "bash"})
		id, _ := info["session_id"].(string)
		for _, p := range []string{"../x", "/etc/passwd", "a/../../x", ""} {
			if res, _ := ts.tool(t, "write_file", map[string]any{"session_id": id, "path": p, "content": "x"}); !res.IsError {
				t.Errorf("write_file %q: %s", p, text(res))
			}
			if res, _ := ts.tool(t, "read_file", map[string]any{"session_id": id, "path": p}); !res.IsError {
				t.Errorf("read_file %q: %s", p, text(res))
			}
		}
		ts.tool(t, "close_session", map[string]any{"session_id": id})
	})
	if vmRSS, _ := rss(h.serverPid); vmRSS > 1<<30 {
		t.Errorf("the server holds %d MiB after the oversized requests", vmRSS>>20)
	}

	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	bigFile := write("big.py", []byte(big))
	nul := write("nul.py", []byte("print(1)\x00\n"))
	invalid := write("invalid.py", []byte("print('\xff\xfe')\n"))
	data := write("data.txt", []byte("x"))
	link := filepath.Join(dir, "link.txt")
	os.Symlink(h.canaryFile, link)
	manyFiles := []string{"run", "--lang", "bash", "-c", "true"}
	for i := range 300 {
		manyFiles = append(manyFiles, "--file", fmt.Sprintf("%s:f%d", data, i))
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown language", []string{"run", "--lang", "cobol", "-c", "x"}, `"cobol" is not available`},
		{"empty code", []string{"run", "--lang", "python", "-c", ""}, "no code given"},
		{"100 MB of code", []string{"run", "--lang", "python", bigFile}, "over the 1MiB limit"},
		{"NUL bytes", []string{"run", "--lang", "python", nul}, "NUL byte"},
		{"invalid UTF-8", []string{"run", "--lang", "python", invalid}, "not valid UTF-8"},
		{"negative timeout", []string{"run", "--lang", "bash", "--timeout", "-5s", "-c", "true"}, "timeout: is negative"},
		{"huge timeout", []string{"run", "--lang", "bash", "--timeout", "10000h", "-c", "true"}, "timeout: 10000h0m0s is out of range"},
		{"file name with ..", []string{"run", "--lang", "bash", "--file", data + ":../x", "-c", "true"}, "leaves the workspace"},
		{"absolute file name", []string{"run", "--lang", "bash", "--file", data + ":/etc/x", "-c", "true"}, "is absolute"},
		{"thousands of files", manyFiles, "300 files given, the limit is 256"},
	} {
		t.Run("cli/"+tc.name, func(t *testing.T) {
			r := safeRun(t, "", tc.args...)
			lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
			if r.code != exitUsage || len(lines) != 1 || !strings.Contains(r.stderr, tc.want) {
				t.Errorf("exit %d, stderr %.300q; want exit 2 and one line containing %q", r.code, r.stderr, tc.want)
			}
		})
	}
	// A --file that is a link on the host is the caller's own file: the CLI
	// reads what it names, as cp would. The sandbox gets a regular file.
	t.Run("cli/host symlink given as --file", func(t *testing.T) {
		r := h.runCLI(t, "bash", `[ -L data.txt ] && echo LEAK link; [ -f data.txt ] && echo PROBE-RAN`, 30*time.Second, "--file", link+":data.txt")
		if r.status != sandbox.StatusOK || strings.Contains(r.stdout, "LEAK") || !strings.Contains(r.stdout, "PROBE-RAN") {
			t.Errorf("%s %s %s", r.status, r.stdout, r.stderr)
		}
	})
	h.assertHostClean(t)
}

// TestThreatSuiteCoversTheCatalogue keeps the suite and the catalogue in
// step: every T-case has a row or a test.
func TestThreatSuiteCoversTheCatalogue(t *testing.T) {
	covered := map[string]bool{"T26": true, "T27": true, "T30": true} // TestThreatsAcrossRuns, TestThreatRequestAbuse
	for _, tc := range threatCases() {
		covered[tc.id] = true
	}
	for i := 1; i <= 33; i++ {
		if id := "T" + strconv.Itoa(i); !covered[id] {
			t.Errorf("%s has no case", id)
		}
	}
}
