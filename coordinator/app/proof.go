package app

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/coordinator/fencing"
)

// proof acts on the engine's proof verdicts (engine/proof.go applies the rules of
// fencing/proof.go to every witness it hears). A driver's read-back proves that the device it was
// told about is off, not that this device powers the node: a witness of the node (its agent, its
// kubelet's Lease renewals and Ready heartbeats) heard after the confirmed power-off means the BMC
// or outlet is mapped to another machine. That raises a critical alarm — the record's
// wrong_machine_at, the metric nodefence_fence_wrong_machine_total, an audit entry (the engine's
// event), a Kubernetes Event — and the release reconciler never releases the node
// (release.Decide) and withdraws its out-of-service taint; the engine requests no automatic
// fence of the node until an operator acts.
type proof struct {
	a      *App
	alarms prometheus.Counter
}

func newProof(a *App, reg prometheus.Registerer) *proof {
	p := &proof{a: a, alarms: prometheus.NewCounter(prometheus.CounterOpts{Name: "nodefence_fence_wrong_machine_total",
		Help: "Fences confirmed off by a driver while a witness of the node (agent or kubelet) kept reporting: the fence hit another machine (critical)."})}
	reg.MustRegister(p.alarms)
	return p
}

// verdicts says what the proof verdicts of one Ready found: a wrong-machine verdict is counted
// and logged at once; the record writer (recordwriter.go) raises it on the record and then in a
// Kubernetes Event.
func (p *proof) verdicts(rs []engine.ProofResult) {
	for _, r := range rs {
		if r.Verdict != fencing.ProofWrongMachine {
			continue
		}
		p.alarms.Inc()
		p.a.log.Error("CRITICAL: a fence switched off another machine: the node's pods are NOT released",
			"fence", r.Fence, "node", r.Node, "alarm", "wrong-machine", "why", r.Why)
	}
}

// event writes a Warning Event on the Node.
func (p *proof) event(ctx context.Context, r engine.ProofResult) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	now := metav1.NewTime(p.a.now())
	text := "CRITICAL: fence " + r.Fence + " confirmed node " + r.Node + " off but " + r.Why +
		": the fence switched off another machine (check the BMC/outlet mapping); the node's pods are NOT released and it is not fenced again automatically until an operator acts"
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: r.Node + ".wrong-machine.", Namespace: metav1.NamespaceDefault},
		InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: r.Node, UID: "", APIVersion: "v1"},
		Reason:         "FenceHitWrongMachine", Message: text, Type: corev1.EventTypeWarning,
		Source: corev1.EventSource{Component: "nodefence-coordinator"}, FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	if _, err := p.a.kube.core.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		p.a.log.Error("wrong-machine Event not written", "node", r.Node, "err", err)
	}
}
