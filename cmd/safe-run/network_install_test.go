package main

import (
	"strings"
	"testing"

	"github.com/safe-run/safe-run/internal/pkgindex"
)

// installFlags are the server's settings for installs from idx: both
// names pinned to it, its URLs as the indexes, its CA trusted.
func installFlags(idx *pkgindex.Server) []string {
	return []string{
		"--allow-net", idx.Pin("pypi.test") + "," + idx.Pin("npm.test"),
		"--pip-index-url", idx.PipIndexURL("pypi.test"),
		"--npm-registry", idx.NPMRegistry("npm.test"),
		"--net-ca", idx.CAFile(),
		"--allow-packages", "tinypkg,tiny-npm",
	}
}

func startIndex(t *testing.T) *pkgindex.Server {
	t.Helper()
	idx, err := pkgindex.Start(pkgindex.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { idx.Close() })
	return idx
}

// TestInstallPackagesCLI: pip and npm install allowed packages from the
// local index before the code runs; pip works from the code too, without
// flags; a package outside --allow-packages is refused and never fetched;
// a run without a network cannot reach the index.
func TestInstallPackagesCLI(t *testing.T) {
	binary(t)
	idx := startIndex(t)
	flags := installFlags(idx)
	runWith := func(args ...string) cliResult {
		t.Helper()
		return safeRun(t, "", append(append([]string{"run"}, flags...), args...)...)
	}
	pypi, npm := "--net="+idx.Pin("pypi.test"), "--net="+idx.Pin("npm.test")

	r := runWith(pypi, "--packages", "tinypkg==1.0.0", "--lang", "python", "-c", "import tinypkg; print(tinypkg.__version__, tinypkg.__file__)")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "1.0.0 /tmp/.local/lib/") || !strings.Contains(r.stderr, "installing packages: python3 -m pip install") {
		t.Errorf("pip install of tinypkg==1.0.0: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}

	r = runWith(npm, "--packages", "tiny-npm", "--lang", "node", "-c", "console.log(require('tiny-npm').version, require.resolve('tiny-npm'))")
	if r.code != 0 || r.stdout != "1.0.0 /workspace/node_modules/tiny-npm/index.js\n" {
		t.Errorf("npm install of tiny-npm: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}

	// From the code, with no flags: the environment makes pip work.
	r = runWith(pypi, "--lang", "bash", "-c", "pip install -q tinypkg==2.0.0 && python3 -c 'import tinypkg; print(tinypkg.__version__)'")
	if r.code != 0 || r.stdout != "2.0.0\n" {
		t.Errorf("pip install in the code: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}

	r = runWith(pypi, "--packages", "otherpkg", "--lang", "python", "-c", "print(1)")
	if r.code == 0 || !strings.Contains(r.stderr, `"otherpkg" is not allowed here`) || idx.Fetched("otherpkg") {
		t.Errorf("otherpkg, outside --allow-packages: exit %d, stderr %q, fetched %v", r.code, r.stderr, idx.Fetched("otherpkg"))
	}

	r = runWith(pypi, "--packages", "tinypkg==9.9", "--lang", "python", "-c", "print('ran')")
	if r.code == 0 || strings.Contains(r.stdout, "ran") || !strings.Contains(r.stderr, "installing packages failed") {
		t.Errorf("a failing install: exit %d, stdout %q, stderr %q; want an error and the code not run", r.code, r.stdout, r.stderr)
	}

	before := len(idx.Requests())
	r = runWith("--lang", "bash", "-c", "curl -sS -m 5 --cacert /dev/null https://pypi.test:"+strings.Split(idx.Addr(), ":")[1]+"/simple/ && echo reached; curl -sS -m 5 -k https://"+idx.Addr()+"/simple/ && echo reached")
	if strings.Contains(r.stdout, "reached") || len(idx.Requests()) != before {
		t.Errorf("a run without a network reached the index: stdout %q, requests %v", r.stdout, idx.Requests()[before:])
	}
}

// TestInstallPackagesMCP: run_code installs its packages; a session
// installs its packages once, keeps them from call to call, and sees what
// its code installs later; a refused package is never fetched.
func TestInstallPackagesMCP(t *testing.T) {
	idx := startIndex(t)
	ts := startServer(t, "stdio", installFlags(idx)...)
	pypi := []any{idx.Pin("pypi.test")}

	res, out := ts.tool(t, "run_code", map[string]any{"language": "python", "code": "import tinypkg; print(tinypkg.__version__)",
		"network": pypi, "packages": []any{"tinypkg==1.0.0"}, "timeout_seconds": 60})
	if res.IsError || out["stdout"] != "1.0.0\n" {
		t.Errorf("run_code with packages: %v %s", out, text(res))
	}

	res, _ = ts.tool(t, "run_code", map[string]any{"language": "python", "code": "print(1)", "network": pypi, "packages": []any{"otherpkg"}})
	if !res.IsError || !strings.Contains(text(res), `"otherpkg" is not allowed here`) || idx.Fetched("otherpkg") {
		t.Errorf("run_code with otherpkg: %s (fetched %v)", text(res), idx.Fetched("otherpkg"))
	}

	res, info := ts.tool(t, "create_session", map[string]any{"language": "python", "network": pypi, "packages": []any{"tinypkg==1.0.0"}})
	id, _ := info["session_id"].(string)
	if res.IsError || id == "" {
		t.Fatalf("create_session with packages: %s", text(res))
	}
	cell := func(code string) map[string]any {
		t.Helper()
		res, out := ts.tool(t, "run_code", map[string]any{"language": "python", "session_id": id, "code": code, "timeout_seconds": 60})
		if res.IsError {
			t.Errorf("cell %q: %s", code, text(res))
		}
		return out
	}
	if out := cell("import tinypkg\ntinypkg.__version__"); out["stdout"] != "'1.0.0'\n" {
		t.Errorf("first cell: %v", out)
	}
	if out := cell("import subprocess, sys\nsubprocess.run([sys.executable, '-m', 'pip', 'install', '-q', 'tinypkg==2.0.0'], check=True).returncode"); out["stdout"] != "0\n" {
		t.Errorf("pip in a cell: %v", out)
	}
	if out := cell("import importlib.metadata\nimportlib.metadata.version('tinypkg'), tinypkg.__version__"); out["stdout"] != "('2.0.0', '1.0.0')\n" {
		t.Errorf("the session's state and its new install: %v", out)
	}
	if n := countFetches(idx, "/packages/tinypkg-1.0.0-py3-none-any.whl"); n != 2 {
		t.Errorf("tinypkg 1.0.0 fetched %d times, want 2 (run_code, and the session once)", n)
	}
}

func countFetches(idx *pkgindex.Server, path string) int {
	n := 0
	for _, r := range idx.Requests() {
		if r.Path == path {
			n++
		}
	}
	return n
}
