package engine

import (
	"fmt"
	"time"

	"github.com/nodefence/nodefence/coordinator/nodes"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// FenceConfig is the automatic trigger and its storm guard (seed 001's fencing policy).
type FenceConfig struct {
	// Enabled turns automatic fencing on. Manual fencing through the API is always available.
	Enabled bool
	// Timeout is how long a node must stay not ready (Unknown or NotReady, not shutting down) after
	// its zone's pacing released it before it is fenced.
	Timeout time.Duration
	// Settle is how long the storm guard must have let a released node's fence pass, without a
	// break, before it is requested — even with a Timeout of 0, so that nodes cut off together,
	// whose grace periods end a heartbeat apart, are all judged (halt, zone state) before the first
	// of them can be fenced.
	Settle time.Duration
	// AllowControlPlane lets nodes that match the control-plane selector be fenced automatically
	// (never the last ready one).
	AllowControlPlane bool
	// MaxUnresponsivePercent: no automatic fencing while more than this share of the cluster's nodes,
	// or of the node's zone, is not ready (a management-network failure looks like that).
	MaxUnresponsivePercent float64
	// Budget automatic fences per zone within BudgetWindow; 0 means no budget.
	Budget       int
	BudgetWindow time.Duration
	// Mode is enforce (automatic decisions fence) or observe (they are recorded as would fence and
	// nothing acts); a node's Configured.Observe puts that node alone in observe mode.
	Mode FenceMode
	// StormCooldown keeps automatic fencing held back this long after the storm guard last held a
	// fence back for a storm (the halt, a disrupted zone, too many nodes not ready), so that a
	// cluster coming back from one does not fence the nodes still recovering all at once; 0: off.
	StormCooldown time.Duration
	// FlapWindow: a node that comes back from a not-ready episode and goes silent again within
	// FlapWindow of coming back keeps its earlier episode's evidence — its not-ready time and, once
	// released again, its first release — so the fence timeout is not waited a second time for a
	// flapping node (the coordinator's --release-healthy-delay; 0: off).
	FlapWindow time.Duration
	// Detect is what starts the fence clock: the release of a node not ready past the grace
	// (DetectGrace), or in Kubernetes mode both witnesses silent past their own windows
	// (DetectWitnesses; silence.go).
	Detect FenceDetect
}

// DefaultFenceSettle is FenceConfig.Settle's default: five heartbeats of the agent's default
// interval, well above the spread of grace-period ends of nodes cut off at once.
const DefaultFenceSettle = 5 * time.Second

// FenceRequest asks the caller to fence a node automatically; the engine has checked the trigger and
// the storm guard.
type FenceRequest struct {
	Node, Zone string
	// Action is what to do: a power-off (FENCE_ACTION_OFF, or unspecified) for a silent node, a
	// power cycle (FENCE_ACTION_REBOOT) for a reporting node a condition trigger found broken.
	Action coordv1.FenceAction
	// KdumpSince is set when the node is dumping its memory (fence_kdump): it is down, so its pods
	// may be released before any power-off.
	KdumpSince time.Time
	// Evidence says why: the judgement and signals behind it.
	Evidence []string
	// LastContact, NotReadySince and At time the stages: detect (last contact -> not ready) and
	// decide (not ready -> requested).
	LastContact, NotReadySince, At time.Time
	// Observe marks a decision made in observe mode: the caller records it as would fence
	// (fencing.ObservedRecord) and never executes it.
	Observe bool
	// Silent marks a decision made on the witnesses' silence (fast detection): NotReadySince is
	// then when both fell silent past their windows.
	Silent bool
}

// Skip records that automatic fencing of a node was held back, and why. Kind is one of fenced,
// excluded, halted, paused, zone-disrupted, cluster-unresponsive, zone-unresponsive, budget,
// control-plane, last-control-plane.
type Skip struct {
	Node, Kind, Reason string
}

// fence requests automatic fencing of nodes whose pacing token was granted and whose not-ready time
// passed the fence timeout, unless the storm guard holds it back.
func (e *Engine) fence(now time.Time) {
	fc := e.cfg.Fence
	if !fc.Enabled {
		return
	}
	var count *unhealthy // counted once per pass, when a node is due to be judged
	for _, n := range e.order {
		name := n.name
		judged, start := e.fenceClock(n, now)
		if !judged || n.fenceRequested || !n.fenceable || n.shuttingDown || (n.wouldFence && e.observing(n)) {
			if !judged || n.shuttingDown {
				n.fenceBlocked = ""
			}
			n.guardClearSince = time.Time{}
			continue
		}
		k := n.zoneKey
		z := e.zones[k]
		// The guard judges on every pass from the release on, so the settle window sees any break.
		kind, reason := e.standingGuard(n)
		if reason == "" {
			kind, reason = e.excludedGuard(n)
		}
		if reason == "" {
			if count == nil {
				c := e.countUnhealthy()
				count = &c
			}
			kind, reason = e.guard(z, *count, now)
		}
		if reason == "" {
			kind, reason = e.controlPlaneGuard(n)
		}
		if reason != "" {
			n.guardClearSince = time.Time{}
		} else if n.guardClearSince.IsZero() {
			n.guardClearSince = now
		}
		if !e.due(n, z, start, now) {
			continue
		}
		if reason != "" {
			if reason != n.fenceBlocked {
				n.fenceBlocked = reason
				e.ready.Skips = append(e.ready.Skips, Skip{Node: name, Kind: kind, Reason: reason})
				e.event(now, "fence-held-back", name, "node %s: automatic fencing held back: %s", name, reason)
			}
			continue
		}
		if now.Sub(n.guardClearSince) < fc.Settle {
			continue
		}
		e.request(n, z, now)
	}
}

// due tells whether the fence timeout of n, counted from start, has run: under DetectGrace also
// the grace since its last restart (a node dumping its memory aside); on the witnesses' silence
// also the zone's pacing.
func (e *Engine) due(n *node, z *zone, start time.Time, now time.Time) bool {
	switch {
	case start.IsZero() || now.Sub(start) < e.cfg.Fence.Timeout:
		return false
	case start.Equal(n.silentSince):
		return e.paced(z, now)
	}
	return e.kdumpDown(n, now) || e.silence(n, now) > e.cfg.NodeMonitorGracePeriod
}

// request decides the node's automatic fence now (the trigger and the storm guard let it pass):
// requested in enforce mode, observed as would fence in observe mode, once per not-ready episode.
func (e *Engine) request(n *node, z *zone, now time.Time) {
	name, k, fc := n.name, z.key, e.cfg.Fence
	observe := e.observing(n)
	n.fenceBlocked = ""
	if observe {
		n.wouldFence = true
	} else {
		n.fenceRequested = true
	}
	// A would-fence spends the budget as the fence would have: observe mode decides as enforce.
	z.fences = append(z.fences, now)
	since, judged := n.notReadySince, fmt.Sprintf("%s since %s (%s): %s", word(n.readiness), n.notReadySince.UTC().Format(time.RFC3339), now.Sub(n.notReadySince).Round(time.Second), n.reason)
	fast := !n.silentSince.IsZero() && (since.IsZero() || n.silentSince.Before(since)) // decided on the witnesses' silence
	if fast {
		since, judged = n.silentSince, fmt.Sprintf("agent and kubelet silent past their windows since %s (%s; the last to fall silent: %s)",
			n.silentSince.UTC().Format(time.RFC3339), now.Sub(n.silentSince).Round(time.Second), n.silentWhy)
	}
	ev := []string{judged, fmt.Sprintf("zone %s %s: %d of %d ready", k, word(z.state), z.ready, z.size)}
	if !n.lastContact.IsZero() {
		ev = append(ev, "last agent contact "+n.lastContact.UTC().Format(time.RFC3339Nano))
	}
	for _, sig := range []string{"memory.available", "pid.available"} {
		if v, ok := n.signals.get(sig); ok {
			ev = append(ev, fmt.Sprintf("last %s=%d", sig, v))
		}
	}
	req := FenceRequest{Node: name, Zone: k, Evidence: ev, LastContact: n.lastContact, NotReadySince: since, At: now, Observe: observe,
		Silent: fast}
	if e.dumping(n, now) {
		req.KdumpSince = n.kdumpFirst
		req.Evidence = append(req.Evidence, "fence_kdump messages since "+n.kdumpFirst.UTC().Format(time.RFC3339Nano))
	}
	e.ready.Fences = append(e.ready.Fences, req)
	clock := fmt.Sprintf("not ready for %s, released %s ago", now.Sub(n.notReadySince).Round(time.Second), now.Sub(n.releasedAt).Round(time.Second))
	if fast {
		clock = fmt.Sprintf("agent and kubelet silent past their windows for %s", now.Sub(since).Round(time.Second))
	}
	if observe {
		e.event(now, "would-fence", name, "node %s: would fence (observe mode: nothing is switched; %s, fence timeout %s)", name, clock, fc.Timeout)
	} else {
		e.event(now, "fence-requested", name, "node %s: fence requested (%s, fence timeout %s)", name, clock, fc.Timeout)
	}
	e.persistNode(n)
}

// guard is the storm guard: the kind and reason to hold fencing back, or "", "".
func (e *Engine) guard(z *zone, u unhealthy, now time.Time) (string, string) {
	fc := e.cfg.Fence
	zc := u.zones[z.key]
	if zc == nil {
		zc = &zoneCount{}
	}
	kind, reason := "", ""
	switch {
	case e.halted:
		kind, reason = "halted", "every zone is fully disrupted: this coordinator may be the one cut off"
	case e.paused:
		return "paused", e.pausedWhy()
	case z.state == coordv1.ZoneState_ZONE_STATE_PARTIAL_DISRUPTION || z.state == coordv1.ZoneState_ZONE_STATE_FULL_DISRUPTION:
		kind, reason = "zone-disrupted", fmt.Sprintf("zone %s is in %s", z.key, word(z.state))
	case fc.MaxUnresponsivePercent > 0 && 100*float64(u.bad) > fc.MaxUnresponsivePercent*float64(u.total):
		kind, reason = "cluster-unresponsive", fmt.Sprintf("%d of %d nodes in the cluster are not ready%s (more than %g%%)", u.bad, u.total, countedNote(u.extra), fc.MaxUnresponsivePercent)
	case fc.MaxUnresponsivePercent > 0 && 100*float64(zc.bad) > fc.MaxUnresponsivePercent*float64(zc.size):
		kind, reason = "zone-unresponsive", fmt.Sprintf("%d of %d nodes in zone %s are not ready%s (more than %g%%)", zc.bad, zc.size, z.key, countedNote(zc.extra), fc.MaxUnresponsivePercent)
	// The zone's state as kube-controller-manager would compute it with the counted nodes not ready.
	case len(zc.extra) > 0 && disrupted(nodes.ZoneStateOf(zc.size-zc.bad, zc.bad, e.cfg.UnhealthyZoneThreshold)):
		st := nodes.ZoneStateOf(zc.size-zc.bad, zc.bad, e.cfg.UnhealthyZoneThreshold)
		kind, reason = "zone-disrupted", fmt.Sprintf("zone %s would be in %s with %d of %d nodes not ready%s", z.key, word(st), zc.bad, zc.size, countedNote(zc.extra))
	}
	if kind != "" {
		e.stormAt = now // a storm: the cooldown counts from the last time it held a fence back
		return kind, reason
	}
	if fc.StormCooldown > 0 && !e.stormAt.IsZero() && now.Sub(e.stormAt) < fc.StormCooldown {
		return "storm-cooldown", fmt.Sprintf("a storm held fencing back until %s: fencing resumes %s after it (--storm-cooldown)",
			e.stormAt.UTC().Format(time.RFC3339), fc.StormCooldown)
	}
	if fc.Budget > 0 {
		kept := z.fences[:0]
		for _, t := range z.fences {
			if now.Sub(t) < fc.BudgetWindow {
				kept = append(kept, t)
			}
		}
		z.fences = kept
		if len(kept) >= fc.Budget {
			return "budget", fmt.Sprintf("zone %s spent its fence budget (%d in %s)", z.key, fc.Budget, fc.BudgetWindow)
		}
	}
	return "", ""
}

// silence is how long the node has been silent (both witnesses in Kubernetes mode) since its last
// contact or the last grace restart, whichever is later.
func (e *Engine) silence(n *node, now time.Time) time.Duration {
	since := e.contact(n)
	if floor := e.graceFloor(n); since.Before(floor) {
		since = floor
	}
	return now.Sub(since)
}

// controlPlaneGuard holds back the automatic fence of a control-plane node: always unless allowed,
// and always when no other control-plane node is ready (fencing it would take the last member).
func (e *Engine) controlPlaneGuard(n *node) (string, string) {
	if !n.controlPlane {
		return "", ""
	}
	if !e.cfg.Fence.AllowControlPlane {
		return "control-plane", "control-plane node: never fenced automatically unless allowed (--fence-control-plane)"
	}
	if why := e.lastControlPlane(n); why != "" {
		return "last-control-plane", why
	}
	return e.controlPlaneQuorum(n)
}

// controlPlaneQuorum holds back the automatic fence of control-plane node n while another
// control-plane node's fence was requested (at most one at a time), or while the other ready
// control-plane nodes alone are not a majority of all of them: with etcd stacked on the control
// plane (one member per control-plane node), n may be a member the current quorum still counts on —
// silent to nodefence, not necessarily to its peers — and powering it off would stop etcd.
func (e *Engine) controlPlaneQuorum(n *node) (string, string) {
	members, ready := 0, 0
	for _, o := range e.order {
		if !o.controlPlane {
			continue
		}
		members++
		if o == n {
			continue
		}
		if o.fenceRequested {
			return "control-plane-busy", fmt.Sprintf("control-plane node %s's fence was requested and it is not back: at most one control-plane node is fenced automatically at a time", o.name)
		}
		if o.readiness == coordv1.Readiness_READINESS_READY {
			ready++
		}
	}
	if quorum := members/2 + 1; ready < quorum {
		return "control-plane-quorum", fmt.Sprintf("fencing %s could break etcd's quorum: %d other control-plane node(s) ready, a majority of %d is %d", n.name, ready, members, quorum)
	}
	return "", ""
}

// lastControlPlane says why fencing n would take the last control-plane member, or "".
func (e *Engine) lastControlPlane(n *node) string {
	others := 0
	for _, o := range e.order {
		if o != n && o.controlPlane && o.readiness == coordv1.Readiness_READINESS_READY && !o.fenceRequested {
			others++
		}
	}
	if others > 0 {
		return ""
	}
	return fmt.Sprintf("fencing %s would take the last control-plane member: no other control-plane node is ready", n.name)
}

// FenceRefusal says why a fence of the node must be refused whoever asks (an operator too): it
// would take the last ready control-plane member. "" when nothing refuses it.
func (e *Engine) FenceRefusal(node string) string {
	n, ok := e.nodes[node]
	if !ok || !n.controlPlane {
		return ""
	}
	return e.lastControlPlane(n)
}

// PoweredOff reports whether a fence confirmed the node off (by read-back or an operator's
// acknowledgement) since its agent last said hello.
func (e *Engine) PoweredOff(name string) bool {
	n, ok := e.nodes[name]
	return ok && n.poweredOff != ""
}

// pausedWhy says that evictions are paused, by whom and why when the pause says so.
func (e *Engine) pausedWhy() string {
	if e.pauseNote == "" {
		return "evictions paused by an operator"
	}
	return "evictions paused by an operator (" + e.pauseNote + ")"
}
