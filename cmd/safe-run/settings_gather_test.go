package main

import (
	"context"
	"errors"
	"flag"
	"maps"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/safe-run/safe-run/egress"
)

// TestEnvNames checks that the environment variables derived from the flag
// names are exactly those safe-run has always read, for every command's
// settings: a rename here would silently drop a user's setting.
func TestEnvNames(t *testing.T) {
	host := map[string]string{
		"runsc": "SAFE_RUN_RUNSC", "agent": "SAFE_RUN_AGENT", "cache-dir": "SAFE_RUN_CACHE", "image": "SAFE_RUN_IMAGE",
		"state-dir": "SAFE_RUN_STATE_DIR", "platform": "SAFE_RUN_PLATFORM", "debug-log-dir": "SAFE_RUN_DEBUG_LOG_DIR",
		"languages": "SAFE_RUN_LANGUAGES",
	}
	audits := map[string]string{
		"audit-log": "SAFE_RUN_AUDIT_LOG", "audit-max-size": "SAFE_RUN_AUDIT_MAX_SIZE",
		"audit-max-files": "SAFE_RUN_AUDIT_MAX_FILES", "audit-code": "SAFE_RUN_AUDIT_CODE",
	}
	serve := map[string]string{
		"config": "SAFE_RUN_CONFIG", "http": "SAFE_RUN_HTTP", "token": "SAFE_RUN_TOKEN", "token-file": "SAFE_RUN_TOKEN_FILE", "session-key-file": "SAFE_RUN_SESSION_KEY_FILE",
		"allowed-origins": "SAFE_RUN_ALLOWED_ORIGINS", "allowed-hosts": "SAFE_RUN_ALLOWED_HOSTS", "max-body": "SAFE_RUN_MAX_BODY",
		"read-timeout": "SAFE_RUN_READ_TIMEOUT", "write-timeout": "SAFE_RUN_WRITE_TIMEOUT", "idle-timeout": "SAFE_RUN_IDLE_TIMEOUT",
		"max-connections": "SAFE_RUN_MAX_CONNECTIONS", "max-response": "SAFE_RUN_MAX_RESPONSE",
		"max-responses-in-flight": "SAFE_RUN_MAX_RESPONSES_IN_FLIGHT", "max-concurrent": "SAFE_RUN_MAX_CONCURRENT",
		"max-queue": "SAFE_RUN_MAX_QUEUE", "timeout": "SAFE_RUN_TIMEOUT", "max-timeout": "SAFE_RUN_MAX_TIMEOUT",
		"memory": "SAFE_RUN_MEMORY", "pids": "SAFE_RUN_PIDS", "cpus": "SAFE_RUN_CPUS", "output-limit": "SAFE_RUN_OUTPUT_LIMIT",
		"max-sessions": "SAFE_RUN_MAX_SESSIONS", "session-idle": "SAFE_RUN_SESSION_IDLE", "session-max-age": "SAFE_RUN_SESSION_MAX_AGE",
		"cache-ttl": "SAFE_RUN_CACHE_TTL", "cache-size": "SAFE_RUN_CACHE_SIZE", "log-level": "SAFE_RUN_LOG_LEVEL",
		"images": "SAFE_RUN_IMAGES", "pool": "SAFE_RUN_POOL", "preload": "SAFE_RUN_PRELOAD",
		"pool-memory": "SAFE_RUN_POOL_MEMORY", "checkpoints": "SAFE_RUN_CHECKPOINTS",
	}
	netHost := map[string]string{"net-link": "SAFE_RUN_NET_LINK", "net-helper": "SAFE_RUN_NET_HELPER"}
	network := map[string]string{"allow-net": "SAFE_RUN_ALLOW_NET", "allow-packages": "SAFE_RUN_ALLOW_PACKAGES",
		"net-max-connections": "SAFE_RUN_NET_MAX_CONNECTIONS", "net-max-bytes": "SAFE_RUN_NET_MAX_BYTES", "net-ca": "SAFE_RUN_NET_CA",
		"pip-index-url": "SAFE_RUN_PIP_INDEX_URL", "npm-registry": "SAFE_RUN_NPM_REGISTRY"}
	monitoring := map[string]string{"monitor": "SAFE_RUN_MONITOR", "monitor-rules": "SAFE_RUN_MONITOR_RULES"}
	kube := map[string]string{"backend": "SAFE_RUN_BACKEND", "kubeconfig": "SAFE_RUN_KUBECONFIG", "namespace": "SAFE_RUN_NAMESPACE",
		"runtime-class": "SAFE_RUN_RUNTIME_CLASS"}
	tls := map[string]string{"tls-cert": "SAFE_RUN_TLS_CERT", "tls-key": "SAFE_RUN_TLS_KEY", "insecure-http": "SAFE_RUN_INSECURE_HTTP"}
	union := func(ms ...map[string]string) map[string]string {
		out := map[string]string{}
		for _, m := range ms {
			maps.Copy(out, m)
		}
		return out
	}
	var h hostFlags
	var a auditFlags
	var n netFlags
	var m monitorFlags
	var k kubeFlags
	var f serveConfig
	_, serveEnv := newServeFlags(&f)
	for _, tc := range []struct {
		command   string
		got, want map[string]string
	}{
		{"serve", serveEnv, union(host, audits, serve, network, netHost, tls, monitoring, kube)},
		{"run", registerWithEnv(flag.NewFlagSet("run", flag.ContinueOnError), h.register, k.register, a.register, n.register, m.register), union(host, audits, network, netHost, monitoring, kube)},
		{"doctor", registerWithEnv(flag.NewFlagSet("doctor", flag.ContinueOnError), h.register, n.registerHost), union(host, netHost)},
	} {
		for name, want := range tc.want {
			if got, ok := tc.got[name]; !ok || got != want {
				t.Errorf("%s --%s: environment variable %q, want %q", tc.command, name, got, want)
			}
		}
		for name, got := range tc.got {
			if _, ok := tc.want[name]; !ok {
				t.Errorf("%s --%s: unexpected environment variable %q", tc.command, name, got)
			}
		}
	}
	// The rule, and its one exception.
	for flagName, want := range map[string]string{"max-queue": "SAFE_RUN_MAX_QUEUE", "max-responses-in-flight": "SAFE_RUN_MAX_RESPONSES_IN_FLIGHT",
		"x": "SAFE_RUN_X", "cache-dir": "SAFE_RUN_CACHE"} {
		if got := envName(flagName); got != want {
			t.Errorf("envName(%q) = %q, want %q", flagName, got, want)
		}
	}
}

// gathered is the part of a serveConfig TestGatherServe compares.
type gathered struct {
	maxQueue       int
	timeout        time.Duration
	maxSessions    int
	cacheDir       string
	token          string
	pool           map[string]int
	maxConnections int
	network        string // the policy's allowlist, canonical, comma-separated
	packages       string
	netLimits      egress.Limits
	pipIndex       string
}

func gatheredOf(f serveConfig) gathered {
	return gathered{maxQueue: f.maxQueue, timeout: f.policy.Default.Timeout, maxSessions: f.sessions.MaxSessions,
		cacheDir: f.host.cacheDir, token: f.token, pool: f.poolCfg.Size, maxConnections: f.httpLimits.maxConnections,
		network: strings.Join(f.policy.Network.Strings(), ","), packages: strings.Join(f.policy.Packages, ","),
		netLimits: f.policy.NetworkLimits, pipIndex: f.policy.PackageIndex.PipIndexURL}
}

// TestGatherServe checks serve's configuration step as data: flags over
// the environment over the config file over the defaults, checked, and
// nothing opened or created on the way.
func TestGatherServe(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	config := write("config.json", `{"max-queue": 3, "token": "from-file", "audit-log": "`+filepath.Join(dir, "audit.log")+`"}`, 0o600)
	other := write("other.json", `{"max-queue": 4}`, 0o600)
	tokenFile := write("token", "s3cret\n", 0o600)
	openToken := write("open-token", "s3cret\n", 0o644)
	sessionKey := write("session-key", strings.Repeat("ab", 32)+"\n", 0o600)
	shortKey := write("short-key", strings.Repeat("ab", 15)+"\n", 0o600)
	openKey := write("open-key", strings.Repeat("ab", 32)+"\n", 0o644)
	var f serveConfig
	newServeFlags(&f) // the defaults
	def := gatheredOf(f)
	def.timeout, def.pool = 30*time.Second, map[string]int{"python": 2, "node": 1, "bash": 1}
	def.netLimits = egress.Limits{MaxConnections: egress.DefaultMaxConnections, MaxBytesOut: egress.DefaultMaxBytes, MaxBytesIn: egress.DefaultMaxBytes}
	netConfig := write("net.json", `{"allow-net": ["pypi", "mirror.test=127.0.0.1:8443"], "allow-packages": ["requests", "lodash@4.17.21"],
		"net-max-connections": 8, "net-max-bytes": "64MiB", "pip-index-url": "https://mirror.test:8443/simple"}`, 0o600)

	for _, tc := range []struct {
		name    string
		args    []string
		env     map[string]string
		want    func(g *gathered) // changes from the defaults
		wantErr string            // substring of the error, instead
	}{
		{name: "defaults", want: func(g *gathered) {}},
		{name: "config file", args: []string{"--config", config}, want: func(g *gathered) { g.maxQueue, g.token = 3, "from-file" }},
		{name: "config file from the environment", env: map[string]string{"SAFE_RUN_CONFIG": config},
			want: func(g *gathered) { g.maxQueue, g.token = 3, "from-file" }},
		{name: "--config over SAFE_RUN_CONFIG", args: []string{"--config", other}, env: map[string]string{"SAFE_RUN_CONFIG": config},
			want: func(g *gathered) { g.maxQueue = 4 }},
		{name: "environment over config file", args: []string{"--config", config}, env: map[string]string{"SAFE_RUN_MAX_QUEUE": "5"},
			want: func(g *gathered) { g.maxQueue, g.token = 5, "from-file" }},
		{name: "empty environment variable ignored", args: []string{"--config", config}, env: map[string]string{"SAFE_RUN_MAX_QUEUE": ""},
			want: func(g *gathered) { g.maxQueue, g.token = 3, "from-file" }},
		{name: "flag over environment", args: []string{"--config", config, "--max-queue", "7"}, env: map[string]string{"SAFE_RUN_MAX_QUEUE": "5"},
			want: func(g *gathered) { g.maxQueue, g.token = 7, "from-file" }},
		{name: "SAFE_RUN_CACHE is --cache-dir", env: map[string]string{"SAFE_RUN_CACHE": "/srv/images"},
			want: func(g *gathered) { g.cacheDir = "/srv/images" }},
		{name: "token file read", args: []string{"--token-file", tokenFile}, want: func(g *gathered) { g.token = "s3cret" }},
		{name: "timeout and sessions", env: map[string]string{"SAFE_RUN_TIMEOUT": "45s", "SAFE_RUN_MAX_SESSIONS": "0"},
			want: func(g *gathered) { g.timeout, g.maxSessions = 45*time.Second, 0 }},
		{name: "pool", args: []string{"--pool", "python=3"}, want: func(g *gathered) { g.pool = map[string]int{"python": 3} }},
		{name: "HTTP limits unchecked without --http", args: []string{"--max-connections", "0"}, want: func(g *gathered) { g.maxConnections = 0 }},
		{name: "network from the config file", args: []string{"--config", netConfig}, want: func(g *gathered) {
			g.network, g.packages, g.pipIndex = "pypi,mirror.test=127.0.0.1:8443", "requests,lodash@4.17.21", "https://mirror.test:8443/simple"
			g.netLimits = egress.Limits{MaxConnections: 8, MaxBytesOut: 64 << 20, MaxBytesIn: 64 << 20}
		}},
		{name: "network flags repeated and comma lists", args: []string{"--allow-net", "pypi", "--allow-net", "npm,api.example.com:8080"},
			want: func(g *gathered) { g.network = "pypi,npm,api.example.com:8080" }},
		{name: "network from the environment over the config file", args: []string{"--config", netConfig}, env: map[string]string{"SAFE_RUN_ALLOW_NET": "npm,mirror.test=127.0.0.1:8443", "SAFE_RUN_ALLOW_PACKAGES": "left-pad"},
			want: func(g *gathered) {
				g.network, g.packages, g.pipIndex = "npm,mirror.test=127.0.0.1:8443", "left-pad", "https://mirror.test:8443/simple"
				g.netLimits = egress.Limits{MaxConnections: 8, MaxBytesOut: 64 << 20, MaxBytesIn: 64 << 20}
			}},
		{name: "a mirror outside the allowlist", args: []string{"--config", netConfig}, env: map[string]string{"SAFE_RUN_ALLOW_NET": "npm"},
			wantErr: "the pip index https://mirror.test:8443/simple is not in the network allowlist"},
		{name: "a bad allowlist entry", args: []string{"--allow-net", "exa mple.com"}, wantErr: `--allow-net: network entry "exa mple.com"`},
		{name: "a CIDR inside a blocked range", args: []string{"--allow-net", "10.0.0.0/8"}, wantErr: `--allow-net: network entry "10.0.0.0/8"`},
		{name: "packages without a network", args: []string{"--allow-packages", "requests"}, wantErr: "packages are allowed but no network is"},
		{name: "a bad link", args: []string{"--net-link", "wifi"}, wantErr: `--net-link "wifi": use auto, tap or veth`},
		{name: "no connections", args: []string{"--allow-net", "pypi", "--net-max-connections", "0"}, wantErr: "--net-max-connections 0: give a positive number"},

		{name: "bad flag", args: []string{"--max-queue", "x"}, wantErr: "exit status 2"},
		{name: "bad environment value", env: map[string]string{"SAFE_RUN_MAX_QUEUE": "x"}, wantErr: `SAFE_RUN_MAX_QUEUE="x"`},
		{name: "unknown config key", args: []string{"--config", write("bad.json", `{"max-queues": 1}`, 0o600)}, wantErr: `unknown setting "max-queues"`},
		{name: "limits not valid", args: []string{"--max-timeout", "48h"}, wantErr: "the configured limits are not valid"},
		{name: "token file others can read", args: []string{"--token-file", openToken}, wantErr: "can be read or changed by other users"},
		{name: "HTTP limits checked with --http", args: []string{"--http", "127.0.0.1:0", "--max-connections", "0"}, wantErr: "--max-connections must be at least 1"},
		{name: "bad pool", args: []string{"--pool", "python"}, wantErr: `"python" is not LANG=N`},
		{name: "session key without --http", args: []string{"--session-key-file", sessionKey}, wantErr: "--session-key-file signs HTTP session IDs; it needs --http"},
		{name: "session key too short", args: []string{"--http", "127.0.0.1:0", "--session-key-file", shortKey}, wantErr: "holds 30 bytes; give at least 32"},
		{name: "session key others can read", args: []string{"--http", "127.0.0.1:0", "--session-key-file", openKey}, wantErr: "session key file " + openKey + " can be read or changed by other users"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lookup := func(name string) (string, bool) { v, ok := tc.env[name]; return v, ok }
			f, err := gatherServe(tc.args, lookup)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("gatherServe = %v, want an error with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("gatherServe: %v", err)
			}
			want := def
			want.pool = maps.Clone(def.pool)
			tc.want(&want)
			if got := gatheredOf(f); !reflect.DeepEqual(got, want) {
				t.Errorf("gathered %+v, want %+v", got, want)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(dir, "audit.log")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("gathering the configuration created the audit log (%v); only newService may", err)
	}
}

// TestNewServiceClosesOnError checks that a service that fails to build
// closes what it built first: the HTTP listener, bound before the slow
// start-up, must not stay bound after serve has given up.
func TestNewServiceClosesOnError(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	f, err := gatherServe([]string{"--http", addr, "--image", "no-such-image", "--cache-dir", t.TempDir(), "--log-level", "error"},
		func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatalf("gatherServe: %v", err)
	}
	svc, err := newService(context.Background(), f)
	if err == nil {
		svc.close()
		t.Fatal("newService started with an image that does not exist")
	}
	again, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("the listener on %s is still bound after newService failed: %v", addr, err)
	}
	again.Close()
}
