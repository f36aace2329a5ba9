package engine

import (
	"fmt"
	"time"

	"github.com/nodefence/nodefence/coordinator/nodes"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// Fast detection (FenceConfig.Detect = DetectWitnesses, Kubernetes mode).
//
// kube-controller-manager calls a node Unknown after --node-monitor-grace-period (50 s) of silence,
// a grace sized for ONE witness, the kubelet, and the conditions that can delay it (a slow or
// stalled apiserver, a busy node). nodefence hears two independent witnesses over two independent
// paths: the agent's stream (a heartbeat a second) and the kubelet's Lease through the apiserver.
// Under DetectWitnesses a node is a fence candidate once BOTH are silent past their own windows —
// fencing.ProofRule.SilentAt, the same rule the proof judges a power-off by: the agent's three
// heartbeats and a second, the kubelet's two Lease renewals and the informer's slack — instead of
// after the grace. Readiness, zone states, taints and the eviction queues stay
// kube-controller-manager's, judged on the grace; only the fence decision moves. What keeps a
// healthy node from being fenced on a fast clock:
//   - both witnesses must be silent; one alone never makes a candidate;
//   - the kubelet's silence counts only while the apiserver shows that it delivers kubelet
//     heartbeats at all: when no kubelet of the cluster was seen renewing for a renewal interval
//     and the slack (a stalled or unreachable apiserver, a coordinator whose watch fell behind),
//     no kubelet is judged silent, and when heartbeats resume every kubelet's silence counts
//     afresh from then (kubeletResumed), as after a blind spell;
//   - the storm guard counts the silent nodes and the suspects — a node whose agent fell silent
//     and whose kubelet was not heard since — as unhealthy from the agent's silence on, so nodes
//     that die together are all counted while the first of them waits for its kubelet window, and
//     the settle window runs during that wait rather than after it;
//   - the fence timeout (--fence-timeout) is counted from the moment both witnesses were silent,
//     and the zone's pacing (its eviction rate) spaces automatic fences in a zone;
//   - the witness re-check before each driver call uses the same windows (Contact).

// FenceDetect is what starts an automatic fence's clock.
type FenceDetect int

// Fence detections.
const (
	// DetectGrace: a node is a fence candidate once it is not ready (silent past the node-monitor
	// grace period, kube-controller-manager's judgement) and its zone's pacing released it; the
	// fence timeout counts from the release. The zero value, and the only detection in standalone
	// mode (one witness).
	DetectGrace FenceDetect = iota
	// DetectWitnesses: in Kubernetes mode, a node is a fence candidate once its agent and its
	// kubelet are both silent past their own windows; the fence timeout counts from then (the
	// coordinator's default).
	DetectWitnesses
)

func (d FenceDetect) String() string {
	if d == DetectWitnesses {
		return "witnesses"
	}
	return "grace"
}

// ParseFenceDetect parses "witnesses" or "grace" (the --fence-detect flag).
func ParseFenceDetect(s string) (FenceDetect, error) {
	switch s {
	case "witnesses":
		return DetectWitnesses, nil
	case "grace":
		return DetectGrace, nil
	}
	return DetectGrace, fmt.Errorf("fence detection %q: want witnesses or grace", clipped(s))
}

// fastDetect reports whether the fence decision follows the witnesses' own windows.
func (e *Engine) fastDetect() bool {
	return e.cfg.KubeletWitness && e.cfg.Fence.Detect == DetectWitnesses
}

// kubeletQuiet is how long no kubelet of the cluster may be seen renewing before the engine stops
// trusting the kubelet witness: one renewal interval and the informer's slack.
func kubeletQuiet(renew time.Duration) time.Duration { return renew + nodes.KubeletSlack }

// heardKubelet records that a kubelet's heartbeat advanced at (any node's): a first advance after a
// cluster-wide quiet restarts every kubelet's silence from at.
func (e *Engine) heardKubelet(n *node, at time.Time) {
	if !e.kubeletLast.IsZero() && at.Sub(e.kubeletLast) > kubeletQuiet(n.renew()) && e.fastDetect() {
		e.kubeletResumed = at
		e.event(at, "witness", "", "kubelet heartbeats resumed after %s in which no kubelet was seen renewing: every kubelet's silence counts from now",
			at.Sub(e.kubeletLast).Round(time.Second))
	}
	if at.After(e.kubeletLast) {
		e.kubeletLast = at
	}
}

// kubeletsHeard reports whether the apiserver showed a kubelet renewing recently enough for one
// kubelet's silence to mean that kubelet, not the path to it.
func (e *Engine) kubeletsHeard(n *node, now time.Time) bool {
	return !e.kubeletLast.IsZero() && now.Sub(e.kubeletLast) <= kubeletQuiet(n.renew())
}

// silentAt is when both witnesses of n were silent past their windows, and which fell silent last;
// zero when the node is not judged that way now: a witness cannot be heard (the apiserver unreadable
// or delivering no kubelet's heartbeat, the all-zones halt) or the kubelet never posted.
func (e *Engine) silentAt(n *node, now time.Time) (time.Time, string) {
	if e.blind || e.halted || !n.kubeletSeen || !e.kubeletsHeard(n, now) {
		return time.Time{}, ""
	}
	w := e.witnessed(n)
	if f := e.silenceFloor(n); f.After(w.Since) {
		w.Since = f
	}
	return e.proofRule().SilentAt(w)
}

// silenceFloor is the latest fresh start of n's witnesses' silence: its grace floor (a new term,
// the apiserver readable again, the end of observe mode) or the resumption of kubelet heartbeats.
func (e *Engine) silenceFloor(n *node) time.Time {
	f := e.graceFloor(n)
	if e.kubeletResumed.After(f) {
		f = e.kubeletResumed
	}
	return f
}

// judgeSilence keeps n's fast-detection state: when both witnesses went silent, and the end of the
// episode when one is heard again (a node whose readiness never left Ready gets its next automatic
// fence decision then).
func (e *Engine) judgeSilence(n *node, now time.Time) {
	if !e.fastDetect() || n.shuttingDown {
		n.silentSince, n.silentWhy = time.Time{}, ""
		return
	}
	if floor := e.silenceFloor(n); !n.silentSince.IsZero() && n.silentJudged.Before(floor) {
		// A fresh start (a new term's, the apiserver readable again, kubelet heartbeats resumed, the
		// node out of observe mode): silence judged before it is no evidence now.
		n.silentSince, n.silentJudged, n.silentWhy = time.Time{}, time.Time{}, ""
	}
	at, why := e.silentAt(n, now)
	silent := !at.IsZero() && !now.Before(at)
	heard := n.lastContact.After(n.silentJudged) || n.kubeletAdvanced.After(n.silentJudged)
	switch {
	case silent && n.silentSince.IsZero():
		n.silentSince, n.silentJudged, n.silentWhy = at, at, why
		if w := e.cfg.Fence.FlapWindow; w > 0 && !n.silentEarlier.IsZero() && e.contact(n).Sub(n.silentBack) <= w && n.silentEarlier.Before(at) {
			n.silentSince = n.silentEarlier
			e.event(now, "witness", n.name, "node %s: agent and kubelet silent past their windows again (%s), %s after coming back: keeps its earlier evidence (silent since %s)",
				n.name, why, e.contact(n).Sub(n.silentBack).Round(time.Second), n.silentSince.UTC().Format(time.RFC3339))
			return
		}
		e.event(now, "witness", n.name, "node %s: agent and kubelet silent past their windows since %s (the last to fall silent: %s): a fence candidate",
			n.name, at.UTC().Format(time.RFC3339), why)
	case !n.silentSince.IsZero() && heard:
		n.silentEarlier, n.silentBack = n.silentSince, now
		if n.fenceRequested || n.wouldFence {
			n.silentEarlier = time.Time{} // fenced (or observed so): the episode ended with its fence
		}
		n.silentSince, n.silentWhy = time.Time{}, ""
		e.event(now, "witness", n.name, "node %s: a witness is heard again: no longer silent", n.name)
		if n.readiness == coordv1.Readiness_READINESS_READY {
			n.fenceRequested, n.fenceBlocked, n.wouldFence, n.guardClearSince = false, "", false, time.Time{}
			e.persistNode(n)
		}
	}
}

// suspect is why the storm guard counts n, ready and not yet silent past both windows, as
// unhealthy under fast detection: its agent is silent past its window and its kubelet was not
// heard since — a node that may be dying with others, whose kubelet window has not ended yet.
func (e *Engine) suspect(n *node, now time.Time) string {
	if !e.fastDetect() || n.shuttingDown || n.lastContact.IsZero() {
		return ""
	}
	if !n.silentSince.IsZero() {
		return "silent (agent and kubelet past their windows)"
	}
	from := n.lastContact
	if f := e.graceFloor(n); f.After(from) {
		from = f
	}
	agentSilent := now.Sub(from) > e.proofRule().AgentWindow()
	if agentSilent && !n.kubeletProbe.After(n.lastContact.Add(nodes.KubeletSlack)) {
		return "agent silent, kubelet not heard since"
	}
	return ""
}

// fenceClock tells whether the automatic fence of n is judged by the storm guard now, and from when
// its fence timeout counts (zero: not due to be counted yet): from the release under DetectGrace,
// from the witnesses' silence under DetectWitnesses (whichever comes first when both apply).
func (e *Engine) fenceClock(n *node, now time.Time) (judged bool, start time.Time) {
	released := n.taint != TaintNone && !n.releasedAt.IsZero()
	if released {
		start = n.releasedAt
	}
	if !n.silentSince.IsZero() && (start.IsZero() || n.silentSince.Before(start)) {
		start = n.silentSince
	}
	return released || !n.silentSince.IsZero() || e.suspect(n, now) != "", start
}

// paced tells whether the zone's pacing lets an automatic fence decided on the witnesses' silence
// go now: at most one per 1/rate in a zone (kube-controller-manager's eviction rate for the zone's
// state), as the grace path's releases are paced.
func (e *Engine) paced(z *zone, now time.Time) bool {
	if z.rate <= 0 {
		return false
	}
	if len(z.fences) == 0 {
		return true
	}
	gap := time.Duration(float64(time.Second) / z.rate)
	return now.Sub(z.fences[len(z.fences)-1]) >= gap
}
