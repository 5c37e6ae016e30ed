package mcp

import (
	"cmp"
	"context"
	"crypto/subtle"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/mark3labs/mcp-go/server"
)

// HTTPPath is where the Streamable HTTP endpoint is served.
const HTTPPath = "/mcp"

// sessionIdleTTL ends HTTP sessions that stay silent this long.
const sessionIdleTTL = time.Hour

// HTTPConfig guards the Streamable HTTP endpoint.
type HTTPConfig struct {
	// Token, if set, must be presented as "Authorization: Bearer <token>".
	Token string
	// AllowedOrigins are browser origins allowed besides loopback ones,
	// e.g. "https://app.example.com". Requests without Origin are allowed.
	AllowedOrigins []string
	// AllowedHosts are Host header names accepted besides loopback ones;
	// "*" accepts any (only sensible with a Token).
	AllowedHosts []string
	// MaxBodyBytes caps a request body.
	MaxBodyBytes int64
	// BodyTimeout, if set, is how long a request body may take to arrive.
	BodyTimeout time.Duration
	// WriteTimeout, if set, ends a connection whose client takes none of
	// 64 KiB of response for this long.
	WriteTimeout time.Duration
	// MaxResponseBytes and MaxInFlightBytes, if both set, cap the JSON of
	// one run_code result and of all results not yet written (see
	// fitResponse).
	MaxResponseBytes, MaxInFlightBytes int64
	// SessionKey, if set, signs the Mcp-Session-Id values (HMAC-SHA256), so
	// that every server holding the same key accepts every other's: a client
	// may reach any replica, and a restarted one, as the same client. Set
	// Config.SharedSessionIDs with it. At least 32 bytes.
	SessionKey []byte
	// Logger receives the transport's diagnostics, with session IDs
	// replaced by their owner labels (see sessionsHidden); nil means
	// slog.Default().
	Logger *slog.Logger
	// Metrics, if set, is served at MetricsPath behind the same checks as
	// the MCP endpoint: a scraper sends the bearer token like any client.
	Metrics http.Handler
}

// HTTPHandler serves s over Streamable HTTP at HTTPPath, behind checks that
// keep web pages and other machines out:
//   - the Host header must name a loopback host or an allowed one, so a
//     DNS-rebinding page cannot reach a loopback server through its own name;
//   - an Origin header, which browsers send, must be a loopback origin or an
//     allowed one;
//   - the bearer token, when configured, must match;
//   - bodies over MaxBodyBytes are refused;
//   - and the limits of limitHTTP apply: slow bodies, unread responses.
func HTTPHandler(s *server.MCPServer, cfg HTTPConfig) http.Handler {
	// Stateful: a session the server never issued, or one that ended, is
	// refused (404), as the protocol asks. Idle sessions expire. The session
	// is the client's identity (see identity.go), so only the versions that
	// have one are spoken. With a SessionKey, "issued" means by any server
	// holding the key (see sessionIDs).
	ids := &sessionIDs{key: cfg.SessionKey}
	streamable := server.NewStreamableHTTPServer(s, server.WithEndpointPath(HTTPPath),
		server.WithSessionIdManager(ids), server.WithSessionIdleTTL(sessionIdleTTL),
		server.WithStreamableHTTPProtocolVersions(httpProtocolVersions()...),
		server.WithStreamableHTTPLogger(slog.New(sessionsHidden{cmp.Or(cfg.Logger, slog.Default()).Handler()})))
	mux := http.NewServeMux()
	mux.Handle(HTTPPath, guard(cfg, ids.streamsNeedASession(s, streamable)))
	if cfg.Metrics != nil {
		mux.Handle(MetricsPath, guard(cfg, cfg.Metrics))
	}
	return limitHTTP(cfg, mux)
}

func guard(cfg HTTPConfig, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !hostAllowed(r.Host, cfg.AllowedHosts) {
			http.Error(w, fmt.Sprintf("forbidden: Host %q is not a name of this server", r.Host), http.StatusForbidden)
			return
		}
		if origin := r.Header.Get("Origin"); origin != "" && !originAllowed(origin, cfg.AllowedOrigins) {
			http.Error(w, fmt.Sprintf("forbidden: Origin %q is not allowed", origin), http.StatusForbidden)
			return
		}
		if cfg.Token != "" {
			// The scheme is case-insensitive (RFC 7235); the token is not.
			scheme, got, _ := strings.Cut(r.Header.Get("Authorization"), " ")
			if !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare([]byte(got), []byte(cfg.Token)) != 1 {
				w.Header().Set("WWW-Authenticate", `Bearer realm="safe-run"`)
				http.Error(w, "unauthorized: send Authorization: Bearer <token>", http.StatusUnauthorized)
				return
			}
		}
		if cfg.MaxBodyBytes > 0 {
			if r.ContentLength > cfg.MaxBodyBytes {
				http.Error(w, fmt.Sprintf("request body of %d bytes is over the %d-byte limit", r.ContentLength, cfg.MaxBodyBytes), http.StatusRequestEntityTooLarge)
				return
			}
			r.Body = http.MaxBytesReader(w, r.Body, cfg.MaxBodyBytes)
		}
		next.ServeHTTP(w, r)
	})
}

// IsLoopbackHost reports whether host (a name or an IP, without port) is
// this machine's loopback.
func IsLoopbackHost(host string) bool {
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") || strings.HasSuffix(strings.ToLower(host), ".localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func hostAllowed(hostport string, allowed []string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	if IsLoopbackHost(host) || slices.Contains(allowed, "*") {
		return true
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	return slices.ContainsFunc(allowed, func(a string) bool { return strings.EqualFold(a, host) })
}

func originAllowed(origin string, allowed []string) bool {
	if slices.Contains(allowed, origin) {
		return true
	}
	u, err := url.Parse(origin)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return false
	}
	return IsLoopbackHost(u.Hostname())
}

// sessionsHidden is a log handler that writes, in place of a session ID, its
// owner label (ownerOf): mcp-go logs the IDs it sweeps or refuses under
// "session" or "sessionID", and an ID is the client's credential (with a
// session key, one that never expires).
type sessionsHidden struct{ slog.Handler }

func hideSession(a slog.Attr) slog.Attr {
	if (a.Key == "session" || a.Key == "sessionID") && a.Value.Kind() == slog.KindString && a.Value.String() != "" {
		return slog.String(a.Key, ownerOf(a.Value.String()))
	}
	return a
}

func (h sessionsHidden) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	r.Attrs(func(a slog.Attr) bool { out.AddAttrs(hideSession(a)); return true })
	return h.Handler.Handle(ctx, out)
}

func (h sessionsHidden) WithAttrs(attrs []slog.Attr) slog.Handler {
	hidden := make([]slog.Attr, len(attrs))
	for i, a := range attrs {
		hidden[i] = hideSession(a)
	}
	return sessionsHidden{h.Handler.WithAttrs(hidden)}
}

func (h sessionsHidden) WithGroup(name string) slog.Handler {
	return sessionsHidden{h.Handler.WithGroup(name)}
}
