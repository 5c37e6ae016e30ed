package sandbox

import (
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/safe-run/safe-run/egress"
)

// Activity is what a run did inside the sandbox, as gVisor's trace points
// reported it (the monitor package fills it in): the processes it started,
// its network attempts, the files it wrote, the sensitive files it read and
// the rules that fired. Every list is capped; a ...Truncated flag says the
// cap was reached, the Events counts still cover everything seen.
type Activity struct {
	// Processes are the programs started (one per successful execve), in
	// the order they started; Parent links them into a tree by PID.
	Processes          []Process `json:"processes,omitempty"`
	ProcessesTruncated bool      `json:"processes_truncated,omitempty"`
	// Clones counts the processes created (fork, vfork, clone without
	// CLONE_THREAD), Threads the threads; a fork bomb shows as a storm.
	Clones  int `json:"clones"`
	Threads int `json:"threads,omitempty"`
	// Network are the socket, connect and bind attempts, with their result.
	Network          []NetworkAttempt `json:"network,omitempty"`
	NetworkTruncated bool             `json:"network_truncated,omitempty"`
	// FilesWritten are the paths opened for writing outside /workspace and
	// /tmp (the places a program is expected to write), each once.
	FilesWritten          []string `json:"files_written,omitempty"`
	FilesWrittenTruncated bool     `json:"files_written_truncated,omitempty"`
	// SensitiveReads are the opens of the monitor's sensitive list
	// (/proc/*/environ, /proc/*/mem, /etc/shadow, ...), each path once.
	SensitiveReads          []string `json:"sensitive_reads,omitempty"`
	SensitiveReadsTruncated bool     `json:"sensitive_reads_truncated,omitempty"`
	// Signals are the signals sent with kill, tkill or tgkill (monitor
	// level "full" only).
	Signals          []SignalSent `json:"signals,omitempty"`
	SignalsTruncated bool         `json:"signals_truncated,omitempty"`
	// Rules are the rules that fired, in order.
	Rules          []RuleHit `json:"rules,omitempty"`
	RulesTruncated bool      `json:"rules_truncated,omitempty"`
	// Dropped counts the trace points that did not reach the monitor: runsc
	// drops a point rather than wait when the monitor's socket is full.
	Dropped int64 `json:"dropped,omitempty"`
	// Lost is non-empty when monitoring of the run ended early, and says
	// why (a broken or garbled stream, a limit hit); what came after is
	// not in this Activity.
	Lost string `json:"lost,omitempty"`
	// Events counts the trace points received, by kind ("execve",
	// "connect", "openat", ...), including those the lists leave out.
	Events map[string]int `json:"events,omitempty"`
}

// Process is one program started in the sandbox.
type Process struct {
	// PID and Parent are the sandbox's own process IDs (its root PID
	// namespace); Parent is 0 when unknown.
	PID    int `json:"pid"`
	Parent int `json:"parent,omitempty"`
	// Binary is the executable's path as the sandbox's kernel resolved it.
	Binary string `json:"binary"`
	// Argv is the argument list, capped in count and length (ArgvTruncated).
	Argv          []string `json:"argv,omitempty"`
	ArgvTruncated bool     `json:"argv_truncated,omitempty"`
	// SHA256 is the executable's hash in hex, when the trace point gave it.
	SHA256 string `json:"sha256,omitempty"`
	// Exited says the process ended while monitored; then ExitCode is its
	// exit status, or Signal names the signal that killed it.
	Exited   bool   `json:"exited,omitempty"`
	ExitCode int    `json:"exit_code,omitempty"`
	Signal   string `json:"signal,omitempty"`
}

// NetworkAttempt is one socket, connect, bind, listen or accept call.
type NetworkAttempt struct {
	// Op is the call: "socket", "connect", "bind", "listen", "accept".
	Op string `json:"op"`
	// PID is the calling process.
	PID int `json:"pid,omitempty"`
	// Family is the address family: "inet", "inet6", "unix", "netlink",
	// "packet", or "family N".
	Family string `json:"family,omitempty"`
	// Type is the socket type for socket: "stream", "dgram", "raw", ...
	Type string `json:"type,omitempty"`
	// Address is "ip:port" ("[ip]:port" for inet6) or a unix socket path.
	Address string `json:"address,omitempty"`
	// Result is "ok" or the errno name, e.g. "ENETUNREACH".
	Result string `json:"result"`
	// Egress is the host's decision on an IP connect of a run with a
	// network: "allowed" or "denied", from the host's record of a TCP
	// connection to the same address and port (see runtime/engine). It is
	// empty for the other calls, in a run without a network (which has no
	// route out: such a connect fails in the sandbox, Result says how), and
	// for a connect the host has no record of (a UDP socket's connect, a
	// connect that never left the sandbox, a record beyond the report's cap).
	Egress string `json:"egress,omitempty"`
	// EgressHost is the host name the allowlist matched (or, denied, the
	// name asked for), when the host's record has one.
	EgressHost string `json:"egress_host,omitempty"`
	// EgressReason is the host's reason for a denial.
	EgressReason string `json:"egress_reason,omitempty"`
}

// SignalSent is one signal a process sent.
type SignalSent struct {
	PID    int    `json:"pid,omitempty"`
	Target int    `json:"target"`
	Signal string `json:"signal"`
}

// RuleHit is one firing of a monitoring rule.
type RuleHit struct {
	// Rule is the rule's name, e.g. "shell-from-python".
	Rule string `json:"rule"`
	// Action is what the rule does: "record", "kill" or "deny-future-calls".
	Action string `json:"action"`
	// Event describes the event that fired it, in one short line, e.g.
	// "execve /bin/sh by python3 (pid 7)".
	Event string `json:"event"`
}

// Notable reports whether the activity holds anything beyond the
// interpreter's own start (one process and the clone that made it): the
// text rendering prints one short line when it does not.
func (a *Activity) Notable() bool {
	if a == nil {
		return false
	}
	return len(a.Processes) > 1 || a.ProcessesTruncated || a.Clones > 1 ||
		a.notableNetwork() > 0 || a.NetworkTruncated || len(a.FilesWritten) > 0 || len(a.SensitiveReads) > 0 ||
		len(a.Signals) > 0 || len(a.Rules) > 0 || a.Lost != "" || a.Dropped > 0
}

// Summary is the activity in one short line for the text output, e.g.
// "3 processes (sh, curl), 12 network attempts, rule shell-from-python (kill)".
func (a *Activity) Summary() string {
	if a == nil {
		return "not monitored"
	}
	if !a.Notable() {
		return "nothing notable"
	}
	var parts []string
	if n := len(a.Processes); n > 1 || a.ProcessesTruncated {
		names := make([]string, 0, 4)
		seen := map[string]bool{}
		for _, p := range a.Processes[1:] {
			b := path.Base(p.Binary)
			if !seen[b] && len(names) < 4 {
				seen[b] = true
				names = append(names, b)
			}
		}
		more := ""
		if a.ProcessesTruncated {
			more = "+"
		}
		parts = append(parts, fmt.Sprintf("%d%s processes (%s)", n, more, strings.Join(names, ", ")))
	}
	if a.Clones > 1 {
		parts = append(parts, fmt.Sprintf("%d forks", a.Clones))
	}
	if n := a.notableNetwork(); n > 0 || a.NetworkTruncated {
		s := count(n, a.NetworkTruncated, "network attempt", "network attempts")
		if allowed, decided := a.egressCounts(); decided > 0 {
			s += fmt.Sprintf(" (%d allowed)", allowed)
		}
		parts = append(parts, s)
	}
	if n := len(a.FilesWritten); n > 0 {
		parts = append(parts, count(n, a.FilesWrittenTruncated, "file written", "files written")+" outside /workspace and /tmp")
	}
	if n := len(a.SensitiveReads); n > 0 {
		parts = append(parts, count(n, a.SensitiveReadsTruncated, "sensitive read", "sensitive reads")+" ("+a.SensitiveReads[0]+")")
	}
	if n := len(a.Signals); n > 0 {
		parts = append(parts, count(n, a.SignalsTruncated, "signal sent", "signals sent"))
	}
	for i, h := range a.Rules {
		if i == 3 {
			parts = append(parts, fmt.Sprintf("%d more rule hits", len(a.Rules)-i))
			break
		}
		parts = append(parts, fmt.Sprintf("rule %s (%s)", h.Rule, h.Action))
	}
	if a.Dropped > 0 {
		parts = append(parts, fmt.Sprintf("%d events dropped", a.Dropped))
	}
	if a.Lost != "" {
		parts = append(parts, "monitoring lost: "+a.Lost)
	}
	return strings.Join(parts, ", ")
}

// nscdSockets are where glibc asks the name service cache daemon first
// whenever a program looks up a user or a host (bash does at start).
var nscdSockets = []string{"/var/run/nscd/socket", "/run/nscd/socket"}

// notableNetwork counts the network attempts that tell something about
// the program: all of them but the unix sockets it only created and
// glibc's probe of nscd's socket. They stay in Network; they only do not
// make a run notable.
func (a *Activity) notableNetwork() int {
	n := 0
	for _, na := range a.Network {
		if na.Family == "unix" && (na.Op == "socket" || slices.Contains(nscdSockets, na.Address)) {
			continue
		}
		n++
	}
	return n
}

// egressCounts counts the attempts the host allowed, and those it decided.
func (a *Activity) egressCounts() (allowed, decided int) {
	for _, na := range a.Network {
		if na.Egress != "" {
			decided++
		}
		if na.Egress == egress.Allowed {
			allowed++
		}
	}
	return allowed, decided
}

// count is "1 thing", "3 things" or "64+ things" when the list was capped.
func count(n int, capped bool, one, many string) string {
	if n == 1 && !capped {
		return "1 " + one
	}
	more := ""
	if capped {
		more = "+"
	}
	return fmt.Sprintf("%d%s %s", n, more, many)
}
