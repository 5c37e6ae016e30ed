package kubernetes_test

import (
	"context"
	"io"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	nodev1 "k8s.io/api/node/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	sandboxv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"

	"github.com/safe-run/safe-run/runtime/engine"
	"github.com/safe-run/safe-run/runtime/kubernetes"
	"github.com/safe-run/safe-run/runtime/kubernetes/kubetest"
	"github.com/safe-run/safe-run/sandbox"
)

// These tests drive the backend through a real API server, the real
// agent-sandbox controller, scheduler and controller manager, with kwok as
// the node (package kubetest).
//
// NO ISOLATION: kwok's exec runs the exec'd agent ON THIS HOST, as the
// test's user (root in CI), and the agent runs the job's program there
// too. So the programs are harmless (`echo 1`, `sleep`), and the agent's
// paths that kill "every other process" are guarded to a sandbox: it
// kills them (kill(-1)) only as pid 1 (killStrays), which an exec'd agent
// never is; TestRun checks that a process of this host outlives one-shot
// runs, which end with that path.

func TestMain(m *testing.M) { kubetest.Main(m) }

var classes = schema.GroupVersionResource{Group: "node.k8s.io", Version: "v1", Resource: "runtimeclasses"}

// setUp returns a backend in a fresh namespace, with gVisor's RuntimeClass
// in the cluster; cfg's zero fields are filled for the test cluster.
func setUp(t *testing.T, cfg kubernetes.Config) (*kubetest.Cluster, *kubernetes.Backend, dynamic.Interface) {
	t.Helper()
	c := kubetest.Shared(t)
	dyn, err := dynamic.NewForConfig(c.RESTConfig)
	if err != nil {
		t.Fatal(err)
	}
	rc := &nodev1.RuntimeClass{TypeMeta: metav1.TypeMeta{APIVersion: "node.k8s.io/v1", Kind: "RuntimeClass"},
		ObjectMeta: metav1.ObjectMeta{Name: kubernetes.DefaultRuntimeClass}, Handler: "runsc"}
	if _, err := c.Client.NodeV1().RuntimeClasses().Create(context.Background(), rc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	untaint(t, c)
	cfg.RESTConfig, cfg.Namespace = c.RESTConfig, c.Namespace(t)
	if cfg.Image == "" {
		cfg.Image = "safe-run.invalid/sandbox:test" // kwok runs no image
	}
	cfg.Agent, cfg.Workdir = agentBinary(t), t.TempDir()
	if cfg.ReapIdle == 0 {
		cfg.ReapIdle = -1 // the tests reap themselves
	}
	cfg.StartTimeout = 60 * time.Second
	b, err := kubernetes.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := b.Wait(ctx); err != nil {
			t.Errorf("sandboxes left: %d", b.Live())
		}
	})
	return c, b, dyn
}

// untaint removes the not-ready taint the API server puts on a new node:
// the node lifecycle controller, which removes it once the node is Ready,
// does not run in kubetest's controller manager, so no Pod would schedule.
func untaint(t *testing.T, c *kubetest.Cluster) {
	t.Helper()
	patch := []byte(`{"spec":{"taints":null}}`)
	if _, err := c.Client.CoreV1().Nodes().Patch(context.Background(), kubetest.NodeName, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("untaint the node: %v", err)
	}
}

// agentBinary is the host's safe-run-agent, which kwok's exec runs.
func agentBinary(t *testing.T) string { return kubetest.HostAgent(t) }

func bashJob(t *testing.T, code string, limits sandbox.Limits) sandbox.Job {
	t.Helper()
	job, _, err := sandbox.Policy{}.Check(sandbox.Job{Language: "bash", Code: code, Limits: limits})
	if err != nil {
		t.Fatal(err)
	}
	return job
}

func newEngine(t *testing.T, b *kubernetes.Backend) *engine.Engine {
	t.Helper()
	e, err := engine.New(engine.Config{Backend: b})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

func claimGone(t *testing.T, dyn dynamic.Interface, ns, name string) bool {
	t.Helper()
	_, err := dyn.Resource(schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxclaims"}).
		Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
	return apierrors.IsNotFound(err)
}

// TestRun runs a program through the engine, a claim, the API server's
// exec streams and the agent, and checks that the claim is gone after.
func TestRun(t *testing.T) {
	_, b, dyn := setUp(t, kubernetes.Config{})
	e := newEngine(t, b)
	// A process of this host that must outlive the one-shot runs (see the
	// file's comment): the agent's kill of every other process must not
	// reach it.
	witness := exec.Command("sleep", "120")
	if err := witness.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = witness.Process.Kill(); _ = witness.Wait() }()
	for _, tt := range []struct {
		code   string
		status sandbox.Status
		exit   int
		stdout string
	}{
		{"echo 1", sandbox.StatusOK, 0, "1\n"},
		{"echo oops >&2; exit 3", sandbox.StatusError, 3, ""},
	} {
		res, err := e.Run(context.Background(), bashJob(t, tt.code, sandbox.Limits{}))
		if err != nil {
			t.Fatal(err)
		}
		if res.Status != tt.status || res.ExitCode != tt.exit || res.Stdout != tt.stdout {
			t.Errorf("%q: %+v", tt.code, res)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if err := e.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
		if !claimGone(t, dyn, b.Namespace(), res.SandboxID) {
			t.Errorf("the claim %s of a finished run is still there", res.SandboxID)
		}
	}
	if err := witness.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("a host process died during the runs: %v", err)
	}
}

// TestWarmPool fills a pool and claims from it: the claim's sandbox is a
// warm one.
func TestWarmPool(t *testing.T) {
	job := bashJob(t, "true", sandbox.Limits{})
	_, b, dyn := setUp(t, kubernetes.Config{Warm: []kubernetes.Warm{{Job: job, Replicas: 2}}})
	pools := schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxwarmpools"}
	deadline := time.Now().Add(90 * time.Second)
	for {
		list, err := dyn.Resource(pools).Namespace(b.Namespace()).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Items) == 1 {
			ready, _, _ := unstructuredInt(list.Items[0].Object, "status", "readyReplicas")
			if ready == 2 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the warm pool did not fill: %+v", list.Items)
		}
		time.Sleep(200 * time.Millisecond)
	}
	start := time.Now()
	sb, err := b.Start(engine.StartSpec{Job: job})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy()
	buf := make([]byte, 64)
	if n, err := sb.Events().Read(buf); err != nil || !strings.Contains(string(buf[:n]), "ready") {
		t.Fatalf("first event %q, %v; want the agent's Ready (%s)", buf[:n], err, sb.ExitReport())
	}
	t.Logf("claimed, bound and exec'd in %s", time.Since(start))
	info, err := b.Lookup(context.Background(), sb.ID())
	if err != nil {
		t.Fatal(err)
	}
	sbRes := schema.GroupVersionResource{Group: "agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxes"}
	u, err := dyn.Resource(sbRes).Namespace(b.Namespace()).Get(context.Background(), info.Sandbox, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if lt := u.GetLabels()[sandboxv1.SandboxLaunchTypeLabel]; lt != sandboxv1.SandboxLaunchTypeWarm {
		t.Errorf("the claim's sandbox %s was launched %q, want warm", info.Sandbox, lt)
	}
}

func unstructuredInt(obj map[string]any, path ...string) (int64, bool, error) {
	var cur any = obj
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return 0, false, nil
		}
		cur = m[p]
	}
	n, ok := cur.(int64)
	return n, ok, nil
}

// TestCancelDeletesTheClaim cancels a run of `sleep 5` (harmless on the
// host): the result says killed and the claim is gone.
func TestCancelDeletesTheClaim(t *testing.T) {
	_, b, dyn := setUp(t, kubernetes.Config{})
	e := newEngine(t, b)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for b.Live() == 0 || len(claimsOf(t, b)) == 0 {
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(2 * time.Second)
		cancel()
	}()
	res, err := e.Run(ctx, bashJob(t, "sleep 5", sandbox.Limits{}))
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != sandbox.StatusKilled {
		t.Errorf("cancelled run: %+v", res)
	}
	if !claimGone(t, dyn, b.Namespace(), res.SandboxID) {
		t.Errorf("the cancelled run's claim %s is still there", res.SandboxID)
	}
}

func claimsOf(t *testing.T, b *kubernetes.Backend) []kubernetes.ClaimInfo {
	list, err := b.Claims(context.Background(), "")
	if err != nil {
		t.Error(err)
	}
	return list
}

// TestPodFailures: the API's reasons reach the run's result.
func TestPodFailures(t *testing.T) {
	for _, tt := range []struct {
		name   string
		cfg    kubernetes.Config
		limits sandbox.Limits
		want   string
	}{
		{"missing RuntimeClass", kubernetes.Config{RuntimeClass: "no-such-class"}, sandbox.Limits{}, `RuntimeClass "no-such-class" not found`},
		{"unschedulable", kubernetes.Config{}, sandbox.Limits{MemoryBytes: 16 * sandbox.GiB}, "unschedulable: 0/1 nodes are available"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, b, _ := setUp(t, tt.cfg)
			res, err := newEngine(t, b).Run(context.Background(), bashJob(t, "echo 1", tt.limits))
			if err != nil {
				t.Fatal(err)
			}
			if res.Status != sandbox.StatusSandboxError || !strings.Contains(res.Message, tt.want) {
				t.Errorf("result %+v, want a sandbox_error saying %q", res, tt.want)
			}
		})
	}
}

// TestReapDeadServer: a server that died left a session's claim; another
// server's reaper removes it and its Sandbox, and the Pod goes with them.
func TestReapDeadServer(t *testing.T) {
	c, b, dyn := setUp(t, kubernetes.Config{Owner: "alive"})
	dead, err := kubernetes.New(kubernetes.Config{RESTConfig: c.RESTConfig, Namespace: b.Namespace(), Image: "safe-run.invalid/sandbox:test",
		Agent: agentBinary(t), Workdir: t.TempDir(), Owner: "dead", ReapIdle: -1})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := dead.Start(engine.StartSpec{Job: bashJob(t, "true", sandbox.Limits{}), KeepAlive: true})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy() // the dead server's goroutines; its objects are gone by then
	if _, err := io.ReadFull(sb.Events(), make([]byte, 8)); err != nil {
		t.Fatalf("the session's agent did not start: %v (%s)", err, sb.ExitReport())
	}
	info, err := b.Lookup(context.Background(), sb.ID())
	if err != nil || info.Owner != "dead" || info.Kind != kubernetes.KindSession {
		t.Fatalf("Lookup from another server = %+v, %v", info, err)
	}
	removed, err := b.Reap(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	want := "sandboxclaim/" + sb.ID()
	if len(removed) == 0 || removed[0] != want {
		t.Errorf("Reap removed %v, want %s first", removed, want)
	}
	if !claimGone(t, dyn, b.Namespace(), sb.ID()) {
		t.Error("the dead server's claim is still there")
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		_, err := c.Client.CoreV1().Pods(b.Namespace()).Get(context.Background(), info.Sandbox, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the dead server's Pod %s is still there: %v", info.Sandbox, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestSession keeps a bash interpreter across calls in one claim (`x=1`,
// then `echo $x`: harmless on the host), whose claim any server can read
// as a session's, and which is gone once the session is closed.
func TestSession(t *testing.T) {
	_, b, dyn := setUp(t, kubernetes.Config{})
	e := newEngine(t, b)
	ctx := context.Background()
	info, err := e.CreateSession(ctx, sandbox.SessionSpec{Language: "bash"})
	if err != nil {
		t.Fatal(err)
	}
	var claim string
	for i, code := range []string{"x=41", "echo $((x+1))"} {
		res, err := e.RunInSession(ctx, info.ID, sandbox.Job{Language: "bash", Code: code})
		if err != nil {
			t.Fatal(err)
		}
		if res.Status != sandbox.StatusOK || (i == 1 && res.Stdout != "42\n") {
			t.Fatalf("call %d %q: %+v", i, code, res)
		}
		claim = res.SandboxID
	}
	sessions, err := b.Claims(ctx, kubernetes.KindSession)
	if err != nil || len(sessions) != 1 || sessions[0].Name != claim {
		t.Errorf("session claims = %+v, %v; want %s", sessions, err, claim)
	}
	if err := e.CloseSession(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := e.Wait(wctx); err != nil {
		t.Fatal(err)
	}
	if !claimGone(t, dyn, b.Namespace(), claim) {
		t.Errorf("the closed session's claim %s is still there", claim)
	}
}

// TestRBACRefusal runs as a user whose Role grants every verb the backend
// uses except pods/exec: the run fails as a sandbox error that names the
// missing permission, and leaves no claim behind.
func TestRBACRefusal(t *testing.T) {
	c, admin, dyn := setUp(t, kubernetes.Config{})
	ns := admin.Namespace()
	user := noExecUser(t, c, ns)
	b, err := kubernetes.New(kubernetes.Config{RESTConfig: user, Namespace: ns, Image: "safe-run.invalid/sandbox:test",
		Agent: agentBinary(t), Workdir: t.TempDir(), ReapIdle: -1, StartTimeout: 60 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	res, err := newEngine(t, b).Run(ctx, bashJob(t, "echo 1", sandbox.Limits{}))
	msg := res.Message
	if err != nil {
		msg = err.Error()
	}
	if err == nil && res.Status != sandbox.StatusSandboxError || !strings.Contains(msg, "pods/exec") {
		t.Errorf("a run without pods/exec: err %v, status %s, message %q; want a sandbox error naming pods/exec", err, res.Status, msg)
	}
	waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := b.Wait(waitCtx); err != nil {
		t.Fatalf("sandboxes left: %d", b.Live())
	}
	if res.SandboxID != "" && !claimGone(t, dyn, ns, res.SandboxID) {
		t.Errorf("the refused run's claim %s is still there", res.SandboxID)
	}
}

// noExecUser is a user whose Role in ns grants every permission the
// backend uses but pods/exec.
func noExecUser(t *testing.T, c *kubetest.Cluster, ns string) *rest.Config {
	t.Helper()
	// Every permission the backend uses (kubernetes.Needs, which the
	// doctor checks), but pods/exec.
	var rules []rbacv1.PolicyRule
	for _, a := range kubernetes.Needs {
		if a.Resource == "pods" && a.Subresource == "exec" {
			continue
		}
		resource := a.Resource
		if a.Subresource != "" {
			resource += "/" + a.Subresource
		}
		rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{a.Group}, Resources: []string{resource}, Verbs: []string{a.Verb}})
	}
	ctx := context.Background()
	name := "no-exec-" + ns
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "no-exec"}, Rules: rules}
	if _, err := c.Client.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "no-exec"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "no-exec"},
		Subjects: []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: name}}}
	if _, err := c.Client.RbacV1().RoleBindings(ns).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	user, _ := c.User(t, name)
	return user
}

// TestDiagnose checks what doctor --backend kubernetes reports: all
// parts usable for the admin, the one missing permission for a user
// without pods/exec, and a RuntimeClass that does not exist.
func TestDiagnose(t *testing.T) {
	c, admin, _ := setUp(t, kubernetes.Config{})
	ns := admin.Namespace()
	ctx := context.Background()
	byName := func(fs []kubernetes.Finding) map[string]kubernetes.Finding {
		m := map[string]kubernetes.Finding{}
		for _, f := range fs {
			m[f.Name] = f
		}
		return m
	}
	all := byName(kubernetes.Diagnose(ctx, kubernetes.Config{RESTConfig: c.RESTConfig, Namespace: ns, Image: "x"}))
	for _, part := range []string{"cluster", "crds", "runtimeclass", "rbac", "image"} {
		if f, ok := all[part]; !ok || !f.OK || f.Unknown {
			t.Errorf("admin: %s: %+v", part, f)
		}
	}
	if !strings.Contains(all["cluster"].Detail, "v1.") {
		t.Errorf("the cluster's version is not named: %q", all["cluster"].Detail)
	}
	user := noExecUser(t, c, ns)
	limited := byName(kubernetes.Diagnose(ctx, kubernetes.Config{RESTConfig: user, Namespace: ns, RuntimeClass: "no-such-class"}))
	if f := limited["rbac"]; f.OK || !slices.Equal(f.Missing, []string{"get pods/exec", "create pods/exec"}) {
		t.Errorf("no-exec user: rbac %+v, want only get and create pods/exec missing", f)
	}
	if f := limited["runtimeclass"]; !f.Unknown {
		t.Errorf("no-exec user, who may not read RuntimeClasses: runtimeclass %+v, want not checked", f)
	}
	if f := limited["image"]; f.OK {
		t.Errorf("no image set: %+v", f)
	}
	missing := byName(kubernetes.Diagnose(ctx, kubernetes.Config{RESTConfig: c.RESTConfig, Namespace: ns, RuntimeClass: "no-such-class", Image: "x"}))
	if f := missing["runtimeclass"]; f.OK || !slices.Equal(f.Missing, []string{"no-such-class"}) {
		t.Errorf("missing RuntimeClass: %+v", f)
	}
}
