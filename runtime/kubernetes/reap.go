package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	sandboxv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
)

var metav1PatchOptions = metav1.PatchOptions{FieldManager: ManagedBy}

// ClaimInfo is a claim's state as safe-run keeps it in the API.
type ClaimInfo struct {
	// Name is the claim's name, the sandbox's ID.
	Name string
	// Language, Owner and Kind are its labels.
	Language, Owner, Kind string
	// Created and LastUsed are its annotations.
	Created, LastUsed time.Time
	// Sandbox is the agent-sandbox Sandbox bound to it, if any.
	Sandbox string
}

// Claims lists the claims safe-run made in the namespace, of kind
// (KindRun, KindSession) or of any kind for "": what any server replica
// sees of every other's sandboxes.
func (b *Backend) Claims(ctx context.Context, kind string) ([]ClaimInfo, error) {
	sel := labels.Set{LabelManagedBy: ManagedBy}
	if kind != "" {
		sel[LabelKind] = kind
	}
	list, err := b.dyn.Resource(claimsResource).Namespace(b.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil, fmt.Errorf("list claims: %w", err)
	}
	infos := make([]ClaimInfo, 0, len(list.Items))
	for _, u := range list.Items {
		var c extv1.SandboxClaim
		if err := fromUnstructured(u.Object, &c); err != nil {
			return nil, fmt.Errorf("read claim %s: %w", u.GetName(), err)
		}
		infos = append(infos, claimInfo(&c))
	}
	return infos, nil
}

// Lookup returns the state of the claim name.
func (b *Backend) Lookup(ctx context.Context, name string) (ClaimInfo, error) {
	var c extv1.SandboxClaim
	if err := b.get(ctx, claimsResource, name, &c); err != nil {
		return ClaimInfo{}, fmt.Errorf("read claim %s: %w", name, err)
	}
	if c.Labels[LabelManagedBy] != ManagedBy {
		return ClaimInfo{}, fmt.Errorf("claim %s is not safe-run's", name)
	}
	return claimInfo(&c), nil
}

func claimInfo(c *extv1.SandboxClaim) ClaimInfo {
	created, _ := time.Parse(time.RFC3339, c.Annotations[AnnotationCreated])
	if created.IsZero() {
		created = c.CreationTimestamp.Time
	}
	used, _ := time.Parse(time.RFC3339, c.Annotations[AnnotationLastUsed])
	if used.IsZero() {
		used = created
	}
	return ClaimInfo{Name: c.Name, Language: c.Labels[LabelLanguage], Owner: c.Labels[LabelOwner], Kind: c.Labels[LabelKind],
		Created: created, LastUsed: used, Sandbox: c.Status.SandboxStatus.Name}
}

// Reap removes what dead servers left: safe-run's claims unused for idle
// (and their Sandboxes), then Sandboxes made for a claim that is gone and
// sandbox Pods whose Sandbox is gone, once older than min(idle, a minute).
// Claims of this backend's own live sandboxes are never taken. It returns
// the names of what it removed.
func (b *Backend) Reap(ctx context.Context, idle time.Duration) ([]string, error) {
	now := time.Now()
	orphanAge := min(idle, time.Minute)
	b.mu.Lock()
	mine := make(map[string]bool, len(b.claims))
	for n := range b.claims {
		mine[n] = true
	}
	b.mu.Unlock()
	var removed []string
	var errs []error
	drop := func(res, name string, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("delete %s %s: %w", res, name, err))
		} else {
			removed = append(removed, res+"/"+name)
		}
	}
	claims, err := b.Claims(ctx, "")
	if err != nil {
		return nil, err
	}
	live := map[string]bool{}
	for _, c := range claims {
		if mine[c.Name] || now.Sub(c.LastUsed) < idle {
			live[c.Name] = true
			continue
		}
		drop("sandboxclaim", c.Name, b.remove(ctx, claimsResource, c.Name))
		if c.Sandbox != "" {
			drop("sandbox", c.Sandbox, b.remove(ctx, sandboxesResource, c.Sandbox))
		}
	}
	// Sandboxes agent-sandbox made for safe-run's claims (it labels them
	// created-by) whose claim is gone.
	sbs, err := b.dyn.Resource(sandboxesResource).Namespace(b.cfg.Namespace).List(ctx,
		metav1.ListOptions{LabelSelector: labels.Set{sandboxv1.CreatedByLabel: ManagedBy}.String()})
	if err != nil {
		return removed, errors.Join(append(errs, fmt.Errorf("list sandboxes: %w", err))...)
	}
	sandboxes := map[string]bool{}
	for _, u := range sbs.Items {
		owner := ownerOfKind(u.GetOwnerReferences(), extv1.SandboxClaimKind)
		if owner != "" && !live[owner] && !mine[owner] && now.Sub(u.GetCreationTimestamp().Time) >= orphanAge {
			drop("sandbox", u.GetName(), b.remove(ctx, sandboxesResource, u.GetName()))
			continue
		}
		sandboxes[u.GetName()] = true
	}
	pods, err := b.dyn.Resource(podsResource).Namespace(b.cfg.Namespace).List(ctx,
		metav1.ListOptions{LabelSelector: labels.Set{LabelManagedBy: ManagedBy, LabelRole: RoleSandbox}.String()})
	if err != nil {
		return removed, errors.Join(append(errs, fmt.Errorf("list pods: %w", err))...)
	}
	for _, u := range pods.Items {
		var pod corev1.Pod
		if fromUnstructured(u.Object, &pod) != nil || now.Sub(pod.CreationTimestamp.Time) < orphanAge {
			continue
		}
		owner := ownerOfKind(pod.OwnerReferences, sandboxv1.SandboxKind)
		if owner == "" || sandboxes[owner] {
			continue
		}
		var sb sandboxv1.Sandbox
		if err := b.get(ctx, sandboxesResource, owner, &sb); err == nil || !apierrors.IsNotFound(err) {
			continue // a warm pool's, or not to be judged now
		}
		drop("pod", pod.Name, b.remove(ctx, podsResource, pod.Name))
	}
	return removed, errors.Join(errs...)
}

func ownerOfKind(refs []metav1.OwnerReference, kind string) string {
	for _, r := range refs {
		if r.Kind == kind {
			return r.Name
		}
	}
	return ""
}

// reapEvery runs Reap now and then every interval, for the process's life.
func (b *Backend) reapEvery(interval time.Duration) {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		removed, err := b.Reap(ctx, b.cfg.ReapIdle)
		cancel()
		if len(removed) > 0 {
			b.log.Warn("removed sandboxes left by a safe-run server that died", "removed", removed)
		}
		if err != nil {
			b.log.Error("reap stale sandboxes", "err", err)
		}
		time.Sleep(interval)
	}
}
