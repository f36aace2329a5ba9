package engine

import (
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/nodefence/nodefence/coordinator/fencing"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// The proof that a fence switched off the right machine (the rules are coordinator/fencing's
// proof.go). The engine hears every witness — agent contact, the kubelet's heartbeats — so it
// judges each node's newest driver-confirmed power-off on every Tick, from what THIS engine heard:
// a new leader's engine starts with nothing heard, so it observes every standing record for a full
// window of its own before it calls a node dark, and a witness heard after the power-off is the
// wrong-machine alarm whenever it comes. While such a record stands no automatic fence of the node
// is requested (standingGuard): the node is fenced, or the fence hit another machine and an
// operator must act.

// FenceRecord is a node's fence record, as written: every version the fence runner writes, an
// acknowledgement's, and at the start of a term the newest record of every configured node. The
// engine keeps the newest record of each node (ids sort by creation time) and judges its proof.
type FenceRecord struct {
	Record *coordv1.NodeFence
	At     time.Time
}

func (FenceRecord) isInput() {}

// ProofResult is a new verdict on a node's driver-confirmed power-off.
type ProofResult struct {
	Node, Fence string
	Verdict     fencing.Proof
	// Why says what was heard, or for how long nothing was.
	Why string
	At  time.Time
}

// standing is a node's newest fence record and this engine's verdict on it.
type standing struct {
	rec     *coordv1.NodeFence
	verdict fencing.Proof
}

// DefaultKubeletRenew is the kubelet's Lease renewal interval when its Lease does not say: a
// quarter of the default 40 s lease duration.
const DefaultKubeletRenew = 10 * time.Second

// renew is the node's kubelet Lease renewal interval (DefaultKubeletRenew when its Lease did not say).
func (n *node) renew() time.Duration {
	if n.kubeletRenew == 0 {
		return DefaultKubeletRenew
	}
	return n.kubeletRenew
}

// fenceRecord keeps the node's newest record; a new record starts with no verdict, and one whose
// alarm is recorded is wrong machine from the start.
func (e *Engine) fenceRecord(in FenceRecord) {
	f := in.Record
	n, ok := e.nodes[f.GetNode()]
	if !ok || f.GetId() == "" {
		return
	}
	if n.fence != nil && f.GetId() < n.fence.rec.GetId() {
		return // a late version of an older record
	}
	if n.fence == nil || n.fence.rec.GetId() != f.GetId() {
		n.fence = &standing{}
	}
	n.fence.rec = proto.Clone(f).(*coordv1.NodeFence)
	if f.GetWrongMachineAt() != nil {
		n.fence.verdict = fencing.ProofWrongMachine
	}
}

// proofRule is the cadences the proof is judged against.
func (e *Engine) proofRule() fencing.ProofRule {
	return fencing.ProofRule{Grace: e.cfg.NodeMonitorGracePeriod, Heartbeat: e.cfg.AgentHeartbeat}
}

// witnessed is what this engine heard from the node's witnesses.
func (e *Engine) witnessed(n *node) fencing.Witnessed {
	w := fencing.Witnessed{Since: e.floor, Blind: e.halted, Agent: n.lastContact, NewBoot: n.newBootAt}

	if e.cfg.KubeletWitness {
		w.Blind = w.Blind || e.blind
		w.Kubelet, w.KubeletRenew, w.KubeletBack = n.kubeletAdvanced, n.renew(), n.kubeletBack
	}
	return w
}

// prove judges every node's standing driver-confirmed power-off: the alarm as soon as a witness
// spoke after it (also after the node was proven dark), dark once observed silent for the window.
func (e *Engine) prove(now time.Time) {
	for _, n := range e.order {
		s := n.fence
		if s == nil || !fencing.NeedsProof(s.rec) || s.verdict == fencing.ProofWrongMachine {
			continue
		}
		v, why := fencing.Verdict(s.rec, e.witnessed(n), now, e.proofRule())
		if v == fencing.ProofPending || v == s.verdict {
			continue
		}
		s.verdict = v
		id := s.rec.GetId()
		e.ready.Proofs = append(e.ready.Proofs, ProofResult{Node: n.name, Fence: id, Verdict: v, Why: why, At: now})
		if v == fencing.ProofWrongMachine {
			e.event(now, "alarm", n.name, "CRITICAL: fence %s: node %s was confirmed off but %s: the fence switched off another machine (check the BMC/outlet mapping); the node's pods are NOT released and it is not fenced again automatically until an operator acts",
				id, n.name, why)
		} else {
			e.event(now, "proof", n.name, "fence %s: node %s: %s: the right machine went dark", id, n.name, why)
		}
	}
}

// standingGuard holds back the automatic fence of a node whose newest record stands: a
// driver-confirmed power-off (left off) or a wrong-machine alarm.
func (e *Engine) standingGuard(n *node) (string, string) {
	s := n.fence
	if s == nil || !fencing.HoldsAutoFence(s.rec) {
		return "", ""
	}
	why := "confirmed the node off"
	if s.verdict == fencing.ProofWrongMachine || s.rec.GetWrongMachineAt() != nil {
		why = "raised the wrong-machine alarm"
	}
	return "fenced", fmt.Sprintf("fence %s %s and stands: no automatic fence until an operator unfences, fences or acknowledges the node", s.rec.GetId(), why)
}

// Proof is this engine's judgement of the node's newest fence record: its id ("" when it has
// none), the verdict (pending for a record that needs no proof), and which witness was heard after
// its confirmed power-off ("" when none).
func (e *Engine) Proof(node string) (fence string, verdict fencing.Proof, spoke string) {
	n, ok := e.nodes[node]
	if !ok || n.fence == nil {
		return "", fencing.ProofPending, ""
	}
	s := n.fence
	return s.rec.GetId(), s.verdict, fencing.Spoke(s.rec, e.witnessed(n), e.proofRule())
}
