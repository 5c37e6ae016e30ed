package mcp

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/safe-run/safe-run/egress"
	"github.com/safe-run/safe-run/sandbox"
)

// MetricsPath is where HTTPHandler serves the metrics.
const MetricsPath = "/metrics"

// Gauges are read at every scrape. A nil field leaves its metric out.
type Gauges struct {
	// LiveSandboxes counts sandboxes started and not yet destroyed.
	LiveSandboxes func() int
	// Sessions counts live sessions.
	Sessions func() int
	// Gate gives the runs holding a slot and the calls waiting for one.
	Gate *sandbox.Gate
	// PoolSizes gives the idle pre-started sandboxes per language. Nil (no
	// pool) leaves the metric out.
	PoolSizes func() map[string]int
}

// Metrics are the Prometheus metrics of a server: runs by language and
// status, run and sandbox start durations, and the gauges.
type Metrics struct {
	registry *prometheus.Registry
	runs     *prometheus.CounterVec
	cached   *prometheus.CounterVec
	duration *prometheus.HistogramVec
	starts   prometheus.Histogram
	egress   *prometheus.CounterVec
	bytes    *prometheus.CounterVec
	events   *prometheus.CounterVec
	rules    *prometheus.CounterVec
}

// NewMetrics registers the metrics, the Go runtime's and the process's.
func NewMetrics(g Gauges) *Metrics {
	m := &Metrics{
		registry: prometheus.NewRegistry(),
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "safe_run_runs_total",
			Help: "Runs of code by language and status (ok, error, timeout, oom, killed, sandbox_error, or refused by the runner).",
		}, []string{"language", "status"}),
		cached: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "safe_run_cached_results_total",
			Help: "run_code calls answered from the result cache, by language; they are not runs.",
		}, []string{"language"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "safe_run_run_duration_seconds",
			Help:    "Wall time of runs, sandbox start included, by language.",
			Buckets: []float64{0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600},
		}, []string{"language"}),
		starts: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "safe_run_sandbox_start_seconds",
			Help:    "Time from starting a sandbox to its agent being ready.",
			Buckets: []float64{0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2, 5, 10, 30, 60},
		}),
		egress: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "safe_run_egress_connections_total",
			Help: "Network decisions of runs with a network, by decision (allowed, denied): TCP connections, DNS questions and dropped datagrams.",
		}, []string{"decision"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "safe_run_egress_bytes_total",
			Help: "Bytes carried by the allowed connections of runs with a network, by direction (out: sent by the sandbox, in: received).",
		}, []string{"direction"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "safe_run_monitor_events_total",
			Help: "Trace points the behaviour monitor received from runs' sandboxes, by kind (execve, clone, connect, openat, ...).",
		}, []string{"kind"}),
		rules: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "safe_run_monitor_rules_total",
			Help: "Behaviour monitoring rules that fired in runs, by rule and action (record, kill, deny-future-calls).",
		}, []string{"rule", "action"}),
	}
	m.registry.MustRegister(m.runs, m.cached, m.duration, m.starts, m.egress, m.bytes, m.events, m.rules,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	gauge := func(name, help string, f func() int) {
		if f != nil {
			m.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help},
				func() float64 { return float64(f()) }))
		}
	}
	gauge("safe_run_live_sandboxes", "Sandboxes started and not yet destroyed (runs, sessions and pools).", g.LiveSandboxes)
	gauge("safe_run_sessions", "Live sessions.", g.Sessions)
	if g.Gate != nil {
		gauge("safe_run_runs_in_progress", "Runs holding one of the --max-concurrent slots.", func() int { r, _ := g.Gate.Load(); return r })
		gauge("safe_run_queue_length", "Calls waiting for a slot.", func() int { _, w := g.Gate.Load(); return w })
	}
	if g.PoolSizes != nil {
		m.registry.MustRegister(poolCollector{g.PoolSizes})
	}
	return m
}

// ObserveSandboxStart records how long a sandbox took to be ready.
func (m *Metrics) ObserveSandboxStart(d time.Duration) {
	if m != nil {
		m.starts.Observe(d.Seconds())
	}
}

func (m *Metrics) observeRun(language, status string, d time.Duration, cached bool) {
	switch {
	case m == nil:
	case cached:
		m.cached.WithLabelValues(language).Inc()
	default:
		m.runs.WithLabelValues(language, status).Inc()
		m.duration.WithLabelValues(language).Observe(d.Seconds())
	}
}

// observeNetwork counts a result's network records: each decision once
// (a connection's open and close records share an ID, and its bytes are
// counted from its last record of the result).
func (m *Metrics) observeNetwork(r *egress.Report) {
	if m == nil || r == nil {
		return
	}
	counted := map[uint64]bool{}
	last := map[uint64]egress.Connection{}
	for _, c := range r.Connections {
		if !counted[c.ID] {
			counted[c.ID] = true
			m.egress.WithLabelValues(c.Decision).Inc()
		}
		last[c.ID] = c
	}
	var out, in int64
	for _, c := range last {
		out, in = out+c.BytesOut, in+c.BytesIn
	}
	m.bytes.WithLabelValues("out").Add(float64(out))
	m.bytes.WithLabelValues("in").Add(float64(in))
}

// observeActivity counts a result's monitored events and rule hits. The
// kinds are the monitor's own names and the rules the operator's, so the
// labels stay few whatever the sandbox does.
func (m *Metrics) observeActivity(a *sandbox.Activity) {
	if m == nil || a == nil {
		return
	}
	for kind, n := range a.Events {
		m.events.WithLabelValues(kind).Add(float64(n))
	}
	for _, h := range a.Rules {
		m.rules.WithLabelValues(h.Rule, h.Action).Inc()
	}
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{})
}

var poolDesc = prometheus.NewDesc("safe_run_pool_sandboxes", "Idle pre-started sandboxes, by language.", []string{"language"}, nil)

// poolCollector reports the pool sizes as they are at the scrape.
type poolCollector struct{ sizes func() map[string]int }

func (c poolCollector) Describe(ch chan<- *prometheus.Desc) { ch <- poolDesc }

func (c poolCollector) Collect(ch chan<- prometheus.Metric) {
	for lang, n := range c.sizes() {
		ch <- prometheus.MustNewConstMetric(poolDesc, prometheus.GaugeValue, float64(n), lang)
	}
}
