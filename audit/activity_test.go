package audit

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/safe-run/safe-run/sandbox"
)

// TestBoundedActivity checks that a record's activity, every string of
// which the sandbox chose, is capped and escaped like the rest.
func TestBoundedActivity(t *testing.T) {
	long := strings.Repeat("a", 10*MaxEntryBytes)
	a := sandbox.Activity{Clones: 3, Events: map[string]int{}}
	for i := range MaxActivityProcesses + 5 {
		a.Processes = append(a.Processes, sandbox.Process{PID: i, Binary: "/bin/x\n{\"forged\":1}", Argv: make([]string, MaxActivityArgs+3)})
	}
	for range MaxActivityEntries + 1 {
		a.FilesWritten = append(a.FilesWritten, long)
		a.Rules = append(a.Rules, sandbox.RuleHit{Rule: "r", Action: "record", Event: "\x1b[2J"})
	}
	a.Network = append(a.Network, sandbox.NetworkAttempt{Op: "connect", Family: "inet", Address: "198.19.0.1:80", Result: "ok",
		Egress: "allowed", EgressHost: long, EgressReason: "dial\n{\"forged\":1}"})
	for i := range MaxActivityEntries * 2 {
		a.Events[strings.Repeat("k", i+1)] = 1
	}
	b := Bounded(Record{Event: EventRun, Activity: &a}).Activity
	switch {
	case len(b.Processes) != MaxActivityProcesses || !b.ProcessesTruncated:
		t.Errorf("%d processes (truncated %v), want %d", len(b.Processes), b.ProcessesTruncated, MaxActivityProcesses)
	case len(b.Processes[0].Argv) != MaxActivityArgs || !b.Processes[0].ArgvTruncated:
		t.Errorf("argv of %d, want %d, truncated", len(b.Processes[0].Argv), MaxActivityArgs)
	case strings.Contains(b.Processes[0].Binary, "\n"):
		t.Errorf("binary %q keeps its newline", b.Processes[0].Binary)
	case len(b.FilesWritten) != MaxActivityEntries || !b.FilesWrittenTruncated || len(b.FilesWritten[0]) > MaxEntryBytes:
		t.Errorf("%d files written of up to %d bytes, want %d cut to %d", len(b.FilesWritten), len(b.FilesWritten[0]), MaxActivityEntries, MaxEntryBytes)
	case len(b.Rules) != MaxActivityEntries || strings.ContainsRune(b.Rules[0].Event, '\x1b'):
		t.Errorf("rules %d, first event %q", len(b.Rules), b.Rules[0].Event)
	case len(b.Events) != MaxActivityEntries:
		t.Errorf("%d event kinds, want %d", len(b.Events), MaxActivityEntries)
	case len(b.Network[0].EgressHost) > MaxEntryBytes || strings.Contains(b.Network[0].EgressReason, "\n") || b.Network[0].Egress != "allowed":
		t.Errorf("network attempt not cleaned: %+v", b.Network[0])
	case b.Clones != 3 || len(a.Processes) != MaxActivityProcesses+5:
		t.Errorf("counts changed (%d clones), or the caller's activity was cut (%d)", b.Clones, len(a.Processes))
	}
	data, _ := json.Marshal(Record{Activity: b})
	if len(data) > MaxLine/8 {
		t.Errorf("a bounded activity takes %d bytes", len(data))
	}
	if Bounded(Record{Event: EventRun}).Activity != nil {
		t.Error("a record without activity gained one")
	}
}
