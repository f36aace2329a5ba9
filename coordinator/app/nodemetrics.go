package app

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodefence/nodefence/coordinator/engine"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// nodeMetrics are the leader's gauges of each node and of the operator's pause, read from the
// engine at scrape time. The agent-down alert judges a node by whether the leader holds its
// agent's stream: a dead host cannot report that its own agent is down. A node a fence confirmed
// off is marked, so the alert leaves it out; the dashboard's node and zone selectors read the
// node and zone labels. A follower reports none of these.
type nodeMetrics struct {
	a                                              *App
	connected, poweredOff, ready, paused, watchdog *prometheus.Desc
}

// nodeMetricsTimeout bounds the engine query of one scrape.
const nodeMetricsTimeout = 2 * time.Second

func newNodeMetrics(a *App) *nodeMetrics {
	labels := []string{"node", "zone"}
	return &nodeMetrics{a: a,
		connected: prometheus.NewDesc("nodefence_node_agent_connected",
			"1 while the node's agent holds a stream to the leader, else 0 (the leader's view; a follower reports nothing).", labels, nil),
		poweredOff: prometheus.NewDesc("nodefence_node_powered_off",
			"1 while a fence has confirmed the node off and its agent has not said hello since, else 0.", labels, nil),
		ready: prometheus.NewDesc("nodefence_node_ready",
			"1 while the leader judges the node Ready, else 0.", labels, nil),
		watchdog: prometheus.NewDesc("nodefence_node_watchdog_armed",
			"1 while the node's agent reports its watchdog armed (node-agent --watchdog-device), else 0.", labels, nil),
		paused: prometheus.NewDesc("nodefence_evictions_paused",
			"1 while an operator has paused pod evictions and automatic fencing (fencectl pause), else 0.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (m *nodeMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.connected
	ch <- m.poweredOff
	ch <- m.ready
	ch <- m.paused
	ch <- m.watchdog
}

// Collect implements prometheus.Collector: one query of the leader's engine.
func (m *nodeMetrics) Collect(ch chan<- prometheus.Metric) {
	m.a.mu.Lock()
	l := m.a.leading
	m.a.mu.Unlock()
	if l == nil {
		return
	}
	type row struct {
		node, zone                        string
		connected, off, isReady, watchdog bool
	}
	var rows []row
	var paused bool
	ctx, cancel := context.WithTimeout(l.Term.Context(), nodeMetricsTimeout)
	defer cancel()
	err := l.Loop.Query(ctx, func(e *engine.Engine) {
		for _, n := range e.Nodes() {
			zone, _, _ := e.ZoneOf(n.Name)
			rows = append(rows, row{n.Name, zone, n.Connected, e.PoweredOff(n.Name), n.Readiness == coordv1.Readiness_READINESS_READY, n.WatchdogArmed})
		}
		paused = e.Paused()
	})
	if err != nil {
		return
	}
	gauge := func(d *prometheus.Desc, v bool, labels ...string) {
		f := 0.0
		if v {
			f = 1
		}
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, f, labels...)
	}
	for _, r := range rows {
		gauge(m.connected, r.connected, r.node, r.zone)
		gauge(m.poweredOff, r.off, r.node, r.zone)
		gauge(m.ready, r.isReady, r.node, r.zone)
		gauge(m.watchdog, r.watchdog, r.node, r.zone)
	}
	gauge(m.paused, paused)
}
