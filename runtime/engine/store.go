package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/safe-run/safe-run/sandbox"
)

// Sessions in a SessionStore. When the backend keeps every session's
// record with its sandbox, where every server finds it, the session table
// holds this server's connections to sessions rather than the sessions:
//   - a call naming a session the table lacks reads its record, checks its
//     owner and attaches a new agent to its sandbox (attach); files in the
//     workspace are the session's, the interpreter starts afresh, and the
//     first cell says so (state_lost);
//   - before each call on a session it holds, the engine reads the record
//     again (checkStored): gone means another server closed or expired the
//     session, and this one lets go of it; another Holder means another
//     server attached since, whose interpreter is now the session's, so
//     this one lets go of its agent and attaches anew (state_lost again);
//   - closing removes the stored sandbox, whichever server holds it;
//   - expiry goes by the record's LastUsed, which the backend updates at
//     every request and a call in progress refreshes (keepTouched), so no
//     server expires a session used or busy on another; a session no server
//     holds (its server died) expires from the first janitor that sees it
//     (sweepStore);
//   - shutting down lets go of the sessions instead of ending them, so a
//     restarted server, or another, serves them on.
//
// Two servers may hold one session at once (a client whose calls go to
// both): calls on it are then one at a time per server, not across them,
// and each server's call first makes its own agent the session's.

// storeTimeout bounds each call to the store.
const storeTimeout = 30 * time.Second

// store returns the backend's SessionStore, or nil.
func (e *Engine) store() SessionStore {
	s, _ := e.cfg.Backend.(SessionStore)
	return s
}

func noSession(id string) error { return fmt.Errorf("session %q: %w", id, sandbox.ErrNoSession) }

// storeError is an error of the store, of class unavailable unless it has
// a class of its own.
func storeError(id string, err error) error {
	err = fmt.Errorf("session %q: read its record: %w", id, err)
	if sandbox.Class(err) == nil {
		err = sandbox.WithClass(err, sandbox.ErrUnavailable)
	}
	return err
}

// record is the session's record for a SessionStore.
func (s *session) record() SessionRecord {
	return SessionRecord{ID: s.id, Owner: s.owner, Language: s.lang.Name, Limits: s.limits, Network: s.network,
		Packages: s.pkgs.packages, Created: s.created, LastUsed: time.Unix(0, s.lastUsed.Load())}
}

// holder is the name of this server's connection to the session's sandbox,
// or "" without one.
func (s *session) holder() string {
	s.stMu.Lock()
	p := s.proc
	s.stMu.Unlock()
	if p == nil {
		return ""
	}
	return p.holder()
}

// findSession reads session id's record; an unknown one is ErrNoSession.
func findSession(ctx context.Context, store SessionStore, id string) (SessionRecord, error) {
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	rec, err := store.FindSession(ctx, id)
	switch {
	case errors.Is(err, sandbox.ErrNoSession):
		return rec, noSession(id)
	case err != nil:
		return rec, storeError(id, err)
	}
	return rec, nil
}

// attach serves session id, which this engine does not hold, from the
// store: it checks the record's owner against ctx's, takes a place in the
// table and attaches a new agent to the session's sandbox.
func (e *Engine) attach(ctx context.Context, store SessionStore, id string) (*session, error) {
	owner := sandbox.OwnerFrom(ctx)
	rec, err := findSession(ctx, store, id)
	if err != nil {
		return nil, err
	}
	if rec.Owner != owner {
		return nil, noSession(id)
	}
	// The record was written by the server that created the session, under
	// its policy: this server serves it only within its own.
	_, lang, err := e.cfg.Policy.Check(sandbox.Job{Language: rec.Language, Code: "session", Limits: rec.Limits,
		Network: rec.Network, Packages: rec.Packages})
	if err != nil {
		return nil, sandbox.WithClass(fmt.Errorf("session %q was made under another policy than this server's (%v): "+
			"give every server the same settings", id, err), sandbox.ErrUnavailable)
	}
	if lang.Interpreter == "" {
		return nil, sandbox.WithClass(fmt.Errorf("session %q is a %q session, which this server's policy does not serve", id, rec.Language), sandbox.ErrUnavailable)
	}
	s := &session{id: id, owner: rec.Owner, lang: lang, limits: rec.Limits, network: rec.Network, created: rec.Created, gone: make(chan struct{})}
	s.pkgs.packages = rec.Packages
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.lastUsed.Store(rec.LastUsed.UnixNano())
	t := e.table()
	t.mu.Lock()
	if other, held := t.m[id]; held {
		// A concurrent call attached first.
		t.mu.Unlock()
		s.cancel()
		if other.current() == sessionClosed || other.owner != owner {
			return nil, noSession(id)
		}
		return other, nil
	}
	switch {
	case t.closed:
		t.mu.Unlock()
		s.cancel()
		return nil, sandbox.WithClass(errors.New("the server is shutting down"), sandbox.ErrUnavailable)
	case len(t.m) >= t.cfg.MaxSessions:
		t.mu.Unlock()
		s.cancel()
		return nil, fmt.Errorf("%w (the limit is %d on this server)", sandbox.ErrTooManySessions, t.cfg.MaxSessions)
	}
	s.mu.Lock() // calls wait for the attach
	defer s.mu.Unlock()
	t.m[id] = s
	t.mu.Unlock()
	t.janitor.Do(func() { go e.expireSessions() })

	bootCtx, done := s.bind(ctx)
	p, err := e.attachBox(bootCtx, store, rec)
	done()
	s.stMu.Lock()
	switch {
	case s.state == sessionClosed:
		err = fmt.Errorf("session %q was closed while this server attached to it: %w", id, sandbox.ErrNoSession)
	case err == nil:
		if err = s.move(sessionReady); err == nil {
			s.proc = p
			s.reportLost, s.attached = true, true
			s.stMu.Unlock()
			e.log.Info("attached to a stored session", "session", id, "sandbox", p.id())
			return s, nil
		}
	default:
		// The session stays in the store, for a later call or its expiry.
		_ = s.move(sessionClosed)
		s.cancel()
	}
	s.stMu.Unlock()
	e.endSession(s, p) // p is nil unless the session was closed after the attach
	return nil, err
}

// attachBox attaches a new agent to the sandbox of the session rec names
// and waits for it.
func (e *Engine) attachBox(ctx context.Context, store SessionStore, rec SessionRecord) (*box, error) {
	spec := e.spec(sandbox.Job{Language: rec.Language, Limits: rec.Limits, Network: rec.Network}, true)
	spec.Session = &rec
	b, err := e.newBox(spec, store.AttachSession, false)
	return e.sessionBoxReady(ctx, b, err)
}

// checkStored makes sure, before a call, that the session this engine
// holds is still stored and that this engine's agent is its holder (see
// the top of the file). The call holds the session.
func (e *Engine) checkStored(ctx context.Context, store SessionStore, s *session) error {
	rec, err := findSession(ctx, store, s.id)
	if errors.Is(err, sandbox.ErrNoSession) {
		e.log.Info("session ended on another server", "session", s.id)
		e.letGo(s)
		return err
	}
	if err != nil {
		return err
	}
	p := s.proc
	if rec.Holder == p.holder() {
		return nil
	}
	p.log.Info("another server attached to the session since; attaching anew", "session", s.id)
	s.drop(p, true)
	np, err := e.attachBox(ctx, store, rec)
	if err != nil {
		e.letGo(s) // the next call attaches from the start
		return err
	}
	s.stMu.Lock()
	s.proc = np
	s.stMu.Unlock()
	s.reportLost, s.attached = true, true
	return nil
}

// letGo closes s, which a call holds, on this server only: the call's end
// lets go of its sandbox and leaves the store as it is.
func (e *Engine) letGo(s *session) {
	s.stMu.Lock()
	if s.move(sessionClosed) == nil {
		s.detach = true
	}
	s.stMu.Unlock()
	s.cancel()
}

// keepTouched refreshes the session's LastUsed in the store while a call
// holds its sandbox d, so that no other server expires it meanwhile.
func (e *Engine) keepTouched(d StoredSandbox) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(e.table().tick())
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			tctx, tcancel := context.WithTimeout(ctx, storeTimeout)
			if err := d.Touch(tctx); err != nil && ctx.Err() == nil {
				e.log.Warn("record that a session is in use", "err", err)
			}
			tcancel()
		}
	}()
	return func() { cancel(); <-done }
}

// closeStored closes session id, which this engine does not hold, in the
// store.
func (e *Engine) closeStored(ctx context.Context, store SessionStore, id string) error {
	rec, err := findSession(ctx, store, id)
	if err != nil {
		return err
	}
	if rec.Owner != sandbox.OwnerFrom(ctx) {
		return noSession(id)
	}
	return e.endStored(ctx, store, rec, "closed")
}

// endStored ends the stored session rec, which this engine does not hold,
// and reports it as a session's end, unless another server ended it first.
func (e *Engine) endStored(ctx context.Context, store SessionStore, rec SessionRecord, why string) error {
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	ended, err := store.EndSession(ctx, rec.ID)
	switch {
	case err != nil:
		return storeError(rec.ID, err)
	case !ended:
		return noSession(rec.ID)
	}
	e.log.Info("session ended", "session", rec.ID, "why", why, "held", "by no server or another")
	if end := e.table().cfg.OnEnd; end != nil {
		end(e.recordInfo(rec), why)
	}
	return nil
}

// recordInfo describes a stored session this engine does not hold; its
// Calls are this server's, so none.
func (e *Engine) recordInfo(rec SessionRecord) sandbox.SessionInfo {
	return sandbox.SessionInfo{ID: rec.ID, Owner: rec.Owner, Language: rec.Language, Created: rec.Created,
		LastUsed: rec.LastUsed, ExpiresAt: e.table().expires(rec.Created, rec.LastUsed)}
}

// expireStored decides on s, a session idle here for the idle timeout:
// it ends only if the store says no server used it since.
func (e *Engine) expireStored(store SessionStore, s *session) {
	rec, err := findSession(context.Background(), store, s.id)
	switch {
	case errors.Is(err, sandbox.ErrNoSession) && s.holder() == "":
		// Its sandbox died here, and its record with it: it is this
		// server's to end.
		e.closeSession(s, "idle timeout")
	case errors.Is(err, sandbox.ErrNoSession):
		e.closeSessionHow(s, "", true) // ended on another server
	case err != nil:
		e.log.Warn("read a session's record for its expiry; trying again later", "session", s.id, "err", err)
	case time.Since(rec.LastUsed) <= e.table().cfg.IdleTimeout && rec.Holder != s.holder():
		e.closeSessionHow(s, "", true) // another server serves it now
	case time.Since(rec.LastUsed) <= e.table().cfg.IdleTimeout:
		s.lastUsed.Store(max(s.lastUsed.Load(), rec.LastUsed.UnixNano()))
	default:
		e.closeSession(s, "idle timeout")
	}
}

// sweepStore ends the stored sessions this engine does not hold that were
// idle or lived too long: those of servers that died, or that let go.
func (e *Engine) sweepStore(store SessionStore, now time.Time) {
	t := e.table()
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	recs, err := store.StoredSessions(ctx)
	if err != nil {
		e.log.Warn("list the stored sessions for their expiry; trying again later", "err", err)
		return
	}
	for _, rec := range recs {
		t.mu.Lock()
		_, held := t.m[rec.ID]
		t.mu.Unlock()
		var why string
		switch {
		case held:
			continue // expired above, if at all
		case now.Sub(rec.Created) > t.cfg.MaxLifetime:
			why = "reached its maximum lifetime"
		case now.Sub(rec.LastUsed) > t.cfg.IdleTimeout:
			why = "idle timeout"
		default:
			continue
		}
		if err := e.endStored(ctx, store, rec, why); err != nil && !errors.Is(err, sandbox.ErrNoSession) {
			e.log.Warn("end an expired stored session", "session", rec.ID, "err", err)
		}
	}
}
