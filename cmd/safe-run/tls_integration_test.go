package main

import (
	"context"
	"crypto/tls"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
)

// TestServeHTTPS: the real server over TLS, with a token, to an MCP client
// trusting the test CA (mcp-go, and the TypeScript SDK through Node's
// NODE_EXTRA_CA_CERTS); the token is still required and plain HTTP is
// refused.
func TestServeHTTPS(t *testing.T) {
	bin := binary(t)
	dir := t.TempDir()
	ca := newTestCA(t, "safe-run test CA")
	cert, key, caFile, tokenFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem"), filepath.Join(dir, "ca.pem"), filepath.Join(dir, "token")
	ca.issue(t, 1, cert, key)
	writeFile(t, caFile, ca.pem, 0o644)
	const token = "tls-test-token-0123456789"
	writeFile(t, tokenFile, []byte(token+"\n"), 0o600)
	endpoint := startHTTPServe(t, bin, []string{"serve", "--http", "127.0.0.1:0", "--tls-cert", cert, "--tls-key", key,
		"--token-file", tokenFile, "--state-dir", filepath.Join(dir, "state"), "--log-level", "warn"}, nil)
	if !strings.HasPrefix(endpoint, "https://") {
		t.Fatalf("the server serves at %s; want https://", endpoint)
	}
	u, _ := url.Parse(endpoint)
	trusting := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.pool()}}}

	t.Run("mcp-go client trusting the CA", func(t *testing.T) {
		c, err := client.NewStreamableHttpClient(endpoint, transport.WithHTTPBasicClient(trusting),
			transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + token}))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		initialize(t, ctx, c, "tls-test")
		res, _, err := callTool(c, "run_code", map[string]any{"language": "python", "code": "print(6*7)"})
		if err != nil || res.IsError || !strings.Contains(text(res), "42") {
			t.Errorf("run_code print(6*7) over HTTPS: %v, %q; want 42", err, resultText(res))
		}
	})
	t.Run("token still required", func(t *testing.T) {
		body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
		req, _ := http.NewRequest("POST", endpoint, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := trusting.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("initialize without the token over HTTPS: %s; want 401", resp.Status)
		}
	})
	t.Run("client not trusting the CA", func(t *testing.T) {
		if _, err := servedSerial(u.Host, newTestCA(t, "another CA").pool()); err == nil {
			t.Error("a client trusting another CA completed the handshake")
		}
	})
	t.Run("plain HTTP to the TLS port", func(t *testing.T) {
		resp, body := rawExchange(t, u.Host, rawRequest("POST", u.Host, "/mcp", "", "{}"))
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "HTTPS") {
			t.Errorf("plain HTTP: %s %q; want 400 naming HTTPS", resp.Status, body)
		}
	})
	t.Run("TypeScript SDK with NODE_EXTRA_CA_CERTS", func(t *testing.T) {
		tools := os.Getenv("SAFE_RUN_NPM_CACHE")
		if tools == "" {
			tools = "/var/cache/safe-run/npm-tools"
		}
		modules := filepath.Join(tools, "node_modules")
		if _, err := exec.LookPath("node"); err != nil {
			t.Skip("node is not installed (scripts/mcp-clients.sh needs it too)")
		}
		if _, err := os.Stat(filepath.Join(modules, "@modelcontextprotocol/sdk")); err != nil {
			t.Skipf("the TypeScript SDK is not in %s; scripts/mcp-clients.sh installs it", modules)
		}
		script, _ := filepath.Abs("../../scripts/mcp-run.mjs")
		run := func(extra ...string) (string, error) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, "node", script, endpoint, token, "print(6*7)")
			cmd.Env = append(os.Environ(), append([]string{"NODE_PATH=" + modules}, extra...)...)
			out, err := cmd.CombinedOutput()
			return string(out), err
		}
		if out, err := run("NODE_EXTRA_CA_CERTS=" + caFile); err != nil || !strings.Contains(out, "42") {
			t.Errorf("the SDK trusting the CA: %v, %q; want 42", err, out)
		}
		if out, err := run(); err == nil || !strings.Contains(out, "certificate") {
			t.Errorf("the SDK not trusting the CA: %v, %q; want a certificate error", err, out)
		}
	})
}
