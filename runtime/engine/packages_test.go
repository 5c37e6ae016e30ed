package engine_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/safe-run/safe-run/agent"
	"github.com/safe-run/safe-run/egress"
	"github.com/safe-run/safe-run/runtime/engine"
	"github.com/safe-run/safe-run/sandbox"
)

// reqLog records every run and cell request; installExit, if set, is how
// each request's install step ends.
type reqLog struct {
	mu          sync.Mutex
	reqs        []agent.Request
	installExit *agent.Exit
}

func (l *reqLog) handler() handler {
	return func(a *fakeAgent, req agent.Request) []agent.Event {
		l.mu.Lock()
		l.reqs = append(l.reqs, req)
		fail := l.installExit
		l.mu.Unlock()
		if len(req.Install) > 0 && fail != nil {
			exit := *fail
			exit.InstallFailed = true
			exit.StderrBytes = int64(len("boom\n"))
			return []agent.Event{{Output: &agent.Output{Stream: agent.Stderr, Data: []byte("boom\n")}}, {Exit: &exit}}
		}
		return printCode(a, req)
	}
}

func (l *reqLog) last() agent.Request {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.reqs[len(l.reqs)-1]
}

func networkPolicy(t *testing.T) sandbox.Policy {
	t.Helper()
	net, err := egress.Parse([]string{"pypi.test", "npm.test"})
	if err != nil {
		t.Fatal(err)
	}
	return sandbox.Policy{Network: net, Packages: []string{"*"},
		PackageIndex: sandbox.PackageIndex{PipIndexURL: "https://pypi.test/simple/", NPMRegistry: "https://npm.test/"}}
}

func envValue(env []string, key string) (string, bool) {
	for _, kv := range slices.Backward(env) {
		if k, v, _ := strings.Cut(kv, "="); k == key {
			return v, true
		}
	}
	return "", false
}

// TestPackagesRequest: a networked job's request carries the installer of
// its language with its packages, its own timeout within the run's, and the
// environment that makes pip and npm work without flags.
func TestPackagesRequest(t *testing.T) {
	tests := []struct {
		name        string
		job         sandbox.Job
		wantInstall []string
		wantEnv     map[string]string // "" value: must be absent
	}{
		{
			name:        "python",
			job:         sandbox.Job{Language: "python", Network: []string{"pypi.test"}, Packages: []string{"tinypkg==1.0.0", "otherpkg"}},
			wantInstall: append(slices.Clone(sandbox.DefaultLanguages[0].Install), "tinypkg==1.0.0", "otherpkg"),
			wantEnv:     map[string]string{"PIP_USER": "1", "PIP_BREAK_SYSTEM_PACKAGES": "1", "PIP_INDEX_URL": "https://pypi.test/simple/", "npm_config_registry": "https://npm.test/", "npm_config_cache": "/tmp/.npm"},
		},
		{
			name:        "node",
			job:         sandbox.Job{Language: "node", Code: "1", Network: []string{"npm.test"}, Packages: []string{"tiny-npm"}},
			wantInstall: append(slices.Clone(sandbox.DefaultLanguages[1].Install), "tiny-npm"),
			wantEnv:     map[string]string{"npm_config_registry": "https://npm.test/"},
		},
		{
			name:    "network, no packages",
			job:     sandbox.Job{Language: "python", Network: []string{"pypi.test"}},
			wantEnv: map[string]string{"PIP_USER": "1"},
		},
		{
			name:    "no network",
			job:     sandbox.Job{Language: "python"},
			wantEnv: map[string]string{"PIP_USER": "", "PIP_INDEX_URL": ""},
		},
		{
			name:    "the job's own env wins",
			job:     sandbox.Job{Language: "python", Network: []string{"pypi.test"}, Env: []string{"PIP_USER=0"}},
			wantEnv: map[string]string{"PIP_USER": "0"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var log reqLog
			e := newEngine(t, newFake(log.handler()), engine.Config{Policy: networkPolicy(t)})
			tt.job.Limits.Timeout = 40 * time.Second
			run(t, e, tt.job)
			req := log.last()
			if !slices.Equal(req.Install, tt.wantInstall) {
				t.Errorf("Install = %q, want %q", req.Install, tt.wantInstall)
			}
			if tt.wantInstall != nil && (req.InstallTimeout <= 0 || req.InstallTimeout >= req.Timeout) {
				t.Errorf("InstallTimeout = %s with Timeout %s, want a part of it", req.InstallTimeout, req.Timeout)
			}
			for k, want := range tt.wantEnv {
				got, ok := envValue(req.Env, k)
				if want == "" && ok || want != "" && got != want {
					t.Errorf("Env %s = %q (set %v), want %q", k, got, ok, want)
				}
			}
		})
	}
}

// TestInstallFailedResult: a failed install is status error naming the
// install, with its exit code and output; a session goes on.
func TestInstallFailedResult(t *testing.T) {
	for _, tt := range []struct {
		name string
		exit agent.Exit
		want string
	}{
		{"exit code", agent.Exit{Code: 1}, "installing packages failed: the installer exited with code 1"},
		{"timeout", agent.Exit{Code: -1, TimedOut: true}, "installing packages failed: no end within 30s (of the 40s timeout)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			log := reqLog{installExit: &tt.exit}
			e := newEngine(t, newFake(log.handler()), engine.Config{Policy: networkPolicy(t)})
			job := sandbox.Job{Language: "python", Code: "print(1)", Network: []string{"pypi.test"}, Packages: []string{"nosuch"}, Limits: sandbox.Limits{Timeout: 40 * time.Second}}
			res, err := e.Run(context.Background(), job)
			if err != nil {
				t.Fatal(err)
			}
			if res.Status != sandbox.StatusError || res.ExitCode != tt.exit.Code || !strings.Contains(res.Message, tt.want) || string(res.Stderr) != "boom\n" {
				t.Errorf("result %s, code %d, message %q, stderr %q; want error, code %d, message with %q", res.Status, res.ExitCode, res.Message, res.Stderr, tt.exit.Code, tt.want)
			}
			ctx := context.Background()
			info, err := e.CreateSession(ctx, sandbox.SessionSpec{Language: "python"})
			if err != nil {
				t.Fatal(err)
			}
			res, err = e.RunInSession(ctx, info.ID, job)
			if err != nil {
				t.Fatal(err)
			}
			if res.Status != sandbox.StatusError || !strings.Contains(res.Message, tt.want) || res.StateLost {
				t.Errorf("session call: %s, %q, state lost %v; want error with %q, state kept", res.Status, res.Message, res.StateLost, tt.want)
			}
		})
	}
}

// TestSessionInstallsItsPackagesOnce: a session's packages are installed by
// its first call, with the session's network environment; later calls
// install nothing, and a failed install is tried again by the next call.
func TestSessionInstallsItsPackagesOnce(t *testing.T) {
	log := reqLog{installExit: &agent.Exit{Code: 1}}
	e := newEngine(t, newFake(log.handler()), engine.Config{Policy: networkPolicy(t)})
	ctx := context.Background()
	info, err := e.CreateSession(ctx, sandbox.SessionSpec{Language: "python", Network: []string{"pypi.test"}, Packages: []string{"tinypkg"}})
	if err != nil {
		t.Fatal(err)
	}
	call := func() agent.Request {
		t.Helper()
		if _, err := e.RunInSession(ctx, info.ID, sandbox.Job{Code: "x = 1"}); err != nil {
			t.Fatal(err)
		}
		return log.last()
	}
	want := append(slices.Clone(sandbox.DefaultLanguages[0].Install), "tinypkg")
	if req := call(); !slices.Equal(req.Install, want) {
		t.Errorf("first call installs %q, want %q", req.Install, want)
	}
	log.mu.Lock()
	log.installExit = nil // the next install succeeds
	log.mu.Unlock()
	if req := call(); !slices.Equal(req.Install, want) {
		t.Errorf("call after a failed install installs %q, want %q again", req.Install, want)
	}
	req := call()
	if req.Install != nil {
		t.Errorf("call after the install installs %q again", req.Install)
	}
	if v, _ := envValue(req.Env, "PIP_USER"); v != "1" {
		t.Errorf("session call's Env %q lacks the network's", req.Env)
	}
}
