package engine

import (
	"sort"

	"google.golang.org/protobuf/types/known/timestamppb"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// The engine's answers to queries: the API's views of nodes and zones, and the counts the
// coordinator's metrics read. Callers run them on the loop goroutine (loop.Query).

// Halted reports whether every zone is fully disrupted (nothing is evicted or fenced).
func (e *Engine) Halted() bool { return e.halted }

// Paused reports whether an operator paused evictions.
func (e *Engine) Paused() bool { return e.paused }

// Nodes returns the API view of every node, sorted by name.
func (e *Engine) Nodes() []*coordv1.Node {
	out := make([]*coordv1.Node, 0, len(e.nodes))
	for _, n := range e.order {
		out = append(out, e.view(n))
	}
	return out
}

// Node returns one node's view, or nil.
func (e *Engine) Node(name string) *coordv1.Node {
	n, ok := e.nodes[name]
	if !ok {
		return nil
	}
	return e.view(n)
}

func (e *Engine) view(n *node) *coordv1.Node {
	v := &coordv1.Node{
		Name: n.name, Readiness: n.readiness, Reason: n.reason, BootId: n.bootID, Zone: n.zone, Region: n.region,
		Connected: n.streams > 0, ShuttingDown: n.shuttingDown, Fenceable: n.fenceable,
		FenceBlocked: n.fenceBlocked, FenceRequested: n.fenceRequested,
		AgentDown: n.agentDown, KubeletDown: n.kubeletDown, ControlPlane: n.controlPlane,
		Observed: e.observing(n), ExcludedFromFencing: n.excludeFencing, WouldFence: n.wouldFence,
		Signals: make(map[string]int64, len(n.signals)), ReadinessChangedAt: timestamppb.New(n.transition),
	}
	if !n.lastContact.IsZero() {
		v.LastSeen = timestamppb.New(n.lastContact)
	}
	if n.poweredOff != "" {
		// Ready until the grace period ends, but known to be off: say so first.
		v.Reason = n.poweredOff + "; " + n.reason
		if n.readiness == coordv1.Readiness_READINESS_READY {
			v.Reason = n.poweredOff + "; its agent's last contact is still within the grace period"
		}
	}
	if !n.kubeletProbe.IsZero() {
		v.KubeletLastSeen = timestamppb.New(n.kubeletProbe)
	}
	if !n.silentSince.IsZero() {
		v.SilentSince = timestamppb.New(n.silentSince)
	}
	if !n.silentBack.IsZero() {
		v.HeardAgainAt = timestamppb.New(n.silentBack)
	}
	n.watchdog.view(v)
	for _, s := range n.signals {
		v.Signals[s.name] = s.value
		if p, ok := s.stalledPercent(); ok {
			if v.StalledPercent == nil {
				v.StalledPercent = map[string]float64{}
			}
			v.StalledPercent[s.name] = p
		}
	}
	for _, c := range n.conditions {
		v.Conditions = append(v.Conditions, c)
	}
	sort.Slice(v.Conditions, func(i, j int) bool { return v.Conditions[i].Type < v.Conditions[j].Type })
	return v
}

// Zones returns the API view of every zone, sorted by key.
func (e *Engine) Zones() []*coordv1.Zone {
	out := make([]*coordv1.Zone, 0, len(e.zones))
	for _, k := range e.sortedZones() {
		z := e.zones[k]
		r := z.rate
		if e.halted || e.paused {
			r = 0
		}
		podRate, inFlight, held, granted, local, fallbacks := e.podZoneView(k)
		out = append(out, &coordv1.Zone{Key: k, State: z.state, Size: int32(z.size), Ready: int32(z.ready),
			NotReady: int32(z.size - z.ready), EvictionRate: r, QueueLength: int32(len(z.queue)), FencesInWindow: int32(len(z.fences)),
			PodEvictionRate: podRate, PodEvictionsInFlight: inFlight, PodEvictionsMaxInFlight: int32(e.cfg.PodEviction.MaxInFlight),
			PodCandidatesHeld: held, PodEvictionsGranted: granted, PodEvictionsLocal: local, PodEvictionFallbacks: fallbacks})
	}
	return out
}

// ZoneOf returns a node's zone key and state.
func (e *Engine) ZoneOf(name string) (string, coordv1.ZoneState, bool) {
	n, ok := e.nodes[name]
	if !ok {
		return "", coordv1.ZoneState_ZONE_STATE_UNSPECIFIED, false
	}
	k := n.zoneKey
	return k, e.zones[k].state, true
}

// Witnesses counts the nodes whose agent alone, or kubelet alone, is down (Kubernetes mode).
func (e *Engine) Witnesses() (agentDown, kubeletDown int) {
	for _, n := range e.order {
		if n.agentDown {
			agentDown++
		}
		if n.kubeletDown {
			kubeletDown++
		}
	}
	return agentDown, kubeletDown
}
