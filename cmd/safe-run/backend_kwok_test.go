package main

import (
	"strings"
	"testing"
)

// TestKwokAgentEnv: the test-only paths of the exec'd agent reach the
// kubernetes backend's configuration together, and one without the other
// is refused rather than half applied.
func TestKwokAgentEnv(t *testing.T) {
	k := kubeFlags{backend: "kubernetes"}
	h := &hostFlags{image: "registry.example/safe-run/default:1"}

	cfg, err := k.runtimeConfig(h)
	if err != nil || cfg.Kube.Agent != "" || cfg.Kube.Workdir != "" {
		t.Fatalf("unset: %v, agent %q, workdir %q; want the backend's defaults", err, cfg.Kube.Agent, cfg.Kube.Workdir)
	}

	t.Setenv(envKwokAgent, "/host/agent")
	if _, err := k.runtimeConfig(h); err == nil || !strings.Contains(err.Error(), envKwokWorkdir) {
		t.Errorf("agent alone: %v, want a refusal naming %s", err, envKwokWorkdir)
	}

	t.Setenv(envKwokWorkdir, "/host/work")
	cfg, err = k.runtimeConfig(h)
	if err != nil || cfg.Kube.Agent != "/host/agent" || cfg.Kube.Workdir != "/host/work" {
		t.Errorf("both: %v, agent %q, workdir %q", err, cfg.Kube.Agent, cfg.Kube.Workdir)
	}
}
