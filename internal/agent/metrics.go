package agent

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics are the agent's Prometheus metrics (docs/agent.md).
type metrics struct {
	reg        *prometheus.Registry
	connected  *prometheus.GaugeVec
	revision   *prometheus.GaugeVec
	failStatic *prometheus.GaugeVec
	applies    *prometheus.CounterVec
	applyErrs  prometheus.Counter
	msgErrs    *prometheus.CounterVec
	reconnects *prometheus.CounterVec
	rules      prometheus.Gauge
	elements   prometheus.Gauge
	applyTime  prometheus.Histogram
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		connected: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "verdict_agent_connected",
			Help: "1 while the workload's WatchRules stream is up."}, []string{"workload"}),
		revision: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "verdict_agent_revision",
			Help: "The revision of the workload's rules programmed last."}, []string{"workload"}),
		failStatic: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "verdict_agent_fail_static",
			Help: "1 while the workload's stream is down and its last rules stay in force."}, []string{"workload"}),
		applies: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "verdict_agent_applies_total",
			Help: "Netlink batches applied: kind full (the table replaced whole) or elements (set elements only)."}, []string{"kind"}),
		applyErrs: prometheus.NewCounter(prometheus.CounterOpts{Name: "verdict_agent_apply_errors_total",
			Help: "Batches the kernel refused (the next apply replaces the table whole)."}),
		msgErrs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "verdict_agent_message_errors_total",
			Help: "WatchRules messages refused as unreadable (the last rules stay; the stream reconnects)."}, []string{"workload"}),
		reconnects: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "verdict_agent_stream_errors_total",
			Help: "WatchRules streams that failed or ended (each is retried with backoff)."}, []string{"workload"}),
		rules: prometheus.NewGauge(prometheus.GaugeOpts{Name: "verdict_agent_rules",
			Help: "nftables rules in the agent's table."}),
		elements: prometheus.NewGauge(prometheus.GaugeOpts{Name: "verdict_agent_set_elements",
			Help: "Interval elements in the agent's sets."}),
		applyTime: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "verdict_agent_apply_seconds",
			Help: "Time of one apply: rendering and the netlink batch.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
	}
	m.reg.MustRegister(m.connected, m.revision, m.failStatic, m.applies, m.applyErrs, m.msgErrs, m.reconnects,
		m.rules, m.elements, m.applyTime, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}
