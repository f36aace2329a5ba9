package app

import (
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodefence/nodefence/coordinator/fencing"
	"github.com/nodefence/nodefence/coordinator/leader"
	"github.com/nodefence/nodefence/services/cli"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// fenceMetrics are the coordinator's metrics of leadership and fence records, the ones the alert
// rules in deploy/monitoring use: who leads under which epoch, fences started (automatic or by an
// operator), finished by result, acknowledged by hand, the records in flight by status, and the
// driver calls the leader made by result. They are fed by the leader as records change
// (fenceChanged); a follower reports leader 0 and no records.
type fenceMetrics struct {
	started      *prometheus.CounterVec
	finished     *prometheus.CounterVec
	acknowledged prometheus.Counter
	proofs       *prometheus.CounterVec
	operations   *prometheus.CounterVec
	active       *prometheus.Desc

	mu   sync.Mutex
	seen map[string]bool               // record id + event, for counting each once
	live map[string]*coordv1.NodeFence // unfinished records, for the active gauge
}

func newFenceMetrics(reg prometheus.Registerer, term func() *leader.Term) *fenceMetrics {
	m := &fenceMetrics{
		started: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nodefence_fences_started_total",
			Help: "Fence records created, by action (off, on) and trigger (automatic, manual)."}, []string{"action", "trigger"}),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nodefence_fences_finished_total",
			Help: "Fence records finished, by action and result (done, error)."}, []string{"action", "result"}),
		acknowledged: prometheus.NewCounter(prometheus.CounterOpts{Name: "nodefence_fence_acknowledgements_total",
			Help: "Fences confirmed by an operator's Acknowledge instead of a device read-back."}),
		proofs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nodefence_fence_proofs_total",
			Help: "Power-off records proven off, by the proof they hold: read-back (a driver's status read-back), operator (an acknowledgement), watchdog-timeout (the node's watchdog by the timing rule)."},
			[]string{"proof"}),
		operations: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nodefence_fence_operations_total",
			Help: "Driver calls of fence records as the leader recorded them, by driver, method and result (confirmed, failed)."},
			[]string{"driver", "method", "result"}),
		active: prometheus.NewDesc("nodefence_fences_active",
			"Unfinished fence records known to this leader, by step and status (new, running, error: failed and waiting to retry).",
			[]string{"step", "status"}, nil),
		seen: map[string]bool{},
		live: map[string]*coordv1.NodeFence{},
	}
	// Known label values start at zero, so rules and dashboards see 0 rather than no series.
	for _, p := range []coordv1.FenceProof{coordv1.FenceProof_FENCE_PROOF_READ_BACK, coordv1.FenceProof_FENCE_PROOF_OPERATOR, coordv1.FenceProof_FENCE_PROOF_WATCHDOG_TIMEOUT} {
		m.proofs.WithLabelValues(fencing.ProofName(p))
	}
	for _, action := range []string{"off", "on"} {
		for _, trigger := range []string{"automatic", "manual"} {
			m.started.WithLabelValues(action, trigger)
		}
		for _, result := range []string{"done", "error"} {
			m.finished.WithLabelValues(action, result)
		}
	}
	leading := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "nodefence_leader",
		Help: "1 while this replica is the leader, else 0."}, func() float64 {
		if term() != nil {
			return 1
		}
		return 0
	})
	epoch := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "nodefence_leader_epoch",
		Help: "The fencing token (election revision) of this replica's leadership; 0 when not leading."}, func() float64 {
		if t := term(); t != nil {
			return float64(t.Epoch)
		}
		return 0
	})
	reg.MustRegister(m.started, m.finished, m.acknowledged, m.proofs, m.operations, m, leading, epoch)
	return m
}

// Describe implements prometheus.Collector for the active-records gauge.
func (m *fenceMetrics) Describe(ch chan<- *prometheus.Desc) { ch <- m.active }

// Collect implements prometheus.Collector: the unfinished records by step and status.
func (m *fenceMetrics) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	counts := map[[2]string]int{}
	for _, step := range []string{"isolation", "power_management", "recovery"} {
		for _, status := range []string{"new", "running", "error"} {
			counts[[2]string{step, status}] = 0
		}
	}
	for _, f := range m.live {
		counts[[2]string{cli.EnumWord(f.Step.String()), cli.EnumWord(f.Status.String())}]++
	}
	m.mu.Unlock()
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(m.active, prometheus.GaugeValue, float64(n), k[0], k[1])
	}
}

// observe counts what is new in this version of a record.
func (m *fenceMetrics) observe(f *coordv1.NodeFence) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.seen) > 100000 {
		m.seen = map[string]bool{}
	}
	once := func(event string) bool {
		k := f.Id + "/" + event
		if m.seen[k] {
			return false
		}
		m.seen[k] = true
		return true
	}
	action := cli.EnumWord(f.Action.String())
	if once("start") {
		trigger := "manual"
		if f.Automatic {
			trigger = "automatic"
		}
		m.started.WithLabelValues(action, trigger).Inc()
	}
	if f.AcknowledgedBy != "" && once("ack") {
		m.acknowledged.Inc()
	}
	if p := fencing.ProofName(f.Proof); p != "" && once("proof/"+p) {
		m.proofs.WithLabelValues(p).Inc()
	}
	for _, op := range f.Operations {
		if op.Result == coordv1.OperationResult_OPERATION_RESULT_UNSPECIFIED {
			continue
		}
		if once(fmt.Sprintf("op/%s/%d", op.OperationId, op.Attempt)) {
			m.operations.WithLabelValues(op.Driver, op.Method, cli.EnumWord(op.Result.String())).Inc()
		}
	}
	if f.FinishedAt != nil {
		delete(m.live, f.Id)
		if once("finish") {
			m.finished.WithLabelValues(action, cli.EnumWord(f.Status.String())).Inc()
		}
		return
	}
	m.live[f.Id] = f
}

// reset forgets the records in flight when leadership ends: the next leader reports them.
func (m *fenceMetrics) reset() {
	if m == nil {
		return
	}
	m.mu.Lock()
	m.live = map[string]*coordv1.NodeFence{}
	m.mu.Unlock()
}
