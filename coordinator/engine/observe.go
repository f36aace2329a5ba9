package engine

import (
	"fmt"
	"strings"
	"time"

	"github.com/nodefence/nodefence/coordinator/fencing"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// Observe mode and the exclusion from automatic fencing (docs/observe.md).
//
// In observe mode (FenceConfig.Mode, or one node's Configured.Observe) the engine makes every
// decision it makes in enforce mode — judgement, pacing, storm guard, budget — and an automatic
// fence comes out of Ready as a FenceRequest with Observe set: the caller records it as "would
// fence" (fencing.ObservedRecord) and calls no driver. A node leaving observe mode gets a fresh
// grace period, so that nothing decided while observing is acted on: an enforced fence of it is a
// new decision, made after the node was silent for a full grace period since the switch.
//
// A node excluded from fencing (Configured.ExcludeFencing) is judged, paced and counted like any
// node, but never fenced automatically: its automatic fence is held back with the kind "excluded".
// An operator may still fence it explicitly.

// FenceMode is what the engine's automatic fence decisions do.
type FenceMode int

// Fence modes.
const (
	// FenceModeEnforce: an automatic decision fences the node (the default).
	FenceModeEnforce FenceMode = iota
	// FenceModeObserve: every decision is made and recorded as "would fence"; nothing acts.
	FenceModeObserve
)

func (m FenceMode) String() string {
	if m == FenceModeObserve {
		return "observe"
	}
	return "enforce"
}

// ParseFenceMode parses "enforce" or "observe" (the --fence-mode flag and the
// nodefence.io/fence-mode annotation).
func ParseFenceMode(s string) (FenceMode, error) {
	switch s {
	case "enforce":
		return FenceModeEnforce, nil
	case "observe":
		return FenceModeObserve, nil
	}
	return FenceModeEnforce, fmt.Errorf("fence mode %q: want observe or enforce", clipped(s))
}

// clipped bounds a value quoted in an error.
func clipped(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// observing reports whether the node's automatic decisions are only observed.
func (e *Engine) observing(n *node) bool {
	return e.cfg.Fence.Mode == FenceModeObserve || n.observeMode
}

// configureModes applies a Configured input's per-node fence mode and exclusion. A node that
// leaves observe mode gets a fresh grace period from at: a fence of it can only be decided anew.
func (e *Engine) configureModes(n *node, in Configured) {
	was, excluded := e.observing(n), n.excludeFencing
	n.observeMode, n.excludeFencing = in.Observe, in.ExcludeFencing
	if in.ModeNote != "" && in.ModeNote != n.modeNote {
		e.event(in.At, "fence-mode", n.name, "node %s: %s", n.name, in.ModeNote)
	}
	n.modeNote = in.ModeNote
	switch now := e.observing(n); {
	case was && !now:
		if in.At.After(n.floor) {
			n.floor = in.At
		}
		n.guardClearSince, n.wouldFence = time.Time{}, false
		e.event(in.At, "fence-mode", n.name, "node %s: fence mode observe -> enforce: a fresh grace period (and fresh witness windows) from now; nothing decided while observing is acted on", n.name)
	case !was && now:
		e.event(in.At, "fence-mode", n.name, "node %s: fence mode enforce -> observe: automatic fences are recorded as would fence, nothing is switched", n.name)
	}
	if in.Maintenance != n.maintenance {
		if in.Maintenance != "" {
			e.event(in.At, "maintenance", n.name, "node %s: in maintenance (%s): no automatic fence; operators may still fence it", n.name, in.Maintenance)
		} else {
			e.event(in.At, "maintenance", n.name, "node %s: maintenance over", n.name)
		}
		n.maintenance = in.Maintenance
	}
	if excluded != n.excludeFencing {
		if n.excludeFencing {
			e.event(in.At, "fence-exclusion", n.name, "node %s: excluded from automatic fencing (%s); operators may still fence it", n.name, LabelExcludeFencing)
		} else {
			e.event(in.At, "fence-exclusion", n.name, "node %s: no longer excluded from automatic fencing", n.name)
		}
	}
}

// LabelExcludeFencing is the Node label that excludes a node from automatic fencing (read in
// coordinator/kube; named here for the engine's words).
const LabelExcludeFencing = "nodefence.io/exclude-from-fencing"

// graceFloor is when the node's current grace period started: the term's (a leader change, the end
// of the halt, the apiserver readable again) or the node's own (it left observe mode), the later.
func (e *Engine) graceFloor(n *node) time.Time {
	if n.floor.After(e.floor) {
		return n.floor
	}
	return e.floor
}

// AnnotationMaintenance is the Node annotation that puts a node in maintenance (its value says why;
// read in coordinator/kube; named here for the engine's words).
const AnnotationMaintenance = "nodefence.io/maintenance"

// excludedGuard holds back the automatic fence of a node in maintenance or excluded from fencing.
func (e *Engine) excludedGuard(n *node) (string, string) {
	if n.maintenance != "" {
		return "maintenance", fmt.Sprintf("node in maintenance (%s: %s); an operator may still fence it", AnnotationMaintenance, n.maintenance)
	}
	if !n.excludeFencing {
		return "", ""
	}
	return "excluded", fmt.Sprintf("node excluded from automatic fencing (label %s); an operator may still fence it", LabelExcludeFencing)
}

// counted is why the storm guard counts a node as unhealthy although it is ready ("" when it does
// not): medik8s's and machine-api-operator's fix after clusters remediated too many nodes — a node
// being fenced, fenced (its record stands), observed as would fence, or excluded from fencing is
// no healthy capacity, whatever its readiness says yet.
func (e *Engine) counted(n *node) string {
	switch {
	case n.fenceRequested:
		return "being fenced"
	case n.fence != nil && fencing.HoldsAutoFence(n.fence.rec):
		return "fenced"
	case n.fence != nil && n.fence.rec.GetFinishedAt() == nil && n.fence.rec.GetAction() != coordv1.FenceAction_FENCE_ACTION_ON:
		return "being fenced"
	case n.poweredOff != "":
		return "fenced"
	case n.wouldFence:
		return "would be fenced (observe mode)"
	case n.maintenance != "":
		return "in maintenance"
	case n.excludeFencing:
		return "excluded from fencing"
	}
	return e.suspect(n, e.now)
}

// unhealthy is the storm guard's count: the cluster's nodes and how many of them are not ready
// (shutting down gracefully aside) or counted unhealthy, and the same per zone (the zone's state
// population: exclude-disruption nodes are not in it), with the counted ready nodes named.
type unhealthy struct {
	total, bad int
	zones      map[string]*zoneCount
	extra      []string // "a2 fenced", cluster-wide
}

type zoneCount struct {
	size, bad int
	extra     []string
}

func (e *Engine) countUnhealthy() unhealthy {
	u := unhealthy{zones: map[string]*zoneCount{}}
	for _, n := range e.order {
		u.total++
		notReady := n.readiness != coordv1.Readiness_READINESS_READY && !n.shuttingDown
		why := ""
		if !notReady {
			why = e.counted(n)
		}
		bad := notReady || why != ""
		if bad {
			u.bad++
		}
		if why != "" {
			u.extra = append(u.extra, n.name+" "+why)
		}
		if n.excluded {
			continue
		}
		z := u.zones[n.zoneKey]
		if z == nil {
			z = &zoneCount{}
			u.zones[n.zoneKey] = z
		}
		z.size++
		// As the zone's own count (updateZones): not ready, shutting down or never reported.
		if n.readiness != coordv1.Readiness_READINESS_READY || !e.reported(n) || why != "" {
			z.bad++
		}
		if why != "" {
			z.extra = append(z.extra, n.name+" "+why)
		}
	}
	return u
}

// disrupted reports whether a zone state holds automatic fencing back.
func disrupted(st coordv1.ZoneState) bool {
	return st == coordv1.ZoneState_ZONE_STATE_PARTIAL_DISRUPTION || st == coordv1.ZoneState_ZONE_STATE_FULL_DISRUPTION
}

// countedNote names the ready nodes counted unhealthy, for a guard's reason ("" when none).
func countedNote(extra []string) string {
	if len(extra) == 0 {
		return ""
	}
	return " or counted unhealthy (" + strings.Join(extra, ", ") + ")"
}
