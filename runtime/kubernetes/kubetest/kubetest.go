// Package kubetest starts a real Kubernetes control plane for the tests of
// the kubernetes backend: etcd and kube-apiserver (through controller-runtime's
// envtest), kube-scheduler, kube-controller-manager, kwok for a fake node that
// runs Pods' status and `pods/exec`, and the real agent-sandbox controller with
// its CRDs. A fake clientset cannot tell whether a claim binds, a warm pool
// fills or the agent protocol survives the API server's exec streams; this can.
// It is imported only by tests.
//
// The binaries come from scripts/kubernetes/build-control-plane.sh (run by
// `make test-kubernetes`), found through SAFE_RUN_KUBERNETES_BIN or that
// script's --print-dir. Without them Start skips the test, unless
// SAFE_RUN_KUBERNETES=1 (set by `make test-kubernetes`) makes it fail.
//
// etcd and kube-apiserver start through envtest rather than by hand: it
// makes their certificates, ports, service account keys and admin user, waits
// for health and installs the CRDs, and is what controller-runtime's own
// users test with. The other components are exec'd here (envtest knows only
// those two), each in its own process group, killed with the test binary.
// envtest's two are not: a test binary killed by -timeout leaves them
// running, which scripts/check-leftovers.sh reports.
//
// Start gives a test its own control plane (about 8 s); Shared, with Main in
// TestMain, one for all of a package's tests, each in its own Namespace.
//
// kwok's local exec runs every exec'd command on this host, as the user the
// tests run as (root in CI): no isolation at all. Tests exec only harmless
// programs through it.
package kubetest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"
)

const (
	// NodeName is the fake node kwok manages; the scheduler binds every Pod to it.
	NodeName = "kwok-node-0"
	// nodeAnnotation marks the nodes kwok manages (its --manage-nodes-with-annotation-selector).
	nodeAnnotation = "kwok.x-k8s.io/node"

	startTimeout = 90 * time.Second
	stopTimeout  = 10 * time.Second
)

// NodeCapacity is the fake node's capacity: a Pod asking for more stays
// Pending with the scheduler's Unschedulable reason, as on a real cluster.
var NodeCapacity = corev1.ResourceList{
	corev1.ResourceCPU:              resource.MustParse("8"),
	corev1.ResourceMemory:           resource.MustParse("16Gi"),
	corev1.ResourceEphemeralStorage: resource.MustParse("100Gi"),
	corev1.ResourcePods:             resource.MustParse("110"),
}

// binaries are the programs the build script puts in the binaries' directory.
var binaries = []string{"etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kwok", "agent-sandbox-controller"}

// Cluster is a running control plane; Start returns it, t.Cleanup stops it.
type Cluster struct {
	// Kubeconfig is the path of an admin (system:masters) kubeconfig.
	Kubeconfig string
	// RESTConfig is the same admin identity as a client config.
	RESTConfig *rest.Config
	// Client is a clientset for RESTConfig.
	Client kubernetes.Interface
	// LogDir holds one log file per component.
	LogDir string

	env      *envtest.Environment
	procs    []*process
	stopOnce sync.Once
}

// process is one component Start runs itself (envtest runs etcd and kube-apiserver).
type process struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Start starts a control plane for t and stops it when t ends. Components'
// logs go to files in t.TempDir(), printed (their ends) if t failed.
func Start(t testing.TB) *Cluster {
	t.Helper()
	bin := built(t)
	logDir := t.TempDir()
	c, err := start(bin, logDir)
	if c != nil {
		t.Cleanup(func() {
			if t.Failed() {
				c.printPods(t)
			}
			c.Stop()
			if t.Failed() {
				c.printLogs(t)
			}
		})
	}
	if err != nil {
		t.Fatalf("kubetest: start the control plane: %v", err)
	}
	return c
}

var shared struct {
	sync.Mutex
	c      *Cluster
	err    error
	logDir string
}

// Shared is Start for a package's tests that can share one control plane
// (each in its own Namespace): started by the first test that asks, stopped
// by Main after the last. The package's TestMain must call Main.
func Shared(t testing.TB) *Cluster {
	t.Helper()
	bin := built(t)
	shared.Lock()
	defer shared.Unlock()
	if shared.c == nil && shared.err == nil {
		shared.logDir, shared.err = os.MkdirTemp("", "kubetest-")
		if shared.err == nil {
			shared.c, shared.err = start(bin, shared.logDir)
		}
	}
	if shared.err != nil {
		if shared.c != nil {
			shared.c.printLogs(t)
		}
		t.Fatalf("kubetest: start the shared control plane: %v", shared.err)
	}
	c := shared.c
	t.Cleanup(func() {
		if t.Failed() {
			c.printPods(t)
			c.printLogs(t)
		}
	})
	return c
}

// Main runs a package's tests (m.Run) and then stops the control plane
// Shared started, removing its logs; call it from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	shared.Lock()
	if shared.c != nil {
		shared.c.Stop()
	}
	if shared.logDir != "" {
		os.RemoveAll(shared.logDir)
	}
	shared.Unlock()
	os.Exit(code)
}

// built is the binaries' directory, or skips t (fails it under SAFE_RUN_KUBERNETES=1).
func built(t testing.TB) string {
	t.Helper()
	bin, err := binDir()
	if err == nil {
		err = checkBuilt(bin)
	}
	if err != nil {
		if os.Getenv("SAFE_RUN_KUBERNETES") == "1" {
			t.Fatalf("kubetest: %v (SAFE_RUN_KUBERNETES=1: the control plane must be there; `make test-kubernetes` builds it)", err)
		}
		t.Skipf("kubetest: %v; `make test-kubernetes` builds the control plane and runs these tests", err)
	}
	return bin
}

// Namespace creates a fresh namespace for t, deleted when t ends.
func (c *Cluster) Namespace(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ns, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "kubetest-"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("kubetest: create namespace: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.Client.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("kubetest: delete namespace %s: %v", ns.Name, err)
		}
	})
	return ns.Name
}

// User returns a client config and a kubeconfig path for a user authenticated
// by client certificate, with no permissions beyond what RBAC grants its name
// and groups: for tests of refusals.
func (c *Cluster) User(t testing.TB, name string, groups ...string) (*rest.Config, string) {
	t.Helper()
	u, err := c.env.AddUser(envtest.User{Name: name, Groups: groups}, nil)
	if err != nil {
		t.Fatalf("kubetest: add user %s: %v", name, err)
	}
	kc, err := u.KubeConfig()
	if err != nil {
		t.Fatalf("kubetest: kubeconfig of user %s: %v", name, err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, kc, 0o600); err != nil {
		t.Fatalf("kubetest: write kubeconfig of user %s: %v", name, err)
	}
	return u.Config(), path
}

// Stop kills every component; Start's cleanup calls it, calling it again does nothing.
func (c *Cluster) Stop() {
	c.stopOnce.Do(func() {
		for i := len(c.procs) - 1; i >= 0; i-- {
			c.procs[i].stop()
		}
		if c.env != nil {
			_ = c.env.Stop()
		}
	})
}

func start(bin, logDir string) (c *Cluster, err error) {
	c = &Cluster{LogDir: logDir}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	crds, err := sandboxCRDs()
	if err != nil {
		return c, err
	}
	etcdLog, err := logFile(logDir, "etcd")
	if err != nil {
		return c, err
	}
	apiLog, err := logFile(logDir, "kube-apiserver")
	if err != nil {
		return c, err
	}
	c.env = &envtest.Environment{
		BinaryAssetsDirectory:    bin,
		CRDInstallOptions:        envtest.CRDInstallOptions{CRDs: crds, MaxTime: startTimeout},
		ControlPlaneStartTimeout: startTimeout,
		ControlPlaneStopTimeout:  stopTimeout,
	}
	c.env.ControlPlane.Etcd = &envtest.Etcd{Out: etcdLog, Err: etcdLog}
	api := &envtest.APIServer{Out: apiLog, Err: apiLog}
	// kwok's node has only an InternalIP (127.0.0.1), where its server listens.
	api.Configure().Set("kubelet-preferred-address-types", "InternalIP")
	c.env.ControlPlane.APIServer = api
	if c.RESTConfig, err = c.env.Start(); err != nil {
		return c, fmt.Errorf("envtest: %w", err)
	}
	if c.Client, err = kubernetes.NewForConfig(c.RESTConfig); err != nil {
		return c, fmt.Errorf("clientset: %w", err)
	}
	c.Kubeconfig = filepath.Join(logDir, "kubeconfig")
	if err := os.WriteFile(c.Kubeconfig, c.env.KubeConfig, 0o600); err != nil {
		return c, fmt.Errorf("write kubeconfig: %w", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	kwokArgs, err := c.kwokConfig(filepath.Dir(bin), logDir)
	if err != nil {
		return c, err
	}
	if _, err := c.Client.CoreV1().Nodes().Create(ctx, fakeNode(), metav1.CreateOptions{}); err != nil {
		return c, fmt.Errorf("create node %s: %w", NodeName, err)
	}
	probe, err := freePort()
	if err != nil {
		return c, err
	}
	components := []struct {
		name string
		args []string
	}{
		{"kwok", kwokArgs},
		{"kube-scheduler", []string{"--kubeconfig=" + c.Kubeconfig, "--leader-elect=false", "--secure-port=0"}},
		// The garbage collector deletes what a deleted object owned (a Sandbox's
		// Pod), the namespace controller empties deleted namespaces, the
		// service account controller makes each namespace's default one, and
		// the deployment and replica set controllers turn a Deployment (the
		// server's own manifests) into Pods for kwok to run.
		{"kube-controller-manager", []string{"--kubeconfig=" + c.Kubeconfig, "--leader-elect=false", "--secure-port=0",
			"--controllers=garbage-collector-controller,namespace-controller,serviceaccount-controller,deployment-controller,replicaset-controller",
			"--use-service-account-credentials=false"}},
		{"agent-sandbox-controller", []string{"--kubeconfig=" + c.Kubeconfig, "--leader-elect=false",
			"--enable-webhook=false", "--manage-webhook-certs=false", "--extensions=true",
			"--metrics-bind-address=0", fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", probe)}},
	}
	for _, comp := range components {
		p, err := c.run(bin, logDir, comp.name, comp.args...)
		if err != nil {
			return c, err
		}
		c.procs = append(c.procs, p)
	}
	if err := c.waitNodeReady(ctx); err != nil {
		if !c.restartCrashedKwok(bin, logDir, kwokArgs) {
			return c, err
		}
		if err := c.waitNodeReady(ctx); err != nil {
			return c, fmt.Errorf("%w (kwok was started a second time after it exited at start)", err)
		}
	}
	if err := c.waitHTTP(ctx, "agent-sandbox-controller", fmt.Sprintf("http://127.0.0.1:%d/readyz", probe)); err != nil {
		return c, err
	}
	return c, nil
}

// kwokConfig writes kwok's certificate and configs and returns its flags.
func (c *Cluster) kwokConfig(cacheDir, logDir string) ([]string, error) {
	dir := filepath.Join(logDir, "kwok")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	cert, key, err := selfSignedCert(dir)
	if err != nil {
		return nil, fmt.Errorf("kwok certificate: %w", err)
	}
	stageFiles, err := filepath.Glob(filepath.Join(cacheDir, "kwok-stages", "*.yaml"))
	if err != nil || len(stageFiles) == 0 {
		return nil, fmt.Errorf("no kwok stages in %s/kwok-stages: rerun scripts/kubernetes/build-control-plane.sh", cacheDir)
	}
	var stages bytes.Buffer
	for _, f := range stageFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		stages.WriteString("---\n")
		stages.Write(b)
		stages.WriteString("\n")
	}
	stagesPath := filepath.Join(dir, "stages.yaml")
	if err := os.WriteFile(stagesPath, stages.Bytes(), 0o600); err != nil {
		return nil, err
	}
	// Every Pod's exec runs on this host, in /tmp: see the package comment.
	execPath := filepath.Join(dir, "exec.yaml")
	const execConfig = `apiVersion: kwok.x-k8s.io/v1alpha1
kind: ClusterExec
metadata:
  name: local
spec:
  execs:
  - local:
      workDir: /tmp
`
	if err := os.WriteFile(execPath, []byte(execConfig), 0o600); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	return []string{
		"--kubeconfig=" + c.Kubeconfig,
		"--manage-all-nodes=false",
		"--manage-nodes-with-annotation-selector=" + nodeAnnotation + "=fake",
		"--cidr=10.244.0.0/24",
		"--node-ip=127.0.0.1",
		fmt.Sprintf("--node-port=%d", port),
		fmt.Sprintf("--server-address=127.0.0.1:%d", port),
		"--tls-cert-file=" + cert,
		"--tls-private-key-file=" + key,
		"--config=" + stagesPath,
		"--config=" + execPath,
	}, nil
}

func fakeNode() *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        NodeName,
			Annotations: map[string]string{nodeAnnotation: "fake"},
			Labels: map[string]string{
				"kubernetes.io/hostname": NodeName,
				"kubernetes.io/os":       "linux",
				"kubernetes.io/arch":     "amd64",
				"type":                   "kwok",
			},
		},
		Status: corev1.NodeStatus{Capacity: NodeCapacity, Allocatable: NodeCapacity},
	}
}

func (c *Cluster) waitNodeReady(ctx context.Context) error {
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if err := c.exited(); err != nil {
			return false, err
		}
		n, err := c.Client.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("wait for kwok to make node %s Ready: %w", NodeName, err)
	}
	// The API server's TaintNodesByCondition admission taints a new node
	// not-ready; the node lifecycle controller, not run here (it would mark
	// the fake node unreachable whenever a busy host delays kwok's
	// heartbeats), removes that taint once the node is Ready: do it for it.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Spec.Taints = nil
		_, err = c.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("remove node %s's not-ready taint: %w", NodeName, err)
	}
	return nil
}

func (c *Cluster) waitHTTP(ctx context.Context, name, url string) error {
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if err := c.exited(); err != nil {
			return false, err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		return fmt.Errorf("wait for %s to be ready (%s): %w", name, url, err)
	}
	return nil
}

// restartCrashedKwok starts kwok again if it has exited, and reports
// whether it did. kwok v0.8.0 can crash as it starts: its node
// controller's goroutines build CEL environments that write one map
// unguarded ("fatal error: concurrent map writes" in easycel's registry;
// once in about fifteen starts here). A crash before the node is Ready
// gets one more start; its log stays in kwok.log, above the new one's.
func (c *Cluster) restartCrashedKwok(bin, logDir string, args []string) bool {
	i := slices.IndexFunc(c.procs, func(p *process) bool { return p.name == "kwok" })
	if i < 0 {
		return false
	}
	select {
	case <-c.procs[i].done:
	default:
		return false // it runs: the node is not Ready for another reason
	}
	p, err := c.run(bin, logDir, "kwok", args...)
	if err != nil {
		return false
	}
	c.procs[i] = p
	return true
}

// exited reports a component that ended while the cluster should be running.
func (c *Cluster) exited() error {
	for _, p := range c.procs {
		select {
		case <-p.done:
			return fmt.Errorf("%s exited: %v (its log: %s)", p.name, p.err, filepath.Join(c.LogDir, p.name+".log"))
		default:
		}
	}
	return nil
}

func (c *Cluster) run(bin, logDir, name string, args ...string) (*process, error) {
	out, err := logFile(logDir, name)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(filepath.Join(bin, name), args...)
	cmd.Stdout, cmd.Stderr = out, out
	// Its own process group, killed as one; and killed with the test binary
	// if that dies without cleaning up.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		out.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		out.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *process) stop() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(stopTimeout):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// printPods logs every Pod's node, phase and conditions: what a test that
// waited in vain most often needs.
func (c *Cluster) printPods(t testing.TB) {
	if c.Client == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pods, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Logf("kubetest: list pods: %v", err)
		return
	}
	for _, p := range pods.Items {
		var conds []string
		for _, cond := range p.Status.Conditions {
			conds = append(conds, fmt.Sprintf("%s=%s %s %s", cond.Type, cond.Status, cond.Reason, cond.Message))
		}
		t.Logf("kubetest: pod %s/%s node %q phase %s conditions %v", p.Namespace, p.Name, p.Spec.NodeName, p.Status.Phase, conds)
	}
}

func (c *Cluster) printLogs(t testing.TB) {
	files, _ := filepath.Glob(filepath.Join(c.LogDir, "*.log"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		if len(lines) > 60 {
			lines = lines[len(lines)-60:]
		}
		t.Logf("kubetest: last lines of %s:\n%s", filepath.Base(f), strings.Join(lines, "\n"))
	}
}

func logFile(dir, name string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("log of %s: %w", name, err)
	}
	return f, nil
}

// HostAgent is the host's safe-run-agent, which kwok's exec runs in place
// of the agent in a sandbox image: SAFE_RUN_AGENT (as `make test` sets it),
// else bin/safe-run-agent of the checkout. It fails t if there is none.
func HostAgent(t testing.TB) string {
	t.Helper()
	p := os.Getenv("SAFE_RUN_AGENT")
	if p == "" {
		root, err := moduleRoot()
		if err != nil {
			t.Fatalf("kubetest: the agent binary: %v", err)
		}
		p = filepath.Join(root, "bin", "safe-run-agent")
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("kubetest: the agent binary: %v (build it with make, or set SAFE_RUN_AGENT)", err)
	}
	return p
}

// binDir is SAFE_RUN_KUBERNETES_BIN, or where the build script puts the binaries.
func binDir() (string, error) {
	if d := os.Getenv("SAFE_RUN_KUBERNETES_BIN"); d != "" {
		return d, nil
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	out, err := exec.Command(filepath.Join(root, "scripts", "kubernetes", "build-control-plane.sh"), "--print-dir").Output()
	if err != nil {
		return "", fmt.Errorf("scripts/kubernetes/build-control-plane.sh --print-dir: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

func checkBuilt(bin string) error {
	var missing []string
	for _, b := range binaries {
		if fi, err := os.Stat(filepath.Join(bin, b)); err != nil || fi.Mode()&0o111 == 0 {
			missing = append(missing, b)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("the control plane is not built (%s missing in %s)", strings.Join(missing, ", "), bin)
	}
	return nil
}

// moduleRoot is the directory of safe-run's go.mod above the working directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "scripts", "kubernetes", "build-control-plane.sh")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("cannot find scripts/kubernetes/build-control-plane.sh above the working directory; set SAFE_RUN_KUBERNETES_BIN")
		}
		dir = parent
	}
}

const agentSandboxModule = "sigs.k8s.io/agent-sandbox"

// sandboxCRDs reads agent-sandbox's CRDs from the module cache, at the version
// of safe-run's go.mod (the Go types' version), and serves
// v1beta1 alone: upstream converts between v1alpha1 and v1beta1 with a
// webhook these tests do not run.
func sandboxCRDs() ([]*apiextensionsv1.CustomResourceDefinition, error) {
	dir, err := moduleDir(agentSandboxModule)
	if err != nil {
		return nil, err
	}
	files, err := filepath.Glob(filepath.Join(dir, "k8s", "crds", "*.yaml"))
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("no CRDs in %s/k8s/crds", dir)
	}
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(b, crd); err != nil {
			return nil, fmt.Errorf("CRD %s: %w", f, err)
		}
		var served []apiextensionsv1.CustomResourceDefinitionVersion
		for _, v := range crd.Spec.Versions {
			if v.Name == "v1beta1" {
				v.Served, v.Storage = true, true
				served = append(served, v)
			}
		}
		if len(served) == 0 {
			return nil, fmt.Errorf("CRD %s has no v1beta1 version", f)
		}
		crd.Spec.Versions = served
		crd.Spec.Conversion = nil
		crds = append(crds, crd)
	}
	return crds, nil
}

// moduleDir is where the module cache holds mod at the version safe-run's
// go.mod requires (the version of the Go types the tests use), downloaded if
// it is not there yet.
func moduleDir(mod string) (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "mod", "download", "-json", mod)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go mod download %s: %w", mod, err)
	}
	var info struct{ Dir, Version, Error string }
	if err := json.Unmarshal(out, &info); err != nil {
		return "", fmt.Errorf("go mod download %s: %w", mod, err)
	}
	if info.Error != "" || info.Dir == "" {
		return "", fmt.Errorf("go mod download %s: no directory (%s)", mod, info.Error)
	}
	return info.Dir, nil
}

// selfSignedCert writes a certificate for 127.0.0.1 and its key into dir:
// the API server does not verify kwok's serving certificate.
func selfSignedCert(dir string) (certPath, keyPath string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "kwok"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return "", "", err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", err
	}
	certPath, keyPath = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := writePEM(certPath, "CERTIFICATE", der); err != nil {
		return "", "", err
	}
	if err := writePEM(keyPath, "EC PRIVATE KEY", keyDER); err != nil {
		return "", "", err
	}
	return certPath, keyPath, nil
}

func writePEM(path, kind string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600)
}

// freePort is a loopback port free now, for a component that wants a port
// number rather than a listener (several clusters may run at once).
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
