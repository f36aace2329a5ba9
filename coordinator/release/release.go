// Package release is the rule that says when a fenced node's pods are released, pure: the release
// reconciler (coordinator/kube) applies it to what one pass observes, and the scenario scripts of
// coordinator/engine replay it against the engine's own view. It imports neither the engine nor
// Kubernetes, so both may use it.
package release

import (
	"fmt"
	"time"

	"github.com/nodefence/nodefence/coordinator/fencing"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// Proven is the leader's proof of a node's newest fence record.
type Proven struct {
	// Fence is the record judged ("" when the leader has none for the node).
	Fence string
	// Verdict is the current term's: dark only once every witness was silent past its own window.
	Verdict fencing.Proof
	// Spoke names the witness heard after the record's confirmed power-off, "" if none.
	Spoke string
}

// Action is what one reconciler pass does to a node's workloads.
type Action int

// Release actions.
const (
	// Nothing: the node is as it should be.
	Nothing Action = iota
	// Apply: taint out-of-service, force-delete the pods, delete the VolumeAttachments.
	Apply
	// Remove: the node is back and healthy long enough: remove the out-of-service taint.
	Remove
	// Hold: nothing now; look again later (requeue after the returned delay, if any).
	Hold
	// Withdraw: a witness of the node spoke after its confirmed power-off (the fence hit
	// another machine): remove the out-of-service taint from the running node.
	Withdraw
	// Would: observe mode. The node's newest record was observed, not executed, and its
	// witnesses are silent: had the fence confirmed the node off, its pods would be released now.
	// Nothing is tainted or deleted; the record says when (would_release_at) and an Event says why.
	Would
)

var actionWords = [...]string{Nothing: "nothing", Apply: "apply", Remove: "remove", Hold: "hold", Withdraw: "withdraw", Would: "would"}

// String is the action's word.
func (a Action) String() string {
	if a < 0 || int(a) >= len(actionWords) {
		return fmt.Sprintf("Action(%d)", int(a))
	}
	return actionWords[a]
}

// ProofPoll is how often a pass looks again at a release that waits for the proof (the engine's
// verdict also asks for a pass at once).
const ProofPoll = 5 * time.Second

// State is what one pass observes about a node.
type State struct {
	// Fence is the node's newest record (nil: none); Running is set while one of its records runs.
	Fence   *coordv1.NodeFence
	Running bool
	// WitnessesBack is set when the engine judges the node ready: a witness reports again.
	WitnessesBack bool
	// BackSince is when the engine last judged the node ready.
	BackSince time.Time
	// NodeReady is the Node's Ready condition (kubelet's and kube-controller-manager's) being True,
	// since ReadySince.
	NodeReady  bool
	ReadySince time.Time
	// Tainted is set while the node has the out-of-service taint.
	Tainted bool
	// Proof is the leader's proof of Fence (zero when it judged another record or none).
	Proof Proven
}

// Witnesses sets the state's witness fields from the engine's view of the node (nil when the
// engine does not know it): back when the node is alive by the one rule (fencing.Alive), since the
// later of its readiness change and its witnesses' return. A node the engine does not know while it
// has a record counts as back: nothing is released on its silence alone.
func (s *State) Witnesses(view *coordv1.Node) {
	if fencing.Alive(view) {
		s.WitnessesBack = true
		s.BackSince = view.GetReadinessChangedAt().AsTime()
		if back := view.GetHeardAgainAt(); back != nil && back.AsTime().After(s.BackSince) {
			s.BackSince = back.AsTime()
		}
	}
	if view == nil && s.Fence != nil {
		s.WitnessesBack = true
	}
}

// Decide is the release reconciler's rule, pure:
//   - a driver-confirmed power-off that hit another machine — its wrong_machine_at alarm, or any
//     witness (agent, kubelet) heard after its confirmed_off_at — never releases anything, and
//     withdraws the out-of-service taint if it is there, even once the node falls silent later;
//   - a driver-confirmed power-off releases only once the leader proved the node dark: every
//     witness silent past its own window, as the current term heard them; until then hold (a node
//     back from a power-off an earlier term proved is judged by the rules below: its taint comes
//     off once it is healthy)
//     (an operator's acknowledgement is the operator's word and needs no proof);
//   - the newest record of the node is a power-off (or isolation) confirmed by read-back, operator
//     acknowledgement or fence_kdump, and the engine still has both witnesses silent: release
//     (idempotent, so every pass completes what an earlier one could not);
//   - a witness reports again after a confirmed power-off while the record runs: hold (the fence
//     flow decides: recovery, or a power-off that did not take);
//   - the node has the out-of-service taint, a record of ours, no record running, both witnesses
//     report (the engine's Ready and the Node's Ready condition) and have for healthyDelay: remove
//     the taint; not yet that long: hold until then;
//   - the newest record was made in observe mode (never executed, never confirmed): with both
//     witnesses silent, "would release" once (until the record says it would have); nothing else
//     about it is ever applied.
func Decide(s State, now time.Time, healthyDelay time.Duration) (Action, time.Duration, string) {
	// A record made in observe mode is never a confirmation, whatever else it says.
	confirmed := s.Fence != nil && s.Fence.GetAction() == coordv1.FenceAction_FENCE_ACTION_OFF && s.Fence.GetConfirmedOffAt() != nil && !fencing.Observed(s.Fence)
	var proof Proven
	if s.Proof.Fence == s.Fence.GetId() {
		proof = s.Proof
	}
	wrong := confirmed && fencing.NeedsProof(s.Fence) &&
		(s.Fence.GetWrongMachineAt() != nil || proof.Verdict == fencing.ProofWrongMachine || proof.Spoke != "")
	switch {
	case wrong && s.Tainted:
		return Withdraw, 0, fmt.Sprintf("fence %s switched off another machine (the node kept reporting): out-of-service taint withdrawn, pods are never released", s.Fence.GetId())
	case wrong:
		return Hold, 0, fmt.Sprintf("fence %s switched off another machine (the node kept reporting): pods are never released", s.Fence.GetId())
	case confirmed && fencing.NeedsProof(s.Fence) && proof.Verdict != fencing.ProofDark && !s.WitnessesBack:
		return Hold, ProofPoll, fmt.Sprintf("fence %s confirmed the node off; its witnesses are being observed before anything is released", s.Fence.GetId())
	case confirmed && !s.WitnessesBack:
		return Apply, 0, fmt.Sprintf("fence %s confirmed the node off; its witnesses are silent", s.Fence.GetId())
	case confirmed && s.Running && !s.Tainted:
		return Hold, 0, fmt.Sprintf("a witness reports after fence %s confirmed the node off: pods are not released", s.Fence.GetId())
	case fencing.Observed(s.Fence) && !s.WitnessesBack && s.Fence.GetWouldReleaseAt() == nil:
		return Would, 0, fmt.Sprintf("would release (observe mode): fence %s was observed, not executed; its witnesses are silent, so had it confirmed the node off its pods would be released now; nothing was tainted or deleted", s.Fence.GetId())
	case s.Tainted && s.Fence != nil && !s.Running && s.WitnessesBack && s.NodeReady:
		since := s.ReadySince
		if s.BackSince.After(since) {
			since = s.BackSince
		}
		if wait := healthyDelay - now.Sub(since); wait > 0 {
			return Hold, wait, fmt.Sprintf("node back and Ready; out-of-service taint stays until it has been healthy for %s", healthyDelay)
		}
		return Remove, 0, fmt.Sprintf("node back and Ready for %s, no fence running", now.Sub(since).Round(time.Second))
	}
	return Nothing, 0, ""
}
