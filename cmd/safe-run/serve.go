package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	goruntime "runtime"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/mark3labs/mcp-go/server"

	"github.com/safe-run/safe-run/audit"
	"github.com/safe-run/safe-run/mcp"
	"github.com/safe-run/safe-run/sandbox"
)

const serveUsage = `Usage: safe-run serve [flags]

Serves the Model Context Protocol: over stdio by default (for desktop
clients, which start safe-run themselves), or over Streamable HTTP at
http://ADDR/mcp with --http ADDR (https:// with --tls-cert and --tls-key).
A listener on a non-loopback address needs a bearer token (--token or
--token-file), and TLS unless --insecure-http.
Over HTTP, Prometheus metrics are served at http://ADDR/metrics, behind
the same Host, Origin and token checks as /mcp.

Settings come from, in order of precedence: these flags, the environment
variables named below, the config file (--config: a JSON object whose keys
are the flag names, e.g. {"max-concurrent": 4, "allowed-origins": ["https://a.example"]}),
and the defaults shown.

Flags:
`

// serveConfig is everything serve is told: its flags, filled in from the
// environment and the config file, checked and resolved (gatherServe).
// It is plain data; building the service from it (newService) is where
// files are opened, sockets bound and sandboxes started.
type serveConfig struct {
	host           hostFlags
	kube           kubeFlags
	config         string
	http           string
	token          string // the token itself, read from tokenFile if one is named
	tokenFile      string
	sessionKey     []byte // read from sessionKeyFile
	sessionKeyFile string
	origins        string
	hosts          string
	maxBody        int64
	httpLimits     httpLimits
	tls            tlsFlags
	maxConcurrent  int
	maxQueue       int
	timeout        time.Duration
	maxTimeout     time.Duration
	limits         sandbox.Limits
	sessions       sessionConfig
	pool           poolFlags
	cacheTTL       time.Duration
	cacheSize      int64
	logLevel       string
	images         string
	audit          auditFlags
	net            netFlags
	monitor        monitorFlags

	// Resolved by gatherServe from the flags above.
	policy  sandbox.Policy // the limits; the languages and images are the backend's
	poolCfg poolConfig
}

func (f *serveConfig) register(fs *flag.FlagSet) {
	f.host.register(fs)
	fs.StringVar(&f.config, "config", "", "JSON config `file`")
	fs.StringVar(&f.http, "http", "", "serve Streamable HTTP on this `address`, e.g. 127.0.0.1:8080 (default: stdio)")
	fs.StringVar(&f.token, "token", "", "bearer `token` HTTP clients must send (prefer --token-file)")
	fs.StringVar(&f.tokenFile, "token-file", "", "read the bearer token from this `file`")
	fs.StringVar(&f.sessionKeyFile, "session-key-file", "", "sign HTTP session IDs with the key in this `file` (at least 32 bytes), shared by every replica, so that any of them serves any client (default: IDs known only to this process)")
	fs.StringVar(&f.origins, "allowed-origins", "", "comma-separated browser `origins` allowed besides loopback ones")
	fs.StringVar(&f.hosts, "allowed-hosts", "", "comma-separated Host `names` accepted besides loopback ones (* for any)")
	f.maxBody = 100 * sandbox.MiB
	fs.Var(sizeFlag{&f.maxBody}, "max-body", "largest HTTP request body (a `size` such as 100MiB)")
	f.httpLimits.register(fs)
	f.tls.register(fs)
	fs.IntVar(&f.maxConcurrent, "max-concurrent", goruntime.NumCPU(), "most runs at once")
	fs.IntVar(&f.maxQueue, "max-queue", 16, "most calls waiting for a run; more are refused")
	fs.DurationVar(&f.timeout, "timeout", sandbox.DefaultLimits.Timeout, "timeout of a call that sets none")
	fs.DurationVar(&f.maxTimeout, "max-timeout", 10*time.Minute, "longest timeout a call may ask for")
	f.limits = sandbox.DefaultLimits
	fs.Var(sizeFlag{&f.limits.MemoryBytes}, "memory", "memory limit of a run (a `size`)")
	fs.IntVar(&f.limits.Processes, "pids", f.limits.Processes, "most processes and threads in a run")
	fs.Float64Var(&f.limits.CPUs, "cpus", f.limits.CPUs, "CPU limit of a run, in cores")
	fs.Var(sizeFlag{&f.limits.OutputBytes}, "output-limit", "most bytes kept of stdout and of stderr, each (a `size`)")
	fs.IntVar(&f.sessions.MaxSessions, "max-sessions", defaultSessions.MaxSessions, "most live sessions (0 disables sessions)")
	fs.DurationVar(&f.sessions.IdleTimeout, "session-idle", defaultSessions.IdleTimeout, "end a session unused this long")
	fs.DurationVar(&f.sessions.MaxLifetime, "session-max-age", defaultSessions.MaxLifetime, "end a session this long after it starts")
	f.pool.register(fs)
	f.kube.register(fs)
	fs.DurationVar(&f.cacheTTL, "cache-ttl", 0, "reuse the result of an identical run_code call (not in sessions) for this `long`; 0 disables")
	f.cacheSize = 64 * sandbox.MiB
	fs.Var(sizeFlag{&f.cacheSize}, "cache-size", "most output kept by the result cache (a `size`)")
	fs.StringVar(&f.logLevel, "log-level", "info", "log `level`: debug, info, warn or error (logs go to stderr)")
	fs.StringVar(&f.images, "images", "", "comma-separated `images` run_code may choose with its image argument")
	f.audit.register(fs)
	f.net.register(fs)
	f.monitor.register(fs)
}

func cmdServe(args []string) int {
	f, err := gatherServe(args, os.LookupEnv)
	var exit exitNow
	if errors.As(err, &exit) {
		return exit.code
	}
	if err != nil {
		return fail(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	svc, err := newService(ctx, f)
	if err != nil {
		return fail(err)
	}
	defer svc.close()
	if err := svc.serve(ctx); err != nil {
		return fail(err)
	}
	return 0
}

// exitNow is an outcome already shown to the user (the help, or a flag
// mistake named): the command ends with code.
type exitNow struct{ code int }

func (e exitNow) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// newServeFlags is serve's flag set bound to f, with the environment
// variable of each of its flags (all of them have one).
func newServeFlags(f *serveConfig) (*flag.FlagSet, map[string]string) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	env := registerWithEnv(fs, f.register)
	fs.Usage = func() { fmt.Fprint(fs.Output(), serveUsage); printSettings(fs, env) }
	return fs, env
}

// gatherServe is serve's configuration step: the flags in args, then the
// environment read through lookupEnv, then the config file they name, then
// the defaults, checked and resolved into one serveConfig. It reads the
// config and token files and changes nothing. For -h, and for a flag
// mistake, it has printed what to say and returns exitNow.
func gatherServe(args []string, lookupEnv func(string) (string, bool)) (serveConfig, error) {
	var f serveConfig
	fs, env := newServeFlags(&f)
	if code, done := parseFlags(fs, args); done {
		return f, exitNow{code}
	}
	// The config file's own path comes from the flag or the environment.
	configFile := f.config
	if configFile == "" {
		configFile, _ = lookupEnv(envName("config"))
	}
	if err := applySettings(fs, env, lookupEnv, configFile); err != nil {
		return f, usageError("%v", err)
	}
	f.policy = sandbox.Policy{
		Default: sandbox.Limits{Timeout: f.timeout, MemoryBytes: f.limits.MemoryBytes, Processes: f.limits.Processes,
			CPUs: f.limits.CPUs, OutputBytes: f.limits.OutputBytes},
		Max: sandbox.Limits{Timeout: f.maxTimeout},
	}
	if err := f.policy.Validate(); err != nil {
		return f, usageError("the configured limits are not valid: %v", err)
	}
	if _, err := f.monitor.options(); err != nil {
		return f, err
	}
	if err := f.net.policy(&f.policy); err != nil {
		return f, err
	}
	token, err := readToken(f.token, f.tokenFile)
	if err != nil {
		return f, err
	}
	f.token = token
	if f.sessionKeyFile != "" {
		if f.http == "" {
			return f, usageError("--session-key-file signs HTTP session IDs; it needs --http")
		}
		key, err := readSecretFile("session key", f.sessionKeyFile)
		if err != nil {
			return f, err
		}
		if len(key) < minSessionKey {
			return f, usageError("session key file %s holds %d bytes; give at least %d, e.g. openssl rand -hex 32 > %s", f.sessionKeyFile, len(key), minSessionKey, f.sessionKeyFile)
		}
		f.sessionKey = []byte(key)
	}
	if f.http != "" {
		if err := f.httpLimits.check(); err != nil {
			return f, err
		}
	}
	if f.poolCfg, err = f.pool.config(); err != nil {
		return f, err
	}
	return f, nil
}

// service is serve built: the listener (for HTTP), the audit log, the
// backend and the MCP server over them.
type service struct {
	cfg      serveConfig
	logger   *slog.Logger
	listener net.Listener // nil: stdio
	auditLog *audit.Log
	backend  backend
	metrics  *mcp.Metrics
	srv      *server.MCPServer
}

// newService builds the service f describes: it binds the HTTP listener
// first, so that a mistake there shows before the slow start-up, then
// opens the audit log, starts the backend (and its pool) and probes the
// sandbox environment the MCP server describes. On an error, what it built
// is closed again.
func newService(ctx context.Context, f serveConfig) (s *service, err error) {
	logger := newLoggerAt(parseLevel(f.logLevel, slog.LevelInfo))
	s = &service{cfg: f, logger: logger}
	defer func() {
		if err != nil {
			s.close()
			s = nil
		}
	}()
	if f.http != "" {
		if s.listener, err = listen(f.http, f.token, splitList(f.hosts, ",")); err != nil {
			return s, err
		}
		s.listener = mcp.LimitConnections(s.listener, f.httpLimits.maxConnections)
		if s.listener, err = f.tls.secure(ctx, s.listener, logger); err != nil {
			return s, err
		}
		if os.Getenv("GOMEMLIMIT") == "" {
			cache := int64(0)
			if f.cacheTTL > 0 {
				cache = f.cacheSize
			}
			debug.SetMemoryLimit(memoryTarget(memoryBound(f.httpLimits, f.maxConcurrent, f.limits.OutputBytes, cache)))
		}
	}

	auditLog, err := f.audit.open(logger)
	if err != nil {
		return s, err
	}
	s.auditLog = auditLog

	cfg, err := f.kube.runtimeConfig(&f.host)
	if err != nil {
		return s, err
	}
	policy := f.policy
	policy.Languages, policy.Images = cfg.Engine.Policy.Languages, splitList(f.images, ",")
	for _, ref := range policy.Images {
		if _, err := f.host.store().Lookup(ref); err != nil {
			return s, fmt.Errorf("--images: %w", err)
		}
	}
	cfg.Engine.Policy, cfg.Engine.Logger, cfg.Engine.Sessions, cfg.Engine.Pool = policy, logger, f.sessions, f.poolCfg
	// A server ends the stored sessions of servers that died (a backend
	// whose sessions outlive their server: kubernetes).
	cfg.Engine.Sessions.SweepStore = f.sessions.MaxSessions > 0
	cfg.Backend.Logger, cfg.Backend.CheckpointDir = logger, f.pool.checkpointDir(f.host.cacheDir)
	f.net.configure(&cfg)
	if err := f.net.checkHost(cfg); err != nil {
		return s, err
	}
	if err := f.monitor.configure(&cfg); err != nil {
		return s, err
	}
	recorder := newRecorder(auditLog, logger)
	if recorder != nil {
		// Sessions also end without a call: idle, too old, or at exit.
		cfg.Engine.Sessions.OnEnd = recorder.SessionEnded
	}
	// Metrics exist only over HTTP. They are made before the backend, whose
	// pool starts sandboxes at once; the gauges read it only when scraped.
	var metrics *mcp.Metrics
	gate := sandbox.NewGate(f.maxConcurrent, f.maxQueue)
	if s.listener != nil {
		metrics = mcp.NewMetrics(mcp.Gauges{
			LiveSandboxes: func() int { return s.backend.LiveSandboxes() },
			Sessions:      func() int { return len(s.backend.ListSessions()) },
			Gate:          gate,
			PoolSizes:     func() map[string]int { return s.backend.PoolSizes() }, // none without --pool
		})
		cfg.Engine.ObserveStart = metrics.ObserveSandboxStart
	}
	s.metrics = metrics
	rt, err := newBackend(cfg)
	if err != nil {
		return s, err
	}
	s.backend = rt

	probeStart := time.Now()
	env := mcp.ProbeEnvironment(ctx, rt)
	logger.Info("probed the sandbox environment", "ms", time.Since(probeStart).Milliseconds())
	var sessions sandbox.Sessions
	if f.sessions.MaxSessions > 0 {
		sessions = rt
		env.Sessions = &mcp.SessionLimits{MaxSessions: f.sessions.MaxSessions,
			IdleTimeoutSeconds: f.sessions.IdleTimeout.Seconds(), MaxLifetimeSeconds: f.sessions.MaxLifetime.Seconds()}
	}
	var runner sandbox.Runner = rt
	if f.cacheTTL > 0 {
		runner = &sandbox.ResultCache{Runner: rt, TTL: f.cacheTTL, MaxBytes: f.cacheSize}
	}
	runner, sessions = audited(recorder, runner, sessions)
	mcpCfg := mcp.Config{
		Runner: runner, Sessions: sessions, Environment: env,
		Gate:       gate,
		MaxTimeout: f.maxTimeout, Version: version, Logger: logger,
		Metrics: metrics, SharedSessionIDs: f.sessionKey != nil,
	}
	s.srv = mcp.NewServer(mcpCfg)
	return s, nil
}

// close ends the backend — cancelled runs clean up after themselves; the
// pool and the sessions are closed, their ends recorded — and then closes
// the audit log and the listener.
func (s *service) close() {
	if s.backend != nil {
		s.backend.Close()
		drain, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.backend.Wait(drain); err != nil {
			s.logger.Error("runs still cleaning up at exit", "err", err)
		}
	}
	closeAuditLog(s.auditLog, s.cfg.audit.path, s.logger)
	if s.listener != nil {
		s.listener.Close()
	}
}

// serve serves MCP over stdio, or over HTTP when there is a listener,
// until ctx ends or the client goes.
func (s *service) serve(ctx context.Context) error {
	if s.listener == nil {
		return s.serveStdio(ctx)
	}
	return s.serveHTTP(ctx)
}

func (s *service) serveStdio(ctx context.Context) error {
	s.logger.Info("serving MCP over stdio")
	stdio := server.NewStdioServer(s.srv)
	stdio.SetErrorLogger(log.New(os.Stderr, "safe-run: ", 0))
	// Enough workers that no call waits inside the library, where a
	// cancellation would be lost; the gate does the queueing.
	server.WithWorkerPoolSize(min(100, s.cfg.maxConcurrent+s.cfg.maxQueue+4))(stdio)
	if err := stdio.Listen(ctx, os.Stdin, os.Stdout); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("serve stdio: %w", err)
	}
	return nil
}

func (s *service) serveHTTP(ctx context.Context) error {
	f := s.cfg
	handler := mcp.HTTPHandler(s.srv, mcp.HTTPConfig{
		Token:          f.token,
		SessionKey:     f.sessionKey,
		Logger:         s.logger,
		AllowedOrigins: splitList(f.origins, ","),
		AllowedHosts:   splitList(f.hosts, ","),
		MaxBodyBytes:   f.maxBody,
		Metrics:        s.metrics.Handler(),
		BodyTimeout:    f.httpLimits.readTimeout, WriteTimeout: f.httpLimits.writeTimeout,
		MaxResponseBytes: f.httpLimits.maxResponse, MaxInFlightBytes: f.httpLimits.maxInFlight,
	})
	// No ReadTimeout or WriteTimeout: both would end long runs and their
	// SSE streams; the handler sets per-body and per-write deadlines.
	httpSrv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: f.httpLimits.idleTimeout,
		BaseContext: func(net.Listener) context.Context { return ctx }}
	fmt.Fprintf(os.Stderr, "safe-run: serving MCP at %s://%s%s\n", f.tls.scheme(), s.listener.Addr(), mcp.HTTPPath)
	errc := make(chan error, 1)
	go func() { errc <- httpSrv.Serve(s.listener) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve http: %w", err)
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = httpSrv.Shutdown(shutdown)
	return nil
}

// listen opens the HTTP listener, refusing without a token one that others
// can reach: anyone who can could run code here. The address that decides
// is the one bound, not the one given: a name (even under .localhost) may
// resolve anywhere. --allowed-hosts * counts as reachable: it turns off the
// Host check that keeps DNS-rebinding web pages out.
func listen(addr, token string, hosts []string) (net.Listener, error) {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, usageError("--http %q: %v; give HOST:PORT, e.g. 127.0.0.1:8080", addr, err)
	}
	if token == "" && slices.Contains(hosts, "*") {
		return nil, usageError("--allowed-hosts * accepts requests for any host name, which lets web pages reach the server by DNS rebinding; set a bearer token with --token-file or SAFE_RUN_TOKEN, or name the hosts")
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	if tcp, ok := l.Addr().(*net.TCPAddr); token == "" && (!ok || !tcp.IP.IsLoopback()) {
		l.Close()
		return nil, usageError("--http %s listens on %s, beyond this machine; set a bearer token with --token-file or SAFE_RUN_TOKEN, or listen on 127.0.0.1", addr, l.Addr())
	}
	return l, nil
}

// readToken returns the token, from file if one is named.
func readToken(token, file string) (string, error) {
	if file == "" {
		return token, nil
	}
	return readSecretFile("token", file)
}

// privateSecret reports whether no one but the file's owner, or root and
// the groups this process is in, can read or change the file: mode 0600 or
// stricter, or a root-owned file readable by its group (0440 or 0400 for
// the group), that group being one of ours. The second form is how
// Kubernetes mounts a Secret for a non-root container (root:fsGroup, the
// volume's defaultMode), and how an operator shares a root-owned secret
// with a service's group; nothing in it lets another user in.
func privateSecret(info os.FileInfo) bool {
	perm := info.Mode().Perm()
	if perm&0o077 == 0 {
		return true
	}
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok || perm&0o037 != 0 || st.Uid != 0 {
		return false
	}
	if int(st.Gid) == os.Getegid() {
		return true
	}
	groups, err := os.Getgroups()
	return err == nil && slices.Contains(groups, int(st.Gid))
}

// minSessionKey is the shortest session key accepted: HMAC-SHA256's own
// output size.
const minSessionKey = 32

// readSecretFile returns the trimmed content of a file holding a secret
// (what names it). The file must be the owner's alone (see privateSecret):
// a secret others can read or replace guards nothing.
func readSecretFile(what, file string) (string, error) {
	fd, err := os.Open(file)
	if err != nil {
		return "", fmt.Errorf("read %s file: %w", what, err)
	}
	defer fd.Close()
	info, err := fd.Stat()
	if err != nil {
		return "", fmt.Errorf("read %s file: %w", what, err)
	}
	if !info.Mode().IsRegular() {
		return "", usageError("%s file %s is not a regular file", what, file)
	}
	if perm := info.Mode().Perm(); !privateSecret(info) {
		return "", usageError("%s file %s can be read or changed by other users (mode %04o); chmod 600 %s, "+
			"or make it root's, in a group safe-run runs in, mode 0440", what, file, perm, file)
	}
	data, err := io.ReadAll(io.LimitReader(fd, 64<<10))
	if err != nil {
		return "", fmt.Errorf("read %s file: %w", what, err)
	}
	t := strings.TrimSpace(string(data))
	if t == "" {
		return "", fmt.Errorf("%s file %s is empty", what, file)
	}
	return t, nil
}
