package engine_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/safe-run/safe-run/agent"
	"github.com/safe-run/safe-run/runtime/engine"
	"github.com/safe-run/safe-run/sandbox"
)

// monitoredBackend is a fake backend whose sandboxes report activity
// (engine.ActivityReporter): each request's code names the rule hit its
// run makes, "kill:NAME", "deny-future-calls:NAME" or "record:NAME", or none.
type monitoredBackend struct {
	*fakeBackend
	mu   sync.Mutex
	acts map[string]*sandbox.Activity // per sandbox, since its last take
	life map[string]*sandbox.Activity // per sandbox, its whole life
}

func newMonitored() *monitoredBackend {
	m := &monitoredBackend{acts: map[string]*sandbox.Activity{}, life: map[string]*sandbox.Activity{}}
	m.fakeBackend = newFake(func(a *fakeAgent, req agent.Request) []agent.Event {
		if req.Op != agent.OpRun && req.Op != agent.OpEval {
			return exit(agent.Exit{})
		}
		code := req.Code
		if req.Op == agent.OpRun {
			code = string(req.Files[0].Data)
		}
		action, rule, _ := strings.Cut(code, ":")
		m.record(a.sb.id, action, rule)
		if action == "kill" {
			return nil // the backend killed the sandbox: the agent's stream ends
		}
		return exit(agent.Exit{})
	})
	return m
}

// record notes what a request of sandbox id did.
func (m *monitoredBackend) record(id, action, rule string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, set := range []map[string]*sandbox.Activity{m.acts, m.life} {
		a := set[id]
		if a == nil {
			a = &sandbox.Activity{}
			set[id] = a
		}
		a.Clones++
		if rule != "" {
			a.Rules = append(a.Rules, sandbox.RuleHit{Rule: rule, Action: action, Event: "execve /bin/sh by python3 (pid 7)"})
		}
	}
}

func (m *monitoredBackend) Start(spec engine.StartSpec) (engine.Sandbox, error) {
	sb, err := m.fakeBackend.Start(spec)
	if err != nil {
		return nil, err
	}
	return &monitoredSandbox{fakeSandbox: sb.(*fakeSandbox), m: m}, nil
}

type monitoredSandbox struct {
	*fakeSandbox
	m *monitoredBackend
}

func (s *monitoredSandbox) TakeActivity(bool) *sandbox.Activity {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	a := s.m.acts[s.id]
	delete(s.m.acts, s.id)
	if a == nil {
		a = &sandbox.Activity{}
	}
	return a
}

func (s *monitoredSandbox) TotalActivity() *sandbox.Activity {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if a := s.m.life[s.id]; a != nil {
		c := *a
		return &c
	}
	return &sandbox.Activity{}
}

func TestActivityInResults(t *testing.T) {
	for _, tc := range []struct {
		code    string
		status  sandbox.Status
		message string
		rules   int
	}{
		{"print(1)", sandbox.StatusOK, "", 0},
		{"record:shell-from-python", sandbox.StatusOK, "", 1},
		{"deny-future-calls:shell-from-python", sandbox.StatusOK, "", 1}, // a single run only records it
		{"kill:miner-name", sandbox.StatusPolicyViolation, `the run was stopped by monitoring rule "miner-name": execve /bin/sh`, 1},
	} {
		t.Run(tc.code, func(t *testing.T) {
			e := newEngine(t, newMonitored(), engine.Config{})
			res, err := e.Run(context.Background(), sandbox.Job{Language: "python", Code: tc.code})
			if err != nil {
				t.Fatal(err)
			}
			if res.Status != tc.status || !strings.HasPrefix(res.Message, tc.message) || res.Activity == nil || len(res.Activity.Rules) != tc.rules {
				t.Errorf("status %s, message %q, activity %+v; want %s, %q, %d rules", res.Status, res.Message, res.Activity, tc.status, tc.message, tc.rules)
			}
			if tc.status == sandbox.StatusPolicyViolation && (res.Err != nil || res.ExitCode != -1) {
				t.Errorf("a policy violation has Err %v and exit code %d, want none and -1", res.Err, res.ExitCode)
			}
		})
	}
}

func TestActivityWithoutReporter(t *testing.T) {
	e := newEngine(t, newFake(printCode), engine.Config{})
	res, err := e.Run(context.Background(), sandbox.Job{Language: "python", Code: "print(1)"})
	if err != nil || res.Activity != nil {
		t.Errorf("a backend without ActivityReporter: %v, activity %+v", err, res.Activity)
	}
}

func TestActivityInSessions(t *testing.T) {
	e := newEngine(t, newMonitored(), engine.Config{})
	t.Cleanup(e.CloseSessions)
	info, err := e.CreateSession(context.Background(), sandbox.SessionSpec{Language: "python"})
	if err != nil {
		t.Fatal(err)
	}
	call := func(code string) (sandbox.Result, error) {
		return e.RunInSession(context.Background(), info.ID, sandbox.Job{Code: code})
	}
	first, err := call("x = 1")
	if err != nil || first.Activity == nil || first.Activity.Clones != 1 || len(first.Activity.Rules) != 0 {
		t.Fatalf("first call: %v, activity %+v; want its own clone only", err, first.Activity)
	}
	second, err := call("deny-future-calls:shell-from-python")
	if err != nil || second.Activity == nil || second.Activity.Clones != 1 || !strings.Contains(second.Message, "refuses further calls") {
		t.Fatalf("second call: %v, activity %+v, message %q", err, second.Activity, second.Message)
	}
	_, err = call("x")
	if err == nil || !strings.Contains(err.Error(), `"shell-from-python"`) || !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("a call after deny-future-calls: %v, want a refusal naming the rule", err)
	}
	if err := e.WriteFiles(context.Background(), info.ID, []sandbox.File{{Path: "a.txt", Data: []byte("a")}}); err == nil {
		t.Error("a file operation after deny-future-calls was allowed")
	}
	tree, err := e.CloseSessionActivity(context.Background(), info.ID)
	if err != nil || tree == nil || tree.Clones != 2 || len(tree.Rules) != 1 {
		t.Errorf("the session's tree: %v, %+v; want both calls' clones and the rule", err, tree)
	}
}
