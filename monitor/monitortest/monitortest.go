// Package monitortest holds the programs that make each of the monitor's
// default rules fire, and their near misses, with the activity summary
// each must produce against the real runsc. It has a home of its own
// because two integration suites run the same table at different layers:
// the gVisor backend (runtime/gvisor) and the CLI with its audit log
// (cmd/safe-run); one table keeps them checking the same facts.
package monitortest

// RuleCase is one default rule's pair of Python programs.
type RuleCase struct {
	// Rule is the default rule's name (docs/monitor.md).
	Rule string
	// Fires is a program that makes Rule fire once; Names is a word its
	// hit's event line must hold; FiresSummary is the activity's exact
	// one-line summary (sandbox.Activity.Summary) of its run.
	Fires, Names, FiresSummary string
	// Quiet is a program close to Fires that Rule must not match;
	// QuietSummary is its run's exact summary.
	Quiet, QuietSummary string
}

// RuleCases are a RuleCase for every default rule, in the order of
// DefaultRules.
var RuleCases = []RuleCase{
	{Rule: "exec-not-in-image",
		Fires:        `import shutil, os, subprocess; shutil.copy("/bin/true", "/workspace/t"); os.chmod("/workspace/t", 0o755); subprocess.run(["/workspace/t"], check=True)`,
		Names:        "/workspace/t",
		FiresSummary: "2 processes (t), 2 forks, rule exec-not-in-image (record), rule exec-written-file (record)",
		Quiet:        `import shutil, subprocess; shutil.copy("/bin/true", "/workspace/t"); subprocess.run(["/bin/true"], check=True)`,
		QuietSummary: "2 processes (true), 2 forks"},
	{Rule: "exec-written-file",
		// A written file is always in a writable place too (the image is
		// read-only), so exec-not-in-image fires with it.
		Fires:        "import os, subprocess\nopen(\"/tmp/w\", \"wb\").write(open(\"/bin/true\", \"rb\").read())\nos.chmod(\"/tmp/w\", 0o755)\nsubprocess.run([\"/tmp/w\"], check=True)",
		Names:        "/tmp/w",
		FiresSummary: "2 processes (w), 2 forks, rule exec-not-in-image (record), rule exec-written-file (record)",
		Quiet:        "import os, subprocess\nopen(\"/tmp/w\", \"wb\").write(open(\"/bin/true\", \"rb\").read())\nos.chmod(\"/tmp/w\", 0o755)\nsubprocess.run([\"/bin/true\"], check=True)",
		QuietSummary: "2 processes (true), 2 forks"},
	{Rule: "shell-from-python",
		Fires:        `import subprocess; subprocess.run(["sh", "-c", "true"], check=True)`,
		Names:        "dash",
		FiresSummary: "2 processes (dash), 2 forks, rule shell-from-python (record)",
		Quiet:        `import subprocess; subprocess.run(["/bin/true"], check=True)`,
		QuietSummary: "2 processes (true), 2 forks"},
	{Rule: "miner-name",
		Fires:        `import subprocess; subprocess.run(["xmrig", "--version"], executable="/bin/true", check=True)`,
		Names:        "execve",
		FiresSummary: "2 processes (true), 2 forks, rule miner-name (record)",
		Quiet:        `import subprocess; subprocess.run(["truly", "--version"], executable="/bin/true", check=True)`,
		QuietSummary: "2 processes (true), 2 forks"},
	{Rule: "miner-pool-port",
		Fires:        "import socket\ns = socket.socket()\ntry: s.connect((\"10.9.9.9\", 3333))\nexcept OSError: pass",
		Names:        "10.9.9.9:3333",
		FiresSummary: "2 network attempts, rule miner-pool-port (record)",
		Quiet:        "import socket\ns = socket.socket()\ntry: s.connect((\"10.9.9.9\", 80))\nexcept OSError: pass",
		QuietSummary: "2 network attempts"},
	{Rule: "connect-storm",
		Fires:        "import socket\nfor i in range(20):\n    s = socket.socket()\n    try: s.connect((\"10.9.9.9\", 80))\n    except OSError: pass\n    s.close()",
		Names:        "(event 20)",
		FiresSummary: "40 network attempts, rule connect-storm (record)",
		Quiet:        "import socket\nfor i in range(19):\n    s = socket.socket()\n    try: s.connect((\"10.9.9.9\", 80))\n    except OSError: pass\n    s.close()",
		QuietSummary: "38 network attempts"},
	{Rule: "fork-storm",
		// Each child exits before the next fork, so the 200 processes
		// stay within the sandbox's process limit; the agent's fork of the
		// interpreter is the first.
		Fires:        "import os\nfor i in range(199):\n    pid = os.fork()\n    if pid == 0: os._exit(0)\n    os.waitpid(pid, 0)",
		Names:        "(event 200)",
		FiresSummary: "200 forks, rule fork-storm (record)",
		Quiet:        "import os\nfor i in range(198):\n    pid = os.fork()\n    if pid == 0: os._exit(0)\n    os.waitpid(pid, 0)",
		QuietSummary: "199 forks"},
	{Rule: "sensitive-read",
		Fires:        `print(len(open("/proc/self/environ").read()) > 0)`,
		Names:        "/proc/self/environ",
		FiresSummary: "1 sensitive read (/proc/self/environ), rule sensitive-read (record)",
		Quiet:        `print(len(open("/proc/self/status").read()) > 0)`,
		QuietSummary: "nothing notable"},
	{Rule: "monitor-incomplete",
		// An execve whose arguments (300 KB) exceed the trace socket's
		// message size: runsc cannot send its point and drops it.
		Fires:        `import subprocess; subprocess.run(["/bin/true"] + ["x" * 100000] * 3, check=True)`,
		Names:        "dropped",
		FiresSummary: "2 forks, rule monitor-incomplete (record), 1 events dropped",
		Quiet:        `import subprocess; subprocess.run(["/bin/true"] + ["x" * 1000] * 3, check=True)`,
		QuietSummary: "2 processes (true), 2 forks"},
}
