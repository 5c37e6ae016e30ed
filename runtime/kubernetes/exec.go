package kubernetes

import (
	"errors"
	"fmt"
	"net/url"
	"path"
	"regexp"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"
)

// executorFunc opens the exec of command in a Pod's sandbox container.
type executorFunc func(pod *corev1.Pod, command []string) (remotecommand.Executor, error)

// restExecutor execs through the API server: WebSocket, falling back to
// SPDY where the server (or a proxy) does not upgrade to it.
func restExecutor(rc *rest.Config) executorFunc {
	return func(pod *corev1.Pod, command []string) (remotecommand.Executor, error) {
		u, err := execURL(rc, pod, command)
		if err != nil {
			return nil, err
		}
		ws, err := remotecommand.NewWebSocketExecutor(rc, "GET", u.String())
		if err != nil {
			return nil, fmt.Errorf("exec in %s: %w", pod.Name, err)
		}
		spdy, err := remotecommand.NewSPDYExecutor(rc, "POST", u)
		if err != nil {
			return nil, fmt.Errorf("exec in %s: %w", pod.Name, err)
		}
		return remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
			return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
		})
	}
}

// execURL is the pods/exec URL of command in pod's sandbox container,
// with stdin and stdout (the protocol) and stderr (the agent's own
// messages) and no TTY.
func execURL(rc *rest.Config, pod *corev1.Pod, command []string) (*url.URL, error) {
	base, _, err := rest.DefaultServerUrlFor(rc)
	if err != nil {
		return nil, fmt.Errorf("exec in %s: %w", pod.Name, err)
	}
	u := *base
	u.Path = path.Join(u.Path, "/api/v1/namespaces", pod.Namespace, "pods", pod.Name, "exec")
	q := url.Values{}
	for _, c := range command {
		q.Add("command", c)
	}
	q.Set("container", ContainerName)
	q.Set("stdin", "true")
	q.Set("stdout", "true")
	q.Set("stderr", "true")
	u.RawQuery = q.Encode()
	return &u, nil
}

// exitStatusText finds the exit status in an exec error whose status is
// only in its text: kwok's exec (and some runtimes) report a failed
// command as "Internal error occurred: ... exit status N".
var exitStatusText = regexp.MustCompile(`exit (?:status|code) (\d+)`)

// ExecExit reads how an exec ended: the command's exit code, and whether
// the error is that exit rather than a broken stream.
func ExecExit(err error) (code int, exited bool) {
	if err == nil {
		return 0, true
	}
	var e utilexec.ExitError
	if errors.As(err, &e) && e.Exited() {
		return e.ExitStatus(), true
	}
	if m := exitStatusText.FindStringSubmatch(err.Error()); m != nil {
		n, _ := strconv.Atoi(m[1])
		return n, true
	}
	return -1, false
}

// exitReport says how the agent's exec ended, for an error message.
func exitReport(err error, stderr string) string {
	var s string
	if code, exited := ExecExit(err); exited {
		s = "agent exit status " + strconv.Itoa(code)
	} else {
		s = "agent exec: " + err.Error()
	}
	if line := lastLine(stderr); line != "" {
		s += ": " + line
	}
	return s
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

func fromUnstructured(m map[string]any, out any) error {
	return runtime.DefaultUnstructuredConverter.FromUnstructured(m, out)
}
