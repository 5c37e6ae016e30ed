package engine_test

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/safe-run/safe-run/agent"
	"github.com/safe-run/safe-run/runtime/engine"
	"github.com/safe-run/safe-run/sandbox"
)

// envLog records the Env of every request of each operation.
type envLog struct {
	mu  sync.Mutex
	env map[string][][]string // by Op ("" is a run)
}

func (l *envLog) handler() handler {
	return func(a *fakeAgent, req agent.Request) []agent.Event {
		l.mu.Lock()
		if l.env == nil {
			l.env = map[string][][]string{}
		}
		l.env[req.Op] = append(l.env[req.Op], req.Env)
		l.mu.Unlock()
		return printCode(a, req)
	}
}

func (l *envLog) of(op string) [][]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.env[op])
}

// TestJobEnvReachesAgent: a job's Env travels with its run request and with
// its session cell (whose interpreter starts with it).
func TestJobEnvReachesAgent(t *testing.T) {
	var log envLog
	b := newFake(log.handler())
	e := newEngine(t, b, engine.Config{})
	env := []string{"TZ=UTC", "PYTHONHASHSEED=0"}
	run(t, e, sandbox.Job{Env: env})
	if got := log.of(agent.OpRun); len(got) != 1 || !slices.Equal(got[0], env) {
		t.Errorf("run requests' Env = %q, want one with %q", got, env)
	}
	ctx := context.Background()
	info, err := e.CreateSession(ctx, sandbox.SessionSpec{Language: "python"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.RunInSession(ctx, info.ID, sandbox.Job{Language: "python", Code: "x = 1", Env: env}); err != nil {
		t.Fatal(err)
	}
	if got := log.of(agent.OpEval); len(got) != 1 || !slices.Equal(got[0], env) {
		t.Errorf("eval requests' Env = %q, want one with %q", got, env)
	}
}

// TestPoolServesOnlyItsEnv: the pool's interpreters are warmed with its Env,
// and only a job with that same Env is given one: another Env (or none)
// starts cold, since PYTHONHASHSEED and the like are fixed at start.
func TestPoolServesOnlyItsEnv(t *testing.T) {
	var log envLog
	b := newFake(log.handler())
	env := []string{"PYTHONHASHSEED=0"}
	e := newEngine(t, b, engine.Config{Pool: engine.PoolConfig{Size: map[string]int{"python": 1}, Env: env}})
	sb := pooled(t, b, "python")
	if got := log.of(agent.OpWarm); len(got) == 0 || !slices.Equal(got[0], env) {
		t.Errorf("warm requests' Env = %q, want %q", got, env)
	}
	for _, other := range [][]string{nil, {"PYTHONHASHSEED=1"}, {"PYTHONHASHSEED=0", "TZ=UTC"}} {
		if res := run(t, e, sandbox.Job{Env: other}); res.SandboxID == sb.id {
			t.Errorf("a job with Env %q took the pool's sandbox warmed with %q", other, env)
		}
	}
	if sb.isDestroyed() {
		t.Fatal("the pooled sandbox was used")
	}
	if res := run(t, e, sandbox.Job{Env: env}); res.SandboxID != sb.id {
		t.Errorf("a job with the pool's Env ran in %s, not the pooled %s", res.SandboxID, sb.id)
	}
}
