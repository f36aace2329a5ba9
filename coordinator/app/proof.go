package app

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/coordinator/fencing"
	"github.com/nodefence/nodefence/coordinator/leader"
	"github.com/nodefence/nodefence/coordinator/loop"
	"github.com/nodefence/nodefence/services/job"
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

// verdicts handles the proof verdicts of one Ready, each alarm on a job of the term's own (the
// loop's goroutine must not wait for etcd or the apiserver).
func (p *proof) verdicts(jobs *job.Group, term *leader.Term, lp *loop.Loop, rs []engine.ProofResult) {
	for _, r := range rs {
		if r.Verdict != fencing.ProofWrongMachine {
			continue
		}
		p.alarms.Inc()
		p.a.log.Error("CRITICAL: a fence switched off another machine: the node's pods are NOT released",
			"fence", r.Fence, "node", r.Node, "alarm", "wrong-machine", "why", r.Why)
		jobs.Go("wrong-machine-alarm "+r.Fence, func(ctx context.Context) error { p.raise(ctx, term, lp, r); return nil })
	}
}

// raise writes the alarm on the record (so every later leader holds the node too) and an Event.
func (p *proof) raise(ctx context.Context, term *leader.Term, lp *loop.Loop, r engine.ProofResult) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for attempt := 0; attempt < 5; attempt++ {
		v, err := p.a.store.GetFence(ctx, r.Fence)
		if err != nil {
			p.a.log.Error("wrong-machine alarm not written to the record", "fence", r.Fence, "err", err)
			break
		}
		f := fencing.WrongMachine(v.Fence, r.At, r.Why)
		if f == nil {
			break
		}
		if _, err := p.a.store.UpdateFence(ctx, term, f, v.Revision); err != nil {
			if errors.Is(err, leader.ErrConflict) {
				continue
			}
			p.a.log.Error("wrong-machine alarm not written to the record", "fence", r.Fence, "err", err)
			break
		}
		for _, in := range engine.RecordWritten(f, p.a.now()) {
			_ = lp.Step(ctx, in)
		}
		break
	}
	if p.a.kube != nil {
		p.event(ctx, r)
	}
}

// event writes a Warning Event on the Node.
func (p *proof) event(ctx context.Context, r engine.ProofResult) {
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
