package kubernetes

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic/fake"
	extv1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/safe-run/safe-run/sandbox"
)

// TestAdoptOnlyTheSameSandbox offers the backend an operator's pool (named
// as deploy/kubernetes names it, not by the backend's hash) whose template
// is the backend's own Pod with one change. It claims from that pool only
// when the change does not reach the sandbox (the template's own labels, a
// quantity written otherwise); any loosening of the hardened Pod, or a
// change of image, network policy or limits, makes it create its own.
func TestAdoptOnlyTheSameSandbox(t *testing.T) {
	no, yes, root := false, true, int64(0)
	for _, tt := range []struct {
		name  string
		adopt bool
		edit  func(s *extv1.SandboxTemplate)
	}{
		{"unchanged", true, func(s *extv1.SandboxTemplate) {}},
		{"template's own labels", true, func(s *extv1.SandboxTemplate) { s.Labels = map[string]string{"team": "a"} }},
		{"cpu written in millicores", true, func(s *extv1.SandboxTemplate) {
			c := &s.Spec.PodTemplate.Spec.Containers[0]
			c.Resources.Limits[corev1.ResourceCPU] = resource.MustParse("1000m")
		}},
		{"another image", false, func(s *extv1.SandboxTemplate) { s.Spec.PodTemplate.Spec.Containers[0].Image = "img:2" }},
		{"no runtimeClassName", false, func(s *extv1.SandboxTemplate) { s.Spec.PodTemplate.Spec.RuntimeClassName = nil }},
		{"runAsUser 0", false, func(s *extv1.SandboxTemplate) {
			s.Spec.PodTemplate.Spec.Containers[0].SecurityContext.RunAsUser = &root
		}},
		{"runAsNonRoot unset", false, func(s *extv1.SandboxTemplate) { s.Spec.PodTemplate.Spec.SecurityContext.RunAsNonRoot = nil }},
		{"writable root", false, func(s *extv1.SandboxTemplate) {
			s.Spec.PodTemplate.Spec.Containers[0].SecurityContext.ReadOnlyRootFilesystem = &no
		}},
		{"privilege escalation", false, func(s *extv1.SandboxTemplate) {
			s.Spec.PodTemplate.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = &yes
		}},
		{"a capability added", false, func(s *extv1.SandboxTemplate) {
			s.Spec.PodTemplate.Spec.Containers[0].SecurityContext.Capabilities.Add = []corev1.Capability{"NET_RAW"}
		}},
		{"seccomp unconfined", false, func(s *extv1.SandboxTemplate) {
			s.Spec.PodTemplate.Spec.SecurityContext.SeccompProfile.Type = corev1.SeccompProfileTypeUnconfined
		}},
		{"service account token", false, func(s *extv1.SandboxTemplate) { s.Spec.PodTemplate.Spec.AutomountServiceAccountToken = &yes }},
		{"service links", false, func(s *extv1.SandboxTemplate) { s.Spec.PodTemplate.Spec.EnableServiceLinks = nil }},
		{"host network", false, func(s *extv1.SandboxTemplate) { s.Spec.PodTemplate.Spec.HostNetwork = true }},
		{"host PID", false, func(s *extv1.SandboxTemplate) { s.Spec.PodTemplate.Spec.HostPID = true }},
		{"workspace on disk", false, func(s *extv1.SandboxTemplate) { s.Spec.PodTemplate.Spec.Volumes[0].EmptyDir.Medium = "" }},
		{"a hostPath volume", false, func(s *extv1.SandboxTemplate) {
			s.Spec.PodTemplate.Spec.Volumes = append(s.Spec.PodTemplate.Spec.Volumes, corev1.Volume{Name: "host",
				VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}})
		}},
		{"more memory", false, func(s *extv1.SandboxTemplate) {
			s.Spec.PodTemplate.Spec.Containers[0].Resources.Limits[corev1.ResourceMemory] = resource.MustParse("4Gi")
		}},
		{"ephemeral storage unbounded", false, func(s *extv1.SandboxTemplate) {
			delete(s.Spec.PodTemplate.Spec.Containers[0].Resources.Limits, corev1.ResourceEphemeralStorage)
		}},
		{"no activeDeadlineSeconds", false, func(s *extv1.SandboxTemplate) { s.Spec.PodTemplate.Spec.ActiveDeadlineSeconds = nil }},
		{"not labelled a sandbox (the deny-all policy's selector)", false, func(s *extv1.SandboxTemplate) {
			delete(s.Spec.PodTemplate.ObjectMeta.Labels, LabelRole)
		}},
		{"agent-sandbox's default network policy", false, func(s *extv1.SandboxTemplate) { s.Spec.NetworkPolicy = nil }},
		{"an egress rule", false, func(s *extv1.SandboxTemplate) {
			s.Spec.NetworkPolicy = &extv1.NetworkPolicySpec{Egress: []networkingv1.NetworkPolicyEgressRule{{}}}
		}},
		{"env injection allowed", false, func(s *extv1.SandboxTemplate) {
			s.Spec.EnvVarsInjectionPolicy = extv1.EnvVarsInjectionPolicyAllowed
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dyn := newFake(t)
			b := testBackend(t, dyn, readyThen(nil))
			job := checked(t)
			own := operatorsPool(t, b, dyn, job, tt.edit)
			pool, err := b.ensurePool(context.Background(), job, 0)
			if err != nil {
				t.Fatal(err)
			}
			pools, err := dyn.Resource(poolsResource).Namespace(testNS).List(context.Background(), metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if tt.adopt {
				if pool.Name != "safe-run-python" || len(pools.Items) != 1 {
					t.Errorf("claims from %s, %d pools; want the operator's pool and no other", pool.Name, len(pools.Items))
				}
			} else if pool.Name != own.Name || len(pools.Items) != 2 {
				t.Errorf("claims from %s, %d pools; want its own pool %s beside the operator's", pool.Name, len(pools.Items), own.Name)
			}
			// The choice is made once.
			if again, err := b.ensurePool(context.Background(), job, 0); err != nil || again.Name != pool.Name {
				t.Errorf("second ensurePool: %v, %v", again, err)
			}
		})
	}
}

// operatorsPool puts a pool safe-run-python of 2 into dyn, whose template
// is b's own for job changed by edit, and returns b's own template.
func operatorsPool(t *testing.T, b *Backend, dyn *fake.FakeDynamicClient, job sandbox.Job, edit func(*extv1.SandboxTemplate)) *extv1.SandboxTemplate {
	t.Helper()
	own, err := Template(job, b.spec)
	if err != nil {
		t.Fatal(err)
	}
	theirs := own.DeepCopy()
	theirs.Name, theirs.Labels = "safe-run-python", nil
	edit(theirs)
	put(t, dyn, templatesResource, theirs)
	two := int32(2)
	put(t, dyn, poolsResource, &extv1.SandboxWarmPool{
		TypeMeta:   metav1.TypeMeta{APIVersion: extv1.GroupVersion.String(), Kind: extv1.SandboxWarmPoolKind},
		ObjectMeta: metav1.ObjectMeta{Name: "safe-run-python", Namespace: testNS},
		Spec:       extv1.SandboxWarmPoolSpec{Replicas: &two, TemplateRef: extv1.SandboxTemplateRef{Name: "safe-run-python"}},
	})
	return own
}

// TestAdoptExplains: when a warm pool is asked for and the language's pool
// is passed over, the log names the pool and the field that differs; for
// a run (no warm pool asked) it says nothing.
func TestAdoptExplains(t *testing.T) {
	for _, replicas := range []int32{0, 2} {
		dyn := newFake(t)
		b := testBackend(t, dyn, readyThen(nil))
		var logged bytes.Buffer
		b.log = slog.New(slog.NewTextHandler(&logged, nil))
		job := checked(t)
		operatorsPool(t, b, dyn, job, func(s *extv1.SandboxTemplate) { s.Spec.PodTemplate.Spec.Containers[0].Image = "img:2" })
		if _, err := b.ensurePool(context.Background(), job, replicas); err != nil {
			t.Fatal(err)
		}
		said := strings.Contains(logged.String(), "pool=safe-run-python") && strings.Contains(logged.String(), "containers[0].image: img:2, want img:1")
		if said != (replicas > 0) {
			t.Errorf("replicas %d: explained %v; log:\n%s", replicas, said, logged.String())
		}
	}
}

func TestFirstDifference(t *testing.T) {
	a := corev1.PodSpec{Containers: []corev1.Container{{Name: "sandbox", Image: "img:1",
		Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}}}}}
	b := *a.DeepCopy()
	b.Containers[0].Resources.Limits[corev1.ResourceCPU] = resource.MustParse("1000m")
	b.Containers[0].Image = "img:2"
	got := firstDifference(a, b)
	if !strings.Contains(got, "containers[0].image: img:1, want img:2") {
		t.Errorf("firstDifference = %q", got)
	}
}
