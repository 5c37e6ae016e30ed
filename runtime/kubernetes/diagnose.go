package kubernetes

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Access is one permission the backend needs in its namespace.
type Access struct {
	Group, Resource, Subresource, Verb string
}

// String names the permission as RBAC rules do: "create pods/exec".
func (a Access) String() string {
	r := a.Resource
	if a.Subresource != "" {
		r += "/" + a.Subresource
	}
	if a.Group != "" {
		r += "." + a.Group
	}
	return a.Verb + " " + r
}

// Needs is every permission the backend uses; deploy/kubernetes's Role
// grants exactly these (its test checks both ways).
var Needs = []Access{
	{claimsResource.Group, "sandboxclaims", "", "create"},
	{claimsResource.Group, "sandboxclaims", "", "get"},
	{claimsResource.Group, "sandboxclaims", "", "list"},
	{claimsResource.Group, "sandboxclaims", "", "patch"},
	{claimsResource.Group, "sandboxclaims", "", "delete"},
	{templatesResource.Group, "sandboxtemplates", "", "create"},
	{templatesResource.Group, "sandboxtemplates", "", "list"},
	{poolsResource.Group, "sandboxwarmpools", "", "create"},
	{poolsResource.Group, "sandboxwarmpools", "", "list"},
	{sandboxesResource.Group, "sandboxes", "", "get"},
	{sandboxesResource.Group, "sandboxes", "", "list"},
	{sandboxesResource.Group, "sandboxes", "", "delete"},
	{"", "pods", "", "get"},
	{"", "pods", "", "list"},
	{"", "pods", "", "delete"},
	// The WebSocket exec is a GET, authorized as get and (Kubernetes
	// >= 1.31) create; SPDY's POST, its fallback, as create.
	{"", "pods", "exec", "get"},
	{"", "pods", "exec", "create"},
	{"", "events", "", "list"},
	{policiesResource.Group, "networkpolicies", "", "create"},
}

// Finding is one fact Diagnose established about the cluster.
type Finding struct {
	// Name is the part checked: "cluster", "crds", "runtimeclass",
	// "rbac" or "image".
	Name string
	// OK says the part is usable. Unknown says it could not be checked
	// (for instance, RuntimeClasses may not be read with these
	// credentials); OK is then true.
	OK, Unknown bool
	// Detail is the fact, one line.
	Detail string
	// Missing lists what is absent: CRDs, or permissions as Access.String.
	Missing []string
}

// The agent-sandbox resources the backend creates or reads, by API group
// and version.
var crdGroups = map[string][]string{
	sandboxesResource.GroupVersion().String(): {"sandboxes"},
	claimsResource.GroupVersion().String():    {"sandboxclaims", "sandboxtemplates", "sandboxwarmpools"},
}

var (
	runtimeClasses = schema.GroupVersionResource{Group: "node.k8s.io", Version: "v1", Resource: "runtimeclasses"}
	accessReviews  = schema.GroupVersionResource{Group: "authorization.k8s.io", Version: "v1", Resource: "selfsubjectaccessreviews"}
)

// Diagnose checks, in the order one would fix them, that the cluster cfg
// names can run the backend's sandboxes: the API server answers, the
// agent-sandbox CRDs are served, the RuntimeClass exists, these
// credentials have every permission in Needs in the namespace, and an
// image is set. It creates nothing but access reviews.
func Diagnose(ctx context.Context, cfg Config) []Finding {
	var out []Finding
	rc, ns, err := restConfig(cfg)
	if err != nil {
		return append(out, Finding{Name: "cluster", Detail: err.Error()})
	}
	httpc, err := rest.HTTPClientFor(rc)
	if err != nil {
		return append(out, Finding{Name: "cluster", Detail: "connect: " + err.Error()})
	}
	base, _, err := rest.DefaultServerUrlFor(rc)
	if err != nil {
		return append(out, Finding{Name: "cluster", Detail: "the API server's address: " + err.Error()})
	}
	host := strings.TrimSuffix(base.String(), "/")
	var version struct {
		GitVersion string `json:"gitVersion"`
	}
	if err := getJSON(ctx, httpc, host+"/version", &version); err != nil {
		return append(out, Finding{Name: "cluster", Detail: fmt.Sprintf("the API server at %s: %v", host, err)})
	}
	out = append(out, Finding{Name: "cluster", OK: true, Detail: fmt.Sprintf("API server %s at %s, namespace %s", version.GitVersion, host, ns)})

	crds := Finding{Name: "crds", OK: true}
	for gv, resources := range crdGroups {
		var list metav1.APIResourceList
		err := getJSON(ctx, httpc, host+"/apis/"+gv, &list)
		served := map[string]bool{}
		for _, r := range list.APIResources {
			served[r.Name] = true
		}
		for _, r := range resources {
			if err != nil || !served[r] {
				crds.Missing = append(crds.Missing, r+"."+strings.Split(gv, "/")[0])
			}
		}
	}
	if crds.OK = len(crds.Missing) == 0; crds.OK {
		crds.Detail = "agent-sandbox's Sandbox, SandboxClaim, SandboxTemplate and SandboxWarmPool (v1beta1) are served"
	} else {
		crds.Detail = "not served: " + strings.Join(crds.Missing, ", ")
	}
	out = append(out, crds)

	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return append(out, Finding{Name: "rbac", Detail: "connect: " + err.Error()})
	}
	class := cfg.RuntimeClass
	if class == "" {
		class = DefaultRuntimeClass
	}
	rcf := Finding{Name: "runtimeclass"}
	obj, err := dyn.Resource(runtimeClasses).Get(ctx, class, metav1.GetOptions{})
	switch {
	case err == nil:
		handler, _, _ := unstructured.NestedString(obj.Object, "handler")
		rcf.OK, rcf.Detail = true, fmt.Sprintf("RuntimeClass %s exists (handler %s)", class, handler)
	case apierrors.IsNotFound(err):
		rcf.Detail, rcf.Missing = fmt.Sprintf("RuntimeClass %s does not exist: sandbox Pods would be rejected", class), []string{class}
	case apierrors.IsForbidden(err):
		rcf.OK, rcf.Unknown = true, true
		rcf.Detail = fmt.Sprintf("RuntimeClass %s not checked: these credentials may not read RuntimeClasses (the server's need not)", class)
	default:
		rcf.Detail = fmt.Sprintf("read RuntimeClass %s: %v", class, err)
	}
	out = append(out, rcf)

	rbac := Finding{Name: "rbac", OK: true}
	for _, a := range Needs {
		allowed, err := review(ctx, dyn, ns, a)
		if err != nil {
			rbac.OK, rbac.Detail = false, fmt.Sprintf("ask whether %s is allowed: %v", a, err)
			break
		}
		if !allowed {
			rbac.Missing = append(rbac.Missing, a.String())
		}
	}
	if rbac.Detail == "" {
		if rbac.OK = len(rbac.Missing) == 0; rbac.OK {
			rbac.Detail = fmt.Sprintf("all %d permissions the backend uses are granted in namespace %s", len(Needs), ns)
		} else {
			rbac.Detail = fmt.Sprintf("not allowed in namespace %s: %s", ns, strings.Join(rbac.Missing, ", "))
		}
	}
	out = append(out, rbac)

	if cfg.Image == "" {
		out = append(out, Finding{Name: "image", Detail: "no sandbox image is set"})
	} else {
		out = append(out, Finding{Name: "image", OK: true, Detail: "sandbox Pods run " + cfg.Image})
	}
	return out
}

// restConfig is the client configuration cfg names, and the namespace.
func restConfig(cfg Config) (*rest.Config, string, error) {
	ns := cfg.Namespace
	if cfg.RESTConfig != nil {
		if ns == "" {
			ns = "default"
		}
		return cfg.RESTConfig, ns, nil
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = cfg.Kubeconfig
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
	rc, err := cc.ClientConfig()
	if err != nil {
		return nil, "", clusterError("load the cluster configuration: %v", err)
	}
	if ns == "" {
		if ns, _, err = cc.Namespace(); err != nil || ns == "" {
			ns = "default"
		}
	}
	return rc, ns, nil
}

// review asks the API server whether these credentials may do a in ns.
func review(ctx context.Context, dyn dynamic.Interface, ns string, a Access) (bool, error) {
	req := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "authorization.k8s.io/v1",
		"kind":       "SelfSubjectAccessReview",
		"spec": map[string]any{"resourceAttributes": map[string]any{
			"namespace": ns, "group": a.Group, "resource": a.Resource, "subresource": a.Subresource, "verb": a.Verb,
		}},
	}}
	res, err := dyn.Resource(accessReviews).Create(ctx, req, metav1.CreateOptions{})
	if err != nil {
		return false, err
	}
	allowed, _, _ := unstructured.NestedBool(res.Object, "status", "allowed")
	return allowed, nil
}

// getJSON GETs url and decodes its JSON body into v.
func getJSON(ctx context.Context, c *http.Client, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.Unmarshal(body, v)
}
