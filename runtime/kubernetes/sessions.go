package kubernetes

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	extv1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/safe-run/safe-run/runtime/engine"
	"github.com/safe-run/safe-run/sandbox"
)

// The backend is an engine.SessionStore: a session's record is its claim
// (LabelSession, AnnotationSession, AnnotationLastUsed, AnnotationHolder),
// so every server using the namespace finds every session, and the server
// process keeps no state of its own.
//
// Attaching is a new pods/exec of the agent into the claim's Pod: the
// files of /workspace (the Pod's emptyDir) are the session's, the
// interpreter is new. The previous holder's exec is left alone: it ends
// when that server lets go (its next call sees another Holder, or its
// janitor does), or when its stream closes because that server died (the
// agent exits at the end of its stdin, and its interpreter with it).
var _ engine.SessionStore = (*Backend)(nil)

// newHolder names a new agent connection of this server.
func newHolder(owner string) string { return owner + "/" + randomHex(6) }

// sessionState is the JSON part of rec kept on its claim.
func sessionState(rec engine.SessionRecord) *SessionState {
	return &SessionState{Owner: rec.Owner, Language: rec.Language, Limits: rec.Limits, Network: rec.Network,
		Packages: rec.Packages, Created: rec.Created}
}

// sessionClaims lists the live claims of session id, or of every session
// for "", newest first.
func (b *Backend) sessionClaims(ctx context.Context, id string) ([]extv1.SandboxClaim, error) {
	sel := labels.Set{LabelManagedBy: ManagedBy, LabelKind: KindSession}
	if id != "" {
		if len(validation.IsValidLabelValue(id)) > 0 {
			return nil, nil // no session has such an ID
		}
		sel[LabelSession] = id
	}
	list, err := b.dyn.Resource(claimsResource).Namespace(b.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil, fmt.Errorf("list session claims: %w", err)
	}
	var claims []extv1.SandboxClaim
	for _, u := range list.Items {
		var c extv1.SandboxClaim
		if err := fromUnstructured(u.Object, &c); err != nil {
			return nil, fmt.Errorf("read claim %s: %w", u.GetName(), err)
		}
		if c.DeletionTimestamp != nil || c.Labels[LabelSession] == "" {
			continue // being deleted, or made before sessions were stored
		}
		claims = append(claims, c)
	}
	slices.SortFunc(claims, func(x, y extv1.SandboxClaim) int {
		return y.CreationTimestamp.Compare(x.CreationTimestamp.Time)
	})
	return claims, nil
}

// sessionRecord reads the record of the session claim c holds.
func sessionRecord(c *extv1.SandboxClaim) (engine.SessionRecord, error) {
	var st SessionState
	if err := json.Unmarshal([]byte(c.Annotations[AnnotationSession]), &st); err != nil {
		return engine.SessionRecord{}, fmt.Errorf("claim %s: its annotation %s: %w", c.Name, AnnotationSession, err)
	}
	return engine.SessionRecord{ID: c.Labels[LabelSession], Owner: st.Owner, Language: st.Language, Limits: st.Limits,
		Network: st.Network, Packages: st.Packages, Created: st.Created, LastUsed: claimInfo(c).LastUsed,
		SandboxID: c.Name, Holder: c.Annotations[AnnotationHolder]}, nil
}

// FindSession returns the record on session id's claim (the newest, if a
// lost sandbox's replacement raced another's).
func (b *Backend) FindSession(ctx context.Context, id string) (engine.SessionRecord, error) {
	claims, err := b.sessionClaims(ctx, id)
	if err != nil {
		return engine.SessionRecord{}, err
	}
	if len(claims) == 0 {
		return engine.SessionRecord{}, fmt.Errorf("no claim holds session %s: %w", id, sandbox.ErrNoSession)
	}
	return sessionRecord(&claims[0])
}

// StoredSessions returns the record of every session in the namespace.
func (b *Backend) StoredSessions(ctx context.Context) ([]engine.SessionRecord, error) {
	claims, err := b.sessionClaims(ctx, "")
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var recs []engine.SessionRecord
	for i := range claims {
		rec, err := sessionRecord(&claims[i])
		if err != nil {
			b.log.Warn("skip a session claim", "err", err)
			continue
		}
		if !seen[rec.ID] {
			seen[rec.ID] = true
			recs = append(recs, rec)
		}
	}
	return recs, nil
}

// AttachSession names a new holder on the session's claim and execs a new
// agent into its Pod, as Start does once a claim is bound.
func (b *Backend) AttachSession(spec engine.StartSpec) (engine.Sandbox, error) {
	rec := spec.Session
	if rec == nil || rec.SandboxID == "" || !spec.KeepAlive {
		return nil, sandbox.WithClass(fmt.Errorf("attach: no session's sandbox named"), sandbox.ErrInvalid)
	}
	name := rec.SandboxID
	holder := newHolder(b.cfg.Owner)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b.track(name)
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		AnnotationHolder: holder, AnnotationLastUsed: time.Now().UTC().Format(time.RFC3339)}}})
	_, err := b.dyn.Resource(claimsResource).Namespace(b.cfg.Namespace).Patch(ctx, name, types.MergePatchType, patch, metav1PatchOptions)
	switch {
	case apierrors.IsNotFound(err):
		b.forget(name)
		return nil, fmt.Errorf("attach to claim %s: %w", name, sandbox.ErrNoSession)
	case err != nil:
		b.forget(name)
		return nil, sandbox.WithClass(fmt.Errorf("attach to claim %s: %w", name, err), classOf(err))
	}
	log := spec.Log
	if log == nil {
		log = b.log
	}
	return b.newClaimSandbox(name, holder, spec, log.With("sandbox", name)), nil
}

// EndSession deletes the claims of session id and their Sandboxes (their
// Pods go with them).
func (b *Backend) EndSession(ctx context.Context, id string) (bool, error) {
	claims, err := b.sessionClaims(ctx, id)
	if err != nil {
		return false, err
	}
	ended := false
	background := metav1.DeletePropagationBackground
	zero := int64(0)
	for _, c := range claims {
		err := b.dyn.Resource(claimsResource).Namespace(b.cfg.Namespace).Delete(ctx, c.Name,
			metav1.DeleteOptions{PropagationPolicy: &background, GracePeriodSeconds: &zero})
		switch {
		case apierrors.IsNotFound(err):
			continue // another server was first
		case err != nil:
			return ended, fmt.Errorf("delete claim %s: %w", c.Name, err)
		}
		ended = true
		if sb := c.Status.SandboxStatus.Name; sb != "" {
			if err := b.remove(ctx, sandboxesResource, sb); err != nil {
				return ended, fmt.Errorf("delete sandbox %s: %w", sb, err)
			}
		}
	}
	return ended, nil
}

// touch records on claim name that its session was used at now.
func (b *Backend) touch(ctx context.Context, name string, now time.Time) error {
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, AnnotationLastUsed, now.UTC().Format(time.RFC3339))
	_, err := b.dyn.Resource(claimsResource).Namespace(b.cfg.Namespace).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1PatchOptions)
	return err
}
