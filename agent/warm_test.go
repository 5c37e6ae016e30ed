//go:build linux

package agent_test

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/safe-run/safe-run/agent"
)

// warmRun is a one-shot agent warmed with kind and preload, then asked to
// run argv with stdin: the two requests a pooled sandbox gets.
func warmRun(t *testing.T, kind string, preload []string, files []agent.File, argv []string, stdin string) (warm, run run) {
	t.Helper()
	return warmRunFor(t, 5*time.Second, kind, preload, files, argv, stdin)
}

// warmRunFor is warmRun with the run's timeout.
func warmRunFor(t *testing.T, timeout time.Duration, kind string, preload []string, files []agent.File, argv []string, stdin string) (warm, run run) {
	t.Helper()
	if _, err := exec.LookPath(map[string]string{"python": "python3", "node": "node", "bash": "bash"}[kind]); err != nil {
		t.Skipf("no %s interpreter on this host", kind)
	}
	dir := t.TempDir()
	s := serve(t, agent.Config{Workdir: dir, OneShot: true},
		agent.Request{Op: agent.OpWarm, Interpreter: kind, Preload: preload, Argv: argv, Timeout: 5 * time.Second},
		agent.Request{Files: files, Argv: argv, Stdin: []byte(stdin), Timeout: timeout, OutputBytes: 1 << 20},
	)
	if s.err != nil {
		t.Fatalf("Serve failed: %v\nstderr:\n%s", s.err, s.stderr)
	}
	runs := s.runs(t)
	if len(runs) != 2 {
		t.Fatalf("got %d answers, want 2 (warm, run); events: %s", len(runs), dump(s.events))
	}
	if runs[0].exit.Error != "" || len(runs[0].outputs) != 0 {
		t.Fatalf("warm answered %+v with output %q %q", runs[0].exit, runs[0].stdout, runs[0].stderr)
	}
	return runs[0], runs[1]
}

// TestWarmPythonRunsAsAScript checks that a warm interpreter runs the file
// as `python3 -u main.py` would: as __main__, with its argv, file name,
// stdin and exit code, and with the preloaded module already imported.
func TestWarmPythonRunsAsAScript(t *testing.T) {
	code := `import sys
print(__name__, __file__, sys.argv, sys.path[0] == __file__.rsplit("/", 1)[0])
print("preloaded:", "json" in sys.modules, "csv" in sys.modules)
print("stdin:", sys.stdin.read())
import atexit, threading, time
atexit.register(lambda: print("atexit ran"))
threading.Thread(target=lambda: (time.sleep(0.2), print("thread finished"))).start()
sys.exit(3)
`
	_, r := warmRun(t, "python", []string{"json", "no_such_module_xyz"},
		[]agent.File{{Path: "main.py", Data: []byte(code)}}, []string{"python3", "-u", "main.py", "arg"}, "hello")
	out := string(r.stdout)
	for _, want := range []string{"__main__ ", "/main.py ['main.py', 'arg'] True", "preloaded: True False", "stdin: hello", "thread finished\natexit ran"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s\nstderr:\n%s", want, out, r.stderr)
		}
	}
	if r.exit.Code != 3 {
		t.Errorf("exit code %d, want 3", r.exit.Code)
	}
}

// TestWarmPythonExceptions checks that an uncaught exception prints the
// user's traceback alone and exits 1, and SystemExit with a message prints
// it and exits 1, as the interpreter does.
func TestWarmPythonExceptions(t *testing.T) {
	for _, tc := range []struct {
		code, stderr string
		exit         int
	}{
		{"def f():\n    raise ValueError('boom')\nf()\n", "ValueError: boom", 1},
		{"raise SystemExit('bye')\n", "bye", 1},
		{"raise SystemExit(300)\n", "", 300 & 0xff},
		{"print('fine')\n", "", 0},
	} {
		_, r := warmRun(t, "python", nil, []agent.File{{Path: "main.py", Data: []byte(tc.code)}}, []string{"python3", "-u", "main.py"}, "")
		if r.exit.Code != tc.exit || !strings.Contains(string(r.stderr), tc.stderr) {
			t.Errorf("%q: exit %d, stderr %q; want %d and %q", tc.code, r.exit.Code, r.stderr, tc.exit, tc.stderr)
		}
		if strings.Contains(string(r.stderr), "<string>") {
			t.Errorf("%q: the driver's own frames show in the traceback:\n%s", tc.code, r.stderr)
		}
	}
}

// TestWarmNodeRunsAsMain checks that a warm Node runs the file as the main
// module, with its argv and stdin.
func TestWarmNodeRunsAsMain(t *testing.T) {
	code := `const path = require('path');
console.log(require.main === module, path.basename(process.argv[1]), process.argv.slice(2).join(','));
console.log('stdin:', require('fs').readFileSync(0, 'utf8'));
process.exitCode = 4;
`
	_, r := warmRun(t, "node", []string{"util"}, []agent.File{{Path: "main.js", Data: []byte(code)}}, []string{"node", "main.js", "x", "y"}, "hi")
	out := string(r.stdout)
	for _, want := range []string{"true main.js x,y", "stdin: hi"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s\nstderr:\n%s", want, out, r.stderr)
		}
	}
	if r.exit.Code != 4 {
		t.Errorf("exit code %d, want 4", r.exit.Code)
	}
}

// TestWarmTimeout checks that the run's timeout applies to the warm
// interpreter as to a program.
func TestWarmTimeout(t *testing.T) {
	_, r := warmRunFor(t, 500*time.Millisecond, "python", nil, []agent.File{{Path: "main.py", Data: []byte("print('start', flush=True)\nwhile True: pass\n")}},
		[]string{"python3", "main.py"}, "")
	if !r.exit.TimedOut || r.exit.Signal != "SIGKILL" || string(r.stdout) != "start\n" {
		t.Errorf("exit %+v, stdout %q; want a timeout that kept the output", r.exit, r.stdout)
	}
}

// TestWarmUnknownInterpreter checks that warming an unknown kind is refused
// and the agent still serves the run cold.
func TestWarmUnknownInterpreter(t *testing.T) {
	dir := t.TempDir()
	s := serve(t, agent.Config{Workdir: dir, OneShot: true},
		agent.Request{Op: agent.OpWarm, Interpreter: "cobol", Timeout: time.Second},
		sh("echo cold"),
	)
	runs := s.runs(t)
	if len(runs) != 2 || !strings.Contains(runs[0].exit.Error, "no warm interpreter") || string(runs[1].stdout) != "cold\n" {
		t.Fatalf("events: %s", dump(s.events))
	}
}

// TestWarmPrime checks that a second OpWarm primes the warm interpreter,
// which then still runs the script.
func TestWarmPrime(t *testing.T) {
	for _, kind := range []string{"python", "node"} {
		bin := map[string]string{"python": "python3", "node": "node"}[kind]
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("no %s on this host", bin)
		}
		file := map[string]string{"python": "main.py", "node": "main.js"}[kind]
		code := map[string]string{"python": "print('ran')", "node": "console.log('ran')"}[kind]
		warmReq := agent.Request{Op: agent.OpWarm, Interpreter: kind, Timeout: 5 * time.Second}
		s := serve(t, agent.Config{Workdir: t.TempDir(), OneShot: true}, warmReq, warmReq, warmReq,
			agent.Request{Files: []agent.File{{Path: file, Data: []byte(code)}}, Argv: []string{bin, file}, Timeout: 5 * time.Second, OutputBytes: 1 << 20})
		runs := s.runs(t)
		if len(runs) != 4 {
			t.Fatalf("%s: %d answers, want 4; events: %s", kind, len(runs), dump(s.events))
		}
		for i, r := range runs[:3] {
			if r.exit.Error != "" {
				t.Errorf("%s: warm %d: %s", kind, i, r.exit.Error)
			}
		}
		if string(runs[3].stdout) != "ran\n" || runs[3].exit.Code != 0 {
			t.Errorf("%s: run after priming: %+v stdout %q stderr %q", kind, runs[3].exit, runs[3].stdout, runs[3].stderr)
		}
	}
}
