package fencing

import (
	"fmt"
	"time"

	"github.com/nodefence/nodefence/coordinator/nodes"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// The proof rules: a driver's read-back proves that the device it was told about is off, not that
// this device powers the node. After a driver confirmed a node off, every witness of the node must
// fall silent: its agent, and in Kubernetes mode its kubelet (Lease renewals, Ready heartbeats). A
// witness heard after the power-off (plus the time a message sent before it may take to arrive)
// means the fence switched off another machine: the critical wrong-machine alarm. The node is
// proven dark once every witness has been silent past its own cadence, as heard by the current
// leadership term only; a term that began after the power-off observes a full window of its own,
// since it has heard nothing before it started. The engine applies these rules to what it hears (coordinator/engine/proof.go);
// the release (coordinator/release.Decide) frees the pods of a driver-confirmed record only
// once proven dark, never while a witness spoke after the power-off, never after the alarm; and
// no automatic fence of the node starts while its record stands (HoldsAutoFence).

// Proof is the verdict on a record confirmed off.
type Proof int

// The verdicts.
const (
	// ProofPending: not yet known; judge again later.
	ProofPending Proof = iota
	// ProofDark: every witness stayed silent for the window: the right machine went dark.
	ProofDark
	// ProofWrongMachine: a witness spoke after the confirmed power-off.
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

// NeedsProof reports whether a record is to be checked: a power-off confirmed by a driver (an
// operator's acknowledgement is the operator's word and is not checked).
func NeedsProof(f *coordv1.NodeFence) bool {
	return f.GetAction() == coordv1.FenceAction_FENCE_ACTION_OFF && f.GetConfirmedOffAt() != nil && f.GetAcknowledgedBy() == ""
}

// HoldsAutoFence reports whether the node's newest record f keeps every automatic fence of the node
// back while it stands: a driver-confirmed power-off (the node is fenced: fencing it again could
// only hit the same device, or another machine once more), or one that raised the wrong-machine
// alarm. An operator lifts it by acting: an unfence, a reboot, a new fence or an acknowledgement
// writes a newer record. A power cycle that powered the node on again does not hold.
func HoldsAutoFence(f *coordv1.NodeFence) bool {
	if !NeedsProof(f) {
		return false
	}
	return f.GetWrongMachineAt() != nil || PoweredOnAt(f).IsZero()
}

// PoweredOnAt is when the record began to power its node on again after the confirmed power-off
// (a power cycle's "on" in power management), zero if it did not: witnesses heard after it are the
// node coming back, not the wrong machine.
func PoweredOnAt(f *coordv1.NodeFence) time.Time {
	off := f.GetConfirmedOffAt().AsTime()
	for _, op := range f.GetOperations() {
		if op.GetStep() == coordv1.FenceStep_FENCE_STEP_POWER_MANAGEMENT && op.GetAction() == "on" && op.GetStartedAt() != nil &&
			!op.GetStartedAt().AsTime().Before(off) {
			return op.GetStartedAt().AsTime()
		}
	}
	return time.Time{}
}

// Witnessed is what the current leadership term heard from a node's witnesses, on its own clock.
type Witnessed struct {
	// Since is when the term began to hear them: its start, or the end of its latest blind spell
	// (the apiserver unreadable, the all-zones halt). Silence before it proves nothing.
	Since time.Time
	// Blind is set while the term cannot hear a witness (Kubernetes mode: the apiserver is
	// unreadable): no silence counts.
	Blind bool
	// Agent is the agent's last contact in this term (zero: none).
	Agent time.Time
	// Kubelet is when this term last saw the kubelet's heartbeat (its Lease's renewTime or its Ready
	// condition's lastHeartbeatTime) advance; the first sight of a heartbeat is no advance, since it
	// may be older than the power-off (zero: none).
	Kubelet time.Time
	// KubeletRenew is how often the kubelet renews its Lease (a quarter of the Lease's duration);
	// zero without a kubelet witness (standalone mode).
	KubeletRenew time.Duration
	// NewBoot is when the node's agent said hello from a boot other than the one this term knew
	// before (zero: none): witnesses heard from then on are a machine that rebooted — the right one.
	NewBoot time.Time
	// KubeletBack is when the kubelet's heartbeat last resumed after a silence longer than its
	// window (zero: never in this term). A live kubelet is never silent that long, so one resuming
	// after the power-off is the node coming back (powered on by hand, a partition healed), while
	// one that kept its cadence across the power-off is the wrong machine.
	KubeletBack time.Time
}

// ProofRule holds the cadences the proof is judged against.
type ProofRule struct {
	// Grace is the node-monitor grace period: the least the current term observes the node after
	// the power-off before it may call it dark (a new leader's agents reconnect within it).
	Grace time.Duration
	// Heartbeat is the agents' heartbeat interval.
	Heartbeat time.Duration
}

// KubeletSlack is how late a Lease renewal or status update the kubelet made before the power-off
// may reach the leader's informer.
const KubeletSlack = nodes.KubeletSlack

// AgentSlack is how late an agent heartbeat sent before the power-off may arrive.
func (r ProofRule) AgentSlack() time.Duration { return min(r.Heartbeat, time.Second) }

// AgentWindow is how long an agent that reports is never silent: three heartbeats and a second.
func (r ProofRule) AgentWindow() time.Duration { return 3*r.Heartbeat + time.Second }

// Window is how long a term that started after the power-off must hear nothing from any witness of
// the node: a full grace period (its agents reconnect to it within one), and at least each
// witness's own window.
func (r ProofRule) Window(kubeletRenew time.Duration) time.Duration {
	return max(r.Grace, r.AgentWindow(), nodes.KubeletWindow(kubeletRenew))
}

// Spoke says which witness of the node was heard after the record's confirmed power-off (and before
// the record powered the node on again, if it did), "" if none: the agent, unless it speaks from a
// new boot (the machine went off and came back); the kubelet, unless its heartbeat resumed after a
// silence past its window (or the agent spoke from a new boot) — an agent still speaking from the
// boot it had before the power-off is the wrong machine whenever it comes.
func Spoke(f *coordv1.NodeFence, w Witnessed, r ProofRule) string {
	if !NeedsProof(f) {
		return ""
	}
	off, on := f.GetConfirmedOffAt().AsTime(), PoweredOnAt(f)
	rebooted := w.NewBoot.After(off)
	heard := func(at time.Time, slack time.Duration) bool {
		return at.After(off.Add(slack)) && (on.IsZero() || at.Before(on)) && !(rebooted && !at.Before(w.NewBoot))
	}
	switch {
	case heard(w.Agent, r.AgentSlack()):
		return "its agent reported at " + stamp(w.Agent)
	case heard(w.Kubelet, KubeletSlack) && !(w.KubeletBack.After(off) && !w.Kubelet.Before(w.KubeletBack)):
		return "its kubelet renewed its heartbeat at " + stamp(w.Kubelet)
	}
	return ""
}

// Verdict judges a driver-confirmed record at now from what the current term heard: wrong machine
// as soon as a witness spoke after the power-off; dark once no witness can still be heard from, on
// its own cadence; pending otherwise. The text says why.
//
// Dark means: the messages sent before the power-off have had time to arrive (the slack), and every
// witness has been silent for its own window (AgentWindow, nodes.KubeletWindow), counted from the last
// time this term heard it or from the term's start. A live node's witness speaks within its window,
// so a witness that was still reporting shortly before the power-off is waited for; one already
// silent for its window when the device went off adds nothing by waiting longer. A term that began
// after the power-off has heard nothing of the node before it: it observes a full Window of its own
// (its agents reconnect within the grace period).
func Verdict(f *coordv1.NodeFence, w Witnessed, now time.Time, r ProofRule) (Proof, string) {
	if !NeedsProof(f) {
		return ProofPending, "not a driver-confirmed power-off"
	}
	if who := Spoke(f, w, r); who != "" {
		return ProofWrongMachine, who + ", after the power-off confirmed at " + stamp(f.GetConfirmedOffAt().AsTime())
	}
	off := f.GetConfirmedOffAt().AsTime()
	if w.NewBoot.After(off) {
		return ProofDark, "its agent reported from a new boot at " + stamp(w.NewBoot) + ": the machine went off and booted again"
	}
	if w.Blind {
		return ProofPending, "a witness cannot be heard (the apiserver is unreadable)"
	}
	if w.Since.After(off) {
		window := r.Window(w.KubeletRenew)
		if now.Sub(w.Since) < window {
			return ProofPending, fmt.Sprintf("this term began after the power-off: observing the witnesses for %s since %s", window, stamp(w.Since))
		}
		return ProofDark, fmt.Sprintf("every witness silent for %s since %s, after the power-off", window, stamp(w.Since))
	}
	slack := r.AgentSlack()
	if w.KubeletRenew > 0 {
		slack = max(slack, KubeletSlack)
	}
	dark := off.Add(slack)
	why := "messages sent before the power-off"
	if at, last := r.SilentAt(w); at.After(dark) {
		dark, why = at, last
	}
	if now.Before(dark) {
		return ProofPending, fmt.Sprintf("waiting until %s for %s", stamp(dark), why)
	}
	return ProofDark, fmt.Sprintf("every witness silent past its window since the power-off at %s (the last to fall silent: %s)", stamp(off), why)
}

// SilentAt is the one definition of a node that does not run: the moment from which every witness
// of the node has been silent for its own window (AgentWindow; nodes.KubeletWindow of the Lease's
// renewal), each counted from the last time this term heard it or from w.Since, whichever is later.
// A live node's witnesses speak within their windows, so before SilentAt the node may be running;
// from it on, none of them can still be heard from. why names the last witness to fall silent.
// The proof judges a power-off against it; the engine's fast detection decides a fence with it.
func (r ProofRule) SilentAt(w Witnessed) (at time.Time, why string) {
	silentFrom := func(heard time.Time) time.Time {
		if heard.Before(w.Since) {
			return w.Since
		}
		return heard
	}
	at = silentFrom(w.Agent).Add(r.AgentWindow())
	why = fmt.Sprintf("the agent (silent since %s, window %s)", stamp(silentFrom(w.Agent)), r.AgentWindow())
	if kw := nodes.KubeletWindow(w.KubeletRenew); kw > 0 {
		if k := silentFrom(w.Kubelet).Add(kw); k.After(at) {
			at, why = k, fmt.Sprintf("the kubelet (silent since %s, window %s)", stamp(silentFrom(w.Kubelet)), kw)
		}
	}
	return at, why
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
