package engine

import (
	"fmt"

	"github.com/safe-run/safe-run/sandbox"
)

// Rule actions the engine acts on (package monitor names them; the engine
// reads them from the Activity so that it needs no monitor of its own).
const (
	actionKill            = "kill"
	actionDenyFutureCalls = "deny-future-calls"
)

// takeActivity takes a monitored sandbox's activity since the last take,
// or nil for a sandbox that is not monitored.
func takeActivity(sb Sandbox, final bool) *sandbox.Activity {
	if ar, ok := sb.(ActivityReporter); ok {
		return ar.TakeActivity(final)
	}
	return nil
}

// totalActivity is a monitored sandbox's whole activity, or nil.
func totalActivity(sb Sandbox) *sandbox.Activity {
	if ar, ok := sb.(ActivityReporter); ok {
		return ar.TotalActivity()
	}
	return nil
}

// ruleHit returns a's first hit of a rule whose action is action, if any.
func ruleHit(a *sandbox.Activity, action string) *sandbox.RuleHit {
	if a == nil {
		return nil
	}
	for i := range a.Rules {
		if a.Rules[i].Action == action {
			return &a.Rules[i]
		}
	}
	return nil
}

// withActivity puts a into res; a kill rule in it makes the run a policy
// violation, whatever else its end looked like (the backend killed the
// sandbox, so the agent's report is missing or says killed).
func withActivity(res sandbox.Result, a *sandbox.Activity) sandbox.Result {
	if a == nil {
		return res
	}
	res.Activity = markEgress(a, res.Network)
	if hit := ruleHit(a, actionKill); hit != nil {
		res.Status = sandbox.StatusPolicyViolation
		res.ExitCode = -1
		res.Signal = ""
		res.Err = nil
		res.Message = policyMessage(*hit)
	}
	return res
}

// policyMessage says which rule stopped a run, and on what.
func policyMessage(hit sandbox.RuleHit) string {
	msg := fmt.Sprintf("the run was stopped by monitoring rule %q", hit.Rule)
	if hit.Event != "" {
		msg += ": " + hit.Event
	}
	return msg
}

// mergeActivities joins the whole activities of a session's sandboxes, in
// order, into one: lists are joined, counts added, the first loss kept.
// Each part was capped by its monitor, and a session has few sandboxes
// (one more each time its state is lost).
func mergeActivities(parts []*sandbox.Activity) *sandbox.Activity {
	if len(parts) == 0 {
		return nil
	}
	if len(parts) == 1 {
		return parts[0]
	}
	out := &sandbox.Activity{}
	for _, a := range parts {
		out.Processes = append(out.Processes, a.Processes...)
		out.ProcessesTruncated = out.ProcessesTruncated || a.ProcessesTruncated
		out.Clones += a.Clones
		out.Threads += a.Threads
		out.Network = append(out.Network, a.Network...)
		out.NetworkTruncated = out.NetworkTruncated || a.NetworkTruncated
		out.FilesWritten = append(out.FilesWritten, a.FilesWritten...)
		out.FilesWrittenTruncated = out.FilesWrittenTruncated || a.FilesWrittenTruncated
		out.SensitiveReads = append(out.SensitiveReads, a.SensitiveReads...)
		out.SensitiveReadsTruncated = out.SensitiveReadsTruncated || a.SensitiveReadsTruncated
		out.Signals = append(out.Signals, a.Signals...)
		out.SignalsTruncated = out.SignalsTruncated || a.SignalsTruncated
		out.Rules = append(out.Rules, a.Rules...)
		out.RulesTruncated = out.RulesTruncated || a.RulesTruncated
		out.Dropped += a.Dropped
		if out.Lost == "" {
			out.Lost = a.Lost
		}
		for k, n := range a.Events {
			if out.Events == nil {
				out.Events = map[string]int{}
			}
			out.Events[k] += n
		}
	}
	capList(&out.Processes, &out.ProcessesTruncated, maxMergedProcesses)
	capList(&out.Network, &out.NetworkTruncated, maxMergedList)
	capList(&out.FilesWritten, &out.FilesWrittenTruncated, maxMergedList)
	capList(&out.SensitiveReads, &out.SensitiveReadsTruncated, maxMergedList)
	capList(&out.Signals, &out.SignalsTruncated, maxMergedList)
	capList(&out.Rules, &out.RulesTruncated, maxMergedList)
	return out
}

// The caps of a session's joined activity: a session that lost its
// sandbox many times still reports a bounded tree.
const (
	maxMergedProcesses = 256
	maxMergedList      = 128
)

// capList cuts *l to n entries, and says so in *truncated.
func capList[T any](l *[]T, truncated *bool, n int) {
	if len(*l) > n {
		*l = (*l)[:n]
		*truncated = true
	}
}
