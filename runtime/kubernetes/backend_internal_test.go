package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"
	sandboxv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/safe-run/safe-run/agent"
	"github.com/safe-run/safe-run/runtime/engine"
	"github.com/safe-run/safe-run/sandbox"
)

// These tests run the backend against client-go's fake dynamic client,
// playing agent-sandbox's and the kubelet's part by hand: binding the
// claim to a Sandbox and giving its Pod the state under test. The agent's
// exec is a fake stream.

const testNS = "sr-test"

func newFake(t *testing.T, objs ...runtime.Object) *fake.FakeDynamicClient {
	t.Helper()
	lists := map[schema.GroupVersionResource]string{
		claimsResource: "SandboxClaimList", templatesResource: "SandboxTemplateList", poolsResource: "SandboxWarmPoolList",
		sandboxesResource: "SandboxList", podsResource: "PodList", eventsResource: "EventList", policiesResource: "NetworkPolicyList",
	}
	return fake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), lists, objs...)
}

// fakeExec is an agent's exec: it runs fn with the stream's ends.
type fakeExec func(o remotecommand.StreamOptions) error

func (f fakeExec) Stream(o remotecommand.StreamOptions) error { return f(o) }
func (f fakeExec) StreamWithContext(ctx context.Context, o remotecommand.StreamOptions) error {
	done := make(chan error, 1)
	go func() { done <- f(o) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// readyThen is an agent that sends Ready, echoes nothing and ends with err.
func readyThen(err error) fakeExec {
	return func(o remotecommand.StreamOptions) error {
		data, _ := json.Marshal(agent.Event{Ready: &agent.Ready{Version: agent.ProtocolVersion}})
		if _, werr := o.Stdout.Write(append(data, '\n')); werr != nil {
			return werr
		}
		_, _ = io.WriteString(o.Stderr, "agent: bye\n")
		return err
	}
}

func testBackend(t *testing.T, dyn *fake.FakeDynamicClient, ex fakeExec) *Backend {
	t.Helper()
	b, err := newBackend(Config{Namespace: testNS, Image: "img:1", Owner: "server a", StartTimeout: 3 * time.Second, ReapIdle: -1},
		dyn, func(*corev1.Pod, []string) (remotecommand.Executor, error) { return ex, nil })
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func checked(t *testing.T) sandbox.Job {
	t.Helper()
	job, _, err := sandbox.Policy{}.Check(sandbox.Job{Language: "python", Code: "print(1)"})
	if err != nil {
		t.Fatal(err)
	}
	return job
}

func put(t *testing.T, dyn *fake.FakeDynamicClient, res schema.GroupVersionResource, obj any) {
	t.Helper()
	u, err := toUnstructured(obj)
	if err != nil {
		t.Fatal(err)
	}
	r := dyn.Resource(res).Namespace(testNS)
	if _, err := r.Create(context.Background(), u, metav1.CreateOptions{}); err != nil {
		if _, err := r.Update(context.Background(), u, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// bind plays agent-sandbox and the kubelet: claim gets a Sandbox of the
// same name, whose Pod has status (and sandbox conditions, if any).
func bind(t *testing.T, dyn *fake.FakeDynamicClient, claimName string, status corev1.PodStatus, conds ...metav1.Condition) {
	t.Helper()
	var claim extv1.SandboxClaim
	u, err := dyn.Resource(claimsResource).Namespace(testNS).Get(context.Background(), claimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := fromUnstructured(u.Object, &claim); err != nil {
		t.Fatal(err)
	}
	claim.Status.SandboxStatus.Name = claimName
	put(t, dyn, claimsResource, &claim)
	sb := &sandboxv1.Sandbox{TypeMeta: metav1.TypeMeta{APIVersion: "agents.x-k8s.io/v1beta1", Kind: "Sandbox"},
		ObjectMeta: metav1.ObjectMeta{Name: claimName, Namespace: testNS, Annotations: map[string]string{sandboxv1.SandboxPodNameAnnotation: claimName}},
		Status:     sandboxv1.SandboxStatus{Conditions: conds}}
	put(t, dyn, sandboxesResource, sb)
	if len(conds) > 0 {
		return // agent-sandbox could not make the Pod
	}
	pod := &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: claimName, Namespace: testNS}, Status: status}
	put(t, dyn, podsResource, pod)
}

func running() corev1.PodStatus {
	return corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{
		Name: ContainerName, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}}
}

func exists(dyn *fake.FakeDynamicClient, res schema.GroupVersionResource, name string) bool {
	_, err := dyn.Resource(res).Namespace(testNS).Get(context.Background(), name, metav1.GetOptions{})
	return err == nil
}

func TestStartClaimsExecsAndDestroys(t *testing.T) {
	dyn := newFake(t)
	b := testBackend(t, dyn, readyThen(nil))
	if !exists(dyn, policiesResource, DenyAllPolicyName) {
		t.Error("New made no deny-all NetworkPolicy")
	}
	sb, err := b.Start(engine.StartSpec{Job: checked(t)})
	if err != nil {
		t.Fatal(err)
	}
	var claim extv1.SandboxClaim
	if err := b.get(context.Background(), claimsResource, sb.ID(), &claim); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{LabelManagedBy: ManagedBy, LabelLanguage: "python", LabelOwner: "server-a", LabelKind: KindRun} {
		if claim.Labels[k] != want {
			t.Errorf("claim label %s = %q, want %q", k, claim.Labels[k], want)
		}
	}
	if !exists(dyn, poolsResource, claim.Spec.WarmPoolRef.Name) || !exists(dyn, templatesResource, claim.Spec.WarmPoolRef.Name) {
		t.Errorf("the claim's pool %s or its template was not created", claim.Spec.WarmPoolRef.Name)
	}
	bind(t, dyn, sb.ID(), running())
	data, err := io.ReadAll(sb.Events())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `"ready"`) {
		t.Errorf("events = %q, want the agent's Ready", data)
	}
	<-sb.Exited()
	if got := sb.ExitReport(); got != "agent exit status 0: agent: bye" {
		t.Errorf("ExitReport = %q", got)
	}
	if b.Live() != 1 {
		t.Errorf("Live = %d before Destroy, want 1", b.Live())
	}
	if err := sb.Destroy(); err != nil {
		t.Fatal(err)
	}
	if exists(dyn, claimsResource, sb.ID()) || exists(dyn, sandboxesResource, sb.ID()) {
		t.Error("Destroy left the claim or its sandbox")
	}
	if err := b.Wait(context.Background()); err != nil || b.Live() != 0 {
		t.Errorf("Wait = %v, Live = %d after Destroy", err, b.Live())
	}
}

// TestPodStatusMapping checks that a Pod that will not run ends the
// sandbox at once with the API's reason, as ErrPod, class unavailable.
func TestPodStatusMapping(t *testing.T) {
	waiting := func(reason, msg string) corev1.PodStatus {
		return corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{{Name: ContainerName,
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}}}}}
	}
	for _, tt := range []struct {
		name   string
		status corev1.PodStatus
		conds  []metav1.Condition
		want   string
	}{
		{"image pull", waiting("ImagePullBackOff", `Back-off pulling image "img:1"`), nil, `ImagePullBackOff: Back-off pulling image "img:1"`},
		{"bad image", waiting("ErrImagePull", "not found"), nil, "ErrImagePull: not found"},
		{"unschedulable", corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled,
			Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable, Message: "0/3 nodes are available: 3 Insufficient memory."}}},
			nil, "unschedulable: 0/3 nodes are available: 3 Insufficient memory."},
		{"missing runtime class", corev1.PodStatus{}, []metav1.Condition{{Type: "Ready", Status: metav1.ConditionFalse, Reason: "ReconcilerError",
			Message: `Error seen: pods "x" is forbidden: pod rejected: RuntimeClass "gvisor" not found`}},
			`RuntimeClass "gvisor" not found`},
		{"oom before the run", corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{{Name: ContainerName,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "OOMKilled", ExitCode: 137}}}}}, nil, "OOMKilled, exit code 137"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dyn := newFake(t)
			b := testBackend(t, dyn, readyThen(nil))
			sb, err := b.Start(engine.StartSpec{Job: checked(t)})
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Destroy()
			bind(t, dyn, sb.ID(), tt.status, tt.conds...)
			select {
			case <-sb.Exited():
			case <-time.After(2 * time.Second):
				t.Fatal("the sandbox did not end")
			}
			if got := sb.ExitReport(); !strings.Contains(got, tt.want) || !strings.HasPrefix(got, ErrPod.Error()) {
				t.Errorf("ExitReport = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestEventReason checks the reasons only events give, such as a node
// without gVisor's handler.
func TestEventReason(t *testing.T) {
	dyn := newFake(t)
	b := testBackend(t, dyn, readyThen(nil))
	sb, err := b.Start(engine.StartSpec{Job: checked(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy()
	bind(t, dyn, sb.ID(), corev1.PodStatus{Phase: corev1.PodPending})
	put(t, dyn, eventsResource, &corev1.Event{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Event"},
		ObjectMeta: metav1.ObjectMeta{Name: "ev1", Namespace: testNS}, Type: corev1.EventTypeWarning, Reason: "FailedCreatePodSandBox",
		Message:        `no runtime for "runsc" is configured`,
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Name: sb.ID(), Namespace: testNS}})
	<-sb.Exited()
	if got := sb.ExitReport(); !strings.Contains(got, `FailedCreatePodSandBox: no runtime for "runsc" is configured`) {
		t.Errorf("ExitReport = %q", got)
	}
}

func TestOOMKilledUsage(t *testing.T) {
	dyn := newFake(t)
	b := testBackend(t, dyn, readyThen(errors.New("error reading from error stream: EOF")))
	sb, err := b.Start(engine.StartSpec{Job: checked(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy()
	bind(t, dyn, sb.ID(), running())
	_, _ = io.ReadAll(sb.Events())
	<-sb.Exited()
	killed := corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{{Name: ContainerName,
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "OOMKilled", ExitCode: 137}}}}}
	put(t, dyn, podsResource, &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: sb.ID(), Namespace: testNS}, Status: killed})
	if u := sb.Usage(); u.OOMKills != 1 {
		t.Errorf("Usage = %+v, want one OOM kill", u)
	}
}

// TestExecExit maps how an exec stream ends to the agent's exit.
func TestExecExit(t *testing.T) {
	for _, tt := range []struct {
		name   string
		err    error
		code   int
		exited bool
		report string
	}{
		{"clean", nil, 0, true, "agent exit status 0: agent: bye"},
		{"kubelet's NonZeroExitCode", utilexec.CodeExitError{Err: errors.New("command terminated with exit code 3"), Code: 3}, 3, true, "agent exit status 3: agent: bye"},
		{"kwok's internal error", errors.New("Internal error occurred: error executing command in container: exit status 2"), 2, true, "agent exit status 2: agent: bye"},
		{"broken stream", errors.New("error reading from error stream: connection reset"), -1, false, "agent exec: error reading from error stream: connection reset: agent: bye"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if code, exited := ExecExit(tt.err); code != tt.code || exited != tt.exited {
				t.Errorf("ExecExit = %d, %v; want %d, %v", code, exited, tt.code, tt.exited)
			}
			dyn := newFake(t)
			b := testBackend(t, dyn, readyThen(tt.err))
			sb, err := b.Start(engine.StartSpec{Job: checked(t)})
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Destroy()
			bind(t, dyn, sb.ID(), running())
			_, _ = io.ReadAll(sb.Events())
			<-sb.Exited()
			if got := sb.ExitReport(); got != tt.report {
				t.Errorf("ExitReport = %q, want %q", got, tt.report)
			}
		})
	}
}

// TestKillDeletesTheClaim: cancelling a run kills its sandbox, and that
// deletes its claim even before its Pod runs.
func TestKillDeletesTheClaim(t *testing.T) {
	dyn := newFake(t)
	b := testBackend(t, dyn, readyThen(nil))
	sb, err := b.Start(engine.StartSpec{Job: checked(t)})
	if err != nil {
		t.Fatal(err)
	}
	sb.Kill()
	if exists(dyn, claimsResource, sb.ID()) {
		t.Error("Kill left the claim")
	}
	if err := sb.Destroy(); err != nil {
		t.Fatal(err)
	}
}

func TestNetworkRefused(t *testing.T) {
	b := testBackend(t, newFake(t), readyThen(nil))
	job := checked(t)
	job.Network = []string{"pypi"}
	if _, err := b.Start(engine.StartSpec{Job: job}); err == nil || !errors.Is(err, sandbox.ErrUnavailable) {
		t.Errorf("Start with a network = %v, want an error of class unavailable", err)
	}
	if b.Live() != 0 {
		t.Errorf("Live = %d", b.Live())
	}
}

func TestSessionClaimAndLookup(t *testing.T) {
	dyn := newFake(t)
	b := testBackend(t, dyn, readyThen(nil))
	sb, err := b.Start(engine.StartSpec{Job: checked(t), KeepAlive: true})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy()
	info, err := b.Lookup(context.Background(), sb.ID())
	if err != nil {
		t.Fatal(err)
	}
	if info.Kind != KindSession || info.Owner != "server-a" || info.Language != "python" || info.Created.IsZero() {
		t.Errorf("Lookup = %+v", info)
	}
	list, err := b.Claims(context.Background(), KindSession)
	if err != nil || len(list) != 1 || list[0].Name != sb.ID() {
		t.Errorf("Claims(session) = %+v, %v", list, err)
	}
	if list, _ := b.Claims(context.Background(), KindRun); len(list) != 0 {
		t.Errorf("Claims(run) = %+v, want none", list)
	}
}

// TestReap removes what a dead server left, and nothing else.
func TestReap(t *testing.T) {
	old := time.Now().Add(-3 * time.Hour)
	claim := func(name string, used time.Time) *unstructured.Unstructured {
		c := Claim(&extv1.SandboxWarmPool{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: testNS}},
			ClaimSpec{Name: name, Language: "python", Owner: "dead", Created: used, Lifetime: time.Hour})
		c.Status.SandboxStatus.Name = name
		u, _ := toUnstructured(c)
		return u
	}
	pod := func(name, owner string) *unstructured.Unstructured {
		p := &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}, ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS,
			Labels: podLabels("python"), CreationTimestamp: metav1.NewTime(old),
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "agents.x-k8s.io/v1beta1", Kind: "Sandbox", Name: owner, UID: "u"}}}}
		u, _ := toUnstructured(p)
		return u
	}
	sbx := func(name string) *unstructured.Unstructured {
		u, _ := toUnstructured(&sandboxv1.Sandbox{TypeMeta: metav1.TypeMeta{APIVersion: "agents.x-k8s.io/v1beta1", Kind: "Sandbox"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS}})
		return u
	}
	dyn := newFake(t)
	// Created through the resource, not as the fake's seed objects: the
	// fake guesses the resource of kind Sandbox as "sandboxs".
	for _, o := range []struct {
		res schema.GroupVersionResource
		obj *unstructured.Unstructured
	}{{claimsResource, claim("stale", old)}, {claimsResource, claim("fresh", time.Now())}, {sandboxesResource, sbx("stale")},
		{sandboxesResource, sbx("warm")}, {podsResource, pod("orphan", "gone")}, {podsResource, pod("warm", "warm")}} {
		put(t, dyn, o.res, o.obj)
	}
	b := testBackend(t, dyn, readyThen(nil))
	removed, err := b.Reap(context.Background(), 2*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"sandboxclaim/stale", "sandbox/stale", "pod/orphan"}
	if strings.Join(removed, " ") != strings.Join(want, " ") {
		t.Errorf("Reap removed %v, want %v", removed, want)
	}
	for _, keep := range []struct {
		res  schema.GroupVersionResource
		name string
	}{{claimsResource, "fresh"}, {sandboxesResource, "warm"}, {podsResource, "warm"}} {
		if !exists(dyn, keep.res, keep.name) {
			t.Errorf("Reap removed %s %s", keep.res.Resource, keep.name)
		}
	}
}

// TestSessionStore: a session's claim carries its record (the ID as a
// label, the state as JSON, the holder); FindSession reads it back,
// AttachSession names a new holder, Detach leaves the claim, and
// EndSession deletes it once.
func TestSessionStore(t *testing.T) {
	dyn := newFake(t)
	b := testBackend(t, dyn, readyThen(nil))
	ctx := context.Background()
	job := checked(t)
	rec := engine.SessionRecord{ID: "session-0123", Owner: "client-1", Language: job.Language, Limits: job.Limits,
		Created: time.Date(2026, 12, 4, 20, 0, 0, 123, time.UTC)}
	sb, err := b.Start(engine.StartSpec{Job: job, KeepAlive: true, Session: &rec})
	if err != nil {
		t.Fatal(err)
	}
	got, err := b.FindSession(ctx, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	first := sb.(engine.StoredSandbox).Holder()
	if got.ID != rec.ID || got.Owner != rec.Owner || got.Limits != rec.Limits || !got.Created.Equal(rec.Created) ||
		got.SandboxID != sb.ID() || got.Holder != first || !strings.HasPrefix(first, "server-a/") {
		t.Errorf("FindSession = %+v, want %+v on claim %s held by %s", got, rec, sb.ID(), first)
	}
	for _, id := range []string{"session-other", "not a label value!"} {
		if _, err := b.FindSession(ctx, id); !errors.Is(err, sandbox.ErrNoSession) {
			t.Errorf("FindSession(%q) = %v, want ErrNoSession", id, err)
		}
	}
	if recs, err := b.StoredSessions(ctx); err != nil || len(recs) != 1 || recs[0].ID != rec.ID {
		t.Errorf("StoredSessions = %+v, %v", recs, err)
	}

	bind(t, dyn, sb.ID(), running())
	again, err := b.AttachSession(engine.StartSpec{Job: job, KeepAlive: true, Session: &got})
	if err != nil {
		t.Fatal(err)
	}
	if now, _ := b.FindSession(ctx, rec.ID); now.Holder != again.(engine.StoredSandbox).Holder() || now.Holder == first {
		t.Errorf("after the attach the holder is %q (first %q)", now.Holder, first)
	}
	if err := sb.(engine.StoredSandbox).Detach(); err != nil {
		t.Fatal(err)
	}
	if !exists(dyn, claimsResource, sb.ID()) {
		t.Fatal("Detach deleted the session's claim")
	}
	if ended, err := b.EndSession(ctx, rec.ID); !ended || err != nil {
		t.Errorf("EndSession = %v, %v", ended, err)
	}
	if exists(dyn, claimsResource, sb.ID()) {
		t.Error("EndSession left the claim")
	}
	if ended, err := b.EndSession(ctx, rec.ID); ended || err != nil {
		t.Errorf("EndSession again = %v, %v; want nothing ended", ended, err)
	}
	if err := again.Destroy(); err != nil {
		t.Fatal(err)
	}
	if b.Live() != 0 {
		t.Errorf("Live = %d", b.Live())
	}
}
