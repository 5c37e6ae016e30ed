package mcp

import "github.com/safe-run/safe-run/sandbox"

// ActivityLine sums up what a run did in the sandbox in one line for the
// text rendering, e.g. "activity: nothing notable" or "activity: 2
// processes (sh), rule shell-from-python (record)". The sandbox chose the
// names in it: hidden characters are shown as escapes.
func ActivityLine(a *sandbox.Activity) string {
	return "activity: " + EscapeName(a.Summary())
}

// ActivitySchema is the JSON Schema of sandbox.Activity, the "activity"
// of run_code's structured output and of close_session's.
const ActivitySchema = `{"type": "object", "description": "what the run did inside the sandbox, from gVisor's trace points (see docs/monitor.md); lists are capped, *_truncated says so",
      "properties": {
        "processes": {"type": "array", "description": "programs started, in order",
          "items": {"type": "object",
            "properties": {
              "pid": {"type": "integer"}, "parent": {"type": "integer"},
              "binary": {"type": "string"}, "argv": {"type": "array", "items": {"type": "string"}},
              "argv_truncated": {"type": "boolean"}, "sha256": {"type": "string"},
              "exited": {"type": "boolean"}, "exit_code": {"type": "integer"}, "signal": {"type": "string"}},
            "required": ["pid", "binary"]}},
        "processes_truncated": {"type": "boolean"},
        "clones": {"type": "integer", "description": "processes created (a fork bomb shows as a storm)"},
        "threads": {"type": "integer"},
        "network": {"type": "array", "description": "socket, connect and bind attempts",
          "items": {"type": "object",
            "properties": {
              "op": {"type": "string"}, "pid": {"type": "integer"}, "family": {"type": "string"},
              "type": {"type": "string"}, "address": {"type": "string"}, "result": {"type": "string"},
              "egress": {"type": "string", "enum": ["allowed", "denied"], "description": "the host's decision on an IP connect of a run with a network; absent without a network or a record of the host's"},
              "egress_host": {"type": "string", "description": "the host name the allowlist matched (or the denied name)"},
              "egress_reason": {"type": "string", "description": "why the host denied it"}},
            "required": ["op", "result"]}},
        "network_truncated": {"type": "boolean"},
        "files_written": {"type": "array", "items": {"type": "string"}, "description": "paths opened for writing outside /workspace and /tmp"},
        "files_written_truncated": {"type": "boolean"},
        "sensitive_reads": {"type": "array", "items": {"type": "string"}, "description": "opens of sensitive files such as /proc/self/environ"},
        "sensitive_reads_truncated": {"type": "boolean"},
        "signals": {"type": "array", "items": {"type": "object",
          "properties": {"pid": {"type": "integer"}, "target": {"type": "integer"}, "signal": {"type": "string"}},
          "required": ["target", "signal"]}},
        "signals_truncated": {"type": "boolean"},
        "rules": {"type": "array", "description": "monitoring rules that fired",
          "items": {"type": "object",
            "properties": {"rule": {"type": "string"}, "action": {"type": "string", "enum": ["record", "kill", "deny-future-calls"]}, "event": {"type": "string"}},
            "required": ["rule", "action", "event"]}},
        "rules_truncated": {"type": "boolean"},
        "dropped": {"type": "integer", "description": "trace points runsc dropped"},
        "lost": {"type": "string", "description": "why monitoring ended early; later events are missing"},
        "events": {"type": "object", "additionalProperties": {"type": "integer"}, "description": "trace points received, by kind"}},
      "required": ["clones"]}`
