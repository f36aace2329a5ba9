// Package nodes keeps the leader's in-memory view of agent contact and judges node readiness.
// Judge and ZoneStateOf are pure; Registry is the small mutable bookkeeping around them.
package nodes

import (
	"fmt"
	"time"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// ShuttingDownReason is the readiness reason of a node that announced a graceful shutdown; the same
// words kubelet uses.
const ShuttingDownReason = "node is shutting down"

// Observation is what readiness is judged from.
type Observation struct {
	// LastContact is the last agent message; zero if never seen.
	LastContact time.Time
	// GraceFloor is when this leader's term began: nobody is judged silent for time before it, so a
	// failover never makes nodes look dead.
	GraceFloor time.Time
	// ShuttingDown is set after the agent announced a graceful shutdown.
	ShuttingDown bool
	// Known is set for a node that reported in an earlier term (restored from the store) although it
	// has not been heard from in this one.
	Known bool
}

// Judge returns the readiness and its reason at now, given the node-monitor grace period.
func Judge(o Observation, now time.Time, grace time.Duration) (coordv1.Readiness, string) {
	since := o.LastContact
	if since.Before(o.GraceFloor) {
		since = o.GraceFloor
	}
	silent := now.Sub(since)
	if o.ShuttingDown {
		// kubelet posts Ready=False "node is shutting down"; once it stops posting,
		// kube-controller-manager turns the condition Unknown like any silent node's.
		if silent > grace {
			return coordv1.Readiness_READINESS_UNKNOWN, fmt.Sprintf("%s; no agent contact for %s (grace %s)", ShuttingDownReason, silent.Round(time.Second), grace)
		}
		return coordv1.Readiness_READINESS_NOT_READY, ShuttingDownReason
	}
	if silent > grace {
		if o.LastContact.IsZero() {
			if o.Known {
				return coordv1.Readiness_READINESS_UNKNOWN, fmt.Sprintf("no agent contact since this leader started %s ago (grace %s)", silent.Round(time.Second), grace)
			}
			return coordv1.Readiness_READINESS_UNKNOWN, fmt.Sprintf("agent never connected (grace %s)", grace)
		}
		if o.LastContact.Before(o.GraceFloor) {
			// Silent since before a fresh grace period: say so, not the shorter count.
			return coordv1.Readiness_READINESS_UNKNOWN, fmt.Sprintf("no agent contact for %s, %s since its grace period restarted (grace %s)",
				now.Sub(o.LastContact).Round(time.Second), silent.Round(time.Second), grace)
		}
		return coordv1.Readiness_READINESS_UNKNOWN, fmt.Sprintf("no agent contact for %s (grace %s)", silent.Round(time.Second), grace)
	}
	if o.LastContact.IsZero() || o.LastContact.Before(o.GraceFloor) {
		return coordv1.Readiness_READINESS_READY, "within grace period after leader start"
	}
	return coordv1.Readiness_READINESS_READY, "agent reporting"
}

// ZoneStateOf classifies a zone from its ready and not-ready counts, as kube-controller-manager's
// ComputeZoneState: no ready node and at least one not ready is a full disruption; more than two not
// ready and at least unhealthyThreshold of the zone not ready is a partial disruption.
func ZoneStateOf(ready, notReady int, unhealthyThreshold float64) coordv1.ZoneState {
	switch {
	case ready == 0 && notReady > 0:
		return coordv1.ZoneState_ZONE_STATE_FULL_DISRUPTION
	case notReady > 2 && float64(notReady)/float64(notReady+ready) >= unhealthyThreshold:
		return coordv1.ZoneState_ZONE_STATE_PARTIAL_DISRUPTION
	default:
		return coordv1.ZoneState_ZONE_STATE_NORMAL
	}
}

// ZoneKey joins region and zone the way the API shows it.
func ZoneKey(region, zone string) string { return region + "/" + zone }

// KubeletObservation is what the kubelet witness (Kubernetes mode) is judged from, the way
// kube-controller-manager's tryUpdateNodeHealth judges it: by when the coordinator last saw the
// kubelet's heartbeat advance, on the coordinator's own clock, so the node's clock never matters.
type KubeletObservation struct {
	// Probe is when the coordinator last saw the heartbeat advance (the node's Lease in
	// kube-node-lease renewed, or its Ready condition's lastHeartbeatTime moved); zero if never.
	Probe time.Time
	// Registered is when the Node was first seen: a kubelet that never posted gets the startup
	// grace period from then, as a Node without a Ready condition does from its creation.
	Registered time.Time
	// GraceFloor is the latest grace restart (a new leadership term, the end of the all-zones halt,
	// the apiserver reachable again): no silence before it counts.
	GraceFloor time.Time
	// Blind is set while the apiserver cannot be read: the kubelet is then never judged silent.
	Blind bool
	// Renew is how often the kubelet renews its Lease (a quarter of its duration); zero: unknown.
	Renew time.Duration
}

// KubeletSlack is how late a Lease renewal the kubelet made may reach the coordinator's informer.
const KubeletSlack = 2 * time.Second

// KubeletWindow is how long a kubelet that renews its Lease every renew is never silent: two
// renewals and the slack (zero without a kubelet witness). A live kubelet renews once per renew
// interval; one renewal lost or delayed by a slow apiserver is still inside the window.
func KubeletWindow(renew time.Duration) time.Duration {
	if renew <= 0 {
		return 0
	}
	return 2*renew + KubeletSlack
}

// KubeletSilent tells whether the kubelet has been silent past its grace period (the startup grace
// period if it never posted), and says so in words. The grace period is never shorter than the
// kubelet's own window (KubeletWindow of o.Renew): a grace shorter than the Lease's renewal
// interval would judge a live kubelet silent between two renewals.
func KubeletSilent(o KubeletObservation, now time.Time, grace, startupGrace time.Duration) (bool, string) {
	if o.Blind {
		return false, "apiserver unreachable: kubelet not judged"
	}
	since, g := o.Probe, max(grace, KubeletWindow(o.Renew))
	if since.IsZero() {
		since, g = o.Registered, startupGrace
	}
	if since.Before(o.GraceFloor) {
		since = o.GraceFloor
	}
	silent := now.Sub(since)
	if silent <= g {
		return false, "kubelet reporting"
	}
	if o.Probe.IsZero() {
		return true, fmt.Sprintf("kubelet never posted (grace %s)", g)
	}
	return true, fmt.Sprintf("kubelet lease not renewed for %s (grace %s)", silent.Round(time.Second), g)
}

// KubeletDownPolicy says what a silent kubelet means while the node's agent keeps reporting.
type KubeletDownPolicy int

// Kubelet-down policies.
const (
	// KubeletDownWait (the default) never makes the node a fence candidate: the agent proves the
	// machine runs, and powering off a running machine to repair its kubelet is not nodefence's
	// call. The node is shown kubelet-down.
	KubeletDownWait KubeletDownPolicy = iota
	// KubeletDownFence treats a node whose kubelet is silent past its grace as failed even though
	// its agent reports: for clusters where a node without a kubelet must be recycled.
	KubeletDownFence
)

// ParseKubeletDownPolicy parses "wait" or "fence".
func ParseKubeletDownPolicy(s string) (KubeletDownPolicy, error) {
	switch s {
	case "wait", "":
		return KubeletDownWait, nil
	case "fence":
		return KubeletDownFence, nil
	}
	return 0, fmt.Errorf("kubelet-down policy %q: want wait or fence", s)
}

func (p KubeletDownPolicy) String() string {
	if p == KubeletDownFence {
		return "fence"
	}
	return "wait"
}

// Witnesses is the two-witness judgement of a node in Kubernetes mode.
type Witnesses struct {
	// Readiness is the node's readiness for pacing and fencing: not ready only when both witnesses
	// are silent (or the kubelet alone, under KubeletDownFence).
	Readiness coordv1.Readiness
	Reason    string
	// AgentDown: the agent is silent past its grace while the kubelet reports.
	AgentDown bool
	// KubeletDown: the kubelet is silent past its grace while the agent reports.
	KubeletDown bool
}

// Combine joins the agent's judgement (from Judge) with the kubelet's (from KubeletSilent). A
// shutting-down node stays as the agent judged it: it is never a fence candidate anyway.
func Combine(agent coordv1.Readiness, agentReason string, kubeletSilent bool, kubeletReason string, policy KubeletDownPolicy) Witnesses {
	agentSilent := agent == coordv1.Readiness_READINESS_UNKNOWN
	switch {
	case agent == coordv1.Readiness_READINESS_NOT_READY:
		return Witnesses{Readiness: agent, Reason: agentReason}
	case agentSilent && kubeletSilent:
		return Witnesses{Readiness: coordv1.Readiness_READINESS_UNKNOWN, Reason: agentReason + "; " + kubeletReason}
	case agentSilent:
		return Witnesses{Readiness: coordv1.Readiness_READINESS_READY, Reason: "agent down (" + agentReason + "); kubelet reporting", AgentDown: true}
	case kubeletSilent && policy == KubeletDownFence:
		return Witnesses{Readiness: coordv1.Readiness_READINESS_UNKNOWN, Reason: kubeletReason + "; agent reporting (kubelet-down policy fence)", KubeletDown: true}
	case kubeletSilent:
		return Witnesses{Readiness: coordv1.Readiness_READINESS_READY, Reason: kubeletReason + "; agent reporting (kubelet-down policy wait)", KubeletDown: true}
	}
	return Witnesses{Readiness: agent, Reason: agentReason}
}
