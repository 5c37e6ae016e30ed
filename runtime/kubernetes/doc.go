// Package kubernetes is the engine's backend for a Kubernetes cluster: each
// sandbox is a gVisor Pod that agent-sandbox (kubernetes-sigs/agent-sandbox)
// manages — a SandboxTemplate per language and limits, a SandboxWarmPool
// that keeps Pods ready, one SandboxClaim per run or session — and the
// agent's protocol is carried unchanged over pods/exec. It implements
// engine.Backend; it has a package of its own because it owns everything
// of the cluster, as package gvisor owns everything of the host.
package kubernetes
