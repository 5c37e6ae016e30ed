package engine_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/safe-run/safe-run/runtime/engine"
	"github.com/safe-run/safe-run/sandbox"
)

// fakeStore is a fakeBackend that is also an engine.SessionStore: its
// records stand for the Kubernetes backend's claims (the store every
// server reads), and an attach starts a new fake agent for the session's
// "claim", whose interpreter starts afresh as a new exec's does.
type fakeStore struct {
	*fakeBackend
	mu      sync.Mutex
	records map[string]engine.SessionRecord
	holders int
}

var _ engine.SessionStore = (*fakeStore)(nil)

func newFakeStore(handle handler) *fakeStore {
	return &fakeStore{fakeBackend: newFake(handle), records: map[string]engine.SessionRecord{}}
}

// storedSandbox is a fake sandbox of a stored session.
type storedSandbox struct {
	*fakeSandbox
	store  *fakeStore
	claim  string // the record's SandboxID
	holder string
}

var _ engine.StoredSandbox = (*storedSandbox)(nil)

func (s *fakeStore) newHolder() string {
	s.holders++
	return fmt.Sprint("holder-", s.holders)
}

func (s *fakeStore) Start(spec engine.StartSpec) (engine.Sandbox, error) {
	sb, err := s.start(spec, "", true)
	if err != nil || spec.Session == nil {
		return sb, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec := *spec.Session
	rec.SandboxID, rec.Holder = sb.id, s.newHolder()
	s.records[rec.ID] = rec
	return &storedSandbox{fakeSandbox: sb, store: s, claim: sb.id, holder: rec.Holder}, nil
}

func (s *fakeStore) FindSession(ctx context.Context, id string) (engine.SessionRecord, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.records[id]
	if !ok {
		return rec, fmt.Errorf("fake store: %w", sandbox.ErrNoSession)
	}
	return rec, nil
}

func (s *fakeStore) StoredSessions(ctx context.Context) ([]engine.SessionRecord, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var recs []engine.SessionRecord
	for _, rec := range s.records {
		recs = append(recs, rec)
	}
	return recs, nil
}

func (s *fakeStore) AttachSession(spec engine.StartSpec) (engine.Sandbox, error) {
	s.mu.Lock()
	rec, ok := s.records[spec.Session.ID]
	if !ok {
		s.mu.Unlock()
		return nil, sandbox.ErrNoSession
	}
	rec.Holder = s.newHolder()
	rec.LastUsed = time.Now()
	s.records[rec.ID] = rec
	s.mu.Unlock()
	sb, err := s.start(spec, "", true)
	if err != nil {
		return nil, err
	}
	return &storedSandbox{fakeSandbox: sb, store: s, claim: rec.SandboxID, holder: rec.Holder}, nil
}

func (s *fakeStore) EndSession(ctx context.Context, id string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.records[id]
	delete(s.records, id)
	return ok, nil
}

// record returns session id's record, if stored.
func (s *fakeStore) record(id string) (engine.SessionRecord, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.records[id]
	return rec, ok
}

func (sb *storedSandbox) Holder() string { return sb.holder }

// Detach ends this agent only; the record stays.
func (sb *storedSandbox) Detach() error { return sb.fakeSandbox.Destroy() }

// Destroy ends the agent and removes the "claim", and so the record.
func (sb *storedSandbox) Destroy() error {
	sb.store.mu.Lock()
	for id, rec := range sb.store.records {
		if rec.SandboxID == sb.claim {
			delete(sb.store.records, id)
		}
	}
	sb.store.mu.Unlock()
	return sb.fakeSandbox.Destroy()
}

func (sb *storedSandbox) Touch(ctx context.Context) error {
	sb.store.mu.Lock()
	defer sb.store.mu.Unlock()
	for id, rec := range sb.store.records {
		if rec.SandboxID == sb.claim {
			rec.LastUsed = time.Now()
			sb.store.records[id] = rec
		}
	}
	return nil
}

// storeEngines returns n engines over one store, as n servers over one
// cluster, and checks when the test ends that, all closed, every sandbox
// was destroyed or let go of exactly once and no goroutine is left.
func storeEngines(t *testing.T, store *fakeStore, n int, cfg engine.Config) []*engine.Engine {
	t.Helper()
	t.Cleanup(func() { checkNoGoroutines(t) })
	cfg.Backend = store
	if cfg.Logger == nil {
		cfg.Logger = discard
	}
	var es []*engine.Engine
	for range n {
		e, err := engine.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		es = append(es, e)
	}
	t.Cleanup(func() {
		for _, e := range es {
			e.Close()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := store.Wait(ctx); err != nil {
			t.Errorf("after Close, %d sandboxes are live", store.Live())
		}
		for _, sb := range store.sandboxes() {
			if n := sb.destroys.Load(); n != 1 {
				t.Errorf("sandbox %s was destroyed %d times, want once", sb.id, n)
			}
		}
	})
	return es
}

// TestStoredSessionAcrossEngines: a session created by engine A is served
// by engine B, which attaches (a fresh interpreter, said in the result);
// A, called again, attaches anew because B holds the session now; another
// owner gets ErrNoSession from B; B's close removes the record, and A then
// has no session.
func TestStoredSessionAcrossEngines(t *testing.T) {
	store := newFakeStore(interpreter)
	es := storeEngines(t, store, 2, engine.Config{})
	a, b := es[0], es[1]
	ctx := sandbox.WithOwner(context.Background(), "client")
	info, err := a.CreateSession(ctx, sandbox.SessionSpec{Owner: "client", Language: "python"})
	if err != nil {
		t.Fatal(err)
	}
	if res := cell(t, a, ctx, info.ID, "n+=1"); res.Stdout != "1" || res.StateLost {
		t.Fatalf("A's first call: %+v", res)
	}
	if _, err := b.RunInSession(sandbox.WithOwner(context.Background(), "other"), info.ID, sandbox.Job{Code: "n+=1"}); !errors.Is(err, sandbox.ErrNoSession) {
		t.Errorf("another owner through B: %v, want ErrNoSession", err)
	}
	res := cell(t, b, ctx, info.ID, "n+=1")
	if res.Stdout != "1" || !res.StateLost || !strings.HasPrefix(res.Message, "this server attached") {
		t.Errorf("B's first call: %+v; want a fresh interpreter, said", res)
	}
	if res := cell(t, b, ctx, info.ID, "n+=1"); res.Stdout != "2" || res.StateLost {
		t.Errorf("B's second call: %+v; want B's interpreter kept", res)
	}
	if res := cell(t, a, ctx, info.ID, "n+=1"); res.Stdout != "1" || !res.StateLost {
		t.Errorf("A after B: %+v; want A to attach anew", res)
	}
	if rec, _ := store.record(info.ID); rec.Owner != "client" || rec.Language != "python" {
		t.Errorf("record %+v", rec)
	}
	if err := b.CloseSession(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
	if _, ok := store.record(info.ID); ok {
		t.Error("the closed session is still stored")
	}
	if _, err := a.RunInSession(ctx, info.ID, sandbox.Job{Code: "n+=1"}); !errors.Is(err, sandbox.ErrNoSession) {
		t.Errorf("A after B closed the session: %v, want ErrNoSession", err)
	}
	if got := a.ListSessions(); len(got) != 0 {
		t.Errorf("A lists %+v after the session ended elsewhere", got)
	}
}

// TestStoredSessionOtherPolicy: a server attaches to a stored session only
// within its own policy; one whose limits are tighter than those the
// session was made with refuses it, starts nothing, and the session stays
// for the server that made it.
func TestStoredSessionOtherPolicy(t *testing.T) {
	store := newFakeStore(interpreter)
	a := storeEngines(t, store, 1, engine.Config{})[0]
	b, err := engine.New(engine.Config{Backend: store, Logger: discard, Policy: sandbox.Policy{Max: sandbox.Limits{Timeout: 5 * time.Second}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close) // before storeEngines' checks, which run after it
	ctx := sandbox.WithOwner(context.Background(), "client")
	info, err := a.CreateSession(ctx, sandbox.SessionSpec{Owner: "client", Language: "python", Limits: sandbox.Limits{Timeout: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	started := len(store.sandboxes())
	_, err = b.RunInSession(ctx, info.ID, sandbox.Job{Code: "n+=1"})
	if !errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), "another policy") {
		t.Errorf("B, whose timeout is at most 5s, on a session of 1m: %v; want ErrUnavailable naming the policy", err)
	}
	if n := len(store.sandboxes()); n != started {
		t.Errorf("B's refusal started %d sandboxes", n-started)
	}
	if res := cell(t, a, ctx, info.ID, "n+=1"); res.Stdout != "1" || res.StateLost {
		t.Errorf("A after B's refusal: %+v; want A's session as it was", res)
	}
	if err := a.CloseSession(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
}

// TestStoredSessionOutlivesItsEngine: closing an engine lets go of its
// stored sessions; another engine serves them, and one that never held a
// session closes it by its record.
func TestStoredSessionOutlivesItsEngine(t *testing.T) {
	store := newFakeStore(interpreter)
	var ended []string
	var mu sync.Mutex
	es := storeEngines(t, store, 3, engine.Config{Sessions: engine.SessionConfig{OnEnd: func(info sandbox.SessionInfo, why string) {
		mu.Lock()
		defer mu.Unlock()
		ended = append(ended, why)
	}}})
	ctx := sandbox.WithOwner(context.Background(), "client")
	info, err := es[0].CreateSession(ctx, sandbox.SessionSpec{Owner: "client", Language: "python"})
	if err != nil {
		t.Fatal(err)
	}
	cell(t, es[0], ctx, info.ID, "n+=1")
	es[0].Close()
	if _, ok := store.record(info.ID); !ok {
		t.Fatal("closing the engine ended its stored session")
	}
	if res := cell(t, es[1], ctx, info.ID, "n+=1"); res.Stdout != "1" || !res.StateLost {
		t.Errorf("another engine's call: %+v", res)
	}
	if err := es[2].CloseSession(sandbox.WithOwner(context.Background(), "other"), info.ID); !errors.Is(err, sandbox.ErrNoSession) {
		t.Errorf("another owner's close: %v, want ErrNoSession", err)
	}
	if err := es[2].CloseSession(ctx, info.ID); err != nil {
		t.Fatalf("close from an engine that never held the session: %v", err)
	}
	if _, ok := store.record(info.ID); ok {
		t.Error("the closed session is still stored")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(ended) != 1 || ended[0] != "closed" {
		t.Errorf("ends reported: %v, want one closed", ended)
	}
}

// TestStoredSessionExpiry: an engine that does not hold a stored session
// ends it once its record's last use is older than the idle timeout; a
// call in progress on another engine refreshes the record meanwhile.
func TestStoredSessionExpiry(t *testing.T) {
	store := newFakeStore(interpreter)
	idle := 400 * time.Millisecond
	whys := make(chan string, 4)
	es := storeEngines(t, store, 2, engine.Config{Sessions: engine.SessionConfig{IdleTimeout: idle, SweepStore: true,
		OnEnd: func(info sandbox.SessionInfo, why string) { whys <- why }}})
	ctx := sandbox.WithOwner(context.Background(), "client")
	info, err := es[0].CreateSession(ctx, sandbox.SessionSpec{Owner: "client", Language: "python"})
	if err != nil {
		t.Fatal(err)
	}
	es[0].Close() // lets go: only the store has it now
	awaitIdleEnd(t, whys, "the stored session")
	if _, ok := store.record(info.ID); ok {
		t.Error("the expired session is still stored")
	}
}

// TestStoredSessionNotSwept: an engine without SweepStore (a one-shot CLI
// run) leaves alone the stored sessions it does not hold, however idle.
func TestStoredSessionNotSwept(t *testing.T) {
	store := newFakeStore(interpreter)
	es := storeEngines(t, store, 2, engine.Config{Sessions: engine.SessionConfig{IdleTimeout: 200 * time.Millisecond}})
	ctx := sandbox.WithOwner(context.Background(), "client")
	left, err := es[0].CreateSession(ctx, sandbox.SessionSpec{Owner: "client", Language: "python"})
	if err != nil {
		t.Fatal(err)
	}
	es[0].Close()
	if _, err := es[1].CreateSession(ctx, sandbox.SessionSpec{Owner: "client", Language: "python"}); err != nil {
		t.Fatal(err) // its janitor runs from now on
	}
	time.Sleep(time.Second)
	if _, ok := store.record(left.ID); !ok {
		t.Error("an engine without SweepStore ended a stored session it did not hold")
	}
}

// TestStoredSessionLostThenIdle: a session whose sandbox died in a call
// (its record went with it) still ends here at its idle timeout, and the
// end is reported.
func TestStoredSessionLostThenIdle(t *testing.T) {
	store := newFakeStore(interpreter)
	whys := make(chan string, 4)
	es := storeEngines(t, store, 1, engine.Config{Sessions: engine.SessionConfig{IdleTimeout: 300 * time.Millisecond,
		OnEnd: func(info sandbox.SessionInfo, why string) { whys <- why }}})
	ctx := sandbox.WithOwner(context.Background(), "client")
	info, err := es[0].CreateSession(ctx, sandbox.SessionSpec{Owner: "client", Language: "python"})
	if err != nil {
		t.Fatal(err)
	}
	if res := cell(t, es[0], ctx, info.ID, "die"); !res.StateLost {
		t.Fatalf("the sandbox's death: %+v", res)
	}
	if _, ok := store.record(info.ID); ok {
		t.Fatal("the dead sandbox's record is still stored")
	}
	awaitIdleEnd(t, whys, "the lost session")
}

// awaitIdleEnd waits for OnEnd to report what (a session) ended at its
// idle timeout.
func awaitIdleEnd(t *testing.T, whys <-chan string, what string) {
	t.Helper()
	select {
	case why := <-whys:
		if why != "idle timeout" {
			t.Errorf("%s ended: %s, want idle timeout", what, why)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not expire", what)
	}
}
