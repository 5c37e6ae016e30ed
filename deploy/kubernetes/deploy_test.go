package deploy

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/diff"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	// kubetest installs the CRDs of the agent-sandbox its test binary is built with.
	extv1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/safe-run/safe-run/runtime/engine"
	kube "github.com/safe-run/safe-run/runtime/kubernetes"
	"github.com/safe-run/safe-run/runtime/kubernetes/kubetest"
	"github.com/safe-run/safe-run/sandbox"
)

// serverAccess is every permission runtime/kubernetes uses (kubernetes.Needs),
// as group/resource:verb: what the server's Role must allow, and all it may allow.
func serverAccess() []string {
	var out []string
	for _, a := range kube.Needs {
		r := a.Resource
		if a.Subresource != "" {
			r += "/" + a.Subresource
		}
		out = append(out, a.Group+"/"+r+":"+a.Verb)
	}
	return out
}

// cluster is the admin configuration of the cluster the test applies to:
// the one in $SAFE_RUN_KUBECONFIG (a real cluster: `make
// test-kubernetes-cluster KUBECONFIG=…`), else a control plane of
// kubetest's, returned too (nil for a real cluster). The real one gets the
// objects in the namespace safe-run, left there for a look; kubetest's is
// gone after the test.
func cluster(t *testing.T) (*rest.Config, *kubetest.Cluster) {
	t.Helper()
	if kc := os.Getenv("SAFE_RUN_KUBECONFIG"); kc != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", kc)
		if err != nil {
			t.Fatalf("SAFE_RUN_KUBECONFIG=%s: %v", kc, err)
		}
		return cfg, nil
	}
	c := kubetest.Start(t)
	return c.RESTConfig, c
}

// onKwok says the cluster is kubetest's, whose node is kwok: its exec runs
// commands on this host (see package kubetest).
func onKwok() bool { return os.Getenv("SAFE_RUN_KUBECONFIG") == "" }

// binaryClaimsFromShippedPools runs the real `safe-run serve` with the
// Deployment's flags (its HTTP ones replaced by stdio), as the server's
// ServiceAccount's user name, over MCP: the default --pool it starts with
// adopts the shipped pools (no pool or template of its own appears), and a
// run's answer comes from a claim of the shipped bash pool, whose log line
// says so. Only on kubetest's cluster, with SAFE_RUN_BIN (make
// test-kubernetes sets it): kwok's exec runs the agent ON THIS HOST with no
// isolation (see serverClaimsFromShippedPools), here through
// SAFE_RUN_KWOK_AGENT/WORKDIR, and the program is an echo.
func binaryClaimsFromShippedPools(ctx context.Context, t *testing.T, kwok *kubetest.Cluster, dyn dynamic.Interface, mapper *restmapper.DeferredDiscoveryRESTMapper, objs []*unstructured.Unstructured) {
	bin := os.Getenv("SAFE_RUN_BIN")
	if kwok == nil || bin == "" {
		t.Skip("needs kubetest's cluster (kwok) and SAFE_RUN_BIN")
	}
	// A certificate user with the ServiceAccount's name and groups has the
	// ServiceAccount's permissions: RBAC binds by that name.
	_, kubeconfig := kwok.User(t, "system:serviceaccount:safe-run:safe-run-server",
		"system:serviceaccounts", "system:serviceaccounts:safe-run")
	args := []string{"serve", "--kubeconfig", kubeconfig, "--log-level", "info"}
	for name, value := range serverFlags(t, objs) {
		switch name {
		case "serve", "http", "insecure-http", "token-file", "session-key-file", "allowed-hosts":
		default:
			args = append(args, "--"+name+"="+value)
		}
	}
	logs, err := os.Create(filepath.Join(t.TempDir(), "serve.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logs.Close()
	logged := func() string { b, _ := os.ReadFile(logs.Name()); return string(b) }
	env := append(os.Environ(), "SAFE_RUN_KWOK_AGENT="+kubetest.HostAgent(t), "SAFE_RUN_KWOK_WORKDIR="+t.TempDir())
	c, err := client.NewStdioMCPClientWithOptions(bin, env, args, transport.WithCommandStderrWriter(logs))
	if err != nil {
		t.Fatalf("start safe-run serve: %v", err)
	}
	defer c.Close()
	var init mcp.InitializeRequest
	init.Params.ClientInfo = mcp.Implementation{Name: "deploy-test", Version: "1"}
	if _, err := c.Initialize(ctx, init); err != nil {
		t.Fatalf("initialize: %v\n%s", err, logged())
	}
	req := mcp.CallToolRequest{}
	req.Params.Name, req.Params.Arguments = "run_code", map[string]any{"language": "bash", "code": "echo from the shipped pool"}
	res, err := c.CallTool(ctx, req)
	if err != nil {
		t.Fatalf("run_code: %v\n%s", err, logged())
	}
	if out, _ := res.StructuredContent.(map[string]any); res.IsError || out["stdout"] != "from the shipped pool\n" {
		t.Errorf("run_code: %+v\n%s", res, logged())
	}
	for _, lang := range []string{"python", "node", "bash"} {
		if !strings.Contains(logged(), "pool=safe-run-"+lang+" ") {
			t.Errorf("the server's log does not say it claims from safe-run-%s:\n%s", lang, logged())
		}
	}
	for _, kind := range []string{"SandboxWarmPool", "SandboxTemplate"} {
		l, err := dyn.Resource(mustResource(t, mapper, "extensions.agents.x-k8s.io", kind)).Namespace("safe-run").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Items) != 3 {
			t.Errorf("%d %ss, want the 3 shipped ones and none of the server's", len(l.Items), kind)
		}
	}
}

// as is admin impersonating the ServiceAccount name of the namespace
// safe-run: the identity the server's Pod has.
func as(admin *rest.Config, name string) kubernetes.Interface {
	cfg := rest.CopyConfig(admin)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:safe-run:" + name,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:safe-run", "system:authenticated"}}
	return kubernetes.NewForConfigOrDie(cfg)
}

// build runs kustomize on this directory, as `kubectl apply -k` would.
func build(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), ".")
	if err != nil {
		t.Fatalf("kustomize build: %v", err)
	}
	var out []*unstructured.Unstructured
	for _, r := range m.Resources() {
		obj, err := r.Map()
		if err != nil {
			t.Fatalf("kustomize build: %s: %v", r.CurId(), err)
		}
		out = append(out, &unstructured.Unstructured{Object: obj})
	}
	return out
}

// TestManifestsApply applies every manifest to a real API server (with the
// agent-sandbox CRDs) by server-side apply, so a schema mistake fails;
// then checks, as the server's ServiceAccount, that its Role allows
// exactly serverAccess; that the Deployment and the warm pools come up as
// far as kwok's fake node runs them; and that the backend, started as the
// Deployment starts it, claims from the shipped pools.
func TestManifestsApply(t *testing.T) {
	admin, kwok := cluster(t)
	client := kubernetes.NewForConfigOrDie(admin)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dyn := dynamic.NewForConfigOrDie(admin)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(discovery.NewDiscoveryClientForConfigOrDie(admin)))
	objs := build(t)
	kinds := map[string]int{}
	for _, u := range objs {
		gvk := u.GroupVersionKind()
		kinds[gvk.Kind]++
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("%s %s: no such kind in the API server: %v", gvk, u.GetName(), err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == "namespace" {
			ri = dyn.Resource(m.Resource).Namespace(u.GetNamespace())
		}
		_, err = ri.Apply(ctx, u.GetName(), u, metav1.ApplyOptions{FieldManager: "safe-run-deploy-test", Force: true})
		if err != nil {
			t.Errorf("server-side apply %s %s/%s: %v", gvk.Kind, u.GetNamespace(), u.GetName(), err)
		}
	}
	for kind, n := range map[string]int{"Namespace": 1, "RuntimeClass": 1, "ServiceAccount": 1, "Role": 1, "RoleBinding": 1,
		"Deployment": 1, "Service": 1, "Secret": 2, "NetworkPolicy": 2, "SandboxTemplate": 3, "SandboxWarmPool": 3} {
		if kinds[kind] != n {
			t.Errorf("kustomize build gave %d %s, want %d", kinds[kind], kind, n)
		}
	}
	if t.Failed() {
		return
	}

	t.Run("role", func(t *testing.T) {
		sa := as(admin, "safe-run-server")
		for _, a := range serverAccess() {
			group, rest, _ := strings.Cut(a, "/")
			res, verb, _ := strings.Cut(rest, ":")
			res, sub, _ := strings.Cut(res, "/")
			r, err := sa.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
				Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
					Namespace: "safe-run", Group: group, Resource: res, Subresource: sub, Verb: verb}},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatalf("access review %s: %v", a, err)
			}
			if !r.Status.Allowed {
				t.Errorf("the server's ServiceAccount may not %s, which runtime/kubernetes does", a)
			}
		}
		// What the Role adds to what every ServiceAccount of the namespace
		// may do anyway (the bootstrap roles of authenticated users).
		base := make(map[string]bool)
		for _, r := range rulesOf(ctx, t, as(admin, "someone-else")) {
			base[r] = true
		}
		var got []string
		for _, r := range rulesOf(ctx, t, sa) {
			if !base[r] {
				got = append(got, r)
			}
		}
		want := serverAccess()
		sort.Strings(got)
		sort.Strings(want)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("the server's ServiceAccount may\n%s\nwant exactly\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	})

	t.Run("running", func(t *testing.T) {
		// kwok's node marks Pods running: what this shows is that the
		// objects are accepted by their controllers (Pod security of the
		// namespace included), not that anything ran.
		pools := dyn.Resource(mustResource(t, mapper, "extensions.agents.x-k8s.io", "SandboxWarmPool"))
		deadline := time.Now().Add(3 * time.Minute)
		for {
			var waiting []string
			d, err := client.AppsV1().Deployments("safe-run").Get(ctx, "safe-run-server", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if d.Status.ReadyReplicas != *d.Spec.Replicas {
				waiting = append(waiting, fmt.Sprintf("deployment: %d of %d ready (%v)", d.Status.ReadyReplicas, *d.Spec.Replicas, d.Status.Conditions))
			}
			for _, lang := range []string{"python", "node", "bash"} {
				p, err := pools.Namespace("safe-run").Get(ctx, "safe-run-"+lang, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				want, _, _ := unstructured.NestedInt64(p.Object, "spec", "replicas")
				ready, _, _ := unstructured.NestedInt64(p.Object, "status", "readyReplicas")
				if ready != want {
					waiting = append(waiting, fmt.Sprintf("pool %s: %d of %d ready (status %v)", lang, ready, want, p.Object["status"]))
				}
			}
			if len(waiting) == 0 {
				return
			}
			if time.Now().After(deadline) {
				events, _ := client.CoreV1().Events("safe-run").List(ctx, metav1.ListOptions{FieldSelector: "type=Warning"})
				for _, e := range events.Items {
					t.Logf("event %s %s: %s", e.InvolvedObject.Name, e.Reason, e.Message)
				}
				t.Fatalf("not up after 3 min: %s", strings.Join(waiting, "; "))
			}
			time.Sleep(time.Second)
		}
	})

	t.Run("server claims from the shipped pools", func(t *testing.T) {
		serverClaimsFromShippedPools(ctx, t, admin, dyn, mapper, objs)
	})
	t.Run("the server binary claims from the shipped pools", func(t *testing.T) {
		binaryClaimsFromShippedPools(ctx, t, kwok, dyn, mapper, objs)
	})
}

// serverClaimsFromShippedPools starts the backend as the Deployment's server
// does (its flags, its ServiceAccount, the CLI's default --pool of
// python=2,node=1,bash=1) against the applied manifests, and checks that it
// creates no template or pool of its own, and that a run's claim names the
// shipped pool of its language and binds one of its warm sandboxes.
//
// On kubetest's cluster, kwok's exec runs the agent ON THIS HOST, with no
// isolation: it is pointed at the host's agent and a temporary workspace
// and given no program at all (the claim is destroyed once bound); the
// agent's paths that kill other processes run only as pid 1 (killStrays).
func serverClaimsFromShippedPools(ctx context.Context, t *testing.T, admin *rest.Config, dyn dynamic.Interface, mapper *restmapper.DeferredDiscoveryRESTMapper, objs []*unstructured.Unstructured) {
	flags := serverFlags(t, objs)
	sa := rest.CopyConfig(admin)
	sa.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:safe-run:safe-run-server",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:safe-run", "system:authenticated"}}
	cfg := kube.Config{RESTConfig: sa, Namespace: flags["namespace"], RuntimeClass: flags["runtime-class"], Image: flags["image"],
		Owner: "deploy-test", ReapIdle: -1}
	if onKwok() {
		cfg.Agent, cfg.Workdir = kubetest.HostAgent(t), t.TempDir()
	}
	for lang, n := range map[string]int{"python": 2, "node": 1, "bash": 1} {
		cfg.Warm = append(cfg.Warm, kube.Warm{Job: checkedJob(t, lang), Replicas: n})
	}
	b, err := kube.New(cfg)
	if err != nil {
		t.Fatalf("start the backend as the server's ServiceAccount: %v", err)
	}
	count := func(kind string) int {
		l, err := dyn.Resource(mustResource(t, mapper, "extensions.agents.x-k8s.io", kind)).Namespace("safe-run").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return len(l.Items)
	}
	sb, err := b.Start(engine.StartSpec{Job: checkedJob(t, "bash")})
	if err != nil {
		t.Fatalf("start a sandbox: %v", err)
	}
	defer func() {
		if err := sb.Destroy(); err != nil {
			t.Errorf("destroy: %v", err)
		}
	}()
	claims := dyn.Resource(mustResource(t, mapper, "extensions.agents.x-k8s.io", "SandboxClaim")).Namespace("safe-run")
	deadline := time.Now().Add(time.Minute)
	for {
		c, err := claims.Get(ctx, sb.ID(), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pool, _, _ := unstructured.NestedString(c.Object, "spec", "warmPoolRef", "name")
		if pool != "safe-run-bash" {
			t.Fatalf("the claim names pool %q, want the shipped safe-run-bash", pool)
		}
		bound, _, _ := unstructured.NestedString(c.Object, "status", "sandbox", "name")
		if strings.HasPrefix(bound, "safe-run-bash-") {
			break // a sandbox of the shipped pool, made warm by agent-sandbox
		}
		if time.Now().After(deadline) {
			t.Fatalf("the claim was not bound to a sandbox of safe-run-bash within a minute: %v", c.Object["status"])
		}
		time.Sleep(200 * time.Millisecond)
	}
	if n, m := count("SandboxWarmPool"), count("SandboxTemplate"); n != 3 || m != 3 {
		t.Errorf("%d warm pools and %d templates, want the 3 shipped ones and none of the server's", n, m)
	}
}

// serverFlags reads the flags of the server's container in the built
// Deployment, as --name=value.
func serverFlags(t *testing.T, objs []*unstructured.Unstructured) map[string]string {
	t.Helper()
	for _, u := range objs {
		if u.GetKind() != "Deployment" || u.GetName() != "safe-run-server" {
			continue
		}
		// kustomize's maps hold Go ints, which the Nested helpers' copies refuse.
		containers, _, _ := unstructured.NestedFieldNoCopy(u.Object, "spec", "template", "spec", "containers")
		list, _ := containers.([]any)
		for _, c := range list {
			args, _ := c.(map[string]any)["args"].([]any)
			flags := map[string]string{}
			for _, a := range args {
				name, value, _ := strings.Cut(strings.TrimPrefix(fmt.Sprint(a), "--"), "=")
				flags[name] = value
			}
			return flags
		}
	}
	t.Fatal("no safe-run-server Deployment in the build")
	return nil
}

// checkedJob is lang's default job, as the server checks it.
func checkedJob(t *testing.T, lang string) sandbox.Job {
	t.Helper()
	job, _, err := sandbox.Policy{}.Check(sandbox.Job{Language: lang, Code: "true"})
	if err != nil {
		t.Fatal(err)
	}
	return job
}

// TestShippedTemplatesAreTheServers checks, without a cluster, that each
// SandboxTemplate of sandboxes.yaml (as kustomize renders it) is the very
// sandbox the server makes for its language's default job with the
// Deployment's flags: the test the server applies before it adopts a pool.
// Each shipped pool must name its language's template.
func TestShippedTemplatesAreTheServers(t *testing.T) {
	objs := build(t)
	flags := serverFlags(t, objs)
	spec := kube.SpecConfig{Namespace: flags["namespace"], RuntimeClass: flags["runtime-class"], Image: flags["image"],
		PodLifetime: kube.DefaultPodLifetime}
	templates, pools := map[string]*extv1.SandboxTemplate{}, map[string]*extv1.SandboxWarmPool{}
	for _, u := range objs {
		switch u.GetKind() {
		case "SandboxTemplate":
			var tmpl extv1.SandboxTemplate
			if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, &tmpl, true); err != nil {
				t.Fatalf("template %s: %v", u.GetName(), err)
			}
			templates[tmpl.Name] = &tmpl
		case "SandboxWarmPool":
			var pool extv1.SandboxWarmPool
			if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, &pool, true); err != nil {
				t.Fatalf("pool %s: %v", u.GetName(), err)
			}
			pools[pool.Name] = &pool
		}
	}
	for _, lang := range []string{"python", "node", "bash"} {
		want, err := kube.Template(checkedJob(t, lang), spec)
		if err != nil {
			t.Fatal(err)
		}
		pool := pools["safe-run-"+lang]
		if pool == nil {
			t.Errorf("no pool safe-run-%s", lang)
			continue
		}
		have := templates[pool.Spec.TemplateRef.Name]
		if have == nil {
			t.Errorf("pool %s names template %q, which is not shipped", pool.Name, pool.Spec.TemplateRef.Name)
			continue
		}
		if !kube.SameSandbox(have, want) {
			t.Errorf("template %s is not the sandbox the server makes for %s; the server would not claim from pool %s:\n%s",
				have.Name, lang, pool.Name, diff.Diff(want.Spec, have.Spec))
		}
	}
}

func mustResource(t *testing.T, mapper *restmapper.DeferredDiscoveryRESTMapper, group, kind string) schema.GroupVersionResource {
	t.Helper()
	m, err := mapper.RESTMapping(schema.GroupKind{Group: group, Kind: kind})
	if err != nil {
		t.Fatal(err)
	}
	return m.Resource
}

// rulesOf lists what cs may do in the namespace safe-run, as group/resource:verb.
func rulesOf(ctx context.Context, t *testing.T, cs kubernetes.Interface) []string {
	t.Helper()
	rules, err := cs.AuthorizationV1().SelfSubjectRulesReviews().Create(ctx, &authorizationv1.SelfSubjectRulesReview{
		Spec: authorizationv1.SelfSubjectRulesReviewSpec{Namespace: "safe-run"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("rules review: %v", err)
	}
	var out []string
	for _, r := range rules.Status.ResourceRules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					out = append(out, g+"/"+res+":"+v)
				}
			}
		}
	}
	return out
}
