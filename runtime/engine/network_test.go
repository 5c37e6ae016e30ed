package engine_test

import (
	"testing"

	"github.com/safe-run/safe-run/egress"
	"github.com/safe-run/safe-run/runtime/engine"
	"github.com/safe-run/safe-run/sandbox"
)

// TestPoolSkipsNetworkJobs: a job with a network never takes a pooled
// (network-less) sandbox; it starts its own, with the policy's network
// limits, and the pooled one keeps waiting.
func TestPoolSkipsNetworkJobs(t *testing.T) {
	b := newFake(printCode)
	limits := egress.Limits{MaxConnections: 7}
	policy := sandbox.Policy{Network: egress.Allowlist{Entries: []egress.Entry{{Host: "example.test"}}}, NetworkLimits: limits}
	e := newEngine(t, b, engine.Config{Policy: policy, Pool: engine.PoolConfig{Size: map[string]int{"python": 1}}})
	sb := pooled(t, b, "python")
	res := run(t, e, sandbox.Job{Network: []string{"example.test"}})
	if res.SandboxID == sb.id {
		t.Fatal("a job with a network took the pooled sandbox")
	}
	cold := b.sandbox(res.SandboxID)
	if len(cold.spec.Job.Network) == 0 || cold.spec.NetworkLimits != limits {
		t.Errorf("started with network %q, limits %+v; want the job's and %+v", cold.spec.Job.Network, cold.spec.NetworkLimits, limits)
	}
	if sb.isDestroyed() {
		t.Error("the pooled sandbox was used")
	}
	// Without a network the pooled sandbox is taken, with no limits set.
	if res := run(t, e, sandbox.Job{}); res.SandboxID != sb.id {
		t.Errorf("a job without a network ran in %s, not the pooled %s", res.SandboxID, sb.id)
	}
}
