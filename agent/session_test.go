//go:build linux

package agent_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/safe-run/safe-run/agent"
)

func eval(kind, code string) agent.Request {
	return agent.Request{Op: agent.OpEval, Interpreter: kind, Code: code, Timeout: 5 * time.Second, OutputBytes: 1 << 20}
}

// evalSession runs the requests in one session and returns the runs.
func evalSession(t *testing.T, reqs ...agent.Request) []run {
	t.Helper()
	s := serve(t, agent.Config{Workdir: t.TempDir()}, reqs...)
	if s.err != nil {
		t.Fatalf("Serve: %v\nstderr:\n%s", s.err, s.stderr)
	}
	runs := s.runs(t)
	if len(runs) != len(reqs) {
		t.Fatalf("got %d runs for %d requests: %s", len(runs), len(reqs), dump(s.events))
	}
	return runs
}

func needInterpreter(t *testing.T, name string) {
	if _, err := exec.LookPath(name); err != nil {
		t.Skipf("%s is not installed on this host; the sandbox tests cover it", name)
	}
}

// stdout of a run: what Output events sent plus the tail.
func out(r run) string { return string(r.stdout) + string(r.exit.StdoutTail) }
func errOut(r run) string {
	return string(r.stderr) + string(r.exit.StderrTail)
}

func TestEvalKeepsState(t *testing.T) {
	for _, tc := range []struct {
		kind  string
		cells []string
		want  []string // stdout of each cell
	}{
		{"python", []string{"x = 41", "x + 1", "def f(a):\n    return a * 2\nprint(f(x))", "import json\njson.dumps([x])"},
			[]string{"", "42\n", "82\n", "'[41]'\n"}},
		{"node", []string{"let y = 20", "y * 2", "const z = await Promise.resolve(y + 1)", "z", "function g() { return 'g' }", "g()"},
			[]string{"", "40\n", "", "21\n", "", "'g'\n"}},
		{"bash", []string{"cd /tmp; FOO=bar; f() { echo fun; }", "pwd; echo $FOO; f", "false"},
			[]string{"", "/tmp\nbar\nfun\n", ""}},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			needInterpreter(t, map[string]string{"python": "python3", "node": "node", "bash": "bash"}[tc.kind])
			var reqs []agent.Request
			for _, c := range tc.cells {
				reqs = append(reqs, eval(tc.kind, c))
			}
			for i, r := range evalSession(t, reqs...) {
				if got := out(r); got != tc.want[i] {
					t.Errorf("cell %d %q: stdout %q, want %q (stderr %q, exit %+v)", i, tc.cells[i], got, tc.want[i], errOut(r), r.exit)
				}
				if r.exit.StateLost {
					t.Errorf("cell %d lost the state", i)
				}
			}
		})
	}
}

func TestEvalErrorsKeepTheSession(t *testing.T) {
	needInterpreter(t, "python3")
	runs := evalSession(t, eval("python", "x = 1"), eval("python", "1 / 0"), eval("python", "import sys; sys.exit(3)"), eval("python", "x"))
	if r := runs[1]; r.exit.Code != 1 || !strings.Contains(errOut(r), "ZeroDivisionError") || !strings.Contains(errOut(r), "1 / 0") {
		t.Errorf("exception: exit %+v, stderr %q; want code 1 and a traceback quoting the line", r.exit, errOut(r))
	}
	if strings.Contains(errOut(runs[1]), "driver") || strings.Contains(errOut(runs[1]), "run_cell") {
		t.Errorf("the traceback shows the driver's own frames: %q", errOut(runs[1]))
	}
	if r := runs[2]; r.exit.Code != 3 {
		t.Errorf("sys.exit(3): exit %+v, want code 3", r.exit)
	}
	if r := runs[3]; out(r) != "1\n" || r.exit.StateLost {
		t.Errorf("after the errors, x = %q (state lost %v), want 1", out(r), r.exit.StateLost)
	}
}

func TestEvalTimeout(t *testing.T) {
	t.Run("python is interrupted and keeps its state", func(t *testing.T) {
		needInterpreter(t, "python3")
		loop := eval("python", "while True: pass")
		loop.Timeout = 300 * time.Millisecond
		runs := evalSession(t, eval("python", "x = 7"), loop, eval("python", "x"))
		if e := runs[1].exit; !e.TimedOut || e.StateLost || !strings.Contains(errOut(runs[1]), "KeyboardInterrupt") {
			t.Errorf("timed-out cell: %+v, stderr %q; want TimedOut, state kept, KeyboardInterrupt", e, errOut(runs[1]))
		}
		if got := out(runs[2]); got != "7\n" {
			t.Errorf("after the timeout x = %q, want 7", got)
		}
	})
	t.Run("an uninterruptible cell loses the state and the next starts fresh", func(t *testing.T) {
		needInterpreter(t, "bash")
		hang := eval("bash", "trap '' INT; sleep 30")
		hang.Timeout = 200 * time.Millisecond
		runs := evalSession(t, eval("bash", "V=kept"), hang, eval("bash", "echo ${V:-fresh}"))
		if e := runs[1].exit; !e.TimedOut || !e.StateLost {
			t.Errorf("hung cell: %+v, want TimedOut and StateLost", e)
		}
		if got := out(runs[2]); got != "fresh\n" {
			t.Errorf("after the reset: %q, want fresh", got)
		}
	})
}

func TestEvalInterpreterDeath(t *testing.T) {
	needInterpreter(t, "python3")
	runs := evalSession(t, eval("python", "x = 1"), eval("python", "import os; print('bye', flush=True); os._exit(9)"), eval("python", "print(globals().get('x', 'fresh'))"))
	if e := runs[1].exit; !e.StateLost || e.Code != 9 || out(runs[1]) != "bye\n" {
		t.Errorf("dying cell: %+v, stdout %q; want StateLost, code 9, its output", e, out(runs[1]))
	}
	if got := out(runs[2]); got != "fresh\n" {
		t.Errorf("next cell: %q, want a fresh interpreter", got)
	}
}

func TestSessionFileOps(t *testing.T) {
	dir := t.TempDir()
	os.Symlink("/etc/passwd", filepath.Join(dir, "link"))
	s := serve(t, agent.Config{Workdir: dir},
		agent.Request{Op: agent.OpWrite, Files: []agent.File{{Path: "data/a.csv", Data: []byte("1,2\n")}}},
		agent.Request{Op: agent.OpRead, Path: "data/a.csv", MaxBytes: 100},
		agent.Request{Op: agent.OpRead, Path: "data/a.csv", MaxBytes: 2},
		agent.Request{Op: agent.OpRead, Path: "link", MaxBytes: 100},
		agent.Request{Op: agent.OpRead, Path: "missing", MaxBytes: 100},
		agent.Request{Op: agent.OpList, Path: ".", MaxFiles: 100},
	)
	runs := s.runs(t)
	if len(runs) != 6 {
		t.Fatalf("%d runs: %s", len(runs), dump(s.events))
	}
	if e := runs[0].exit; e.Code != 0 || e.Error != "" {
		t.Errorf("write: %+v", e)
	}
	if f := runs[1].exit.Files; len(f) != 1 || string(f[0].Data) != "1,2\n" {
		t.Errorf("read: %+v", runs[1].exit)
	}
	for i, want := range map[int]string{2: "limit", 3: "symbolic link", 4: "no such file"} {
		if e := runs[i].exit; e.Error == "" || !strings.Contains(e.Error, want) || len(e.Files) > 0 {
			t.Errorf("request %d: %+v, want an error about %q and no data", i, e, want)
		}
	}
	types := map[string]string{}
	for _, f := range runs[5].exit.Files {
		types[f.Path] = f.Type
	}
	if types["data"] != "dir" || types["data/a.csv"] != "file" || types["link"] != "symlink" {
		t.Errorf("list: %v", types)
	}
}
