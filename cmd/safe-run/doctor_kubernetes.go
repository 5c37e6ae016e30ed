package main

import (
	"context"
	"strings"
	"time"

	"github.com/safe-run/safe-run/rootfs"
	"github.com/safe-run/safe-run/runtime/kubernetes"
)

// diagnoseKubernetes is doctor --backend kubernetes: the cluster's side of
// what runs need (package kubernetes finds the facts), each part with what
// to do about it. Nothing of this host is needed.
func diagnoseKubernetes(host *hostFlags, kube *kubeFlags) []check {
	image := host.image
	if image == rootfs.DefaultName {
		image = "" // the local default image is not one a cluster can pull
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	findings := kubernetes.Diagnose(ctx, kubernetes.Config{Kubeconfig: kube.kubeconfig, Namespace: kube.namespace,
		RuntimeClass: kube.runtimeClass, Image: image})
	checks := make([]check, 0, len(findings))
	for _, f := range findings {
		c := check{Name: f.Name, OK: f.OK, Detail: f.Detail}
		switch {
		case f.Unknown && f.Name == "runtimeclass":
			c.Fix = "run doctor with a kubeconfig that may read RuntimeClasses to check it"
		case f.OK:
		case f.Name == "cluster":
			c.Fix = "point --kubeconfig (or $KUBECONFIG) at the cluster, or run in a Pod whose ServiceAccount reaches it"
		case f.Name == "crds":
			c.Fix = "install agent-sandbox (v0.5.6 is what is tested): its CRDs and controller; see deploy/kubernetes/README.md"
		case f.Name == "runtimeclass":
			c.Fix = "create it (kubectl apply -f deploy/kubernetes/runtimeclass.yaml on nodes with runsc; GKE Sandbox makes gvisor itself), or name yours with --runtime-class"
		case f.Name == "rbac" && len(f.Missing) > 0:
			c.Fix = "grant " + strings.Join(f.Missing, ", ") + " in the namespace: the Role in deploy/kubernetes/rbac.yaml has exactly what the backend uses"
		case f.Name == "image":
			c.Fix = "push the image with the agent: safe-run image push default REF, then pass --image REF"
		}
		checks = append(checks, c)
	}
	return checks
}
