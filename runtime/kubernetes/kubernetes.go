package kubernetes

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	extv1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/safe-run/safe-run/bundle"
	"github.com/safe-run/safe-run/runtime/engine"
	"github.com/safe-run/safe-run/sandbox"
)

// Config configures a Backend. Image is required; the zero value of every
// other field is a working default.
type Config struct {
	// Kubeconfig is the kubeconfig file; empty means $KUBECONFIG or
	// ~/.kube/config if there is one, else the in-cluster configuration
	// (the Pod's service account).
	Kubeconfig string
	// RESTConfig, if set, is used instead of Kubeconfig (for tests and
	// embedding).
	RESTConfig *rest.Config
	// Namespace holds every object; empty means the kubeconfig context's,
	// or the Pod's own in the cluster, else "default".
	Namespace string
	// RuntimeClass is the sandbox Pods' runtimeClassName; empty means
	// DefaultRuntimeClass.
	RuntimeClass string
	// Image is the container image of jobs that name none: one with the
	// agent at bundle.AgentPath, as `safe-run image push` builds it.
	Image string
	// Images maps an image a job names (Job.Image) to the image the
	// cluster pulls for it; a job naming another is refused.
	Images map[string]string
	// Warm lists the warm pools to keep: for each, the job whose
	// template the pool fills (a language's default job) and its size.
	Warm []Warm
	// Owner names this server on its claims (LabelOwner); empty means the
	// host name (the Pod's name in a Deployment).
	Owner string
	// PodLifetime bounds every sandbox Pod (activeDeadlineSeconds); empty
	// means DefaultPodLifetime.
	PodLifetime time.Duration
	// SessionLifetime bounds a session's claim; zero means
	// DefaultPodLifetime. A run's claim lives its timeout plus StartTimeout.
	SessionLifetime time.Duration
	// StartTimeout bounds the wait for a claimed sandbox's Pod to run;
	// zero means DefaultStartTimeout.
	StartTimeout time.Duration
	// ReapIdle is how long a claim may go unused before the reaper takes
	// it for one a dead server left; zero means DefaultReapIdle, negative
	// runs no reaper.
	ReapIdle time.Duration
	// Agent and Workdir are the agent's path and the workspace in the
	// container; empty means bundle.AgentPath and bundle.Workspace. Tests
	// against kwok, whose exec runs on the host, point them at the host.
	Agent   string
	Workdir string
	// Logger receives diagnostics; nil means slog.Default().
	Logger *slog.Logger
}

// Warm is one warm pool to keep.
type Warm struct {
	// Job is the job the pool's sandboxes are built for; its limits must
	// be complete. A run whose job has the same language, image and
	// limits claims from the pool.
	Job sandbox.Job
	// Replicas is the pool's size.
	Replicas int
}

// Defaults of Config's zero fields.
const (
	DefaultStartTimeout = 60 * time.Second
	DefaultReapIdle     = 2 * time.Hour
)

// The resources the backend uses.
var (
	claimsResource    = extv1.GroupVersion.WithResource("sandboxclaims")
	templatesResource = extv1.GroupVersion.WithResource("sandboxtemplates")
	poolsResource     = extv1.GroupVersion.WithResource("sandboxwarmpools")
	sandboxesResource = schema.GroupVersionResource{Group: "agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxes"}
	podsResource      = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	eventsResource    = schema.GroupVersionResource{Version: "v1", Resource: "events"}
	policiesResource  = networkingv1.SchemeGroupVersion.WithResource("networkpolicies")
)

// ErrCluster marks the errors of New about reaching the cluster (class
// sandbox.ErrUnavailable), so that the CLI can say how to point it at one.
var ErrCluster = errors.New("the Kubernetes cluster")

// Backend starts sandboxes as agent-sandbox claims in one namespace. It is
// safe for concurrent use.
type Backend struct {
	cfg  Config
	spec SpecConfig
	log  *slog.Logger
	dyn  dynamic.Interface
	// exec opens the stream of the agent exec'd into a Pod.
	exec executorFunc

	live  sync.WaitGroup
	liveN atomic.Int64

	mu     sync.Mutex
	pools  map[string]*extv1.SandboxWarmPool // by TemplateName: the pool its claims name
	claims map[string]int                    // claims of sandboxes not yet destroyed: how many of this server's connections each has
}

var _ engine.Backend = (*Backend)(nil)

// New connects to the cluster cfg names and returns a Backend. It creates
// the deny-all NetworkPolicy and the warm pools if they are missing, and
// starts the reaper. Its errors are of class sandbox.ErrUnavailable.
func New(cfg Config) (*Backend, error) {
	rc, ns, err := restConfig(cfg)
	if err != nil {
		return nil, err
	}
	cfg.Namespace = ns
	if cfg.Logger != nil {
		// client-go reports through klog, to stderr in its own format; a
		// killed sandbox's exec stream alone logs four lines. They go to
		// the server's logger instead. (klog is global: one backend per
		// process, as in the CLI.)
		klog.SetSlogLogger(cfg.Logger.With("component", "client-go"))
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, clusterError("connect to the cluster: %v", err)
	}
	return newBackend(cfg, dyn, restExecutor(rc))
}

// newBackend is New over a given client and executor (the unit tests'
// fakes).
func newBackend(cfg Config, dyn dynamic.Interface, exec executorFunc) (*Backend, error) {
	if cfg.Namespace == "" {
		cfg.Namespace = "default"
	}
	if cfg.RuntimeClass == "" {
		cfg.RuntimeClass = DefaultRuntimeClass
	}
	if cfg.PodLifetime <= 0 {
		cfg.PodLifetime = DefaultPodLifetime
	}
	if cfg.SessionLifetime <= 0 {
		cfg.SessionLifetime = DefaultPodLifetime
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = DefaultStartTimeout
	}
	if cfg.ReapIdle == 0 {
		cfg.ReapIdle = DefaultReapIdle
	}
	if cfg.Agent == "" {
		cfg.Agent = bundle.AgentPath
	}
	if cfg.Workdir == "" {
		cfg.Workdir = bundle.Workspace
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Owner == "" {
		cfg.Owner, _ = os.Hostname()
	}
	cfg.Owner = labelValue(cfg.Owner)
	if cfg.Image == "" {
		return nil, clusterError("no sandbox image is set: push one with `safe-run image push` and name it")
	}
	b := &Backend{cfg: cfg, log: cfg.Logger, dyn: dyn, exec: exec, pools: map[string]*extv1.SandboxWarmPool{}, claims: map[string]int{},
		spec: SpecConfig{Namespace: cfg.Namespace, RuntimeClass: cfg.RuntimeClass, Image: cfg.Image, PodLifetime: cfg.PodLifetime}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.create(ctx, policiesResource, DenyAll(cfg.Namespace)); apierrors.IsForbidden(err) {
		// The templates' own policies deny all as well; an operator may
		// ship this one instead of letting the server create it.
		b.log.Warn("cannot create the deny-all NetworkPolicy: ship it with the deployment", "name", DenyAllPolicyName, "err", err)
	} else if err != nil {
		return nil, clusterError("create the NetworkPolicy %s: %v", DenyAllPolicyName, err)
	}
	for _, w := range cfg.Warm {
		if _, err := b.ensurePool(ctx, w.Job, int32(w.Replicas)); err != nil {
			return nil, sandbox.WithClass(err, sandbox.ErrUnavailable)
		}
	}
	if cfg.ReapIdle > 0 {
		go b.reapEvery(10 * time.Minute)
	}
	return b, nil
}

// clusterError is an error of New: the cluster cannot be used.
func clusterError(format string, args ...any) error {
	return sandbox.WithClass(fmt.Errorf("%w: %s", ErrCluster, fmt.Sprintf(format, args...)), sandbox.ErrUnavailable)
}

// labelValue makes s a valid label value: at most 63 characters of
// [A-Za-z0-9._-], starting and ending with an alphanumeric.
func labelValue(s string) string {
	s = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-' {
			return r
		}
		return '-'
	}, s)
	if len(s) > validation.LabelValueMaxLength {
		s = s[:validation.LabelValueMaxLength]
	}
	s = strings.Trim(s, "._-")
	if s == "" {
		return "unknown"
	}
	return s
}

// Namespace is the namespace the backend works in.
func (b *Backend) Namespace() string { return b.cfg.Namespace }

// Owner is the name this server puts on its claims.
func (b *Backend) Owner() string { return b.cfg.Owner }

// create creates obj in the namespace, unless it exists already.
func (b *Backend) create(ctx context.Context, res schema.GroupVersionResource, obj any) error {
	u, err := toUnstructured(obj)
	if err != nil {
		return err
	}
	_, err = b.dyn.Resource(res).Namespace(b.cfg.Namespace).Create(ctx, u, metav1.CreateOptions{FieldManager: ManagedBy})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// get reads the object name of res into out.
func (b *Backend) get(ctx context.Context, res schema.GroupVersionResource, name string, out any) error {
	u, err := b.dyn.Resource(res).Namespace(b.cfg.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	return runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, out)
}

// remove deletes the object name of res; one already gone is no error.
func (b *Backend) remove(ctx context.Context, res schema.GroupVersionResource, name string) error {
	background := metav1.DeletePropagationBackground
	zero := int64(0)
	err := b.dyn.Resource(res).Namespace(b.cfg.Namespace).Delete(ctx, name,
		metav1.DeleteOptions{PropagationPolicy: &background, GracePeriodSeconds: &zero})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

func toUnstructured(obj any) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, err
	}
	return &unstructured.Unstructured{Object: m}, nil
}

// image is the cluster image of job.
func (b *Backend) image(job sandbox.Job) (string, error) {
	if job.Image == "" || job.Image == b.cfg.Image {
		return b.cfg.Image, nil
	}
	if ref, ok := b.cfg.Images[job.Image]; ok {
		return ref, nil
	}
	return "", sandbox.WithClass(fmt.Errorf("image %s has no image in the cluster: push it with `safe-run image push %s REF` and map it to REF", job.Image, job.Image), sandbox.ErrUnavailable)
}

// ensurePool returns the warm pool to claim job's sandboxes from: one
// already in the namespace whose template is the very sandbox this
// backend would make (adoptable: an operator's, such as
// deploy/kubernetes's safe-run-LANG pools), else the backend's own, whose
// template and pool it creates unless they exist. An adopted pool keeps
// the size its owner gave it. A pool created here for a run has replicas
// 0: its claims are created cold.
func (b *Backend) ensurePool(ctx context.Context, job sandbox.Job, replicas int32) (*extv1.SandboxWarmPool, error) {
	sc := b.spec
	var err error
	if sc.Image, err = b.image(job); err != nil {
		return nil, err
	}
	tmpl, err := Template(job, sc)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	pool, known := b.pools[tmpl.Name]
	b.mu.Unlock()
	if known {
		return pool, nil
	}
	// Why a pool of the language was passed over matters when a warm
	// pool is asked for (the operator expects to find theirs used); for
	// a run with other limits the language's pools differ as they should.
	pool, err = b.adoptable(ctx, tmpl, replicas > 0)
	if err != nil {
		return nil, err
	}
	if pool != nil {
		b.log.Info("claiming from an existing warm pool: its template is the sandbox this server makes",
			"pool", pool.Name, "template", pool.Spec.TemplateRef.Name, "language", job.Language, "replicas", replicasOf(pool))
		if replicas > 0 && replicas != replicasOf(pool) {
			b.log.Warn("the pool's size is its owner's: the configured size does not change an adopted pool",
				"pool", pool.Name, "replicas", replicasOf(pool), "asked", replicas)
		}
	} else {
		pool = WarmPool(tmpl, replicas)
		if err := b.create(ctx, templatesResource, tmpl); err != nil {
			return nil, fmt.Errorf("create template %s: %w", tmpl.Name, err)
		}
		if err := b.create(ctx, poolsResource, pool); err != nil {
			return nil, fmt.Errorf("create warm pool %s: %w", pool.Name, err)
		}
	}
	b.mu.Lock()
	b.pools[tmpl.Name] = pool
	b.mu.Unlock()
	return pool, nil
}

// Start claims a sandbox for spec. The claim is made at once (an error of
// the API, such as a refusal by RBAC, is returned); the wait for its Pod
// and the agent's exec go on in the background, and their failure ends
// the sandbox with its reason in ExitReport.
func (b *Backend) Start(spec engine.StartSpec) (engine.Sandbox, error) {
	job := spec.Job
	if len(job.Network) > 0 {
		return nil, sandbox.WithClass(errors.New("the kubernetes backend gives sandboxes no network yet: run without network access"), sandbox.ErrUnavailable)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := b.ensurePool(ctx, job, 0)
	if err != nil {
		return nil, sandbox.WithClass(fmt.Errorf("start sandbox: %w", err), classOf(err))
	}
	name := "safe-run-" + randomHex(6)
	lifetime := b.cfg.SessionLifetime
	if !spec.KeepAlive {
		lifetime = job.Limits.Timeout + b.cfg.StartTimeout + time.Minute
	}
	cs := ClaimSpec{Name: name, Language: job.Language, Owner: b.cfg.Owner, Session: spec.KeepAlive,
		Created: time.Now(), Lifetime: lifetime}
	if rec := spec.Session; rec != nil && spec.KeepAlive {
		cs.SessionID, cs.State, cs.Holder = rec.ID, sessionState(*rec), newHolder(b.cfg.Owner)
	}
	claim := Claim(pool, cs)
	b.track(name)
	if err := b.create(ctx, claimsResource, claim); err != nil {
		b.forget(name)
		return nil, sandbox.WithClass(fmt.Errorf("create claim %s: %w", name, err), classOf(err))
	}
	log := spec.Log
	if log == nil {
		log = b.log
	}
	return b.newClaimSandbox(name, cs.Holder, spec, log.With("sandbox", name)), nil
}

// track counts a connection to claim name's sandbox live.
func (b *Backend) track(name string) {
	b.live.Add(1)
	b.liveN.Add(1)
	b.mu.Lock()
	b.claims[name]++
	b.mu.Unlock()
}

// forget counts a connection to claim name's sandbox gone.
func (b *Backend) forget(name string) {
	b.mu.Lock()
	if b.claims[name]--; b.claims[name] <= 0 {
		delete(b.claims, name)
	}
	b.mu.Unlock()
	b.liveN.Add(-1)
	b.live.Done()
}

// classOf is the class of an API error: a quota or rate limit is
// exhaustion, anything else makes the backend unusable for now.
func classOf(err error) error {
	if c := sandbox.Class(err); c != nil {
		return c
	}
	if apierrors.IsTooManyRequests(err) || strings.Contains(err.Error(), "exceeded quota") {
		return sandbox.ErrExhausted
	}
	return sandbox.ErrUnavailable
}

// Wait blocks until every sandbox started has been destroyed, or ctx ends.
func (b *Backend) Wait(ctx context.Context) error {
	done := make(chan struct{})
	go func() { b.live.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Live counts the sandboxes started and not yet destroyed.
func (b *Backend) Live() int { return int(b.liveN.Load()) }

func randomHex(n int) string {
	buf := make([]byte, n)
	_, _ = rand.Read(buf)
	return hex.EncodeToString(buf)
}
