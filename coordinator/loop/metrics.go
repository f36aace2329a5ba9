package loop

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodefence/nodefence/coordinator/engine"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// Metrics are the loop's Prometheus collectors, with kube-controller-manager's names under the
// nodefence_ prefix where Kubernetes has one.
type Metrics struct {
	ZoneHealth     *prometheus.GaugeVec
	ZoneSize       *prometheus.GaugeVec
	UnhealthyNodes *prometheus.GaugeVec
	Evictions      *prometheus.CounterVec
	Updates        prometheus.Counter
	ApplyLatency   prometheus.Histogram
	// QueueLatency is the coordinator's own share: from the stream receiving a message to the
	// engine applying it.
	QueueLatency  prometheus.Histogram
	FenceSkips    *prometheus.CounterVec
	FenceRequests prometheus.Counter
	// WitnessDown counts the nodes one of whose two witnesses (Kubernetes mode) is down while the
	// other reports, by witness: agent or kubelet.
	WitnessDown *prometheus.GaugeVec
	// FenceStages observes, per stage, how long a fence took: confirm (record created -> power-off
	// or isolation confirmed), finish (created -> finished).
	FenceStages *prometheus.HistogramVec
	// Recovery observes, for automatic fences, the seconds from the node's last witness contact
	// (its death, as near as the coordinator can tell) to each phase of its recovery.
	Recovery *prometheus.HistogramVec
	// PodGrants counts soft-threshold pod evictions granted, by zone.
	PodGrants *prometheus.CounterVec
	// PodCandidatesHeld is how many nodes' eviction candidates wait for their zone's budget.
	PodCandidatesHeld *prometheus.GaugeVec
	// PodEvictionsLocal counts pod evictions agents carried out on their own (hard thresholds and
	// fallbacks when no grant came), by zone.
	PodEvictionsLocal *prometheus.GaugeVec
	// PodEvictionFallbacks counts the local evictions that were candidates no grant came for, by
	// zone.
	PodEvictionFallbacks *prometheus.GaugeVec
	// AgentEventsDropped counts agent events whose writes their node's rate limit held back
	// (coalesced) or dropped, by kind (engine.Drop).
	AgentEventsDropped *prometheus.CounterVec
	// seen remembers which records' stages were observed (bounded: cleared when large).
	seen map[string]bool
	mu   sync.Mutex
}

// ObserveFence records the stage durations a record reached, once per record and stage.
func (m *Metrics) ObserveFence(f *coordv1.NodeFence) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.seen) > 10000 {
		m.seen = map[string]bool{}
	}
	created := f.GetCreatedAt().AsTime()
	if f.LastContactAt != nil && !m.seen[f.Id+"/decision"] {
		m.seen[f.Id+"/decision"] = true
		m.Recovery.WithLabelValues(RecoveryDecision).Observe(created.Sub(f.LastContactAt.AsTime()).Seconds())
	}
	if f.LastContactAt != nil && f.ConfirmedOffAt != nil && !m.seen[f.Id+"/recovery-confirm"] {
		m.seen[f.Id+"/recovery-confirm"] = true
		m.Recovery.WithLabelValues(RecoveryConfirmedOff).Observe(f.ConfirmedOffAt.AsTime().Sub(f.LastContactAt.AsTime()).Seconds())
	}
	if f.ConfirmedOffAt != nil && !m.seen[f.Id+"/confirm"] {
		m.seen[f.Id+"/confirm"] = true
		m.FenceStages.WithLabelValues("confirm").Observe(f.ConfirmedOffAt.AsTime().Sub(created).Seconds())
	}
	if f.FinishedAt != nil && !m.seen[f.Id+"/finish"] {
		m.seen[f.Id+"/finish"] = true
		m.FenceStages.WithLabelValues("finish").Observe(f.FinishedAt.AsTime().Sub(created).Seconds())
	}
}

// Recovery phases (nodefence_recovery_seconds{phase}).
const (
	RecoveryNotReady     = "not-ready"     // judged failed: not ready past the grace, or (--fence-detect witnesses) both witnesses silent past their windows
	RecoveryDecision     = "decision"      // the automatic fence decided (record created)
	RecoveryConfirmedOff = "confirmed-off" // a driver's read-back confirmed the node off
	RecoveryReleased     = "released"      // its pods released (Kubernetes mode)
)

// ObserveRecovery records the seconds from the node's last contact to phase for an automatic
// fence (records without a last contact are not observed).
func (m *Metrics) ObserveRecovery(f *coordv1.NodeFence, phase string, at time.Time) {
	if m == nil || f.GetLastContactAt() == nil {
		return
	}
	m.Recovery.WithLabelValues(phase).Observe(at.Sub(f.LastContactAt.AsTime()).Seconds())
}

// ObserveStage records one stage duration (detect, decide, release, recover) measured elsewhere.
func (m *Metrics) ObserveStage(stage string, d time.Duration) {
	if m != nil {
		m.FenceStages.WithLabelValues(stage).Observe(d.Seconds())
	}
}

// NewMetrics registers the collectors on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		ZoneHealth: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "nodefence_zone_health",
			Help: "Percentage of healthy nodes per zone."}, []string{"zone"}),
		ZoneSize: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "nodefence_zone_size",
			Help: "Number of nodes per zone."}, []string{"zone"}),
		UnhealthyNodes: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "nodefence_unhealthy_nodes_in_zone",
			Help: "Number of not-ready nodes per zone."}, []string{"zone"}),
		Evictions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nodefence_evictions_total",
			Help: "Nodes released from a zone's eviction queue."}, []string{"zone"}),
		Updates: prometheus.NewCounter(prometheus.CounterOpts{Name: "nodefence_agent_updates_total",
			Help: "Agent messages applied by the engine."}),
		ApplyLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "nodefence_sample_apply_latency_seconds",
			Help:    "From a sample's observed_at on the agent to the engine having applied it.",
			Buckets: []float64{.00025, .0005, .001, .002, .003, .005, .0075, .01, .015, .02, .03, .04, .05, .075, .1, .2, .5, 1, 2, 5}}),
	}
	m.QueueLatency = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "nodefence_engine_queue_latency_seconds",
		Help:    "From the coordinator receiving an agent message to the engine having applied it.",
		Buckets: []float64{.00005, .0001, .00025, .0005, .001, .002, .005, .01, .02, .05, .1, .5, 1}})
	m.FenceSkips = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nodefence_fence_skips_total",
		Help: "Automatic fences held back by the storm guard, by kind."}, []string{"kind"})
	m.FenceRequests = prometheus.NewCounter(prometheus.CounterOpts{Name: "nodefence_fence_requests_total",
		Help: "Automatic fences requested by the engine."})
	m.FenceStages = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "nodefence_fence_stage_seconds",
		Help:    "Duration of each fencing stage: detect (last contact -> not ready), decide (not ready -> fence requested), confirm (requested -> confirmed off), finish (requested -> finished).",
		Buckets: []float64{.05, .1, .25, .5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800}}, []string{"stage"})
	// Known label values start at zero, so rules and dashboards see 0 rather than no series.
	for _, kind := range []string{"halted", "paused", "zone-disrupted", "cluster-unresponsive", "zone-unresponsive", "budget", "excluded"} {
		m.FenceSkips.WithLabelValues(kind)
	}
	for _, stage := range []string{"detect", "decide", "confirm", "finish", "release"} {
		m.FenceStages.WithLabelValues(stage)
	}
	m.Recovery = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "nodefence_recovery_seconds",
		Help:    "Automatic fences: seconds from the node's last witness contact to each recovery phase: not-ready, decision (fence requested), confirmed-off (read-back), released (its pods released, Kubernetes mode). fencectl timeline shows one fence's phases.",
		Buckets: []float64{1, 2, 5, 10, 15, 20, 25, 30, 40, 50, 60, 90, 120, 180, 300, 600}}, []string{"phase"})
	for _, phase := range []string{RecoveryNotReady, RecoveryDecision, RecoveryConfirmedOff, RecoveryReleased} {
		m.Recovery.WithLabelValues(phase)
	}
	m.WitnessDown = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "nodefence_witness_down_nodes",
		Help: "Nodes whose agent (witness=agent) or kubelet (witness=kubelet) alone is down while the other reports (Kubernetes mode)."}, []string{"witness"})
	m.PodGrants = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nodefence_pod_eviction_grants_total",
		Help: "Soft-threshold pod evictions granted under the zone's budget."}, []string{"zone"})
	m.PodCandidatesHeld = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "nodefence_pod_eviction_candidates_held",
		Help: "Nodes whose pod-eviction candidate is held back by the zone's budget."}, []string{"zone"})
	m.PodEvictionsLocal = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "nodefence_pod_evictions_local",
		Help: "Pod evictions agents carried out on their own in this leader's term: hard thresholds and fallbacks when no grant came."}, []string{"zone"})
	m.PodEvictionFallbacks = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "nodefence_pod_eviction_fallbacks",
		Help: "Pod evictions agents carried out on their own in this leader's term because no grant came in time."}, []string{"zone"})
	m.AgentEventsDropped = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nodefence_agent_events_dropped_total",
		Help: "Agent events (condition, shutdown, eviction-report, eviction-candidate) whose writes their node's rate limit held back or dropped; the newest condition and announcement are still written."}, []string{"kind"})
	for _, k := range []string{engine.DropCondition, engine.DropShutdown, engine.DropEviction, engine.DropCandidate} {
		m.AgentEventsDropped.WithLabelValues(k)
	}
	m.seen = map[string]bool{}
	reg.MustRegister(m.PodEvictionFallbacks, m.AgentEventsDropped,
		m.ZoneHealth, m.ZoneSize, m.UnhealthyNodes, m.Evictions, m.Updates, m.ApplyLatency, m.QueueLatency, m.FenceSkips, m.FenceRequests, m.FenceStages, m.Recovery, m.WitnessDown,
		m.PodGrants, m.PodCandidatesHeld, m.PodEvictionsLocal)
	return m
}

func (m *Metrics) observeZones(e *engine.Engine) {
	for _, z := range e.Zones() {
		m.ZoneSize.WithLabelValues(z.Key).Set(float64(z.Size))
		m.UnhealthyNodes.WithLabelValues(z.Key).Set(float64(z.NotReady))
		health := 100.0
		if z.Size > 0 {
			health = 100 * float64(z.Ready) / float64(z.Size)
		}
		m.ZoneHealth.WithLabelValues(z.Key).Set(health)
		m.PodCandidatesHeld.WithLabelValues(z.Key).Set(float64(z.PodCandidatesHeld))
		m.PodEvictionsLocal.WithLabelValues(z.Key).Set(float64(z.PodEvictionsLocal))
		m.PodEvictionFallbacks.WithLabelValues(z.Key).Set(float64(z.PodEvictionFallbacks))
	}
	agent, kubelet := e.Witnesses()
	m.WitnessDown.WithLabelValues("agent").Set(float64(agent))
	m.WitnessDown.WithLabelValues("kubelet").Set(float64(kubelet))
}
