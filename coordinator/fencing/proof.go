package fencing

import (
	"time"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// The proof rules: a driver's read-back proves that the device it was told about is off, not that
// this device powers the node. After a driver confirmed a node off, the node's agent must go silent;
// an agent that still reports after the power-off (plus one heartbeat in flight) means the fence
// switched off another machine. The coordinator's proof check (coordinator/app) applies these rules
// to the engine's last contact with the agent; the release never frees the pods of a record marked
// wrong machine.

// Proof is the verdict on a record confirmed off.
type Proof int

// The verdicts.
const (
	// ProofPending: not yet known; judge again later.
	ProofPending Proof = iota
	// ProofDark: the agent stayed silent: the right machine went dark.
	ProofDark
	// ProofWrongMachine: the agent reported after the confirmed power-off.
	ProofWrongMachine
)

func (p Proof) String() string {
	switch p {
	case ProofDark:
		return "dark"
	case ProofWrongMachine:
		return "wrong-machine"
	}
	return "pending"
}

// NeedsProof reports whether a record version is to be checked: a power-off confirmed by a driver
// (an operator's acknowledgement is not checked) and not already marked wrong machine.
func NeedsProof(f *coordv1.NodeFence) bool {
	return f.GetAction() == coordv1.FenceAction_FENCE_ACTION_OFF && f.GetConfirmedOffAt() != nil &&
		f.GetAcknowledgedBy() == "" && f.GetWrongMachineAt() == nil
}

// ProofWindow returns, for agents sending a heartbeat every hb, how long the agent must stay silent
// after a confirmed power-off (window) and how late a heartbeat sent before the power-off may still
// arrive (slack).
func ProofWindow(hb time.Duration) (window, slack time.Duration) {
	return 3*hb + time.Second, min(hb, time.Second)
}

// ProofVerdict judges a record confirmed off at off, whose node's agent was last heard at last
// (zero: never), at now.
func ProofVerdict(off, last, now time.Time, window, slack time.Duration) Proof {
	if last.After(off.Add(slack)) {
		return ProofWrongMachine
	}
	// Dark once no heartbeat in flight can still come and the agent has been silent for the window
	// (a node dead before the fence was silent long before it: no wait).
	if now.After(off.Add(slack)) && now.Sub(last) >= window {
		return ProofDark
	}
	return ProofPending
}
