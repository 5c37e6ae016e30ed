package main

// The agent's file operations against a program racing them (issue 13,
// item 7): a process of the session keeps swapping directories of the
// workspace for symbolic links to /etc and /dev and back, while the test
// calls read_file, write_file and list_files, and runs cells whose out/ is
// collected, hundreds of times each. The agent, root in the sandbox, must
// never read, list or write through a link.

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// agentRaceTries is how often each operation runs against the swapping. On
// the agent that checked each directory and then opened the path, the
// attacks won within 32 (read_file) and 72 (collection) tries.
const agentRaceTries = 400

// agentWriteTries is the same for write_file, whose race is won more
// rarely: the old agent created its first file in /dev after 8 to 138 tries.
const agentWriteTries = 1000

// shadowSign is in every line of the image's /etc/shadow and in no file a
// probe of this suite writes: "name:*:days:0:99999:7:::".
const shadowSign = ":99999:7:::"

// swapperCell starts, in the background of the session, a process that
// swaps each NAME between a real directory (holding a decoy "shadow"; out/d's
// is rewritten every round) and a link to its target, passing through
// "missing" each time, until
// /tmp/stop-swapping exists. It counts its rounds in /tmp/swaps.
const swapperCell = `import subprocess, sys
src = r'''
import os, shutil
os.chdir("/workspace")
pairs = [("d", "/etc"), ("w", "/dev"), ("out/d", "/etc")]
for name, target in pairs:
    os.makedirs(name, exist_ok=True)
    with open(name + "/shadow", "w") as f:
        f.write("decoy")
    os.symlink(target, name + ".link")
n = 0
while not os.path.exists("/tmp/stop-swapping"):
    for name, _ in pairs:
        for a, b in ((name, name + ".dir"), (name + ".link", name), (name, name + ".link")):
            try:
                os.rename(a, b)
            except OSError:
                pass
        try:
            os.rename(name + ".dir", name)
        except OSError:
            # the agent made the directory while it was missing
            shutil.rmtree(name, ignore_errors=True)
            try:
                os.rename(name + ".dir", name)
            except OSError:
                pass
    try:
        # a new decoy each round: the session's collection returns only
        # files changed since the last cell
        with open("out/d/shadow", "w") as f:
            f.write("decoy %d" % n)
    except OSError:
        pass
    n += 1
    if n % 200 == 0:
        with open("/tmp/swaps", "w") as f:
            f.write(str(n))
'''
swapper = subprocess.Popen([sys.executable, "-c", src], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
print("swapping", swapper.pid)`

// leaksShadow reports whether anything the client received holds the
// image's /etc/shadow, as text or base64 anywhere in the result.
func leaksShadow(v any) bool {
	data, _ := json.Marshal(v)
	if strings.Contains(string(data), shadowSign) {
		return true
	}
	var walk func(any) bool
	walk = func(x any) bool {
		switch x := x.(type) {
		case string:
			b, err := base64.StdEncoding.DecodeString(x)
			return err == nil && strings.Contains(string(b), shadowSign)
		case []any:
			for _, e := range x {
				if walk(e) {
					return true
				}
			}
		case map[string]any:
			for _, e := range x {
				if walk(e) {
					return true
				}
			}
		}
		return false
	}
	var tree any
	json.Unmarshal(data, &tree)
	return walk(tree)
}

// TestThreatAgentFileRaces: while a process of the session swaps
// /workspace/d and /workspace/out/d for links to /etc and /workspace/w for
// a link to /dev, read_file of d/shadow never returns /etc/shadow,
// list_files of d never lists /etc, write_file of w/NAME never creates
// /dev/NAME, and the out/ collection after each cell never returns
// /etc/shadow. Counts show that the race reached the directory and the link.
func TestThreatAgentFileRaces(t *testing.T) {
	h := newThreatHarness(t)
	ts := h.server
	res, info := ts.tool(t, "create_session", map[string]any{"language": "python"})
	id, _ := info["session_id"].(string)
	if res.IsError || id == "" {
		t.Fatalf("create_session: %s", text(res))
	}
	cell := func(code string) *threatRun {
		return mcpRun(t, ts, map[string]any{"language": "python", "session_id": id, "code": code, "timeout_seconds": 30})
	}
	if r := cell(swapperCell); !strings.Contains(r.stdout, "swapping") {
		t.Fatalf("the swapper did not start: %s%s", r.stdout, r.stderr)
	}
	marker := h.marker + "-agentfiles"

	t.Run("read_file", func(t *testing.T) {
		var decoy, link int
		for i := range agentRaceTries {
			res, out := ts.tool(t, "read_file", map[string]any{"session_id": id, "path": "d/shadow"})
			if leaksShadow(res) || leaksShadow(out) {
				t.Fatalf("try %d: read_file returned /etc/shadow through the link: %.300s", i+1, text(res))
			}
			switch body := text(res); {
			case !res.IsError && strings.Contains(body, "decoy"):
				decoy++
			case res.IsError && strings.Contains(body, "symbolic link"):
				link++
			}
		}
		t.Logf("%d tries: the decoy %d times, the link refused %d times", agentRaceTries, decoy, link)
		if decoy == 0 || link == 0 {
			t.Errorf("the race never reached both the directory (%d) and the link (%d): the case proves nothing", decoy, link)
		}
	})
	t.Run("list_files", func(t *testing.T) {
		var listed int
		for i := range agentRaceTries {
			res, _ := ts.tool(t, "list_files", map[string]any{"session_id": id, "path": "d"})
			body := text(res)
			if strings.Contains(body, "d/passwd") || strings.Contains(body, "d/hostname") {
				t.Fatalf("try %d: list_files listed /etc through the link: %.300s", i+1, body)
			}
			if strings.Contains(body, "d/shadow") {
				listed++
			}
		}
		t.Logf("%d tries: the real directory listed %d times", agentRaceTries, listed)
		if listed == 0 {
			t.Errorf("list_files never listed the real directory: the case proves nothing")
		}
	})
	t.Run("write_file", func(t *testing.T) {
		var wrote int
		for i := range agentWriteTries {
			res, _ := ts.tool(t, "write_file", map[string]any{"session_id": id, "path": fmt.Sprintf("w/%s-%d", marker, i), "content": "x"})
			if !res.IsError {
				wrote++
			}
		}
		t.Logf("%d tries: written into the real directory %d times", agentWriteTries, wrote)
		if wrote == 0 {
			t.Errorf("write_file never wrote into the real directory: the case proves nothing")
		}
		if r := cell(createdOutside(marker)); strings.Contains(r.stdout, "LEAK") || !strings.Contains(r.stdout, "PROBE-RAN") {
			t.Errorf("write_file wrote through the link (the number is the try):\n%s%s", r.stdout, r.stderr)
		}
	})
	t.Run("out collection", func(t *testing.T) {
		var decoys int
		for i := range agentRaceTries {
			r := cell("pass")
			if leaksShadow(r.mcp) || leaksShadow(r.mcpOut) {
				t.Fatalf("cell %d: the out/ collection returned /etc/shadow through the link", i+1)
			}
			if strings.Contains(r.all, "d/shadow") {
				decoys++
			}
		}
		t.Logf("%d cells: the decoy collected in %d", agentRaceTries, decoys)
		if decoys == 0 {
			t.Errorf("the collection never returned the decoy: the case proves nothing")
		}
	})

	// From a fresh cell, with the swapping stopped: nothing was created
	// outside the workspace, and the swapper ran throughout.
	r := cell(`import os, time
open("/tmp/stop-swapping", "w").close()
time.sleep(0.5)
print("swaps", open("/tmp/swaps").read() if os.path.exists("/tmp/swaps") else "under 200")
` + createdOutside(marker))
	if strings.Contains(r.stdout, "LEAK") || !strings.Contains(r.stdout, "PROBE-RAN") {
		t.Errorf("after the races:\n%s%s", r.stdout, r.stderr)
	}
	t.Logf("swapper: %s", strings.TrimSpace(strings.SplitN(r.stdout, "\n", 2)[0]))
	if res, _ := ts.tool(t, "close_session", map[string]any{"session_id": id}); res.IsError {
		t.Errorf("close_session: %s", text(res))
	}
	h.assertHostClean(t)
}

// createdOutside is a cell that prints "LEAK created PATH" for every file
// named with marker in /dev, /etc or /, and then PROBE-RAN.
func createdOutside(marker string) string {
	return `import os
for d in ("/dev", "/etc", "/"):
    for name in os.listdir(d):
        if "` + marker + `" in name:
            print("LEAK created", os.path.join(d, name))
print("PROBE-RAN")`
}
