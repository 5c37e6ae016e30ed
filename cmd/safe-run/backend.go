package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"

	"github.com/safe-run/safe-run/rootfs"
	"github.com/safe-run/safe-run/runtime/engine"
	"github.com/safe-run/safe-run/runtime/gvisor"
	"github.com/safe-run/safe-run/runtime/kubernetes"
	"github.com/safe-run/safe-run/sandbox"
)

// This file is the one place where cmd/safe-run names the backends that
// start sandboxes (package gvisor on this host, package kubernetes in a
// cluster, chosen by --backend) and builds the engine over them: another
// backend is chosen here, and nowhere else in cmd/.

// backend is what the commands use of the sandbox runner: runs, sessions,
// the stats that metrics read, and an orderly end.
type backend interface {
	sandbox.Runner
	sandbox.Sessions
	// Policy is the policy jobs are checked against.
	Policy() sandbox.Policy
	// Close ends the sessions and the pool; runs in progress clean up
	// after themselves (Wait waits for them).
	Close()
	// Wait returns once every sandbox is gone, or ctx's error.
	Wait(ctx context.Context) error
	// LiveSandboxes counts sandboxes started and not yet destroyed.
	LiveSandboxes() int
	// PoolSizes gives the idle warm sandboxes per language.
	PoolSizes() map[string]int
}

// backendConfig configures the backend and the engine over it.
type backendConfig struct {
	Backend gvisor.Config
	// Kube, if set, makes the backend the kubernetes one instead.
	Kube   *kubernetes.Config
	Engine engine.Config
}

// newBackend starts the backend that cfg describes and the engine over it.
func newBackend(cfg backendConfig) (backend, error) {
	var (
		be  engine.Backend
		err error
	)
	if cfg.Kube != nil {
		be, err = newKubeBackend(&cfg)
	} else {
		be, err = gvisor.New(cfg.Backend)
	}
	if err != nil {
		return nil, withHint(err)
	}
	cfg.Engine.Backend = be
	e, err := engine.New(cfg.Engine)
	if err != nil {
		return nil, err // not a typed nil inside the interface
	}
	return e, nil
}

// The configuration and defaults of the engine and the backend, named here
// so that the other files of cmd/ do not name their packages.
type (
	poolConfig    = engine.PoolConfig
	sessionConfig = engine.SessionConfig
	backendImage  = gvisor.Image
	imageResolver = gvisor.ImageResolver
	cgroupLayout  = gvisor.CgroupLayout
)

// defaultPoolMemory is the pool's memory budget unless --pool-memory says.
const defaultPoolMemory = engine.DefaultPoolMemory

// defaultPlatform is runsc's platform unless --platform says.
const defaultPlatform = gvisor.DefaultPlatform

// defaultSessions are the session bounds unless --max-sessions and the
// session timeouts say.
var defaultSessions = engine.DefaultSessions

// The host's side of the backend: the checks doctor and version report,
// and the re-executions main starts with.
var (
	preloadModules       = engine.DefaultPreload
	defaultStateDir      = gvisor.DefaultStateDir
	checkPrivileges      = gvisor.CheckPrivileges
	runscVersion         = gvisor.RunscVersion
	hostRoot             = gvisor.HostRoot
	hostUID              = gvisor.HostUID
	detectCgroups        = gvisor.DetectCgroups
	detectUserCgroups    = gvisor.DetectUserCgroups
	userNamespaceCheck   = gvisor.UserNamespaceCheck
	userNamespaceCapable = gvisor.UserNamespaceCapable
	userNamespaceFix     = gvisor.UserNamespaceFix
	userNamespaceMain    = gvisor.UserNamespaceMain
	shimMain             = gvisor.ShimMain
	networkCheck         = gvisor.NetworkCheck
)

// backendHints say how to provide a part the backend found missing or
// broken: the backend names the part and the fact, the CLI the fix.
var backendHints = []struct {
	part error
	hint string
}{
	{gvisor.ErrRunsc, "build it with `make runsc`, or name another with --runsc or " + envName("runsc")},
	{gvisor.ErrAgent, "build it with `make`, or name it with --agent or " + envName("agent")},
	{gvisor.ErrRootfs, "build the default image with `make rootfs`"},
	{gvisor.ErrPrivileges, "start safe-run as the command (it enters a user namespace of its own for ordinary users)"},
	{gvisor.ErrStateDirFull, "free space there or choose another with --state-dir or " + envName("state-dir")},
	{gvisor.ErrStateDir, "remove it or make it and its parents private to you, or choose another with --state-dir or " + envName("state-dir")},
	{gvisor.ErrMemoryUnwatched, "run safe-run as root or in a delegated cgroup (see docs/rootless.md)"},
	{kubernetes.ErrCluster, "name the cluster with --kubeconfig and the namespace with --namespace (or run in the cluster), and the image with --image"},
	{kubernetes.ErrPod, "see the Pod's events (`kubectl get events -n NAMESPACE`); check --runtime-class, --image and the nodes' capacity"},
}

// hint returns the fix for err, or "".
func hint(err error) string {
	for _, h := range backendHints {
		if errors.Is(err, h.part) {
			return h.hint
		}
	}
	return ""
}

// hintedError is an error with the CLI's fix appended to its text.
type hintedError struct {
	err  error
	hint string
}

func (e *hintedError) Error() string { return e.err.Error() + "; " + e.hint }
func (e *hintedError) Unwrap() error { return e.err }

// withHint appends the fix for err, if there is one.
func withHint(err error) error {
	if h := hint(err); h != "" && err != nil {
		return &hintedError{err: err, hint: h}
	}
	return err
}

// kubeFlags choose the backend and, for the kubernetes one, the cluster.
// Serve and run register them; with --backend kubernetes, --image is the
// image the cluster pulls (see `safe-run image push`).
type kubeFlags struct {
	backend, kubeconfig, namespace, runtimeClass string
}

func (k *kubeFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&k.backend, "backend", "gvisor", "what starts sandboxes: gvisor (runsc on this host) or kubernetes (gVisor Pods through agent-sandbox; --image is then the image the cluster pulls)")
	fs.StringVar(&k.kubeconfig, "kubeconfig", "", "kubeconfig `file` of --backend kubernetes (default: $KUBECONFIG, ~/.kube/config, else the in-cluster service account)")
	fs.StringVar(&k.namespace, "namespace", "", "namespace of --backend kubernetes's sandboxes (default: the kubeconfig context's, or the server Pod's)")
	fs.StringVar(&k.runtimeClass, "runtime-class", kubernetes.DefaultRuntimeClass, "RuntimeClass of --backend kubernetes's sandbox Pods (gVisor's)")
}

// runtimeConfig is the runtime configuration of the chosen backend: the
// host's (hostFlags.runtimeConfig), or the cluster's, which needs nothing
// of this host — no runsc, no privileges, no image cache.
func (k *kubeFlags) runtimeConfig(h *hostFlags) (backendConfig, error) {
	switch k.backend {
	case "", "gvisor":
		return h.runtimeConfig()
	case "kubernetes":
	default:
		return backendConfig{}, usageError("--backend %q is not one of gvisor and kubernetes", k.backend)
	}
	if h.image == rootfs.DefaultName {
		return backendConfig{}, usageError("--backend kubernetes needs --image: the image the cluster pulls, with the agent in it (push one with `safe-run image push default REF`, then pass --image REF)")
	}
	logger := newLogger()
	var cfg backendConfig
	cfg.Kube = &kubernetes.Config{Kubeconfig: k.kubeconfig, Namespace: k.namespace, RuntimeClass: k.runtimeClass,
		Image: h.image, Logger: logger}
	if agent, workdir := os.Getenv(envKwokAgent), os.Getenv(envKwokWorkdir); agent != "" || workdir != "" {
		if agent == "" || workdir == "" {
			return backendConfig{}, usageError("%s and %s are set together (tests against kwok only)", envKwokAgent, envKwokWorkdir)
		}
		logger.Warn("exec'ing the agent at a test path: for tests against kwok, whose exec runs on this host", "agent", agent, "workdir", workdir)
		cfg.Kube.Agent, cfg.Kube.Workdir = agent, workdir
	}
	cfg.Engine.Policy, cfg.Engine.Logger = sandbox.Policy{Languages: h.languageTable()}, logger
	return cfg, nil
}

// The agent exec'd into a sandbox Pod is bundle.AgentPath, serving
// bundle.Workspace: paths in the sandbox image. kwok's exec runs the
// command on the host instead (kubetest), where neither exists; a test
// that drives the real binary against kwok names the host's agent and a
// directory of its own with these. Nothing but such a test sets them: on
// a real cluster they would only make every exec fail, as the paths are
// looked up inside the hardened container.
const (
	envKwokAgent   = "SAFE_RUN_KWOK_AGENT"
	envKwokWorkdir = "SAFE_RUN_KWOK_WORKDIR"
)

// newKubeBackend starts the kubernetes backend. The pool's sizes become
// agent-sandbox warm pools of each language's default job; the engine
// keeps no pool of its own over it (a claimed sandbox is single use).
func newKubeBackend(cfg *backendConfig) (engine.Backend, error) {
	kc := *cfg.Kube
	kc.Logger = cfg.Engine.Logger
	if !cfg.Engine.Pool.OnDemand {
		langs := make([]string, 0, len(cfg.Engine.Pool.Size))
		for lang := range cfg.Engine.Pool.Size {
			langs = append(langs, lang)
		}
		slices.Sort(langs)
		for _, lang := range langs {
			n := cfg.Engine.Pool.Size[lang]
			if n <= 0 {
				continue
			}
			job, l, err := cfg.Engine.Policy.Check(sandbox.Job{Language: lang, Code: "pass"})
			if err != nil {
				return nil, fmt.Errorf("--pool %s: %w", lang, err)
			}
			job.Image = l.Image
			kc.Warm = append(kc.Warm, kubernetes.Warm{Job: job, Replicas: n})
		}
	}
	cfg.Engine.Pool = engine.PoolConfig{}
	return kubernetes.New(kc)
}
