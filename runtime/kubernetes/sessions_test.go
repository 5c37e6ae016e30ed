package kubernetes_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/safe-run/safe-run/runtime/engine"
	"github.com/safe-run/safe-run/runtime/kubernetes"
	"github.com/safe-run/safe-run/runtime/kubernetes/kubetest"
	"github.com/safe-run/safe-run/sandbox"
)

// Sessions across servers: each "server" here is an engine over a backend
// of its own (its own client, no memory shared with the other), in one
// namespace, as two replicas of the Deployment are. kwok's exec runs every
// agent on this host (see integration_test.go), so the servers' agents
// share one workspace directory, as agents exec'd into one Pod share its
// emptyDir. The cells are harmless: echo, cat, sleep.

// secondServer is another server's backend in the namespace of b, whose
// agents work in workdir.
func secondServer(t *testing.T, c *kubetest.Cluster, b *kubernetes.Backend, owner, workdir string) *kubernetes.Backend {
	t.Helper()
	other, err := kubernetes.New(kubernetes.Config{RESTConfig: c.RESTConfig, Namespace: b.Namespace(), Image: "safe-run.invalid/sandbox:test",
		Agent: agentBinary(t), Workdir: workdir, Owner: owner, ReapIdle: -1, StartTimeout: 60 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := other.Wait(ctx); err != nil {
			t.Errorf("sandboxes left on server %s: %d", owner, other.Live())
		}
	})
	return other
}

func sessionEngine(t *testing.T, b *kubernetes.Backend, sessions engine.SessionConfig) *engine.Engine {
	t.Helper()
	e, err := engine.New(engine.Config{Backend: b, Sessions: sessions})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

// sharedWorkdir is the workspace of two servers' agents (setUp gives
// each backend one of its own): the Pod's emptyDir, on kwok.
func sharedWorkdir(t *testing.T) string { return t.TempDir() }

func run(t *testing.T, e *engine.Engine, ctx context.Context, id, code string) sandbox.Result {
	t.Helper()
	res, err := e.RunInSession(ctx, id, sandbox.Job{Language: "bash", Code: code})
	if err != nil {
		t.Fatalf("%q: %v", code, err)
	}
	if res.Status != sandbox.StatusOK {
		t.Fatalf("%q: %+v", code, res)
	}
	return res
}

// leftOf lists what is left in ns of session claims, Sandboxes and
// sandbox Pods.
func leftOf(t *testing.T, dyn dynamic.Interface, c *kubetest.Cluster, ns string) []string {
	t.Helper()
	var left []string
	for _, res := range []schema.GroupVersionResource{
		{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxclaims"},
		{Group: "agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxes"},
	} {
		list, err := dyn.Resource(res).Namespace(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, u := range list.Items {
			left = append(left, res.Resource+"/"+u.GetName())
		}
	}
	pods, err := c.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: kubernetes.LabelRole + "=" + kubernetes.RoleSandbox})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		left = append(left, "pods/"+p.Name)
	}
	return left
}

// waitNothingLeft waits until no claim, Sandbox or sandbox Pod is left in ns.
func waitNothingLeft(t *testing.T, dyn dynamic.Interface, c *kubetest.Cluster, ns string) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		left := leftOf(t, dyn, c, ns)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("left after the session's end: %v", left)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// TestSessionAcrossServers: a session created through server A is served
// by server B, which attaches a new agent to its Pod (files kept, the
// interpreter new, and the result says so); A, called again, sees that B
// holds the session now and attaches anew; another client cannot reach it
// through B; B closes it and nothing is left, and A then has no session.
func TestSessionAcrossServers(t *testing.T) {
	c, a, dyn := setUp(t, kubernetes.Config{Owner: "server-a"})
	workdir := sharedWorkdir(t)
	a = secondServer(t, c, a, "server-a", workdir) // setUp's own workdir is its alone
	b := secondServer(t, c, a, "server-b", workdir)
	ea := sessionEngine(t, a, engine.SessionConfig{})
	eb := sessionEngine(t, b, engine.SessionConfig{})
	ctx := sandbox.WithOwner(context.Background(), "client-1")

	info, err := ea.CreateSession(ctx, sandbox.SessionSpec{Owner: "client-1", Language: "bash"})
	if err != nil {
		t.Fatal(err)
	}
	first := run(t, ea, ctx, info.ID, "echo kept > note.txt; x=41")
	rec, err := a.FindSession(ctx, info.ID)
	if err != nil || rec.Owner != "client-1" || rec.Language != "bash" || rec.SandboxID != first.SandboxID {
		t.Fatalf("the session's record on its claim: %+v, %v", rec, err)
	}

	if _, err := eb.RunInSession(sandbox.WithOwner(context.Background(), "client-2"), info.ID, sandbox.Job{Code: "true"}); !errors.Is(err, sandbox.ErrNoSession) {
		t.Errorf("another client's call through B: %v, want ErrNoSession", err)
	}
	second := run(t, eb, ctx, info.ID, `cat note.txt; echo "x=${x:-unset}"; x=1`)
	if second.Stdout != "kept\nx=unset\n" || !second.StateLost || !strings.Contains(second.Message, "attached") {
		t.Errorf("B's first call: stdout %q, state_lost %v, message %q; want the file, no variable, and state_lost said", second.Stdout, second.StateLost, second.Message)
	}
	if second.SandboxID != first.SandboxID {
		t.Errorf("B served the session in sandbox %s, A in %s: want the same claim", second.SandboxID, first.SandboxID)
	}
	if third := run(t, eb, ctx, info.ID, `echo "x=$x"`); third.Stdout != "x=1\n" || third.StateLost {
		t.Errorf("B's second call: %+v; want its own interpreter kept", third)
	}
	files, err := eb.ListFiles(ctx, info.ID, ".")
	if err != nil || !slices.ContainsFunc(files, func(f sandbox.OutputFile) bool { return f.Path == "note.txt" }) {
		t.Errorf("B lists %+v, %v", files, err)
	}

	// A still holds its old agent; B is the holder now.
	back := run(t, ea, ctx, info.ID, `cat note.txt; echo "x=${x:-unset}"`)
	if back.Stdout != "kept\nx=unset\n" || !back.StateLost {
		t.Errorf("A after B: %+v; want A to attach anew (state lost)", back)
	}
	if n := len(ea.ListSessions()); n != 1 {
		t.Errorf("A lists %d sessions, want 1", n)
	}

	if err := eb.CloseSession(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
	waitNothingLeft(t, dyn, c, a.Namespace())
	if _, err := ea.RunInSession(ctx, info.ID, sandbox.Job{Code: "true"}); !errors.Is(err, sandbox.ErrNoSession) {
		t.Errorf("A's call after B closed the session: %v, want ErrNoSession", err)
	}
	if n := len(ea.ListSessions()); n != 0 {
		t.Errorf("A still lists %d sessions", n)
	}
}

// TestSessionServerKilled: server A, a process of its own, is killed
// (SIGKILL) in the middle of a call; server B attaches to the session and
// serves it, with the file A's first call wrote; closing it from B leaves
// nothing. A's shutdown never ran: no claim was deleted by it.
func TestSessionServerKilled(t *testing.T) {
	c, b, dyn := setUp(t, kubernetes.Config{Owner: "server-b"})
	workdir := sharedWorkdir(t)
	b = secondServer(t, c, b, "server-b", workdir)
	eb := sessionEngine(t, b, engine.SessionConfig{})

	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperSessionServer$", "-test.v")
	cmd.Env = append(os.Environ(), "SAFE_RUN_TEST_SESSION_SERVER=1", "KUBECONFIG="+c.Kubeconfig,
		"SAFE_RUN_TEST_NAMESPACE="+b.Namespace(), "SAFE_RUN_TEST_WORKDIR="+workdir, "SAFE_RUN_AGENT="+agentBinary(t))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	kill := func() { once.Do(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }) }
	defer kill()
	lines := bufio.NewScanner(out)
	var id string
	for lines.Scan() {
		line := lines.Text()
		if rest, ok := strings.CutPrefix(line, "SESSION "); ok {
			id = rest
		}
		if line == "CALLING" {
			break
		}
	}
	if id == "" {
		t.Fatalf("the server process never got to its second call: %v", lines.Err())
	}
	time.Sleep(time.Second) // the call's sleep runs
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	kill()

	ctx := sandbox.WithOwner(context.Background(), "client-1")
	res := run(t, eb, ctx, id, "cat kept.txt")
	if res.Stdout != "kept\n" || !res.StateLost {
		t.Errorf("after the server died: %+v; want the file it wrote, and state_lost", res)
	}
	if err := eb.CloseSession(ctx, id); err != nil {
		t.Fatal(err)
	}
	waitNothingLeft(t, dyn, c, b.Namespace())
}

// TestHelperSessionServer is the server process TestSessionServerKilled
// kills: it creates a session, writes a file in it, says so, and starts a
// call that the kill interrupts.
func TestHelperSessionServer(t *testing.T) {
	if os.Getenv("SAFE_RUN_TEST_SESSION_SERVER") != "1" {
		t.Skip("run by TestSessionServerKilled")
	}
	b, err := kubernetes.New(kubernetes.Config{Kubeconfig: os.Getenv("KUBECONFIG"), Namespace: os.Getenv("SAFE_RUN_TEST_NAMESPACE"),
		Image: "safe-run.invalid/sandbox:test", Agent: os.Getenv("SAFE_RUN_AGENT"), Workdir: os.Getenv("SAFE_RUN_TEST_WORKDIR"),
		Owner: "server-a", ReapIdle: -1, StartTimeout: 60 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(engine.Config{Backend: b})
	if err != nil {
		t.Fatal(err)
	}
	ctx := sandbox.WithOwner(context.Background(), "client-1")
	info, err := e.CreateSession(ctx, sandbox.SessionSpec{Owner: "client-1", Language: "bash"})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := e.RunInSession(ctx, info.ID, sandbox.Job{Code: "echo kept > kept.txt"}); err != nil || res.Status != sandbox.StatusOK {
		t.Fatalf("%+v, %v", res, err)
	}
	fmt.Printf("SESSION %s\nCALLING\n", info.ID)
	_, _ = e.RunInSession(ctx, info.ID, sandbox.Job{Code: "sleep 20"})
	t.Fatal("the call ended before the process was killed")
}

// TestSessionExpiresFromAnotherServer: a call on server A that outlasts
// the idle timeout keeps the session alive for server B too (A refreshes
// its last use); A shutting down lets go of the session rather than end
// it; B, which never served it, ends it once its claim's last use is
// older than the idle timeout, and reports the end; nothing is left.
func TestSessionExpiresFromAnotherServer(t *testing.T) {
	c, a, dyn := setUp(t, kubernetes.Config{Owner: "server-a"})
	ctx := sandbox.WithOwner(context.Background(), "client-1")
	idle := 8 * time.Second // both servers', as replicas of one Deployment have
	ea := sessionEngine(t, a, engine.SessionConfig{IdleTimeout: idle})
	info, err := ea.CreateSession(ctx, sandbox.SessionSpec{Owner: "client-1", Language: "bash"})
	if err != nil {
		t.Fatal(err)
	}
	b := secondServer(t, c, a, "server-b", t.TempDir())
	ended := make(chan string, 4)
	sessionEngine(t, b, engine.SessionConfig{IdleTimeout: idle, SweepStore: true, OnEnd: func(info sandbox.SessionInfo, why string) {
		ended <- info.ID + ": " + why
	}})
	if res := run(t, ea, ctx, info.ID, "sleep 10; echo done"); res.Stdout != "done\n" {
		t.Errorf("the long call: %+v", res)
	}
	select {
	case end := <-ended:
		t.Fatalf("B ended the session (%s) while A used it", end)
	default:
	}
	ea.Close()
	if _, err := b.FindSession(ctx, info.ID); err != nil {
		t.Fatalf("A's shutdown ended the session: %v", err)
	}
	select {
	case end := <-ended:
		if end != info.ID+": idle timeout" {
			t.Errorf("B reported %q", end)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("B did not end the idle session")
	}
	waitNothingLeft(t, dyn, c, a.Namespace())
}
