package app

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/coordinator/fencing"
	"github.com/nodefence/nodefence/coordinator/leader"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// proof checks that a fence switched off the right machine. A driver's read-back proves that the
// device it was told about is off; it does not prove that this device powers the node. So after a
// driver confirmed a node off, the node's agent must go silent: a node whose agent still reports
// after the power-off (plus one heartbeat in flight) was not switched off — the BMC or outlet is
// mapped to another machine. That raises a critical alarm (the record's wrong_machine_at, the
// metric nodefence_fence_wrong_machine_total, an audit entry, a Kubernetes Event), and the release
// reconciler never releases a record with wrong_machine_at set (kube.DecideRelease), even once the
// node goes silent later. A node that stays silent is recorded in the audit trail as gone dark.
type proof struct {
	a      *App
	alarms prometheus.Counter

	mu     sync.Mutex
	state  map[string]proofState // by fence id; bounded, see remember
	checks map[string]bool       // fence ids being checked
}

type proofState int

const (
	proofPending proofState = iota
	proofDark               // the agent stayed silent: the right machine went dark
	proofWrong              // the agent kept reporting: the alarm is raised
)

func newProof(a *App, reg prometheus.Registerer) *proof {
	p := &proof{a: a, state: map[string]proofState{}, checks: map[string]bool{},
		alarms: prometheus.NewCounter(prometheus.CounterOpts{Name: "nodefence_fence_wrong_machine_total",
			Help: "Fences confirmed off by a driver while the node's agent kept reporting: the fence hit another machine (critical)."})}
	reg.MustRegister(p.alarms)
	return p
}

// observe starts the check of a record confirmed off by a driver, once per record.
func (p *proof) observe(term *leader.Term, f *coordv1.NodeFence) {
	if !fencing.NeedsProof(f) {
		return
	}
	p.mu.Lock()
	if p.checks[f.Id] || p.state[f.Id] != proofPending {
		p.mu.Unlock()
		return
	}
	p.checks[f.Id] = true
	p.mu.Unlock()
	go p.check(term, f.Id, f.Node, f.GetConfirmedOffAt().AsTime())
}

func (p *proof) check(term *leader.Term, id, node string, off time.Time) {
	defer func() {
		p.mu.Lock()
		delete(p.checks, id)
		p.mu.Unlock()
	}()
	window, slack := fencing.ProofWindow(p.a.cfg.AgentHeartbeatInterval)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		last, ok := p.lastContact(term, node)
		if !ok {
			return // the term ended: the next leader checks again
		}
		switch fencing.ProofVerdict(off, last, p.a.now(), window, slack) {
		case fencing.ProofWrongMachine:
			p.raise(term, id, node, off, last)
			return
		case fencing.ProofDark:
			p.remember(id, proofDark)
			p.a.audit(term, node, "proof", fmt.Sprintf("fence %s: node silent for %s and since the confirmed power-off: the right machine went dark", id, window))
			return
		}
		select {
		case <-term.Context().Done():
			return
		case <-tick.C:
		}
	}
}

func (p *proof) lastContact(term *leader.Term, node string) (time.Time, bool) {
	p.a.mu.Lock()
	l := p.a.leading
	p.a.mu.Unlock()
	if l == nil || l.Term != term || term.Context().Err() != nil {
		return time.Time{}, false
	}
	var last time.Time
	ctx, cancel := context.WithTimeout(term.Context(), 5*time.Second)
	defer cancel()
	if err := l.Loop.Query(ctx, func(e *engine.Engine) {
		if n := e.Node(node); n != nil && n.LastSeen != nil {
			last = n.LastSeen.AsTime()
		}
	}); err != nil {
		return time.Time{}, false
	}
	return last, true
}

// raise records the alarm everywhere it must be seen.
func (p *proof) raise(term *leader.Term, id, node string, off, last time.Time) {
	p.remember(id, proofWrong)
	p.alarms.Inc()
	text := fmt.Sprintf("CRITICAL: fence %s: node %s was confirmed off at %s but its agent still reported at %s: the fence switched off another machine (check the BMC/outlet mapping); the node's pods are NOT released",
		id, node, off.UTC().Format(time.RFC3339Nano), last.UTC().Format(time.RFC3339Nano))
	p.a.log.Error(text, "fence", id, "node", node, "alarm", "wrong-machine")
	p.a.audit(term, node, "alarm", text)
	ctx, cancel := context.WithTimeout(term.Context(), 10*time.Second)
	defer cancel()
	for attempt := 0; attempt < 5; attempt++ {
		v, err := p.a.store.GetFence(ctx, id)
		if err != nil {
			p.a.log.Error("wrong-machine alarm not written to the record", "fence", id, "err", err)
			break
		}
		f := v.Fence
		f.WrongMachineAt = timestamppb.New(p.a.now())
		f.Evidence = append(f.Evidence, "wrong machine: agent reported after the confirmed power-off")
		if _, err := p.a.store.UpdateFence(ctx, term, f, v.Revision); err != nil {
			if errors.Is(err, leader.ErrConflict) {
				continue
			}
			p.a.log.Error("wrong-machine alarm not written to the record", "fence", id, "err", err)
		}
		break
	}
	if p.a.kube != nil {
		p.event(ctx, node, text)
	}
}

// event writes a Warning Event on the Node.
func (p *proof) event(ctx context.Context, node, text string) {
	now := metav1.NewTime(p.a.now())
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: node + ".wrong-machine.", Namespace: metav1.NamespaceDefault},
		InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: node, UID: "", APIVersion: "v1"},
		Reason:         "FenceHitWrongMachine", Message: text, Type: corev1.EventTypeWarning,
		Source: corev1.EventSource{Component: "nodefence-coordinator"}, FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	if _, err := p.a.kube.core.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		p.a.log.Error("wrong-machine Event not written", "node", node, "err", err)
	}
}

// remember records a record's outcome; the map is bounded (old outcomes are only needed until the
// release ran).
func (p *proof) remember(id string, s proofState) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.state) > 10000 {
		p.state = map[string]proofState{}
	}
	p.state[id] = s
}
