package main

// Threat cases of the HTTP server itself, not of the sandbox: clients that
// never read their responses, send their bodies a byte at a time, keep
// idle connections, open too many; and listen settings that would expose
// the server without a token. The timeouts are shortened through the
// environment (SAFE_RUN_READ_TIMEOUT and the like), which a server that
// does not know them ignores: then the case shows the attack succeeding.

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	goruntime "runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/safe-run/safe-run/runtime/gvisor"
	"github.com/safe-run/safe-run/sandbox"
)

// httpServe is a `safe-run serve --http` the test started itself.
type httpServe struct {
	url, addr string
	pid       int
}

// serveHTTP starts safe-run serve on a loopback port with env added to its
// environment and returns once it serves.
func serveHTTP(t *testing.T, env []string, args ...string) *httpServe {
	t.Helper()
	stateDir := filepath.Join(t.TempDir(), "state")
	url := startHTTPServe(t, binary(t), append([]string{"serve", "--http", "127.0.0.1:0", "--state-dir", stateDir, "--log-level", "warn"}, args...), env)
	addr := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/mcp")
	// Without root the serving process is the child of the one started.
	return &httpServe{url: url, addr: addr, pid: serverPid(t, stateDir)}
}

// startHTTPServe starts bin with args (a serve --http) and env added to
// its environment, stops it with SIGINT when the test ends, and returns
// the URL it serves at.
func startHTTPServe(t *testing.T, bin string, args, env []string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			t.Error("the HTTP server did not stop within 30s of SIGINT")
		}
	})
	return waitForURL(t, stderr)
}

// rawRequest is an HTTP/1.1 request written by hand, for clients no
// library would imitate.
func rawRequest(method, addr, path, sessionID, body string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n", method, path, addr)
	if sessionID != "" {
		fmt.Fprintf(&b, "Mcp-Session-Id: %s\r\nMcp-Protocol-Version: 2025-06-18\r\n", sessionID)
	}
	fmt.Fprintf(&b, "Content-Length: %d\r\n\r\n%s", len(body), body)
	return b.String()
}

// mcpSession initializes an MCP session by hand and returns its id.
func mcpSession(t *testing.T, addr string) string {
	t.Helper()
	init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"threat-http","version":"1"}}}`
	resp, body := rawExchange(t, addr, rawRequest("POST", addr, "/mcp", "", init))
	id := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || id == "" {
		t.Fatalf("initialize: %s %q", resp.Status, body)
	}
	rawExchange(t, addr, rawRequest("POST", addr, "/mcp", id, `{"jsonrpc":"2.0","method":"notifications/initialized"}`))
	return id
}

// rawExchange sends one request on a new connection and reads the response.
func rawExchange(t *testing.T, addr, req string) (*http.Response, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(60 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

// runsTotal reads how many runs the server has finished from its metrics.
func runsTotal(addr string) int {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	n := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if m := runsTotalLine.FindStringSubmatch(sc.Text()); m != nil {
			v, _ := strconv.ParseFloat(m[1], 64)
			n += int(v)
		}
	}
	return n
}

var runsTotalLine = regexp.MustCompile(`^safe_run_runs_total\{.*\} ([0-9.e+]+)$`)

// unreadAttack is the program whose results the attacker never reads: 32
// MiB of incompressible files (the most a run returns) and 1 MiB of '<' on
// stdout, each of which JSON spells in six bytes.
const unreadAttack = `for i in 1 2 3 4; do head -c $((8 * 1024 * 1024 - 4096)) /dev/urandom > out/f$i.bin; done
head -c $((1024 * 1024)) /dev/zero | tr '\0' '<'`

// unreadCalls is how many results the attacker leaves unread.
const unreadCalls = 12

// unreadRSSBound is the server's peak RSS the README states under the
// default limits but --max-concurrent (see "HTTP server limits").
func unreadRSSBound(maxConcurrent int) int64 {
	var l httpLimits
	l.register(flag.NewFlagSet("", flag.ContinueOnError))
	return memoryBound(l, maxConcurrent, sandbox.DefaultLimits.OutputBytes, 0)
}

// TestThreatHTTPUnreadResponses leaves the largest results unread and
// checks that the server's peak memory stays under the
// stated bound and that it still answers a client that reads.
func TestThreatHTTPUnreadResponses(t *testing.T) {
	s := serveHTTP(t, nil)
	_, hwmBefore := rss(s.pid)
	peak, rssAfter := attackUnread(t, s.addr, s.pid, unreadCalls)
	t.Logf("server RSS: peak before the attack %s, peak during it %s, after it %s (bound %s)", mib(hwmBefore), mib(peak), mib(rssAfter), mib(unreadRSSBound(goruntime.NumCPU())))
	if peak > unreadRSSBound(goruntime.NumCPU()) {
		t.Errorf("the server's peak RSS reached %s with %d results unread; the bound is %s", mib(peak), unreadCalls, mib(unreadRSSBound(goruntime.NumCPU())))
	}
	// A client that reads is still served.
	c := connectHTTP(t, s.url, "threat-http-reader")
	defer c.Close()
	ts := &testServer{client: c}
	res, out := ts.mustCall(t, map[string]any{"language": "bash", "code": "echo still-here"})
	if out["stdout"] != "still-here\n" {
		t.Errorf("a reading client after the attack got %q", text(res))
	}
}

// attackUnread makes calls run_code calls with the largest results a run
// can have on connections that never read a byte of the response, until
// all have run, and returns the server's peak RSS (VmHWM) and its RSS then.
func attackUnread(t *testing.T, addr string, pid, calls int) (peak, rssAfter int64) {
	t.Helper()
	id := mcpSession(t, addr)
	before := runsTotal(addr)
	args, _ := json.Marshal(map[string]any{"language": "bash", "code": unreadAttack})
	for i := range calls {
		call := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"run_code","arguments":%s}}`, 100+i, args)
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() }) // never read before the end of the test
		if _, err := io.WriteString(c, rawRequest("POST", addr, "/mcp", id, call)); err != nil {
			t.Fatal(err)
		}
	}
	// Every call has run (their results may have been refused, which the
	// metrics count too) and the server holds what it holds.
	waitUntil(t, 10*time.Minute, func() bool {
		if _, hwm := rss(pid); hwm > peak {
			peak = hwm
		}
		return runsTotal(addr) >= before+calls
	})
	time.Sleep(3 * time.Second)
	rssAfter, hwm := rss(pid)
	return max(peak, hwm), rssAfter
}

// TestThreatHTTPSlowBody sends a request body a byte a second: the server
// must give up on it within its read timeout, not hold the connection.
func TestThreatHTTPSlowBody(t *testing.T) {
	s := serveHTTP(t, []string{"SAFE_RUN_READ_TIMEOUT=2s"})
	c, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	head := rawRequest("POST", s.addr, "/mcp", "", strings.Repeat(" ", 200))
	head = head[:len(head)-200]
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, c)
		closed <- err
	}()
	// Far longer than the 2 s timeout; the server that has none keeps the
	// connection past it.
	for range 30 {
		select {
		case <-closed:
			return
		case <-time.After(time.Second):
		}
		if _, err := io.WriteString(c, " "); err != nil {
			return // closed by the server
		}
	}
	t.Error("a body sent at 1 byte/s kept its connection open for 30 s (read timeout 2 s)")
}

// TestThreatHTTPIdleKeepAlive leaves a kept-alive connection idle after a
// response: the server must close it after its idle timeout.
func TestThreatHTTPIdleKeepAlive(t *testing.T) {
	s := serveHTTP(t, []string{"SAFE_RUN_IDLE_TIMEOUT=2s"})
	c, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, rawRequest("GET", s.addr, "/metrics", "", "")); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("metrics: %s (close %v); want 200 on a kept-alive connection", resp.Status, resp.Close)
	}
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := r.ReadByte(); err != io.EOF {
		t.Errorf("an idle kept-alive connection was not closed by the server within 30 s (idle timeout 2 s): %v", err)
	}
}

// TestThreatHTTPConnectionCap holds as many connections as the server
// allows: one more is refused with a 503 naming the limit, and served
// again once a connection closes.
func TestThreatHTTPConnectionCap(t *testing.T) {
	const limit = 4
	s := serveHTTP(t, []string{"SAFE_RUN_MAX_CONNECTIONS=" + strconv.Itoa(limit)})
	get := func(c net.Conn) (*http.Response, string, error) {
		c.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := io.WriteString(c, rawRequest("GET", s.addr, "/metrics", "", "")); err != nil {
			return nil, "", err
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return nil, "", err
		}
		body, _ := io.ReadAll(resp.Body)
		return resp, string(body), nil
	}
	var held []net.Conn
	for range limit {
		c, err := net.Dial("tcp", s.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if resp, _, err := get(c); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("connection %d of %d: %v %v", len(held)+1, limit, resp, err)
		}
		held = append(held, c)
	}
	extra, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	resp, body, err := get(extra)
	extra.Close()
	if err != nil || resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "connections") {
		status := "no response"
		if resp != nil {
			status = resp.Status
		}
		t.Errorf("connection %d with %d held: %s %q %v; want 503 naming the connection limit", limit+1, limit, status, body[:min(len(body), 200)], err)
	}
	held[0].Close()
	waitUntil(t, 30*time.Second, func() bool {
		c, err := net.Dial("tcp", s.addr)
		if err != nil {
			return false
		}
		defer c.Close()
		resp, _, err := get(c)
		return err == nil && resp.StatusCode == http.StatusOK
	})
}

// refusedServe runs a serve command that must be refused at once, before
// it serves, with a line naming the bearer token; a server that accepts
// it is stopped after a while.
func refusedServe(t *testing.T, cmd *exec.Cmd, want string) {
	t.Helper()
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	code := -1
	if cmd.ProcessState != nil {
		code = cmd.ProcessState.ExitCode()
	}
	if code != exitUsage || !strings.Contains(out.String(), want) || strings.Contains(out.String(), "serving MCP at") {
		t.Errorf("exit %d (%v), output %q; want exit %d and a refusal naming %q", code, err, out.String(), exitUsage, want)
	}
}

// TestThreatHTTPLocalhostName listens on a name under .localhost that
// /etc/hosts resolves to a non-loopback address, in a network and mount
// namespace of the test's own (10.213.7.1 on its loopback interface, an
// address that is not a loopback one, and a private /etc/hosts): without a token this must be refused. As root the
// namespaces are plain ones; as an ordinary user they belong to a user
// namespace of its own, where it is root.
func TestThreatHTTPLocalhostName(t *testing.T) {
	bin := binary(t)
	dir := t.TempDir()
	hosts := filepath.Join(dir, "hosts")
	if err := os.WriteFile(hosts, []byte("127.0.0.1 localhost\n10.213.7.1 evil.localhost\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	script := `set -e
ip link set lo up
ip addr add 10.213.7.1/32 dev lo
mount --bind "$1" /etc/hosts
shift
exec timeout 30 "$@"`
	args := []string{"sh", "-c", script, "sh", hosts, bin, "serve", "--http", "evil.localhost:0", "--state-dir", filepath.Join(dir, "state")}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var cmd *exec.Cmd
	if gvisor.HostRoot() {
		cmd = exec.CommandContext(ctx, "unshare", append([]string{"--net", "--mount", "--"}, args...)...)
	} else {
		cmd = hostUserNamespace(ctx, append([]string{"--net", "--"}, args...)...)
	}
	refusedServe(t, cmd, "bearer token")
}

// TestThreatHTTPAnyHostNeedsToken: --allowed-hosts '*' turns the Host
// check off, so it is treated as listening beyond loopback.
func TestThreatHTTPAnyHostNeedsToken(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary(t), "serve", "--http", "127.0.0.1:0", "--allowed-hosts", "*",
		"--state-dir", filepath.Join(t.TempDir(), "state"))
	cmd.WaitDelay = 5 * time.Second
	refusedServe(t, cmd, "bearer token")
}

// TestThreatHTTPTokenFilePermissions: a token file others may read is
// refused; the same file private to its owner is accepted.
func TestThreatHTTPTokenFilePermissions(t *testing.T) {
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte("s3cret-"+randomHex(8)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chmod(file, 0o644) // past the umask
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary(t), "serve", "--http", "127.0.0.1:0", "--token-file", file,
		"--state-dir", filepath.Join(t.TempDir(), "state"))
	cmd.WaitDelay = 5 * time.Second
	refusedServe(t, cmd, "chmod 600")

	// The positive control: the same file, private, serves.
	if err := os.Chmod(file, 0o600); err != nil {
		t.Fatal(err)
	}
	serveHTTP(t, nil, "--token-file", file)
}
