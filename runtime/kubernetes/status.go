package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sandboxv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/safe-run/safe-run/sandbox"
)

// ErrPod marks a sandbox whose Pod cannot run, with the reason the API
// gives (class sandbox.ErrUnavailable): unschedulable, its image not
// pulled, its RuntimeClass missing.
var ErrPod = errors.New("the sandbox's Pod cannot run")

// podError is the failure of a claimed sandbox's Pod.
func podError(format string, args ...any) error {
	return sandbox.WithClass(fmt.Errorf("%w: %s", ErrPod, fmt.Sprintf(format, args...)), sandbox.ErrUnavailable)
}

// waitingFailures are the container waiting reasons no wait will mend.
var waitingFailures = map[string]bool{
	"ErrImagePull": true, "ImagePullBackOff": true, "InvalidImageName": true, "ErrImageNeverPull": true,
	"CreateContainerConfigError": true, "CreateContainerError": true, "RunContainerError": true,
}

// warningFailures are the Warning event reasons that say a Pod will not
// run: it cannot be scheduled, created (a RuntimeClass refused) or given
// its sandbox by the node's runtime (a RuntimeClass whose handler the node
// lacks).
var warningFailures = map[string]bool{
	"FailedScheduling": true, "FailedCreate": true, "FailedCreatePodSandBox": true,
}

// podFailure says why pod will not run, or nil if it may yet.
func podFailure(pod *corev1.Pod) error {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return podError("unschedulable: %s", c.Message)
		}
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil && waitingFailures[w.Reason] {
			return podError("%s: %s", w.Reason, w.Message)
		}
		if t := cs.State.Terminated; t != nil {
			return podError("its container ended before the run (%s, exit code %d): %s", t.Reason, t.ExitCode, t.Message)
		}
	}
	if pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded {
		return podError("it ended before the run (%s): %s %s", pod.Status.Phase, pod.Status.Reason, pod.Status.Message)
	}
	return nil
}

// podRunning says the Pod's container runs, so the agent can be exec'd.
func podRunning(pod *corev1.Pod) bool {
	if pod.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name == ContainerName && cs.State.Running != nil {
			return true
		}
	}
	return false
}

// sandboxFailure says why agent-sandbox cannot make the sandbox's Pod, or
// nil: the API server refusing the Pod (a RuntimeClass that does not
// exist, a policy) shows only in its Ready condition.
func sandboxFailure(sb *sandboxv1.Sandbox) error {
	for _, c := range sb.Status.Conditions {
		if c.Type == string(sandboxv1.SandboxConditionReady) && c.Status == metav1.ConditionFalse &&
			c.Reason == "ReconcilerError" && (strings.Contains(c.Message, "RuntimeClass") || strings.Contains(c.Message, "forbidden")) {
			return podError("%s", strings.TrimPrefix(c.Message, "Error seen: "))
		}
	}
	return nil
}

// eventFailure is the first Warning event about one of names that says
// its Pod will not run, or nil.
func eventFailure(events []corev1.Event, names ...string) error {
	for _, ev := range events {
		if ev.Type != corev1.EventTypeWarning || !warningFailures[ev.Reason] {
			continue
		}
		for _, n := range names {
			if n != "" && ev.InvolvedObject.Name == n {
				return podError("%s: %s", ev.Reason, ev.Message)
			}
		}
	}
	return nil
}

// OOMKilled says the Pod's container was killed for its memory.
func OOMKilled(pod *corev1.Pod) bool {
	for _, cs := range pod.Status.ContainerStatuses {
		for _, st := range []corev1.ContainerState{cs.State, cs.LastTerminationState} {
			if st.Terminated != nil && st.Terminated.Reason == "OOMKilled" {
				return true
			}
		}
	}
	return false
}

// awaitPod waits until claim has a sandbox whose Pod runs, and returns the
// Pod; or returns why not, at once for a failure no wait will mend, else
// after the start timeout.
func (b *Backend) awaitPod(ctx context.Context, claimName string) (*corev1.Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.StartTimeout)
	defer cancel()
	var (
		last    string // the latest state seen, for the timeout's message
		delay   = 10 * time.Millisecond
		eventAt time.Time
	)
	for {
		pod, state, err := b.podOf(ctx, claimName)
		if err != nil {
			return nil, err
		}
		if pod != nil && podRunning(pod) {
			return pod, nil
		}
		last = state
		if time.Since(eventAt) > time.Second {
			// Events cost a list; they matter only once a Pod is slow.
			eventAt = time.Now()
			if err := b.eventsFailure(ctx, claimName, pod); err != nil {
				return nil, err
			}
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return nil, podError("it did not run within %s (%s)", b.cfg.StartTimeout, last)
			}
			return nil, ctx.Err()
		case <-time.After(delay):
		}
		delay = min(2*delay, 250*time.Millisecond)
	}
}

// podOf reads claim, its sandbox and its Pod as far as they exist. It
// returns the Pod (nil if there is none yet), a line saying how far it
// got, and an error for a failure no wait will mend.
func (b *Backend) podOf(ctx context.Context, claimName string) (*corev1.Pod, string, error) {
	var claim extv1.SandboxClaim
	if err := b.get(ctx, claimsResource, claimName, &claim); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, "", podError("its claim %s was deleted", claimName)
		}
		return nil, "read claim " + claimName + ": " + err.Error(), nil
	}
	sbName := claim.Status.SandboxStatus.Name
	if sbName == "" {
		sbName = claim.Annotations[extv1.AssignedSandboxNameAnnotation]
	}
	if sbName == "" {
		return nil, "claim " + claimName + " has no sandbox yet" + conditionText(claim.Status.Conditions), nil
	}
	var sb sandboxv1.Sandbox
	if err := b.get(ctx, sandboxesResource, sbName, &sb); err != nil {
		return nil, "read sandbox " + sbName + ": " + err.Error(), nil
	}
	if err := sandboxFailure(&sb); err != nil {
		return nil, "", err
	}
	podName := sb.Annotations[sandboxv1.SandboxPodNameAnnotation]
	if podName == "" {
		podName = sbName
	}
	var pod corev1.Pod
	if err := b.get(ctx, podsResource, podName, &pod); err != nil {
		return nil, "sandbox " + sbName + " has no Pod yet" + conditionText(sb.Status.Conditions), nil
	}
	if err := podFailure(&pod); err != nil {
		return &pod, "", err
	}
	return &pod, fmt.Sprintf("Pod %s is %s", pod.Name, pod.Status.Phase), nil
}

// eventsFailure looks for a failure in the Warning events about the claim,
// its sandbox and its Pod.
func (b *Backend) eventsFailure(ctx context.Context, claimName string, pod *corev1.Pod) error {
	list, err := b.dyn.Resource(eventsResource).Namespace(b.cfg.Namespace).List(ctx, metav1.ListOptions{FieldSelector: "type=Warning"})
	if err != nil {
		return nil // events are only a better reason; the wait goes on
	}
	events := make([]corev1.Event, 0, len(list.Items))
	for _, u := range list.Items {
		var ev corev1.Event
		if fromUnstructured(u.Object, &ev) == nil {
			events = append(events, ev)
		}
	}
	podName := ""
	if pod != nil {
		podName = pod.Name
	}
	return eventFailure(events, claimName, podName)
}

func conditionText(conds []metav1.Condition) string {
	for _, c := range conds {
		if c.Type == "Ready" && c.Message != "" {
			return " (" + c.Reason + ": " + c.Message + ")"
		}
	}
	return ""
}
