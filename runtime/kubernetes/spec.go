package kubernetes

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sandboxv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/safe-run/safe-run/bundle"
	"github.com/safe-run/safe-run/sandbox"
)

// This file is the whole Kubernetes side of a sandbox's posture as data:
// the SandboxTemplate (and its Pod), the SandboxWarmPool, the SandboxClaim
// and the deny-all NetworkPolicy. Nothing here talks to the API, so it can
// be read, and tested, as the values it returns (golden files in testdata).

// Labels and annotations safe-run puts on what it creates. A claim's are
// its session state in the API: any server replica can find a claim by
// them, and the reaper finds what a dead server left.
const (
	// LabelManagedBy marks every object safe-run creates (with ManagedBy).
	LabelManagedBy = "app.kubernetes.io/managed-by"
	// ManagedBy is LabelManagedBy's value.
	ManagedBy = "safe-run"
	// LabelRole says what an object is to safe-run: RoleSandbox on
	// sandbox Pods (the NetworkPolicy selects them by it).
	LabelRole = "safe-run.dev/role"
	// RoleSandbox is LabelRole's value on sandbox Pods.
	RoleSandbox = "sandbox"
	// LabelLanguage is the job's language.
	LabelLanguage = "safe-run.dev/language"
	// LabelOwner names the server that created a claim (Config.Owner).
	LabelOwner = "safe-run.dev/owner"
	// LabelKind is KindRun for a one-shot run's claim, KindSession for a
	// session's.
	LabelKind = "safe-run.dev/kind"
	// AnnotationCreated and AnnotationLastUsed are RFC 3339 times: when
	// the claim was made and when a request last went to its sandbox (or,
	// for a session, a call last held it, on any server).
	AnnotationCreated  = "safe-run.dev/created"
	AnnotationLastUsed = "safe-run.dev/last-used"
	// LabelSession is the ID of the session a session's claim holds: any
	// server finds the session's claim by it.
	LabelSession = "safe-run.dev/session"
	// AnnotationSession is the session's record as JSON (SessionState):
	// what any server needs to serve it.
	AnnotationSession = "safe-run.dev/session-state"
	// AnnotationHolder names the agent connection that attached to the
	// session's sandbox last; a server whose connection it does not name
	// attaches anew before its next call.
	AnnotationHolder = "safe-run.dev/holder"
)

// SessionState is the part of a session's record kept as JSON in
// AnnotationSession; its ID is LabelSession, its last use AnnotationLastUsed.
type SessionState struct {
	// Owner is the client the session belongs to (sandbox.SessionSpec.Owner).
	Owner    string         `json:"owner"`
	Language string         `json:"language"`
	Limits   sandbox.Limits `json:"limits"`
	Network  []string       `json:"network,omitempty"`
	Packages []string       `json:"packages,omitempty"`
	Created  time.Time      `json:"created"`
}

// The values of LabelKind.
const (
	KindRun     = "run"
	KindSession = "session"
)

// ContainerName is the sandbox Pod's one container, the one exec'd into.
const ContainerName = "sandbox"

// DefaultRuntimeClass is the RuntimeClass of sandbox Pods unless
// configured: the conventional name of gVisor's (handler runsc).
const DefaultRuntimeClass = "gvisor"

// DefaultPodLifetime bounds every sandbox Pod (activeDeadlineSeconds),
// warm or claimed: a backstop behind the agent's timeout, the server's
// deadline and the claim's shutdown time.
const DefaultPodLifetime = sandbox.TimeoutCeiling

// EphemeralStorage bounds what a sandbox Pod may write to the node's disk:
// its root is read-only and its workspace in memory, so only its logs.
var EphemeralStorage = resource.MustParse("64Mi")

// DenyAllPolicyName is the name of the NetworkPolicy that cuts sandbox
// Pods off the network.
const DenyAllPolicyName = "safe-run-sandboxes-deny-all"

// SpecConfig is what the objects need of the backend's configuration.
type SpecConfig struct {
	// Namespace holds every object.
	Namespace string
	// RuntimeClass is the Pods' runtimeClassName.
	RuntimeClass string
	// Image is the container image, one with the agent at bundle.AgentPath
	// (as `safe-run image push` builds it).
	Image string
	// PodLifetime is the Pods' activeDeadlineSeconds.
	PodLifetime time.Duration
}

// podLabels are the labels of every sandbox Pod of language.
func podLabels(language string) map[string]string {
	return map[string]string{LabelManagedBy: ManagedBy, LabelRole: RoleSandbox, LabelLanguage: language}
}

// TemplateName names the template (and its warm pool) of sandboxes for
// job under cfg: its language and a hash of everything the Pod is built
// from, so that jobs with other limits or another image get a template of
// their own and a changed configuration never adopts a stale Pod.
func TemplateName(job sandbox.Job, cfg SpecConfig) string {
	l := job.Limits
	key, _ := json.Marshal([]any{cfg.Image, cfg.RuntimeClass, cfg.PodLifetime, l.MemoryBytes, l.CPUs, l.WorkspaceBytes, l.TmpBytes})
	sum := sha256.Sum256(key)
	lang := strings.ToLower(job.Language)
	if len(lang) > 30 {
		lang = lang[:30]
	}
	return "safe-run-" + lang + "-" + hex.EncodeToString(sum[:5])
}

// PodSpec is the Pod of a sandbox for job, whose limits must be complete
// (see sandbox.Policy.Check). It mirrors the local bundle: gVisor, the
// programs' unprivileged user, no capabilities, a read-only root, the
// workspace and /tmp in memory with their sizes, the job's memory (plus
// gVisor's headroom, as locally) and CPU, no service account token, no
// host namespaces. Its process only waits (the agent's --wait mode): the
// agent that serves requests is exec'd into it per run, so that a warm
// Pod holds no connection and any server replica can use it.
func PodSpec(job sandbox.Job, cfg SpecConfig) (corev1.PodSpec, error) {
	l := job.Limits
	if l.MemoryBytes <= 0 || l.CPUs <= 0 || l.WorkspaceBytes <= 0 || l.TmpBytes <= 0 {
		return corev1.PodSpec{}, fmt.Errorf("build pod spec: limits are incomplete: %+v", l)
	}
	if cfg.Image == "" || cfg.RuntimeClass == "" || cfg.PodLifetime <= 0 {
		return corev1.PodSpec{}, fmt.Errorf("build pod spec: image %q, runtime class %q and pod lifetime %s must be set", cfg.Image, cfg.RuntimeClass, cfg.PodLifetime)
	}
	no, yes := false, true
	user, group := int64(bundle.UID), int64(bundle.GID)
	deadline := int64(cfg.PodLifetime / time.Second)
	grace := int64(2)
	memory := *resource.NewQuantity(l.MemoryBytes+bundle.MemoryHeadroom, resource.BinarySI)
	cpu := *resource.NewMilliQuantity(int64(math.Ceil(l.CPUs*1000)), resource.DecimalSI)
	resources := corev1.ResourceList{
		corev1.ResourceMemory:           memory,
		corev1.ResourceCPU:              cpu,
		corev1.ResourceEphemeralStorage: EphemeralStorage,
	}
	memoryDir := func(name string, size int64) corev1.Volume {
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{
			Medium: corev1.StorageMediumMemory, SizeLimit: resource.NewQuantity(size, resource.BinarySI)}}}
	}
	var env []corev1.EnvVar
	for _, kv := range bundle.DefaultEnv {
		name, value, _ := strings.Cut(kv, "=")
		if name == "PATH" {
			continue // the image's own PATH stays
		}
		env = append(env, corev1.EnvVar{Name: name, Value: value})
	}
	rc := cfg.RuntimeClass
	return corev1.PodSpec{
		RuntimeClassName:              &rc,
		RestartPolicy:                 corev1.RestartPolicyNever,
		AutomountServiceAccountToken:  &no,
		EnableServiceLinks:            &no,
		HostNetwork:                   false,
		HostPID:                       false,
		HostIPC:                       false,
		ShareProcessNamespace:         &no,
		ActiveDeadlineSeconds:         &deadline,
		TerminationGracePeriodSeconds: &grace,
		Hostname:                      "sandbox",
		SecurityContext: &corev1.PodSecurityContext{
			RunAsUser:      &user,
			RunAsGroup:     &group,
			RunAsNonRoot:   &yes,
			SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
		Containers: []corev1.Container{{
			Name:       ContainerName,
			Image:      cfg.Image,
			Command:    []string{bundle.AgentPath, "--wait"},
			WorkingDir: bundle.Workspace,
			Env:        env,
			Resources:  corev1.ResourceRequirements{Requests: resources, Limits: resources},
			VolumeMounts: []corev1.VolumeMount{
				{Name: "workspace", MountPath: bundle.Workspace},
				{Name: "tmp", MountPath: "/tmp"},
			},
			SecurityContext: &corev1.SecurityContext{
				Privileged:               &no,
				AllowPrivilegeEscalation: &no,
				ReadOnlyRootFilesystem:   &yes,
				RunAsNonRoot:             &yes,
				RunAsUser:                &user,
				RunAsGroup:               &group,
				Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
			ImagePullPolicy:          corev1.PullIfNotPresent,
		}},
		Volumes: []corev1.Volume{memoryDir("workspace", l.WorkspaceBytes), memoryDir("tmp", l.TmpBytes)},
	}, nil
}

// Template is the SandboxTemplate of sandboxes for job (see PodSpec). Its
// network policy is an empty one, which agent-sandbox turns into a
// deny-all for the template's Pods; left out, agent-sandbox would apply
// its default, which lets Pods reach the internet.
func Template(job sandbox.Job, cfg SpecConfig) (*extv1.SandboxTemplate, error) {
	spec, err := PodSpec(job, cfg)
	if err != nil {
		return nil, err
	}
	return &extv1.SandboxTemplate{
		TypeMeta: metav1.TypeMeta{APIVersion: extv1.GroupVersion.String(), Kind: extv1.SandboxTemplateKind},
		ObjectMeta: metav1.ObjectMeta{Name: TemplateName(job, cfg), Namespace: cfg.Namespace,
			Labels: map[string]string{LabelManagedBy: ManagedBy, LabelLanguage: job.Language}},
		Spec: extv1.SandboxTemplateSpec{
			SandboxBlueprint: sandboxv1.SandboxBlueprint{PodTemplate: sandboxv1.PodTemplate{
				ObjectMeta: sandboxv1.PodMetadata{Labels: podLabels(job.Language)},
				Spec:       spec,
			}},
			NetworkPolicy:              &extv1.NetworkPolicySpec{},
			NetworkPolicyManagement:    extv1.NetworkPolicyManagementManaged,
			EnvVarsInjectionPolicy:     extv1.EnvVarsInjectionPolicyDisallowed,
			VolumeClaimTemplatesPolicy: extv1.VolumeClaimTemplatesPolicyDisallowed,
		},
	}, nil
}

// WarmPool is the SandboxWarmPool of template, keeping replicas sandboxes
// ready to be claimed; 0 makes every claim of it cold.
func WarmPool(template *extv1.SandboxTemplate, replicas int32) *extv1.SandboxWarmPool {
	return &extv1.SandboxWarmPool{
		TypeMeta: metav1.TypeMeta{APIVersion: extv1.GroupVersion.String(), Kind: extv1.SandboxWarmPoolKind},
		ObjectMeta: metav1.ObjectMeta{Name: template.Name, Namespace: template.Namespace,
			Labels: map[string]string{LabelManagedBy: ManagedBy, LabelLanguage: template.Labels[LabelLanguage]}},
		Spec: extv1.SandboxWarmPoolSpec{
			Replicas:    &replicas,
			TemplateRef: extv1.SandboxTemplateRef{Name: template.Name},
		},
	}
}

// ClaimSpec is what a claim says beyond its pool.
type ClaimSpec struct {
	// Name is the claim's name (and its Pod's, when created cold).
	Name string
	// Language is the job's.
	Language string
	// Owner names the server making the claim (a label value).
	Owner string
	// Session marks a session's claim rather than a run's.
	Session bool
	// Created is now.
	Created time.Time
	// Lifetime is how long the claim may live: agent-sandbox deletes it,
	// and its sandbox, at Created+Lifetime whatever the server does.
	Lifetime time.Duration
	// SessionID, State and Holder are a session's (LabelSession,
	// AnnotationSession, AnnotationHolder); empty for a run.
	SessionID string
	State     *SessionState
	Holder    string
}

// Claim is the SandboxClaim of one sandbox from pool.
func Claim(pool *extv1.SandboxWarmPool, c ClaimSpec) *extv1.SandboxClaim {
	kind := KindRun
	if c.Session {
		kind = KindSession
	}
	created := c.Created.UTC().Format(time.RFC3339)
	shutdown := metav1.NewTime(c.Created.Add(c.Lifetime).Truncate(time.Second))
	labels := map[string]string{LabelManagedBy: ManagedBy, LabelLanguage: c.Language, LabelOwner: c.Owner,
		LabelKind: kind, sandboxv1.CreatedByLabel: ManagedBy}
	annotations := map[string]string{AnnotationCreated: created, AnnotationLastUsed: created}
	if c.SessionID != "" {
		labels[LabelSession] = c.SessionID
		state, _ := json.Marshal(c.State) // plain data: never fails
		annotations[AnnotationSession] = string(state)
		annotations[AnnotationHolder] = c.Holder
	}
	return &extv1.SandboxClaim{
		TypeMeta: metav1.TypeMeta{APIVersion: extv1.GroupVersion.String(), Kind: extv1.SandboxClaimKind},
		ObjectMeta: metav1.ObjectMeta{
			Name: c.Name, Namespace: pool.Namespace, Labels: labels, Annotations: annotations,
		},
		Spec: extv1.SandboxClaimSpec{
			WarmPoolRef: extv1.SandboxWarmPoolRef{Name: pool.Name},
			Lifecycle:   &extv1.Lifecycle{ShutdownTime: &shutdown, ShutdownPolicy: extv1.ShutdownPolicyDelete},
		},
	}
}

// DenyAll is the NetworkPolicy that denies sandbox Pods (by LabelRole)
// every connection in and out: sandboxes have no network, as locally. An
// egress allowlist would be an explicit egress policy per job's network
// (or a proxy Pod it may reach), selected by a label of its own.
func DenyAll(namespace string) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{
		TypeMeta: metav1.TypeMeta{APIVersion: networkingv1.SchemeGroupVersion.String(), Kind: "NetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: DenyAllPolicyName, Namespace: namespace,
			Labels: map[string]string{LabelManagedBy: ManagedBy}},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{LabelManagedBy: ManagedBy, LabelRole: RoleSandbox}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
		},
	}
}
