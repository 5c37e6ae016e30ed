//go:build linux

package agent_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/safe-run/safe-run/agent"
)

// coldRun runs argv with files as a cold one-shot sandbox would: no warm
// interpreter.
func coldRun(t *testing.T, files []agent.File, argv []string, stdin string) run {
	t.Helper()
	return serveOne(t, t.TempDir(), agent.Request{Files: files, Argv: argv, Stdin: []byte(stdin), Timeout: 5 * time.Second, OutputBytes: 1 << 20})
}

// sameEnd checks that a warm run ended as the cold run of the same program.
func sameEnd(t *testing.T, name string, warm, cold run) {
	t.Helper()
	w, c := warm.exit, cold.exit
	if w.Code != c.Code || w.Signal != c.Signal || w.TimedOut != c.TimedOut || w.Error != c.Error {
		t.Errorf("%s: warm ended code %d signal %q timed out %v error %q; cold code %d signal %q timed out %v error %q",
			name, w.Code, w.Signal, w.TimedOut, w.Error, c.Code, c.Signal, c.TimedOut, c.Error)
	}
	if !bytes.Equal(warm.stdout, cold.stdout) {
		t.Errorf("%s: warm stdout %q, cold %q", name, warm.stdout, cold.stdout)
	}
}

// TestWarmPythonEndsAsCold runs programs that end in every way a Python
// program can, warm and cold, and checks that both end alike: exit codes
// of SystemExit with an int, None or a string, os._exit (no report from
// the driver), signals, KeyboardInterrupt (Python then kills itself with
// SIGINT), atexit functions and non-daemon threads that print after the
// program's end.
func TestWarmPythonEndsAsCold(t *testing.T) {
	tests := []struct{ name, code, stderr string }{
		{"falls off the end", "print('a')\n", ""},
		{"SystemExit int", "import sys\nprint('a')\nsys.exit(4)\n", ""},
		{"SystemExit None", "raise SystemExit(None)\n", ""},
		{"SystemExit str", "raise SystemExit('bye')\n", "bye"},
		{"SystemExit over 255", "raise SystemExit(257)\n", ""},
		{"exception", "x = 1\nraise ValueError('boom')\n", `main.py", line 2`},
		{"os._exit", "import os\nprint('a', flush=True)\nos._exit(6)\n", ""},
		{"signal", "import os, signal\nprint('a', flush=True)\nos.kill(os.getpid(), signal.SIGTERM)\n", ""},
		{"KeyboardInterrupt", "raise KeyboardInterrupt\n", "KeyboardInterrupt"},
		{"atexit and threads", "import atexit, threading, time\natexit.register(lambda: print('atexit'))\n" +
			"threading.Thread(target=lambda: (time.sleep(0.1), print('thread'))).start()\nprint('main')\n", ""},
		{"atexit exit code", "import atexit, sys\natexit.register(lambda: sys.exit(9))\n", ""},
		{"stdin", "import sys\nprint(sys.stdin.read().upper())\n", ""},
		// Only stdio, as cold (and the listing's own descriptor): none of
		// the driver's, which the program could write a report to.
		{"descriptors", "import os\nprint(sorted(int(f) for f in os.listdir('/proc/self/fd')))\n", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			files := []agent.File{{Path: "main.py", Data: []byte(tt.code)}}
			argv := []string{"python3", "-u", "main.py"}
			_, warm := warmRun(t, "python", nil, files, argv, "in")
			cold := coldRun(t, files, argv, "in")
			sameEnd(t, tt.name, warm, cold)
			if !strings.Contains(string(warm.stderr), tt.stderr) || !strings.Contains(string(cold.stderr), tt.stderr) {
				t.Errorf("stderr lacks %q: warm %q, cold %q", tt.stderr, warm.stderr, cold.stderr)
			}
		})
	}
}

// TestWarmNodeEndsAsCold is TestWarmPythonEndsAsCold for Node.
func TestWarmNodeEndsAsCold(t *testing.T) {
	tests := []struct{ name, code, stderr string }{
		{"falls off the end", "console.log('a')\n", ""},
		{"exitCode", "process.exitCode = 4\n", ""},
		{"process.exit", "console.log('a'); process.exit(3); console.log('b')\n", ""},
		{"exception", "const x = 1;\nthrow new Error('boom');\n", "main.js:2"},
		{"async exception", "setTimeout(() => { throw new Error('later') }, 10)\n", "Error: later"},
		{"unhandled rejection", "Promise.reject(new Error('rejected'))\n", "rejected"},
		{"signal", "console.log('a'); process.kill(process.pid, 'SIGTERM')\n", ""},
		{"exit listeners", "process.on('exit', (c) => console.log('exit', c)); setTimeout(() => process.on('exit', () => { console.log('late'); process.exitCode = 5 }), 10)\n", ""},
		{"timers", "setTimeout(() => console.log('timer'), 50); console.log('main')\n", ""},
		{"stdin", "console.log(require('fs').readFileSync(0, 'utf8').toUpperCase())\n", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			files := []agent.File{{Path: "main.js", Data: []byte(tt.code)}}
			argv := []string{"node", "main.js"}
			_, warm := warmRun(t, "node", nil, files, argv, "in")
			cold := coldRun(t, files, argv, "in")
			sameEnd(t, tt.name, warm, cold)
			if !strings.Contains(string(warm.stderr), tt.stderr) || !strings.Contains(string(cold.stderr), tt.stderr) {
				t.Errorf("stderr lacks %q: warm %q, cold %q", tt.stderr, warm.stderr, cold.stderr)
			}
		})
	}
}

// TestWarmNodeLoadsAsCold checks that the warm Node loads its main module
// as `node main.js` does, whether it compiles the bytes it wrote or lets the
// loader read the file: the module's identity and paths, a package.json
// that makes the file an ES module (the warm Node does not serve such a
// run: the program starts cold), ES module syntax, a byte order mark and
// bytes that are not UTF-8.
func TestWarmNodeLoadsAsCold(t *testing.T) {
	identity := "const path = require('path');\n" +
		"console.log(require.main === module, module.id, module.loaded, module.parent, path.basename(__filename), __filename === process.argv[1],\n" +
		"  __dirname === process.cwd(), module.paths[0] === path.join(process.cwd(), 'node_modules'), require.resolve('./main.js') === __filename,\n" +
		"  require.cache[__filename] === module, Object.keys(require.cache).length, require.extensions['.js'] === require('module')._extensions['.js'])\n"
	tests := []struct {
		name  string
		files []agent.File
	}{
		{"identity", []agent.File{{Path: "main.js", Data: []byte(identity)}}},
		{"package.json type module", []agent.File{{Path: "main.js", Data: []byte("console.log(typeof require, typeof module)\n")}, {Path: "package.json", Data: []byte(`{"type": "module"}`)}}},
		{"import", []agent.File{{Path: "main.js", Data: []byte("import { sep } from 'path';\nconsole.log(sep)\n")}}},
		{"byte order mark", []agent.File{{Path: "main.js", Data: []byte("\ufeffconsole.log('bom')\n")}}},
		{"not UTF-8", []agent.File{{Path: "main.js", Data: []byte("console.log('\xff\xfe'.length)\n")}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			argv := []string{"node", "main.js"}
			_, warm := warmRun(t, "node", nil, tt.files, argv, "")
			cold := coldRun(t, tt.files, argv, "")
			sameEnd(t, tt.name, warm, cold)
			if len(cold.stdout) == 0 && cold.exit.Code == 0 {
				t.Errorf("the cold run printed nothing; stderr %q", cold.stderr)
			}
		})
	}
}

// TestWarmNameEndsTheRun checks that a warm run ends when its process is
// named "srexit:CODE" and its stdio closed, as the driver does at the end,
// not at the exit of its process: here the program does both itself and
// then sleeps far beyond the test's deadline, which the agent would wait
// for if it waited for the exit. (A program can end its own run early so,
// as it could by exiting.)
func TestWarmNameEndsTheRun(t *testing.T) {
	code := `import ctypes, os, time
print("named", flush=True)
ctypes.CDLL(None).prctl(15, b"srexit:7", 0, 0, 0)
os.closerange(0, 3)
time.sleep(60)
`
	_, r := warmRun(t, "python", nil, []agent.File{{Path: "main.py", Data: []byte(code)}}, []string{"python3", "-u", "main.py"}, "")
	if r.exit.Code != 7 || r.exit.TimedOut || r.exit.Signal != "" || string(r.stdout) != "named\n" {
		t.Errorf("exit %+v, stdout %q; want code 7 from the name, with the output", r.exit, r.stdout)
	}
}

// TestWarmDriverClosesItsDescriptors runs the Python and Node drivers by
// hand, as the agent does, and checks that each closes its status
// descriptor once it has the run (EOF there, no report), before the
// program runs, and then exits with the program's code.
func TestWarmDriverClosesItsDescriptors(t *testing.T) {
	for _, tc := range []struct {
		kind, bin, file, code string
	}{
		{"python", "python3", "main.py", "print('out')\nimport sys; sys.exit(5)\n"},
		{"node", "node", "main.js", "console.log('out'); process.exitCode = 5\n"},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			if _, err := exec.LookPath(tc.bin); err != nil {
				t.Skipf("no %s on this host", tc.bin)
			}
			dir := t.TempDir()
			src, err := os.ReadFile(filepath.Join("drivers", map[string]string{"python": "warm.py", "node": "warm.js"}[tc.kind]))
			if err != nil {
				t.Fatal(err)
			}
			args := map[string][]string{"python": {"-u", "-c", string(src)}, "node": {"-e", string(src)}}[tc.kind]
			cmd := exec.Command(tc.bin, args...)
			cmd.Dir = dir
			outR, outW, _ := os.Pipe()
			cmdR, cmdW, _ := os.Pipe()
			statR, statW, _ := os.Pipe()
			cmd.Stdout, cmd.Stderr = outW, os.Stderr
			cmd.ExtraFiles = []*os.File{cmdR, statW}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Process.Kill()
			outW.Close()
			cmdR.Close()
			statW.Close()
			status := make([]byte, 64)
			if n, _ := statR.Read(status); string(status[:n]) != "ready\n" {
				t.Fatalf("first answer %q, want ready", status[:n])
			}
			msg := agent.RunMessage(&agent.File{Path: tc.file, Mode: 0o644, Data: []byte(tc.code)}, "", false, []string{tc.bin, tc.file})
			if _, err := cmdW.Write(msg); err != nil {
				t.Fatal(err)
			}
			cmdW.Close()
			rest, _ := readAll(statR)
			out, _ := readAll(outR)
			if len(rest) != 0 || string(out) != "out\n" {
				t.Errorf("status after the run %q, stdout %q; want nothing (closed), then %q", rest, out, "out\n")
			}
			fi, err := os.Stat(filepath.Join(dir, tc.file))
			if err != nil || fi.Mode().Perm() != 0o644 {
				t.Errorf("the driver's code file: %v, %v; want mode 0644", fi, err)
			}
			if err := cmd.Wait(); cmd.ProcessState.ExitCode() != 5 {
				t.Errorf("the driver exited %v, want code 5", err)
			}
		})
	}
}

func readAll(f *os.File) ([]byte, error) {
	var b bytes.Buffer
	_, err := b.ReadFrom(f)
	return b.Bytes(), err
}

// TestWarmBackgroundChildHoldsStdout checks that a child the program leaves
// running with its stdout (here in a session of its own, so that it escapes
// the agent's kill outside a sandbox) does not keep the run from ending,
// and that all the main program wrote comes back.
func TestWarmBackgroundChildHoldsStdout(t *testing.T) {
	code := `import subprocess, os
p = subprocess.Popen(["sleep", "30"], start_new_session=True)
open("child.pid", "w").write(str(p.pid))
print("main program output")
`
	dir := t.TempDir()
	s := serve(t, agent.Config{Workdir: dir, OneShot: true},
		agent.Request{Op: agent.OpWarm, Interpreter: "python", Timeout: 5 * time.Second},
		agent.Request{Files: []agent.File{{Path: "main.py", Data: []byte(code)}}, Argv: []string{"python3", "-u", "main.py"}, Timeout: 5 * time.Second, OutputBytes: 1 << 20},
	)
	if data, err := os.ReadFile(filepath.Join(dir, "child.pid")); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil {
			killSleep(t, pid)
		}
	}
	runs := s.runs(t)
	if len(runs) != 2 || runs[1].exit.Code != 0 || string(runs[1].stdout) != "main program output\n" {
		t.Fatalf("events: %s", dump(s.events))
	}
}

// TestWarmCodeFile checks the file the driver writes for the run: the
// request's bytes, its exact mode whatever the umask, and the output
// directory made, as the agent makes them for a cold run.
func TestWarmCodeFile(t *testing.T) {
	for _, kind := range []string{"python", "node"} {
		t.Run(kind, func(t *testing.T) {
			bin, file := driverKind(t, kind)
			var code string
			if kind == "python" {
				code = "import os\nprint(oct(os.stat(__file__).st_mode & 0o7777), os.path.isdir('out/plots'))\n"
			} else {
				code = "const fs = require('fs');\nconsole.log('0o' + (fs.statSync(__filename).mode & 0o7777).toString(8), fs.statSync('out/plots').isDirectory())\n"
			}
			dir := t.TempDir()
			s := serve(t, agent.Config{Workdir: dir, OneShot: true},
				agent.Request{Op: agent.OpWarm, Interpreter: kind, Timeout: 5 * time.Second},
				agent.Request{Files: []agent.File{{Path: file, Data: []byte(code), Mode: 0o640}, {Path: "data/in.txt", Data: []byte("x")}},
					Argv: []string{bin, file}, Timeout: 5 * time.Second, OutputBytes: 1 << 20,
					Collect: &agent.Collect{Dir: "out/plots", MaxFiles: 10, MaxFileBytes: 100, MaxTotalBytes: 100}},
			)
			runs := s.runs(t)
			if len(runs) != 2 {
				t.Fatalf("events: %s", dump(s.events))
			}
			if got := string(runs[1].stdout); got != "0o640 True\n" && got != "0o640 true\n" {
				t.Errorf("the program saw %q, want mode 0o640 and the output directory", got)
			}
			data, err := os.ReadFile(filepath.Join(dir, file))
			if err != nil || string(data) != code {
				t.Errorf("code file %q, %v; want the request's bytes", data, err)
			}
			if data, err := os.ReadFile(filepath.Join(dir, "data/in.txt")); err != nil || string(data) != "x" {
				t.Errorf("the request's other file: %q, %v", data, err)
			}
			for _, d := range []string{"out", "out/plots"} {
				fi, err := os.Stat(filepath.Join(dir, d))
				if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o755&^umask() {
					t.Errorf("%s: %v %v; want a directory with mode %o", d, fi, err, 0o755&^umask())
				}
			}
		})
	}
}

// driverKind is the interpreter and code file of a warm driver's kind; it
// skips the test on a host without that interpreter.
func driverKind(t *testing.T, kind string) (bin, file string) {
	t.Helper()
	bin = map[string]string{"python": "python3", "node": "node"}[kind]
	if _, err := exec.LookPath(bin); err != nil {
		t.Skipf("no %s on this host", bin)
	}
	return bin, map[string]string{"python": "main.py", "node": "main.js"}[kind]
}

func umask() os.FileMode {
	// The agent, and so its drivers, run with the test's umask.
	m := syscallUmask(0)
	syscallUmask(m)
	return os.FileMode(m)
}

// TestWarmPrimeReseeds checks that priming reseeds the generators a
// sandbox restored from a checkpoint shares with its siblings. The preload
// here seeds them with fixed values at import, as a checkpoint freezes
// them; after a prime a run must draw other numbers and temporary names.
func TestWarmPrimeReseeds(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3 on this host")
	}
	lib := t.TempDir()
	seed := "import random, tempfile\nrandom.seed(42)\nnext(tempfile._get_candidate_names())\n" +
		"try:\n    import numpy\n    numpy.random.seed(42)\nexcept ImportError:\n    pass\n"
	if err := os.WriteFile(filepath.Join(lib, "fixedseed.py"), []byte(seed), 0o644); err != nil {
		t.Fatal(err)
	}
	code := "import random, tempfile, sys\nprint(random.random(), next(tempfile._get_candidate_names()), " +
		"sys.modules['numpy'].random.random() if 'numpy' in sys.modules else '-')\n"
	// What the fixed seeds give, as a sandbox that was not reseeded would print.
	frozen, err := exec.Command("python3", "-c", seed+"\n"+code).Output()
	if err != nil {
		t.Fatal(err)
	}
	stdout := primedPythonRun(t, lib, "fixedseed", code)
	got := strings.Fields(string(stdout))
	want := strings.Fields(string(frozen))
	if len(got) != 3 || len(want) != 3 {
		t.Fatalf("printed %q, frozen %q", stdout, frozen)
	}
	for i, what := range []string{"random", "tempfile names", "numpy.random"} {
		if got[i] == want[i] && got[i] != "-" {
			t.Errorf("%s after a prime: %s, the same as the frozen generator's", what, got[i])
		}
	}
}

// TestWarmHeapFrozen checks that the warm interpreter's heap (what the
// preloads made, and the prime) is out of the garbage collector's
// generations when the run starts, so that the run's collections walk only
// the objects it makes, and that they still free the run's garbage.
func TestWarmHeapFrozen(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3 on this host")
	}
	lib := t.TempDir()
	if err := os.WriteFile(filepath.Join(lib, "heapmark.py"), []byte("marker = [object()]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code := "import gc, heapmark\nmine = [object()]\n" +
		"print('preloaded', any(o is heapmark.marker for o in gc.get_objects()))\n" +
		"print('own', any(o is mine for o in gc.get_objects()))\n" +
		"a = []\na.append(a)\ndel a\nprint('collected', gc.collect() > 0)\n"
	if got, want := string(primedPythonRun(t, lib, "heapmark", code)), "preloaded False\nown True\ncollected True\n"; got != want {
		t.Errorf("the run printed %q, want %q", got, want)
	}
}

// TestWarmExitRehearsed checks that the prime's rehearsal of logging's and
// threading's exit steps leaves their locks as it found them: after a
// prime, a run can still start a thread, log from it through the handler
// of last resort (whose lock the rehearsal took), add a handler and log
// through it, and its end still joins the thread, runs the atexit functions
// and shuts logging down. A lock left held would hang the run instead.
func TestWarmExitRehearsed(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3 on this host")
	}
	code := "import atexit, logging, sys, threading, time\n" +
		"threading.Thread(target=lambda: (time.sleep(0.1), logging.getLogger('u').warning('to stderr'), print('thread'))).start()\n" +
		"log = logging.getLogger('t')\nlog.addHandler(logging.StreamHandler(sys.stdout))\nlog.warning('logged')\n" +
		"atexit.register(lambda: print('atexit'))\nprint('main')\n"
	if got, want := string(primedPythonRun(t, t.TempDir(), "logging", code)), "logged\nmain\nthread\natexit\n"; got != want {
		t.Errorf("the run printed %q, want %q", got, want)
	}
}

// primedPythonRun warms a Python interpreter with module of the directory
// lib preloaded, primes it as the engine primes a restored sandbox, runs
// code as main.py in it and returns what the run printed; the run must end
// with code 0.
func primedPythonRun(t *testing.T, lib, module, code string) []byte {
	t.Helper()
	warm := agent.Request{Op: agent.OpWarm, Interpreter: "python", Preload: []string{module}, Env: []string{"PYTHONPATH=" + lib}, Timeout: 5 * time.Second}
	s := serve(t, agent.Config{Workdir: t.TempDir(), OneShot: true}, warm, warm,
		agent.Request{Files: []agent.File{{Path: "main.py", Data: []byte(code)}}, Argv: []string{"python3", "-u", "main.py"}, Timeout: 5 * time.Second, OutputBytes: 1 << 20})
	runs := s.runs(t)
	if len(runs) != 3 || runs[2].exit.Code != 0 {
		t.Fatalf("events: %s", dump(s.events))
	}
	return runs[2].stdout
}

// TestWarmBashEndsAsCold checks that a warm Bash sandbox (the run's shell
// started ahead, waiting in its start-up file) runs the script exactly as a
// cold one: the same process layout, arguments, shell flags, exit code and
// traps, and nothing of the hook left in the shell's variables, functions,
// options, environment or descriptors.
func TestWarmBashEndsAsCold(t *testing.T) {
	// The sandbox's environment has no _ (see hookable); go test's has.
	t.Setenv("_", "")
	os.Unsetenv("_")
	// Variables that differ from one shell to the next whatever the start,
	// listed with their value or not: RANDOM, SECONDS, BASH_ARGV and
	// BASH_ARGC are listed with one once a script has used them (or sourced
	// a file), and PIPESTATUS once any command has run, as the hook's did.
	const volatile = `^declare -[-a-zA-Z]* (RANDOM|SRANDOM|BASHPID|EPOCHREALTIME|EPOCHSECONDS|SECONDS|PPID|BASH_ARGC|BASH_ARGV|PIPESTATUS)(=|$)`
	tests := []struct{ name, code string }{
		{"exit code", "echo \"$0\" \"$#\" \"$-\"; exit 3\n"},
		{"trap", "trap 'echo trapped' EXIT\necho main\n"},
		{"top-level return", "echo a\nreturn 2\necho b\n"},
		{"caller and FUNCNAME", "caller; echo \"${FUNCNAME[*]}\" \"${#BASH_SOURCE[@]}\"\n"},
		{"descriptors", "cd /proc/$$/fd && echo *\n"},
		{"signal", "kill -TERM $$\n"},
		{"stdin", "read -r line; echo \"got $line\"\n"},
		{"first status, $_ and LINENO", "echo \"$? [$_] $LINENO\"\n"},
		{"variables", "v=$(declare -p | grep -Ev '" + volatile + "'); echo \"${v//$PWD/WORKDIR}\"\n"},
		{"functions and options", "declare -F; shopt; set -o; echo \"$-\"\n"},
		{"environment", "v=$(env | sort); echo \"${v//$PWD/WORKDIR}\"\n"},
		{"SECONDS from the start", "echo $SECONDS\n"},
		{"BASH_ARGV once read", "echo \"${BASH_ARGV[*]}|${BASH_ARGC[*]}\"\n"},
		{"PIPESTATUS after a command", "true | false; echo \"${PIPESTATUS[*]}\"\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			files := []agent.File{{Path: "main.sh", Data: []byte(tt.code)}}
			argv := []string{"bash", "main.sh"}
			_, warm := warmRun(t, "bash", nil, files, argv, "in")
			cold := coldRun(t, files, argv, "in")
			sameEnd(t, tt.name, warm, cold)
			if !bytes.Equal(warm.stderr, cold.stderr) {
				t.Errorf("stderr: warm %q, cold %q", warm.stderr, cold.stderr)
			}
		})
	}
}

// TestWarmBashReseeds checks that each warm shell's RANDOM is seeded with
// the seed its run message carries: three runs print three different
// sequences, where a seed lost on its way (an empty or constant value)
// would print one sequence three times.
func TestWarmBashReseeds(t *testing.T) {
	t.Setenv("_", "")
	os.Unsetenv("_")
	seen := map[string]bool{}
	for range 3 {
		files := []agent.File{{Path: "main.sh", Data: []byte("echo $RANDOM $RANDOM $RANDOM\n")}}
		_, r := warmRun(t, "bash", nil, files, []string{"bash", "main.sh"}, "")
		if r.exit.Code != 0 || len(strings.Fields(string(r.stdout))) != 3 {
			t.Fatalf("the run ended %+v, printed %q (stderr %q)", r.exit, r.stdout, r.stderr)
		}
		seen[string(r.stdout)] = true
	}
	if len(seen) != 3 {
		t.Errorf("three warm shells printed %d different sequences of RANDOM: %v", len(seen), seen)
	}
}

// TestWarmBashStartsAhead checks that a warm Bash run is served by the
// shell started at the warm-up (its exec-time environment, which unset
// does not change, still names the hook) unless its environment sets a
// start-up file or options of its own: then it starts cold, and sources the
// user's BASH_ENV as a cold shell does.
func TestWarmBashStartsAhead(t *testing.T) {
	t.Setenv("_", "")
	os.Unsetenv("_")
	dir := t.TempDir()
	userEnv := filepath.Join(dir, "env.sh")
	if err := os.WriteFile(userEnv, []byte("echo sourced\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code := "tr '\\0' '\\n' </proc/$$/environ | grep -c '^BASH_ENV=.*/\\.safe-run-warm-.*\\.sh$'\n"
	for _, tc := range []struct {
		name string
		env  []string
		want string
	}{
		{"plain", nil, "1\n"},
		{"user BASH_ENV", []string{"BASH_ENV=" + userEnv}, "sourced\n0\n"},
		{"SHELLOPTS", []string{"SHELLOPTS=errexit"}, "0\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := exec.LookPath("bash"); err != nil {
				t.Skip("no bash on this host")
			}
			argv := []string{"bash", "main.sh"}
			s := serve(t, agent.Config{Workdir: t.TempDir(), OneShot: true},
				agent.Request{Op: agent.OpWarm, Interpreter: "bash", Argv: argv, Env: tc.env, Timeout: 5 * time.Second},
				agent.Request{Files: []agent.File{{Path: "main.sh", Data: []byte(code)}}, Argv: argv, Env: tc.env,
					Timeout: 5 * time.Second, OutputBytes: 1 << 20},
			)
			runs := s.runs(t)
			if len(runs) != 2 {
				t.Fatalf("events: %s", dump(s.events))
			}
			if got := string(runs[1].stdout); got != tc.want {
				t.Errorf("printed %q (stderr %q), want %q", got, runs[1].stderr, tc.want)
			}
		})
	}
}

// TestWarmBashOtherCommand: a run of another command than the warm shell's
// (or another environment) is not served by it; it starts cold, and the
// warm shell is gone.
func TestWarmBashOtherCommand(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash on this host")
	}
	t.Setenv("_", "")
	os.Unsetenv("_")
	s := serve(t, agent.Config{Workdir: t.TempDir(), OneShot: true},
		agent.Request{Op: agent.OpWarm, Interpreter: "bash", Argv: []string{"bash", "main.sh"}, Timeout: 5 * time.Second},
		agent.Request{Files: []agent.File{{Path: "other.sh", Data: []byte("echo \"$0\" $#; pgrep -c -P $PPID -f '^bash main.sh' || true\n")}},
			Argv: []string{"bash", "other.sh", "x"}, Timeout: 5 * time.Second, OutputBytes: 1 << 20},
	)
	runs := s.runs(t)
	if len(runs) != 2 {
		t.Fatalf("events: %s", dump(s.events))
	}
	if got := string(runs[1].stdout); got != "other.sh 1\n0\n" {
		t.Errorf("printed %q (stderr %q), want other.sh run cold and no warm shell left", got, runs[1].stderr)
	}
}

// TestWarmDriverFailsToWrite: a driver that cannot write the code file
// reports why and exits; the agent reads the report after the exit (it
// does not watch the descriptor during the run) and the run fails as a
// cold run whose file cannot be written does: code -1, naming the file.
func TestWarmDriverFailsToWrite(t *testing.T) {
	for _, kind := range []string{"python", "node"} {
		t.Run(kind, func(t *testing.T) {
			bin, file := driverKind(t, kind)
			dir := t.TempDir()
			// A directory where the code file goes: neither the driver nor
			// the agent can write it.
			if err := os.Mkdir(filepath.Join(dir, file), 0o755); err != nil {
				t.Fatal(err)
			}
			s := serve(t, agent.Config{Workdir: dir, OneShot: true},
				agent.Request{Op: agent.OpWarm, Interpreter: kind, Timeout: 5 * time.Second},
				agent.Request{Files: []agent.File{{Path: file, Data: []byte("print(1)\n")}}, Argv: []string{bin, file},
					Timeout: 5 * time.Second, OutputBytes: 1 << 20},
			)
			runs := s.runs(t)
			if len(runs) != 2 {
				t.Fatalf("events: %s", dump(s.events))
			}
			e := runs[1].exit
			if e.Code != -1 || !strings.Contains(e.Error, "write") || !strings.Contains(e.Error, file) || e.TimedOut {
				t.Errorf("exit %+v; want code -1 and an error naming the write of %s", e, file)
			}
		})
	}
}

// TestWarmSeesTheUserSite: a warm Python started before the user site
// existed imports from it when the run's own files or its install step
// made it, as a cold python3 started after them would.
func TestWarmSeesTheUserSite(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3 on this host")
	}
	out, err := exec.Command("python3", "-c", "import sys; print('python%d.%d' % sys.version_info[:2])").Output()
	if err != nil {
		t.Fatal(err)
	}
	site := ".local/lib/" + strings.TrimSpace(string(out)) + "/site-packages"
	for _, tc := range []struct {
		name    string
		files   []agent.File
		install []string
	}{
		{"files", []agent.File{{Path: site + "/newmod.py", Data: []byte("v = 'there'\n")}}, nil},
		{"install", nil, []string{"sh", "-c", `mkdir -p "$1" && echo "v = 'there'" > "$1/newmod.py"`, "sh", site}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			env := []string{"HOME=" + dir, "PYTHONUSERBASE=" + filepath.Join(dir, ".local")}
			files := append([]agent.File{{Path: "main.py", Data: []byte("import newmod\nprint(newmod.v)\n")}}, tc.files...)
			s := serve(t, agent.Config{Workdir: dir, OneShot: true},
				agent.Request{Op: agent.OpWarm, Interpreter: "python", Env: env, Timeout: 5 * time.Second},
				agent.Request{Op: agent.OpWarm, Timeout: 5 * time.Second}, // the prime, before the files exist
				agent.Request{Files: files, Install: tc.install, Env: env, Argv: []string{"python3", "main.py"},
					Timeout: 5 * time.Second, OutputBytes: 1 << 20},
			)
			runs := s.runs(t)
			if len(runs) != 3 {
				t.Fatalf("events: %s", dump(s.events))
			}
			if got := string(runs[2].stdout); got != "there\n" {
				t.Errorf("the run printed %q (stderr %q, exit %+v), want the module from the user site", got, runs[2].stderr, runs[2].exit)
			}
		})
	}
}
