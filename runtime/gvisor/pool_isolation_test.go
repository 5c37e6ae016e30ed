package gvisor

import (
	"strings"
	"testing"

	"github.com/safe-run/safe-run/sandbox"
)

// TestPoolIsolationAcrossCalls has call N of each pooled language leave a
// file (in the workspace, /tmp and, for Python, /dev/shm), a running
// process that left the program's group, an environment change and a
// module-level (for Python also a builtin) variable behind, and checks
// that call N+1 of the same pool finds none of it.
func TestPoolIsolationAcrossCalls(t *testing.T) {
	tests := []struct {
		lang          string
		leave, search string
	}{
		{"python", `import builtins, os, json, subprocess
open("/workspace/left.txt", "w").write("x")
open("/tmp/left.txt", "w").write("x")
open("/dev/shm/left", "w").write("x")
os.environ["SAFE_RUN_LEFT"] = "1"
json.SAFE_RUN_LEFT = 1
builtins.SAFE_RUN_LEFT = 1
subprocess.Popen(["sleep", "600"], start_new_session=True)
print("left")`, `import builtins, os, json
found = [p for p in ("/workspace/left.txt", "/tmp/left.txt", "/dev/shm/left") if os.path.exists(p)]
if "SAFE_RUN_LEFT" in os.environ: found.append("env")
if hasattr(json, "SAFE_RUN_LEFT"): found.append("module variable")
if hasattr(builtins, "SAFE_RUN_LEFT"): found.append("builtin")
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        if open("/proc/%s/cmdline" % pid).read().startswith("sleep"): found.append("process")
    except OSError:
        pass
print("found:", found)`},
		{"node", `const fs = require('fs'), cp = require('child_process');
fs.writeFileSync('/workspace/left.txt', 'x'); fs.writeFileSync('/tmp/left.txt', 'x');
process.env.SAFE_RUN_LEFT = '1'; require('path').SAFE_RUN_LEFT = 1; globalThis.SAFE_RUN_LEFT = 1;
cp.spawn('sleep', ['600'], {detached: true, stdio: 'ignore'}).unref();
console.log('left');`, `const fs = require('fs');
const found = ['/workspace/left.txt', '/tmp/left.txt'].filter((p) => fs.existsSync(p));
if (process.env.SAFE_RUN_LEFT) found.push('env');
if (require('path').SAFE_RUN_LEFT || globalThis.SAFE_RUN_LEFT) found.push('module variable');
for (const pid of fs.readdirSync('/proc').filter((p) => /^\d+$/.test(p))) {
  try { if (fs.readFileSync('/proc/' + pid + '/cmdline', 'utf8').startsWith('sleep')) found.push('process'); } catch {}
}
console.log('found: [' + found.join(', ') + ']');`},
		{"bash", `echo x >/workspace/left.txt; echo x >/tmp/left.txt
export SAFE_RUN_LEFT=1; SAFE_RUN_VAR=1
setsid sleep 600 </dev/null >/dev/null 2>&1 &
echo left`, `found=()
for p in /workspace/left.txt /tmp/left.txt; do [ -e "$p" ] && found+=("$p"); done
[ -n "${SAFE_RUN_LEFT:-}" ] && found+=(env)
[ -n "${SAFE_RUN_VAR:-}" ] && found+=("module variable")
for c in /proc/[0-9]*/cmdline; do case "$(tr '\0' ' ' <"$c" 2>/dev/null)" in sleep*) found+=(process);; esac; done
echo "found: [${found[*]}]"`},
	}
	var langs []string
	for _, tt := range tests {
		langs = append(langs, tt.lang)
	}
	rt := newPoolRuntime(t, langs...)
	var ids []string
	for _, tt := range tests {
		t.Run(tt.lang, func(t *testing.T) {
			for i, code := range []string{tt.leave, tt.search} {
				pooled := waitPooled(t, rt, tt.lang)
				res := mustRun(t, rt, sandbox.Job{Language: tt.lang, Code: code})
				wantStatus(t, res, sandbox.StatusOK)
				if res.SandboxID != pooled {
					t.Fatalf("call %d ran in %s, not in the pooled sandbox %s", i, res.SandboxID, pooled)
				}
				ids = append(ids, res.SandboxID)
				if i == 1 && strings.TrimSpace(res.Stdout) != "found: []" {
					t.Errorf("call N+1 saw what call N left: %s", res.Stdout)
				}
			}
		})
	}
	rt.Close()
	assertNothingLeft(t, rt, ids)
}

// TestPoolRunsAsCold compares what a pooled and a cold run see of their own
// files and ending: the code file's owner and mode, the output directory's,
// the traceback's file and line, a background child holding stdout, and
// the exit by KeyboardInterrupt.
func TestPoolRunsAsCold(t *testing.T) {
	jobs := []sandbox.Job{
		{Language: "python", OutputDir: "out", Code: `import os
for p in ("main.py", "out"):
    st = os.stat(p)
    print(p, st.st_uid, st.st_gid, oct(st.st_mode))
print(os.getuid(), os.getgid())`},
		{Language: "node", OutputDir: "out", Code: `const fs = require('fs');
for (const p of ['main.js', 'out']) { const st = fs.statSync(p); console.log(p, st.uid, st.gid, st.mode.toString(8)); }`},
		{Language: "python", Code: "x = 1\n\nraise ValueError('line 3')"},
		{Language: "python", Code: "import subprocess\nsubprocess.Popen(['sleep', '5'])\nprint('main done')"},
		{Language: "python", Code: "print('before', flush=True)\nraise KeyboardInterrupt"},
		{Language: "python", Code: "import atexit, threading, time\natexit.register(lambda: print('atexit'))\nthreading.Thread(target=lambda: (time.sleep(0.2), print('thread'))).start()\nraise SystemExit('bye')"},
		{Language: "python", OutputDir: "out", Code: "import os\nos.makedirs('out/sub')\nopen('out/sub/a.txt', 'w').write('a')"},
	}
	run := func(rt *testRuntime, wait bool) []sandbox.Result {
		var out []sandbox.Result
		for _, job := range jobs {
			pooled := ""
			if wait {
				pooled = waitPooled(t, rt, job.Language)
			}
			res := mustRun(t, rt, job)
			if wait && res.SandboxID != pooled {
				t.Fatalf("%q ran in %s, not in the pooled sandbox %s", job.Code, res.SandboxID, pooled)
			}
			out = append(out, res)
		}
		return out
	}
	cold := run(newTestRuntime(t, sandbox.Policy{}), false)
	warm := run(newPoolRuntime(t, "python", "node"), true)
	for i := range jobs {
		c, w := cold[i], warm[i]
		if c.Status != w.Status || c.ExitCode != w.ExitCode || c.Signal != w.Signal || c.Stdout != w.Stdout || c.Stderr != w.Stderr ||
			len(c.Files) != len(w.Files) || (len(c.Files) > 0 && c.Files[0].Path != w.Files[0].Path) {
			t.Errorf("job %d (%s %q) differs:\ncold: %s %d %q stdout %q stderr %q files %v\nwarm: %s %d %q stdout %q stderr %q files %v",
				i, jobs[i].Language, jobs[i].Code,
				c.Status, c.ExitCode, c.Signal, c.Stdout, c.Stderr, c.Files,
				w.Status, w.ExitCode, w.Signal, w.Stdout, w.Stderr, w.Files)
		}
	}
	if !strings.Contains(warm[0].Stdout, "main.py 65534 65534 0o100644") || !strings.Contains(warm[0].Stdout, "out 65534 65534 0o40755") {
		t.Errorf("pooled files: %q, want main.py and out/ owned by 65534 with modes 0644 and 0755", warm[0].Stdout)
	}
	if !strings.Contains(warm[2].Stderr, `main.py", line 3`) {
		t.Errorf("pooled traceback %q does not name main.py, line 3", warm[2].Stderr)
	}
}
