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
http://ADDR/mcp with --http ADDR. A listener on a non-loopback address
needs a bearer token (--token or --token-file).
Over HTTP, Prometheus metrics are served at http://ADDR/metrics, behind
the same Host, Origin and token checks as /mcp.

Settings come from, in order of precedence: these flags, the environment
variables named below, the config file (--config: a JSON object whose keys
are the flag names, e.g. {"max-concurrent": 4, "allowed-origins": ["https://a.example"]}),
and the defaults shown.

Flags:
`

// serveEnv names the environment variable of each serve flag.
var serveEnv = map[string]string{
	"config":                  "SAFE_RUN_CONFIG",
	"http":                    "SAFE_RUN_HTTP",
	"token":                   "SAFE_RUN_TOKEN",
	"token-file":              "SAFE_RUN_TOKEN_FILE",
	"allowed-origins":         "SAFE_RUN_ALLOWED_ORIGINS",
	"allowed-hosts":           "SAFE_RUN_ALLOWED_HOSTS",
	"max-body":                "SAFE_RUN_MAX_BODY",
	"read-timeout":            "SAFE_RUN_READ_TIMEOUT",
	"write-timeout":           "SAFE_RUN_WRITE_TIMEOUT",
	"idle-timeout":            "SAFE_RUN_IDLE_TIMEOUT",
	"max-connections":         "SAFE_RUN_MAX_CONNECTIONS",
	"max-response":            "SAFE_RUN_MAX_RESPONSE",
	"max-responses-in-flight": "SAFE_RUN_MAX_RESPONSES_IN_FLIGHT",
	"max-concurrent":          "SAFE_RUN_MAX_CONCURRENT",
	"max-queue":               "SAFE_RUN_MAX_QUEUE",
	"timeout":                 "SAFE_RUN_TIMEOUT",
	"max-timeout":             "SAFE_RUN_MAX_TIMEOUT",
	"memory":                  "SAFE_RUN_MEMORY",
	"pids":                    "SAFE_RUN_PIDS",
	"cpus":                    "SAFE_RUN_CPUS",
	"output-limit":            "SAFE_RUN_OUTPUT_LIMIT",
	"max-sessions":            "SAFE_RUN_MAX_SESSIONS",
	"session-idle":            "SAFE_RUN_SESSION_IDLE",
	"session-max-age":         "SAFE_RUN_SESSION_MAX_AGE",
	"cache-ttl":               "SAFE_RUN_CACHE_TTL",
	"cache-size":              "SAFE_RUN_CACHE_SIZE",
	"log-level":               "SAFE_RUN_LOG_LEVEL",
	"images":                  "SAFE_RUN_IMAGES",
}

type serveFlags struct {
	host          hostFlags
	config        string
	http          string
	token         string
	tokenFile     string
	origins       string
	hosts         string
	maxBody       int64
	httpLimits    httpLimits
	maxConcurrent int
	maxQueue      int
	timeout       time.Duration
	maxTimeout    time.Duration
	limits        sandbox.Limits
	sessions      sessionConfig
	pool          poolFlags
	cacheTTL      time.Duration
	cacheSize     int64
	logLevel      string
	images        string
	audit         auditFlags
}

func (f *serveFlags) register(fs *flag.FlagSet) {
	f.host.register(fs)
	fs.StringVar(&f.config, "config", "", "JSON config `file`")
	fs.StringVar(&f.http, "http", "", "serve Streamable HTTP on this `address`, e.g. 127.0.0.1:8080 (default: stdio)")
	fs.StringVar(&f.token, "token", "", "bearer `token` HTTP clients must send (prefer --token-file)")
	fs.StringVar(&f.tokenFile, "token-file", "", "read the bearer token from this `file`")
	fs.StringVar(&f.origins, "allowed-origins", "", "comma-separated browser `origins` allowed besides loopback ones")
	fs.StringVar(&f.hosts, "allowed-hosts", "", "comma-separated Host `names` accepted besides loopback ones (* for any)")
	f.maxBody = 100 * sandbox.MiB
	fs.Var(sizeFlag{&f.maxBody}, "max-body", "largest HTTP request body (a `size` such as 100MiB)")
	f.httpLimits.register(fs)
	fs.IntVar(&f.maxConcurrent, "max-concurrent", goruntime.NumCPU(), "most runs at once")
	fs.IntVar(&f.maxQueue, "max-queue", 16, "most calls waiting for a run; more are refused")
	fs.DurationVar(&f.timeout, "timeout", sandbox.DefaultLimits.Timeout, "timeout of a call that sets none")
	fs.DurationVar(&f.maxTimeout, "max-timeout", 10*time.Minute, "longest timeout a call may ask for")
	f.limits = sandbox.DefaultLimits
	fs.Var(sizeFlag{&f.limits.MemoryBytes}, "memory", "memory limit of a run (a `size`)")
	fs.IntVar(&f.limits.Processes, "pids", f.limits.Processes, "most processes and threads in a run")
	fs.Float64Var(&f.limits.CPUs, "cpus", f.limits.CPUs, "CPU limit of a run, in cores")
	fs.Var(sizeFlag{&f.limits.OutputBytes}, "output-limit", "most bytes kept of stdout and of stderr, each (a `size`)")
	fs.IntVar(&f.sessions.MaxSessions, "max-sessions", 8, "most live sessions (0 disables sessions)")
	fs.DurationVar(&f.sessions.IdleTimeout, "session-idle", 10*time.Minute, "end a session unused this long")
	fs.DurationVar(&f.sessions.MaxLifetime, "session-max-age", time.Hour, "end a session this long after it starts")
	f.pool.register(fs)
	fs.DurationVar(&f.cacheTTL, "cache-ttl", 0, "reuse the result of an identical run_code call (not in sessions) for this `long`; 0 disables")
	f.cacheSize = 64 * sandbox.MiB
	fs.Var(sizeFlag{&f.cacheSize}, "cache-size", "most output kept by the result cache (a `size`)")
	fs.StringVar(&f.logLevel, "log-level", "info", "log `level`: debug, info, warn or error (logs go to stderr)")
	fs.StringVar(&f.images, "images", "", "comma-separated `images` run_code may choose with its image argument")
	f.audit.register(fs)
}

func cmdServe(args []string) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	var f serveFlags
	f.register(fs)
	env := map[string]string{}
	for k, v := range hostEnv {
		env[k] = v
	}
	for k, v := range serveEnv {
		env[k] = v
	}
	for k, v := range poolEnv {
		env[k] = v
	}
	for k, v := range auditEnv {
		env[k] = v
	}
	fs.Usage = func() { fmt.Fprint(fs.Output(), serveUsage); printSettings(fs, env) }
	if code, done := parseFlags(fs, args); done {
		return code
	}
	// The config file's own path comes from the flag or the environment.
	configFile := f.config
	if configFile == "" {
		configFile = os.Getenv("SAFE_RUN_CONFIG")
	}
	if err := applySettings(fs, env, configFile); err != nil {
		return fail(usageError("%v", err))
	}
	if err := serve(f); err != nil {
		return fail(err)
	}
	return 0
}

func serve(f serveFlags) error {
	logger := newLoggerAt(parseLevel(f.logLevel, slog.LevelInfo))
	policy := sandbox.Policy{
		Default: sandbox.Limits{Timeout: f.timeout, MemoryBytes: f.limits.MemoryBytes, Processes: f.limits.Processes,
			CPUs: f.limits.CPUs, OutputBytes: f.limits.OutputBytes},
		Max: sandbox.Limits{Timeout: f.maxTimeout},
	}
	if err := policy.Validate(); err != nil {
		return usageError("the configured limits are not valid: %v", err)
	}
	token, err := readToken(f.token, f.tokenFile)
	if err != nil {
		return err
	}
	var listener net.Listener
	if f.http != "" {
		if err := f.httpLimits.check(); err != nil {
			return err
		}
		// Listen before the slow start-up, so that a mistake shows at once.
		if listener, err = listen(f.http, token, splitList(f.hosts, ",")); err != nil {
			return err
		}
		defer listener.Close()
		listener = mcp.LimitConnections(listener, f.httpLimits.maxConnections)
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
		return err
	}
	defer closeAuditLog(auditLog, f.audit.path, logger)

	cfg, err := f.host.runtimeConfig()
	if err != nil {
		return err
	}
	policy.Languages, policy.Images = cfg.Policy.Languages, splitList(f.images, ",")
	for _, ref := range policy.Images {
		if _, err := f.host.store().Lookup(ref); err != nil {
			return fmt.Errorf("--images: %w", err)
		}
	}
	cfg.Policy, cfg.Logger, cfg.Sessions = policy, logger, f.sessions
	if auditLog != nil {
		// Sessions also end without a call: idle, too old, or at exit.
		cfg.Sessions.OnEnd = func(info sandbox.SessionInfo, reason string) {
			rec := audit.Record{Time: time.Now().UTC(), Event: audit.EventSessionEnd, SessionID: info.ID,
				Language: info.Language, Status: "ok", Message: reason,
				DurationMS: time.Since(info.Created).Milliseconds()}
			if err := auditLog.Append(rec); err != nil {
				logger.Error("AUDIT LOG WRITE FAILED: the end of a session is not recorded; runs are refused until the log is writable", "session", info.ID, "err", err)
			}
		}
	}
	if cfg.Pool, err = f.pool.config(f.host.cacheDir); err != nil {
		return err
	}
	// Metrics exist only over HTTP. They are made before the runtime, whose
	// pool starts sandboxes at once; the gauges read rt only when scraped.
	var rt backend
	var metrics *mcp.Metrics
	gate := sandbox.NewGate(f.maxConcurrent, f.maxQueue)
	if listener != nil {
		metrics = mcp.NewMetrics(mcp.Gauges{
			LiveSandboxes: func() int { return rt.LiveSandboxes() },
			Sessions:      func() int { return len(rt.ListSessions()) },
			Gate:          gate,
			PoolSizes:     func() map[string]int { return rt.PoolSizes() }, // none without --pool
		})
		cfg.ObserveStart = metrics.ObserveSandboxStart
	}
	if rt, err = newBackend(cfg); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	defer func() {
		// Cancelled runs clean up after themselves; the pool and sessions
		// are closed.
		rt.Close()
		drain, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := rt.Wait(drain); err != nil {
			logger.Error("runs still cleaning up at exit", "err", err)
		}
	}()

	probeStart := time.Now()
	env := mcp.ProbeEnvironment(ctx, rt, policy)
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
	mcpCfg := mcp.Config{
		Runner: runner, Sessions: sessions, Policy: policy, Environment: env,
		Gate:       gate,
		MaxTimeout: f.maxTimeout, Version: version, Logger: logger,
		Metrics: metrics,
	}
	if auditLog != nil {
		mcpCfg.Audit = auditLog
	}
	srv := mcp.NewServer(mcpCfg)

	if listener == nil {
		logger.Info("serving MCP over stdio")
		stdio := server.NewStdioServer(srv)
		stdio.SetErrorLogger(log.New(os.Stderr, "safe-run: ", 0))
		// Enough workers that no call waits inside the library, where a
		// cancellation would be lost; the gate does the queueing.
		server.WithWorkerPoolSize(min(100, f.maxConcurrent+f.maxQueue+4))(stdio)
		if err := stdio.Listen(ctx, os.Stdin, os.Stdout); err != nil && !errors.Is(err, context.Canceled) {
			return fmt.Errorf("serve stdio: %w", err)
		}
		return nil
	}

	handler := mcp.HTTPHandler(srv, mcp.HTTPConfig{
		Token:          token,
		AllowedOrigins: splitList(f.origins, ","),
		AllowedHosts:   splitList(f.hosts, ","),
		MaxBodyBytes:   f.maxBody,
		Metrics:        metrics.Handler(),
		BodyTimeout:    f.httpLimits.readTimeout, WriteTimeout: f.httpLimits.writeTimeout,
		MaxResponseBytes: f.httpLimits.maxResponse, MaxInFlightBytes: f.httpLimits.maxInFlight,
	})
	// No ReadTimeout or WriteTimeout: both would end long runs and their
	// SSE streams; the handler sets per-body and per-write deadlines.
	httpSrv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: f.httpLimits.idleTimeout,
		BaseContext: func(net.Listener) context.Context { return ctx }}
	fmt.Fprintf(os.Stderr, "safe-run: serving MCP at http://%s%s\n", listener.Addr(), mcp.HTTPPath)
	errc := make(chan error, 1)
	go func() { errc <- httpSrv.Serve(listener) }()
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

// readToken returns the token, from file if one is named. The file must be
// the owner's alone: a token others can read or replace guards nothing.
func readToken(token, file string) (string, error) {
	if file == "" {
		return token, nil
	}
	fd, err := os.Open(file)
	if err != nil {
		return "", fmt.Errorf("read token file: %w", err)
	}
	defer fd.Close()
	info, err := fd.Stat()
	if err != nil {
		return "", fmt.Errorf("read token file: %w", err)
	}
	if !info.Mode().IsRegular() {
		return "", usageError("token file %s is not a regular file", file)
	}
	if perm := info.Mode().Perm(); perm&0o077 != 0 {
		return "", usageError("token file %s can be read or changed by other users (mode %04o); chmod 600 %s", file, perm, file)
	}
	data, err := io.ReadAll(io.LimitReader(fd, 64<<10))
	if err != nil {
		return "", fmt.Errorf("read token file: %w", err)
	}
	t := strings.TrimSpace(string(data))
	if t == "" {
		return "", fmt.Errorf("token file %s is empty", file)
	}
	return t, nil
}
