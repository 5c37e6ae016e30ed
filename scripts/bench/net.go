package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/safe-run/safe-run/sandbox"
)

// netDownload is the size of the throughput row's download.
const netDownload = 64 << 20

// NetReport is the network benchmark: what a run with a network (issue
// 16) costs beside one without, through a test server on loopback reached
// by a pinned entry, as the tests reach theirs.
type NetReport struct {
	Date     string  `json:"date"`
	Machine  string  `json:"machine"`
	Runs     int     `json:"runs"`
	StartOff Stats   `json:"start_without_network"` // `safe-run run` of print(1), cold
	StartOn  Stats   `json:"start_with_network"`
	Request  float64 `json:"request_p50_ms"`      // one HTTP request on a new connection, in the sandbox
	HostReq  float64 `json:"host_request_p50_ms"` // the same request from the host, directly
	MiBps    float64 `json:"download_mib_s"`      // median of 3 downloads of netDownload bytes
}

// netServer serves netBody, or ?bytes=N bytes, on 127.0.0.1.
func netServer() (port int, stop func(), err error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, nil, err
	}
	chunk := bytes.Repeat([]byte("x"), 1<<20)
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.Atoi(r.URL.Query().Get("bytes"))
		if err != nil {
			fmt.Fprint(w, "ok")
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(n))
		for n > 0 {
			k := min(n, len(chunk))
			if _, err := w.Write(chunk[:k]); err != nil {
				return
			}
			n -= k
		}
	})}
	go srv.Serve(l)
	return l.Addr().(*net.TCPAddr).Port, func() { srv.Close() }, nil
}

// runJSON runs code with `safe-run run --json` and returns its stdout.
func runJSON(o options, stateDir string, netArgs []string, code string) (string, time.Duration, error) {
	args := append([]string{"run", "--json", "--state-dir", stateDir, "--lang", "python", "--timeout", "120s"}, netArgs...)
	start := time.Now()
	out, err := exec.Command(o.bin, append(args, "-c", code)...).Output()
	d := time.Since(start)
	var res sandbox.Result
	if jerr := json.Unmarshal(out, &res); jerr != nil {
		return "", d, fmt.Errorf("safe-run run: %v %v: %s", err, jerr, out)
	}
	if res.Status != sandbox.StatusOK {
		return "", d, fmt.Errorf("run %s: %s %s", res.Status, res.Message, res.Stderr)
	}
	return res.Stdout, d, nil
}

func runNetBench(o options) (*NetReport, error) {
	port, stop, err := netServer()
	if err != nil {
		return nil, err
	}
	defer stop()
	entry := fmt.Sprintf("bench.test=127.0.0.1:%d", port)
	netArgs := []string{"--allow-net", entry, "--net", entry}
	stateDir, err := os.MkdirTemp("", "safe-run-bench-net-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(stateDir)
	rep := &NetReport{Date: time.Now().UTC().Format("2006-01-02"), Machine: machine(), Runs: o.runs}

	// Start: the two kinds of run alternate, so that load drifts alike.
	var off, on []time.Duration
	for i := range o.runs + 1 {
		_, d1, err := runJSON(o, stateDir, nil, "print(1)")
		if err != nil {
			return nil, err
		}
		_, d2, err := runJSON(o, stateDir, netArgs, "print(1)")
		if err != nil {
			return nil, err
		}
		if i > 0 { // the first of each warms the caches
			off, on = append(off, d1), append(on, d2)
		}
	}
	rep.StartOff, rep.StartOn = summarise(off), summarise(on)
	log.Printf("start without network p50 %.1f ms, with %.1f ms", rep.StartOff.P50, rep.StartOn.P50)

	// Request latency: a new connection (and DNS question) per request.
	out, _, err := runJSON(o, stateDir, netArgs, fmt.Sprintf(`import http.client, statistics, time
ts = []
for i in range(%d):
    t = time.perf_counter()
    c = http.client.HTTPConnection("bench.test", %d, timeout=10); c.request("GET", "/"); c.getresponse().read(); c.close()
    ts.append(time.perf_counter() - t)
print(statistics.median(ts[1:]) * 1000)`, o.runs+1, port))
	if err != nil {
		return nil, err
	}
	if rep.Request, err = strconv.ParseFloat(strings.TrimSpace(out), 64); err != nil {
		return nil, fmt.Errorf("request latency: %q", out)
	}
	var host []time.Duration
	for range o.runs {
		t := time.Now()
		resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
		if err != nil {
			return nil, err
		}
		resp.Body.Close()
		host = append(host, time.Since(t))
	}
	rep.HostReq = summarise(host).P50
	log.Printf("request p50 %.2f ms through the stack, %.2f ms from the host", rep.Request, rep.HostReq)

	// Throughput: the download's time inside the sandbox.
	var rates []float64
	for range 3 {
		out, _, err := runJSON(o, stateDir, netArgs, fmt.Sprintf(`import socket, time
s = socket.create_connection(("bench.test", %d), timeout=30)
s.sendall(b"GET /?bytes=%d HTTP/1.0\r\nHost: bench.test\r\n\r\n")
t, n = time.perf_counter(), 0
while True:
    b = s.recv(1 << 20)
    if not b: break
    n += len(b)
print(n, time.perf_counter() - t)`, port, netDownload))
		if err != nil {
			return nil, err
		}
		f := strings.Fields(out)
		n, _ := strconv.Atoi(f[0])
		secs, _ := strconv.ParseFloat(f[len(f)-1], 64)
		if n < netDownload || secs <= 0 {
			return nil, fmt.Errorf("download: %q", out)
		}
		rates = append(rates, float64(n)/(1<<20)/secs)
	}
	slices.Sort(rates)
	rep.MiBps = rates[1]
	log.Printf("64 MiB download %.0f MiB/s", rep.MiBps)
	return rep, nil
}

func (rep *NetReport) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Measured %s on %s; p50 of %d runs (`%s`).\n\n", rep.Date, rep.Machine, rep.Runs, "go run ./scripts/bench -net")
	b.WriteString("| Network (issue 16) | without network | with network |\n|---|---|---|\n")
	fmt.Fprintf(&b, "| `safe-run run` of `print(1)`, cold: start to result | %.0f ms | %.0f ms |\n", rep.StartOff.P50, rep.StartOn.P50)
	fmt.Fprintf(&b, "| one HTTP request on a new connection (DNS, connect, answer) | %.2f ms (host, direct) | %.2f ms (sandbox, through the helper) |\n", rep.HostReq, rep.Request)
	fmt.Fprintf(&b, "| 64 MiB download from a loopback server through a pinned entry | — | %.0f MiB/s |\n", rep.MiBps)
	return b.String()
}

// netMain measures only the network rows and writes them to net.{md,json}
// and docs/benchmarks.md's bench-net section.
func netMain(o options) {
	rep, err := runNetBench(o)
	if err != nil {
		fatal(err)
	}
	writeReport(o, "net", "bench-net", rep, rep.markdown())
}
