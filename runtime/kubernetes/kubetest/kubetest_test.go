package kubetest

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/utils/ptr"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestControlPlane drives the control plane the way the kubernetes backend
// does: a warm pool fills through kwok, a claim adopts a warm sandbox, and
// pods/exec through the API server reaches the sandbox's Pod.
//
// kwok's local exec runs the exec'd commands on this host as the test's user
// (root in CI), without isolation: only echo and sh -c 'exit 3' run through it.
func TestControlPlane(t *testing.T) {
	c := Start(t)
	ns := c.Namespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{scheme.AddToScheme, sandboxv1beta1.AddToScheme, extv1beta1.AddToScheme} {
		if err := add(s); err != nil {
			t.Fatal(err)
		}
	}
	cl, err := client.New(c.RESTConfig, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}

	tmpl := &extv1beta1.SandboxTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "smoke", Namespace: ns},
		Spec: extv1beta1.SandboxTemplateSpec{SandboxBlueprint: sandboxv1beta1.SandboxBlueprint{
			PodTemplate: sandboxv1beta1.PodTemplate{Spec: corev1.PodSpec{
				Containers: []corev1.Container{{Name: "agent", Image: "safe-run.invalid/agent:test"}},
			}},
		}},
	}
	pool := &extv1beta1.SandboxWarmPool{
		ObjectMeta: metav1.ObjectMeta{Name: "smoke", Namespace: ns},
		Spec: extv1beta1.SandboxWarmPoolSpec{
			Replicas:    ptr.To[int32](2),
			TemplateRef: extv1beta1.SandboxTemplateRef{Name: tmpl.Name},
		},
	}
	for _, o := range []client.Object{tmpl, pool} {
		if err := cl.Create(ctx, o); err != nil {
			t.Fatalf("create %T: %v", o, err)
		}
	}

	warm := map[string]bool{}
	err = wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		var list sandboxv1beta1.SandboxList
		if err := cl.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return false, err
		}
		clear(warm)
		for _, sb := range list.Items {
			if apimeta.IsStatusConditionTrue(sb.Status.Conditions, string(sandboxv1beta1.SandboxConditionReady)) {
				warm[sb.Name] = true
			}
		}
		return len(warm) == 2, nil
	})
	if err != nil {
		t.Fatalf("warm pool of 2: %d sandboxes Ready: %v", len(warm), err)
	}

	claim := &extv1beta1.SandboxClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "smoke", Namespace: ns},
		Spec:       extv1beta1.SandboxClaimSpec{WarmPoolRef: extv1beta1.SandboxWarmPoolRef{Name: pool.Name}},
	}
	claimed := time.Now()
	if err := cl.Create(ctx, claim); err != nil {
		t.Fatalf("create claim: %v", err)
	}
	err = wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if err := cl.Get(ctx, client.ObjectKeyFromObject(claim), claim); err != nil {
			return false, err
		}
		return claim.Status.SandboxStatus.Name != "" &&
			apimeta.IsStatusConditionTrue(claim.Status.Conditions, string(sandboxv1beta1.SandboxConditionReady)), nil
	})
	if err != nil {
		t.Fatalf("claim bound to a Ready sandbox: status %+v: %v", claim.Status, err)
	}
	name := claim.Status.SandboxStatus.Name
	if !warm[name] {
		t.Fatalf("claim bound sandbox %s, not one of the warm ones %v", name, warm)
	}
	t.Logf("claim bound warm sandbox %s in %v", name, time.Since(claimed).Round(time.Millisecond))

	var sb sandboxv1beta1.Sandbox
	if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &sb); err != nil {
		t.Fatal(err)
	}
	pod := sb.Name
	if p := sb.Annotations[sandboxv1beta1.SandboxPodNameAnnotation]; p != "" {
		pod = p
	}

	tests := []struct {
		name    string
		cmd     []string
		stdout  string
		wantErr string
	}{
		{name: "echo", cmd: []string{"echo", "hi"}, stdout: "hi\n"},
		// Through kwok a non-zero exit is not the kubelet's NonZeroExitCode
		// status (client-go's exec.CodeExitError) but an error text; seen here:
		// "Internal error occurred: error executing command in container:
		// exit status 3". The backend's exit-code mapping is tested against a
		// fake stream as well.
		{name: "exit 3", cmd: []string{"sh", "-c", "exit 3"}, wantErr: "exit status 3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := c.exec(ctx, ns, pod, "agent", tt.cmd, &stdout, &stderr)
			if tt.wantErr == "" && err != nil {
				t.Fatalf("exec %q: %v (stderr %q)", tt.cmd, err, stderr.String())
			}
			if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("exec %q: error %v, want one containing %q", tt.cmd, err, tt.wantErr)
			}
			if err != nil {
				t.Logf("exec %q: error %T: %v", tt.cmd, err, err)
			}
			if stdout.String() != tt.stdout {
				t.Errorf("exec %q: stdout %q, want %q", tt.cmd, stdout.String(), tt.stdout)
			}
		})
	}
}

// exec runs cmd in a Pod's container through the API server, over WebSocket
// with SPDY as the fallback, as the backend does.
func (c *Cluster) exec(ctx context.Context, ns, pod, container string, cmd []string, stdout, stderr *bytes.Buffer) error {
	req := c.Client.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: container, Command: cmd, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ws, err := remotecommand.NewWebSocketExecutor(c.RESTConfig, "GET", req.URL().String())
	if err != nil {
		return err
	}
	spdy, err := remotecommand.NewSPDYExecutor(c.RESTConfig, "POST", req.URL())
	if err != nil {
		return err
	}
	ex, err := remotecommand.NewFallbackExecutor(ws, spdy, httpstream.IsUpgradeFailure)
	if err != nil {
		return err
	}
	return ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: stdout, Stderr: stderr})
}
