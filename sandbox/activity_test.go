package sandbox

import "testing"

func TestActivitySummary(t *testing.T) {
	interp := Process{PID: 2, Parent: 1, Binary: "/usr/local/bin/python3.12"}
	cases := []struct {
		name    string
		a       *Activity
		notable bool
		want    string
	}{
		{"not monitored", nil, false, "not monitored"},
		{"empty (a warm run)", &Activity{}, false, "nothing notable"},
		{"the interpreter's own start", &Activity{Processes: []Process{interp}, Clones: 1, Threads: 4,
			Events: map[string]int{"sentry_exec": 1, "open": 300}}, false, "nothing notable"},
		{"a shell and curl", &Activity{
			Processes: []Process{interp, {PID: 4, Binary: "/usr/bin/dash"}, {PID: 5, Binary: "/usr/bin/curl"}, {PID: 6, Binary: "/usr/bin/dash"}},
			Clones:    4,
			Network:   []NetworkAttempt{{Op: "connect"}, {Op: "connect"}},
			Rules:     []RuleHit{{Rule: "shell-from-python", Action: "kill"}},
		}, true, "4 processes (dash, curl), 4 forks, 2 network attempts, rule shell-from-python (kill)"},
		{"capped lists", &Activity{
			FilesWritten: []string{"/etc/a", "/etc/b"}, FilesWrittenTruncated: true,
			SensitiveReads: []string{"/etc/shadow (EACCES)"},
		}, true, "2+ files written outside /workspace and /tmp, 1 sensitive read (/etc/shadow (EACCES))"},
		{"many rules", &Activity{Rules: []RuleHit{{Rule: "a", Action: "record"}, {Rule: "b", Action: "record"},
			{Rule: "c", Action: "record"}, {Rule: "d", Action: "record"}, {Rule: "e", Action: "record"}}},
			true, "rule a (record), rule b (record), rule c (record), 2 more rule hits"},
		{"lost and dropped", &Activity{Dropped: 12, Lost: "more than 5000000 events"}, true,
			"12 events dropped, monitoring lost: more than 5000000 events"},
		{"glibc's nscd probe (bash at start)", &Activity{Processes: []Process{interp}, Clones: 1, Network: []NetworkAttempt{
			{Op: "socket", Family: "unix", Type: "stream", Result: "ok"}, {Op: "connect", Family: "unix", Address: "/var/run/nscd/socket", Result: "ENOENT"},
			{Op: "socket", Family: "unix", Type: "stream", Result: "ok"}, {Op: "connect", Family: "unix", Address: "/var/run/nscd/socket", Result: "ENOENT"},
		}}, false, "nothing notable"},
		{"a unix socket that is not nscd's", &Activity{Network: []NetworkAttempt{
			{Op: "socket", Family: "unix", Type: "stream", Result: "ok"}, {Op: "connect", Family: "unix", Address: "/var/run/docker.sock", Result: "ENOENT"},
		}}, true, "1 network attempt"},
		{"one fork more", &Activity{Processes: []Process{interp}, Clones: 2}, true, "2 forks"},
		{"a run with a network: how many the host allowed", &Activity{Network: []NetworkAttempt{
			{Op: "socket", Family: "inet", Type: "stream", Result: "ok"},
			{Op: "connect", Family: "inet", Address: "198.19.0.1:80", Result: "ok", Egress: "allowed", EgressHost: "allowed.test"},
			{Op: "connect", Family: "inet", Address: "203.0.113.9:80", Result: "ECONNREFUSED", Egress: "denied"},
		}}, true, "3 network attempts (1 allowed)"},
		{"none allowed", &Activity{Network: []NetworkAttempt{
			{Op: "connect", Family: "inet", Address: "203.0.113.9:80", Result: "ECONNREFUSED", Egress: "denied"},
		}}, true, "1 network attempt (0 allowed)"},
	}
	for _, c := range cases {
		if got := c.a.Notable(); got != c.notable {
			t.Errorf("%s: Notable() = %v, want %v", c.name, got, c.notable)
		}
		if got := c.a.Summary(); got != c.want {
			t.Errorf("%s: Summary()\n got %q\nwant %q", c.name, got, c.want)
		}
	}
}
