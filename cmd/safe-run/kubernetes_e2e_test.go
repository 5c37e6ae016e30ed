package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/safe-run/safe-run/runtime/kubernetes"
	"github.com/safe-run/safe-run/runtime/kubernetes/kubetest"
)

// TestKubernetesEndToEnd drives the real binary with --backend kubernetes
// against kubetest's control plane (a real etcd, kube-apiserver,
// scheduler, controller manager and agent-sandbox controller, kwok as the
// node): `safe-run serve` through MCP over stdio (a run with its stdout
// and exit code, a run that fails, a session across two calls) and
// `safe-run run`; afterwards no claim is left, and no Pod but the warm
// pool's.
//
// NO ISOLATION: kwok's exec runs the exec'd agent ON THIS HOST, as the
// test's user (root in CI), and the agent runs the programs there too; the
// server is told the host's agent and a temporary workspace through
// SAFE_RUN_KWOK_AGENT and SAFE_RUN_KWOK_WORKDIR (backend.go), which only
// tests set. So the programs here are harmless (echo, arithmetic), and
// every agent path that signals or kills "all other processes" stays
// guarded to a sandbox: killStrays kills only as pid 1, which an exec'd
// agent never is. A process of this host is started before the runs and
// must outlive them.
func TestKubernetesEndToEnd(t *testing.T) {
	bin := binary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	k := startKubeE2E(t, ctx)
	env, cluster, count := k.env, k.cluster, k.count

	witness := exec.Command("sleep", "300")
	if err := witness.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = witness.Process.Kill(); _ = witness.Wait() }()

	t.Run("serve", func(t *testing.T) {
		ts := startServerEnv(t, "stdio", env, append(cluster, "--pool", "bash=1")...)
		for _, tt := range []struct {
			code   string
			stdout string
			exit   float64
		}{
			{"echo hello from a claim", "hello from a claim\n", 0},
			{"echo oops >&2; exit 3", "", 3},
		} {
			res, out := ts.tool(t, "run_code", map[string]any{"language": "bash", "code": tt.code})
			if out["stdout"] != tt.stdout || out["exit_code"] != tt.exit {
				t.Errorf("run_code %q: %v %s", tt.code, out, text(res))
			}
		}
		res, info := ts.tool(t, "create_session", map[string]any{"language": "bash"})
		id, _ := info["session_id"].(string)
		if res.IsError || id == "" {
			t.Fatalf("create_session: %s", text(res))
		}
		if res, out := ts.tool(t, "run_code", map[string]any{"language": "bash", "session_id": id, "code": "x=41"}); res.IsError {
			t.Fatalf("first call of the session: %v %s", out, text(res))
		}
		if res, out := ts.tool(t, "run_code", map[string]any{"language": "bash", "session_id": id, "code": "echo $((x + 1))"}); out["stdout"] != "42\n" {
			t.Errorf("second call of the session: %v %s", out, text(res))
		}
		if res, _ := ts.tool(t, "close_session", map[string]any{"session_id": id}); res.IsError {
			t.Errorf("close_session: %s", text(res))
		}
		ts.client.Close()
	})

	t.Run("run", func(t *testing.T) {
		cmd := exec.Command(bin, append(append([]string{"run"}, cluster...), "--lang", "bash", "-c", "echo ran; exit 4")...)
		cmd.Env = append(os.Environ(), env...)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		_ = cmd.Run()
		if code := cmd.ProcessState.ExitCode(); code != 4 || out.String() != "ran\n" {
			t.Errorf("safe-run run: exit %d, stdout %q, stderr %s", code, out.String(), errOut.String())
		}
	})

	// Nothing left: no claim; no Sandbox or Pod but the warm pool's one.
	deadline := time.Now().Add(time.Minute)
	for {
		claims, sandboxes, pods := count("extensions.agents.x-k8s.io", "sandboxclaims"), count("agents.x-k8s.io", "sandboxes"), count("", "pods")
		if claims == 0 && sandboxes == 1 && pods == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("left after the server and the run exited: %d claims, %d sandboxes, %d pods; want 0, 1 and 1 (the warm pool's)", claims, sandboxes, pods)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err := witness.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("a host process died during the runs: %v", err)
	}
}

// kubeE2E is a namespace of kubetest's control plane made ready for the
// real binary: the RuntimeClass exists, and env and cluster are what a
// safe-run process needs to use it (see TestKubernetesEndToEnd on what
// SAFE_RUN_KWOK_AGENT and SAFE_RUN_KWOK_WORKDIR do).
type kubeE2E struct {
	env, cluster []string
	count        func(group, resource string) int // objects of a resource in the namespace
}

func startKubeE2E(t *testing.T, ctx context.Context) kubeE2E {
	t.Helper()
	c := kubetest.Start(t)
	agentBin := kubetest.HostAgent(t)
	rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: kubernetes.DefaultRuntimeClass}, Handler: "runsc"}
	if _, err := c.Client.NodeV1().RuntimeClasses().Create(ctx, rc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	ns := c.Namespace(t)
	dyn := dynamic.NewForConfigOrDie(c.RESTConfig)
	return kubeE2E{
		env: []string{"SAFE_RUN_KWOK_AGENT=" + agentBin, "SAFE_RUN_KWOK_WORKDIR=" + t.TempDir()},
		cluster: []string{"--backend", "kubernetes", "--kubeconfig", c.Kubeconfig, "--namespace", ns,
			"--image", "safe-run.invalid/sandbox:test"}, // kwok pulls no image
		count: func(group, resource string) int {
			t.Helper()
			gvr := schema.GroupVersionResource{Group: group, Version: "v1beta1", Resource: resource}
			if group == "" {
				gvr.Version = "v1"
			}
			l, err := dyn.Resource(gvr).Namespace(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatalf("list %s: %v", resource, err)
			}
			return len(l.Items)
		},
	}
}

// TestKubernetesHTTPReplicas: two `safe-run serve --http` processes with
// one --session-key-file serve one MCP client as the same client, as two
// replicas behind a Service without affinity would. The client initializes
// on A and makes a session there; its next call, sent to B with the same
// Mcp-Session-Id, is served in that session (the file A's call wrote is
// there; the interpreter is new, as after any attach); A is killed
// (SIGKILL) and B still serves the client; close_session through B leaves
// no claim. The same NO ISOLATION as TestKubernetesEndToEnd: the programs
// are echo and cat, run on this host.
func TestKubernetesHTTPReplicas(t *testing.T) {
	bin := binary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	k := startKubeE2E(t, ctx)
	keyFile := filepath.Join(t.TempDir(), "session-key")
	if err := os.WriteFile(keyFile, []byte(strings.Repeat("5e", 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	replica := func() (*exec.Cmd, string) {
		args := append([]string{"serve", "--state-dir", filepath.Join(t.TempDir(), "state"), "--log-level", "warn",
			"--http", "127.0.0.1:0", "--session-key-file", keyFile}, k.cluster...)
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), k.env...)
		stderr, _ := cmd.StderrPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if cmd.ProcessState == nil {
				_ = cmd.Process.Signal(os.Interrupt)
				_ = cmd.Wait()
			}
		})
		return cmd, waitForURL(t, stderr)
	}
	a, urlA := replica()
	_, urlB := replica()

	onA := &testServer{client: connectHTTP(t, urlA, "replicas")}
	defer onA.client.Close()
	id := onA.client.GetTransport().(*transport.StreamableHTTP).GetSessionId()
	res, info := onA.tool(t, "create_session", map[string]any{"language": "bash"})
	session, _ := info["session_id"].(string)
	if res.IsError || session == "" {
		t.Fatalf("create_session on A: %s", text(res))
	}
	call := func(ts *testServer, code string) map[string]any {
		t.Helper()
		res, out := ts.tool(t, "run_code", map[string]any{"language": "bash", "session_id": session, "code": code})
		if res.IsError {
			t.Fatalf("run_code %q: %v %s", code, out, text(res))
		}
		return out
	}
	call(onA, "echo kept > state.txt; x=1")

	// B has never seen this client: no initialize there, only its ID.
	tr, err := transport.NewStreamableHTTP(urlB, transport.WithSession(id))
	if err != nil {
		t.Fatal(err)
	}
	onB := &testServer{client: client.NewClient(tr, client.WithSession())}
	if err := onB.client.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer onB.client.Close()
	if out := call(onB, "cat state.txt; echo x=${x:-unset}"); out["stdout"] != "kept\nx=unset\n" || out["state_lost"] != true {
		t.Errorf("the session's next call, on B: %v; want the file and a new interpreter (state_lost)", out)
	}

	if err := a.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = a.Wait()
	if out := call(onB, "echo after A; cat state.txt"); out["stdout"] != "after A\nkept\n" {
		t.Errorf("on B after A was killed: %v", out)
	}
	if res, _ := onB.tool(t, "close_session", map[string]any{"session_id": session}); res.IsError {
		t.Fatalf("close_session on B: %s", text(res))
	}
	deadline := time.Now().Add(time.Minute)
	for {
		claims := k.count("extensions.agents.x-k8s.io", "sandboxclaims")
		if claims == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d claims left after close_session on B", claims)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
