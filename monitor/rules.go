package monitor

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"strings"
)

// Action is what a rule does when it fires.
type Action string

const (
	// ActionRecord only records the hit in the Activity (and the audit log).
	ActionRecord Action = "record"
	// ActionKill records the hit and calls Options.OnKill (once per
	// Monitor): the run ends with status policy_violation.
	ActionKill Action = "kill"
	// ActionDenyFutureCalls records the hit; a session refuses further
	// calls after it (a single run only records it).
	ActionDenyFutureCalls Action = "deny-future-calls"
	// actionOff, in a rules file only, removes a default rule.
	actionOff Action = "off"
)

// The events a rule can match (Rule.Event).
const (
	// EventExec is a program start (a successful execve).
	EventExec = "exec"
	// EventConnect is a connect attempt, whatever its result.
	EventConnect = "connect"
	// EventBind is a bind attempt.
	EventBind = "bind"
	// EventOpen is an open attempt (open, openat, creat); a write counts
	// only when the open succeeded.
	EventOpen = "open"
	// EventClone is a new process (not a thread).
	EventClone = "clone"
	// EventMonitorIncomplete is monitoring that missed events: points
	// dropped by runsc, or monitoring ended early (Activity.Lost).
	EventMonitorIncomplete = "monitor-incomplete"
)

// Rule matches events of the trace stream and says what to do when they
// occur. The match fields that are set must all hold; those unset match
// anything. Patterns are path.Match globs; a pattern ending in "/**" also
// matches everything below its directory.
type Rule struct {
	// Name identifies the rule in results, the audit log and metrics.
	Name string `json:"name"`
	// Action is record, kill or deny-future-calls (record when empty).
	Action Action `json:"action,omitempty"`
	// Event is the kind of event matched: exec, connect, bind, open, clone
	// or monitor-incomplete.
	Event string `json:"event"`
	// Names (exec) match the base name of the binary or of argv[0].
	Names []string `json:"names,omitempty"`
	// ParentNames (exec) match the base name of the parent's binary, or of
	// the binary the process ran before this execve (python exec'ing a
	// shell in its place).
	ParentNames []string `json:"parent_names,omitempty"`
	// Paths match the binary's path (exec) or the opened path (open).
	Paths []string `json:"paths,omitempty"`
	// NotInImage (exec) matches a binary that cannot be the image's: under
	// a writable place (/workspace, /tmp, /dev/shm, /run, /var/tmp), in a
	// memfd, on an overlay's upper layer, or written during the run.
	NotInImage bool `json:"not_in_image,omitempty"`
	// Written (exec) matches a binary that was opened for writing earlier
	// in the sandbox's life: a file written, then run.
	Written bool `json:"written,omitempty"`
	// Write (open) matches only opens for writing.
	Write bool `json:"write,omitempty"`
	// Ports (connect, bind) match the port of the address.
	Ports []int `json:"ports,omitempty"`
	// Families (connect, bind) match the address family: inet, inet6,
	// unix, netlink, packet, unspec.
	Families []string `json:"families,omitempty"`
	// Count makes the rule fire once, at the Count-th matching event in
	// the sandbox's life (e.g. "more than 20 connect attempts"); 0 or 1
	// fires at every distinct matching event.
	Count int `json:"count,omitempty"`
	// Description is shown in the rule reference; free text.
	Description string `json:"description,omitempty"`
}

// families are the address families a rule can name (familyName's).
var families = []string{"inet", "inet6", "unix", "netlink", "packet", "unspec"}

// shells are the shells the shell-from-python rule looks for.
var shells = []string{"sh", "bash", "dash", "ash", "zsh", "ksh", "mksh", "csh", "tcsh", "fish", "busybox"}

// minerPorts are the ports mining pools customarily listen on.
var minerPorts = []int{3333, 4444, 5555, 6666, 7777, 8888, 9999, 14433, 14444, 45560, 45700}

// SensitivePaths are the files whose reading the activity reports
// (SensitiveReads) and the sensitive-read rule matches: other processes'
// and the sandbox's secrets, credentials and memory.
var SensitivePaths = []string{
	"/proc/*/environ", "/proc/*/mem", "/proc/*/maps", "/proc/*/auxv",
	"/proc/*/task/*/environ", "/proc/*/task/*/mem",
	"/proc/kcore", "/proc/kallsyms", "/proc/self/environ", "/proc/self/mem",
	"/etc/shadow", "/etc/gshadow", "/etc/sudoers", "/etc/sudoers.d/**",
	"/root/**", "/home/*/.ssh/**", "/var/run/secrets/**", "/run/secrets/**",
	// Not all of /sys/kernel: runtimes read its mm/ files at start (Go's
	// transparent_hugepage size, numpy's hugepage setting), which would make
	// every run notable.
	"/sys/kernel/security/**", "/sys/kernel/debug/**", "/dev/mem", "/dev/kmem",
}

// DefaultRules are the rules a monitor applies unless configured otherwise;
// all record only. docs/monitor.md is their reference.
func DefaultRules() []Rule {
	rules := []Rule{
		{Name: "exec-not-in-image", Event: EventExec, NotInImage: true,
			Description: "a program started from a writable place (/workspace, /tmp, ...), a memfd or a file written during the run: not a binary of the image"},
		{Name: "exec-written-file", Event: EventExec, Written: true,
			Description: "a file opened for writing earlier in the sandbox's life, then executed (a dropped binary or script)"},
		{Name: "shell-from-python", Event: EventExec, Names: shells, ParentNames: []string{"python*"},
			Description: "a shell started by a Python process (subprocess, os.system)"},
		{Name: "miner-name", Event: EventExec, Names: []string{"xmrig*", "minerd", "cpuminer*", "ccminer*", "ethminer*", "t-rex", "nbminer", "lolminer*", "xmr-stak*", "nanominer"},
			Description: "a program named like a known cryptocurrency miner"},
		{Name: "miner-pool-port", Event: EventConnect, Ports: minerPorts,
			Description: "a connect attempt to a port mining pools customarily use"},
		{Name: "connect-storm", Event: EventConnect, Count: 20, Families: []string{"inet", "inet6"},
			Description: "the 20th IP connect attempt in the sandbox's life (a scan or a flood)"},
		{Name: "fork-storm", Event: EventClone, Count: 200,
			Description: "the 200th process created in the sandbox's life (a fork bomb)"},
		{Name: "sensitive-read", Event: EventOpen, Paths: SensitivePaths,
			Description: "an open of a file of the sensitive list (environ, mem, shadow, secrets...)"},
		{Name: "monitor-incomplete", Event: EventMonitorIncomplete,
			Description: "monitoring missed events: runsc dropped points, or the stream ended early (Activity.Lost says why)"},
	}
	for i := range rules {
		rules[i].Action = ActionRecord
	}
	return rules
}

// ruleFields lists Rule's JSON fields for the message of a misspelt one.
const ruleFields = "name, action, event, names, parent_names, paths, not_in_image, written, write, ports, families, count, description"

// ParseRules reads an operator's rules file: a JSON array of rules applied
// over DefaultRules. A rule named as a default replaces it, or, with no
// event, only changes its action ("off" removes it); a new name adds a rule.
// It returns the rules in effect. Each bad rule gets one line naming it and
// what is wrong.
func ParseRules(data []byte) ([]Rule, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var file []Rule
	if err := dec.Decode(&file); err != nil {
		if strings.Contains(err.Error(), "unknown field") {
			return nil, fmt.Errorf("rules file: %v; a rule's fields are %s", err, ruleFields)
		}
		return nil, fmt.Errorf("rules file: %v; it must be a JSON array of rules, e.g. [{\"name\": \"shell-from-python\", \"action\": \"kill\"}]", err)
	}
	if dec.More() {
		return nil, fmt.Errorf("rules file: more than one JSON value; it must be one array of rules")
	}
	rules := DefaultRules()
	index := func(name string) int {
		for i, r := range rules {
			if r.Name == name {
				return i
			}
		}
		return -1
	}
	seen := map[string]bool{}
	for n, r := range file {
		where := fmt.Sprintf("rules file: rule %d", n+1)
		if r.Name != "" {
			where += fmt.Sprintf(" (%q)", r.Name)
		}
		if r.Name == "" {
			return nil, fmt.Errorf("%s has no name; every rule needs one", where)
		}
		if seen[r.Name] {
			return nil, fmt.Errorf("%s: the name is given twice; each rule once", where)
		}
		seen[r.Name] = true
		switch r.Action {
		case "", ActionRecord, ActionKill, ActionDenyFutureCalls, actionOff:
		default:
			return nil, fmt.Errorf("%s: unknown action %q; the actions are record, kill, deny-future-calls and off", where, r.Action)
		}
		i := index(r.Name)
		if r.Event == "" {
			if i < 0 {
				return nil, fmt.Errorf("%s: no event, and no default rule has that name; give an event (exec, connect, bind, open, clone, monitor-incomplete) or a default rule's name", where)
			}
			if r.Action == "" {
				return nil, fmt.Errorf("%s: neither an event nor an action; to change a default rule give its action", where)
			}
			if r.Action == actionOff {
				rules = append(rules[:i], rules[i+1:]...)
				continue
			}
			rules[i].Action = r.Action
			continue
		}
		if r.Action == actionOff {
			return nil, fmt.Errorf("%s: action off with an event; to remove a default rule give only its name and \"action\": \"off\"", where)
		}
		if r.Action == "" {
			r.Action = ActionRecord
		}
		if err := r.check(); err != nil {
			return nil, fmt.Errorf("%s: %v", where, err)
		}
		if i >= 0 {
			rules[i] = r
		} else {
			rules = append(rules, r)
		}
	}
	return rules, nil
}

// check says what is wrong with a rule's match fields, if anything.
func (r Rule) check() error {
	only := func(field string, set bool, events ...string) error {
		if !set {
			return nil
		}
		for _, e := range events {
			if r.Event == e {
				return nil
			}
		}
		return fmt.Errorf("%s applies only to the event %s, not %s", field, strings.Join(events, " or "), r.Event)
	}
	switch r.Event {
	case EventExec, EventConnect, EventBind, EventOpen, EventClone, EventMonitorIncomplete:
	default:
		return fmt.Errorf("unknown event %q; the events are exec, connect, bind, open, clone and monitor-incomplete", r.Event)
	}
	for _, err := range []error{
		only("names", len(r.Names) > 0, EventExec),
		only("parent_names", len(r.ParentNames) > 0, EventExec),
		only("paths", len(r.Paths) > 0, EventExec, EventOpen),
		only("not_in_image", r.NotInImage, EventExec),
		only("written", r.Written, EventExec),
		only("write", r.Write, EventOpen),
		only("ports", len(r.Ports) > 0, EventConnect, EventBind),
		only("families", len(r.Families) > 0, EventConnect, EventBind),
	} {
		if err != nil {
			return err
		}
	}
	for _, list := range [][]string{r.Names, r.ParentNames, r.Paths} {
		for _, p := range list {
			if _, err := path.Match(strings.TrimSuffix(p, "/**"), ""); err != nil || p == "" {
				return fmt.Errorf("pattern %q is not a valid glob (path.Match syntax, or a directory followed by /**)", p)
			}
		}
	}
	for _, f := range r.Families {
		if !slices.Contains(families, f) {
			return fmt.Errorf("family %q is not one of %s", f, strings.Join(families, ", "))
		}
	}
	for _, p := range r.Ports {
		if p < 1 || p > 65535 {
			return fmt.Errorf("port %d is out of range; ports are 1 to 65535", p)
		}
	}
	if r.Count < 0 {
		return fmt.Errorf("count %d is negative; give the number of matching events at which the rule fires", r.Count)
	}
	return nil
}

// match reports whether name matches one of the patterns (see Rule).
func match(patterns []string, name string) bool {
	for _, p := range patterns {
		if dir, ok := strings.CutSuffix(p, "/**"); ok {
			if strings.HasPrefix(name, dir) && (len(name) == len(dir) || name[len(dir)] == '/') {
				return true
			}
			continue
		}
		// The literal prefix first: most names fail there, cheaply.
		lit := literal(p)
		if len(lit) == len(p) && p != name {
			continue
		}
		if !strings.HasPrefix(name, lit) {
			continue
		}
		if ok, _ := path.Match(p, name); ok {
			return true
		}
	}
	return false
}

// literal is the part of a glob before its first special character.
func literal(p string) string {
	for i := 0; i < len(p); i++ {
		switch p[i] {
		case '*', '?', '[', '\\':
			return p[:i]
		}
	}
	return p
}
