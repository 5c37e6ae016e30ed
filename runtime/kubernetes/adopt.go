package kubernetes

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	extv1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
)

// This file finds the warm pools an operator made (deploy/kubernetes's
// sandboxes.yaml, or an overlay of it) that the backend may claim from
// instead of creating its own: a pool whose template makes exactly the
// sandbox the backend would make for the job. The test is equality of
// the templates' specs as data — never a name, a label or a subset — so a
// template that drops or loosens any part of the hardened Pod (PodSpec),
// or its network policy, is never adopted; it may only add nothing.

// SameSandbox says whether the template have makes the sandboxes that
// want describes: their specs are equal as values (a quantity written
// "1" or "1000m" is the same quantity; a field left out differs from one
// set). Names, labels and annotations of the templates themselves are not
// compared: they do not reach the Pod.
func SameSandbox(have, want *extv1.SandboxTemplate) bool {
	return equality.Semantic.DeepEqual(have.Spec, want.Spec)
}

// adoptable finds, among the warm pools in the namespace, one whose
// template is the same sandbox as want (SameSandbox), or returns nil. When
// several are, the largest wins, then the first by name. With explain,
// pools whose templates are labelled for want's language but differ are
// logged with the first difference, so that an operator sees why a shipped
// pool stays unused (most often: the server's image is not the template's).
func (b *Backend) adoptable(ctx context.Context, want *extv1.SandboxTemplate, explain bool) (*extv1.SandboxWarmPool, error) {
	var pools extv1.SandboxWarmPoolList
	if err := b.list(ctx, poolsResource, &pools); err != nil {
		return nil, fmt.Errorf("list warm pools: %w", err)
	}
	if len(pools.Items) == 0 {
		return nil, nil
	}
	var templates extv1.SandboxTemplateList
	if err := b.list(ctx, templatesResource, &templates); err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	byName := map[string]*extv1.SandboxTemplate{}
	for i := range templates.Items {
		byName[templates.Items[i].Name] = &templates.Items[i]
	}
	sort.SliceStable(pools.Items, func(i, j int) bool {
		ri, rj := replicasOf(&pools.Items[i]), replicasOf(&pools.Items[j])
		if ri != rj {
			return ri > rj
		}
		return pools.Items[i].Name < pools.Items[j].Name
	})
	lang := want.Labels[LabelLanguage]
	for i := range pools.Items {
		pool := &pools.Items[i]
		have, ok := byName[pool.Spec.TemplateRef.Name]
		if !ok || have.DeletionTimestamp != nil || pool.DeletionTimestamp != nil {
			continue
		}
		if SameSandbox(have, want) {
			return pool, nil
		}
		if explain && have.Spec.PodTemplate.ObjectMeta.Labels[LabelLanguage] == lang && have.Name != want.Name {
			b.log.Warn("not claiming from a warm pool of this language: its template is not the sandbox this server makes",
				"pool", pool.Name, "template", have.Name, "language", lang, "differs at", firstDifference(have.Spec, want.Spec))
		}
	}
	return nil, nil
}

func replicasOf(p *extv1.SandboxWarmPool) int32 {
	if p.Spec.Replicas == nil {
		return 0
	}
	return *p.Spec.Replicas
}

// list reads every object of res in the namespace into out, a typed list.
func (b *Backend) list(ctx context.Context, res schema.GroupVersionResource, out any) error {
	u, err := b.dyn.Resource(res).Namespace(b.cfg.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	return runtime.DefaultUnstructuredConverter.FromUnstructured(u.UnstructuredContent(), out)
}

// firstDifference names the first field (in the order of their JSON
// forms) where have and want differ, with both values, for a log line.
func firstDifference(have, want any) string {
	h, err1 := runtime.DefaultUnstructuredConverter.ToUnstructured(&have)
	w, err2 := runtime.DefaultUnstructuredConverter.ToUnstructured(&want)
	if err1 != nil || err2 != nil {
		return "?"
	}
	if path, ok := differ("spec", h, w); ok {
		return path
	}
	return "?"
}

// differ walks two JSON-like values and reports the first path where they
// differ. Quantities written differently but equal are not a difference.
func differ(path string, h, w any) (string, bool) {
	hm, hok := h.(map[string]any)
	wm, wok := w.(map[string]any)
	if hok && wok {
		keys := make([]string, 0, len(hm)+len(wm))
		for k := range hm {
			keys = append(keys, k)
		}
		for k := range wm {
			if _, ok := hm[k]; !ok {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		for _, k := range keys {
			if p, ok := differ(path+"."+k, hm[k], wm[k]); ok {
				return p, true
			}
		}
		return "", false
	}
	hl, hok := h.([]any)
	wl, wok := w.([]any)
	if hok && wok {
		for i := 0; i < max(len(hl), len(wl)); i++ {
			var hi, wi any
			if i < len(hl) {
				hi = hl[i]
			}
			if i < len(wl) {
				wi = wl[i]
			}
			if p, ok := differ(fmt.Sprintf("%s[%d]", path, i), hi, wi); ok {
				return p, true
			}
		}
		return "", false
	}
	if reflect.DeepEqual(h, w) {
		return "", false
	}
	if hs, ok := h.(string); ok {
		if ws, ok := w.(string); ok {
			hq, err1 := resource.ParseQuantity(hs)
			wq, err2 := resource.ParseQuantity(ws)
			if err1 == nil && err2 == nil && hq.Cmp(wq) == 0 {
				return "", false
			}
		}
	}
	return fmt.Sprintf("%s: %s, want %s", path, show(h), show(w)), true
}

func show(v any) string {
	if v == nil {
		return "unset"
	}
	s := fmt.Sprint(v)
	if len(s) > 80 {
		s = s[:80] + "…"
	}
	return strings.ReplaceAll(s, "\n", " ")
}
