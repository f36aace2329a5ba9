package engine

import (
	"fmt"
	"strings"
	"time"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// Node conditions as triggers (--unhealthy-condition): a node whose agent and kubelet still report
// but whose Node carries a configured condition (Node Problem Detector's KernelDeadlock,
// ReadonlyFilesystem, ...) in the configured status for the configured time is alive but broken. It
// becomes a fence candidate for a power cycle only (a reboot record: off, confirmed by read-back,
// then on): its pods are never released, since the node may still write until the confirmed off and
// comes back right after it. The storm guard (its budget per zone), the control-plane rules, observe
// mode and the exclusion apply as to any automatic fence. Ready and the kubelet's pressure
// conditions are not triggers: Ready stays kube-controller-manager's, and silence is judged by the
// two-witness rule.

// ConditionTrigger is one --unhealthy-condition: Type in Status for at least For.
type ConditionTrigger struct {
	Type, Status string
	For          time.Duration
}

func (c ConditionTrigger) String() string { return fmt.Sprintf("%s=%s:%s", c.Type, c.Status, c.For) }

// maxConditionTriggers bounds --unhealthy-condition.
const maxConditionTriggers = 16

// notTriggers are the conditions that are never triggers: Ready is kube-controller-manager's
// judgement (silence is the two-witness rule's), the pressure conditions are the kubelet's
// eviction signals.
var notTriggers = map[string]bool{"Ready": true, "MemoryPressure": true, "DiskPressure": true, "PIDPressure": true, "NetworkUnavailable": true}

// ParseConditionTrigger parses TYPE=STATUS:DURATION (KernelDeadlock=True:5m).
func ParseConditionTrigger(s string) (ConditionTrigger, error) {
	typ, rest, ok := strings.Cut(s, "=")
	status, dur, ok2 := strings.Cut(rest, ":")
	if !ok || !ok2 {
		return ConditionTrigger{}, fmt.Errorf("%q: want TYPE=STATUS:DURATION, as KernelDeadlock=True:5m", s)
	}
	if typ == "" || len(typ) > 316 || strings.ContainsFunc(typ, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return ConditionTrigger{}, fmt.Errorf("%q: condition type must be a non-empty word of at most 316 characters", s)
	}
	if notTriggers[typ] {
		return ConditionTrigger{}, fmt.Errorf("%q: %s is not a trigger (Ready stays kube-controller-manager's, the pressure conditions the kubelet's)", s, typ)
	}
	if status != "True" && status != "False" && status != "Unknown" {
		return ConditionTrigger{}, fmt.Errorf("%q: status must be True, False or Unknown", s)
	}
	d, err := time.ParseDuration(dur)
	if err != nil || d <= 0 {
		return ConditionTrigger{}, fmt.Errorf("%q: duration must be positive, as 5m", s)
	}
	return ConditionTrigger{Type: typ, Status: status, For: d}, nil
}

// ValidateConditionTriggers checks a set of triggers: bounded, one per condition type.
func ValidateConditionTriggers(ts []ConditionTrigger) error {
	if len(ts) > maxConditionTriggers {
		return fmt.Errorf("%d triggers: at most %d", len(ts), maxConditionTriggers)
	}
	seen := map[string]bool{}
	for _, t := range ts {
		if seen[t.Type] {
			return fmt.Errorf("condition %s given twice", t.Type)
		}
		seen[t.Type] = true
	}
	return nil
}

// conditionSeen is a trigger condition's status as the engine saw it, since when (its own clock).
type conditionSeen struct {
	status string
	since  time.Time
}

// observeConditions records the statuses of the triggers' condition types from a Node (conds:
// type -> status); a status the engine sees change starts its clock at at.
func (e *Engine) observeConditions(n *node, conds map[string]string, at time.Time) {
	for _, t := range e.cfg.UnhealthyConditions {
		status := conds[t.Type]
		if cur, ok := n.conds[t.Type]; ok && cur.status == status {
			continue
		}
		if n.conds == nil {
			n.conds = map[string]conditionSeen{}
		}
		n.conds[t.Type] = conditionSeen{status: status, since: at}
		if n.condFenced == t.Type {
			n.condFenced = "" // the condition changed: a new episode
		}
	}
}

// dueTrigger is the first trigger whose condition has held on n for its time (counted from this
// term's start at the earliest), or nil.
func (e *Engine) dueTrigger(n *node, now time.Time) (*ConditionTrigger, time.Time) {
	for i, t := range e.cfg.UnhealthyConditions {
		seen, ok := n.conds[t.Type]
		if !ok || seen.status != t.Status {
			continue
		}
		since := seen.since
		if since.Before(e.graceFloor(n)) {
			since = e.graceFloor(n)
		}
		if now.Sub(since) >= t.For {
			return &e.cfg.UnhealthyConditions[i], since
		}
	}
	return nil, time.Time{}
}

// conditionFences requests a power cycle of every reporting node whose trigger is due, once per
// episode of the condition, unless a guard holds it back.
func (e *Engine) conditionFences(now time.Time) {
	if len(e.cfg.UnhealthyConditions) == 0 || !e.cfg.Fence.Enabled {
		return
	}
	var count *unhealthy // counted once per pass, when a node is due
	for _, n := range e.order {
		if n.readiness != coordv1.Readiness_READINESS_READY || !n.fenceable || n.shuttingDown || n.condFenced != "" {
			continue
		}
		t, since := e.dueTrigger(n, now)
		if t == nil {
			continue
		}
		kind, reason := e.standingGuard(n)
		if reason == "" {
			kind, reason = e.excludedGuard(n)
		}
		if reason == "" {
			if count == nil {
				c := e.countUnhealthy()
				count = &c
			}
			kind, reason = e.guard(e.zones[n.zoneKey], *count, now)
		}
		if reason == "" {
			kind, reason = e.controlPlaneGuard(n)
		}
		if reason != "" {
			if reason != n.condBlocked {
				n.condBlocked = reason
				e.ready.Skips = append(e.ready.Skips, Skip{Node: n.name, Kind: kind, Reason: reason})
				e.event(now, "fence-held-back", n.name, "node %s: power cycle for %s held back: %s", n.name, t, reason)
			}
			continue
		}
		n.condBlocked, n.condFenced = "", t.Type
		why := fmt.Sprintf("condition %s=%s since %s (%s, trigger %s); agent and kubelet reporting: alive but broken",
			t.Type, t.Status, since.UTC().Format(time.RFC3339), now.Sub(since).Round(time.Second), t)
		if e.observing(n) {
			e.event(now, "would-fence", n.name, "node %s: would power-cycle (observe mode): %s", n.name, why)
			continue
		}
		e.zones[n.zoneKey].fences = append(e.zones[n.zoneKey].fences, now)
		e.ready.Fences = append(e.ready.Fences, FenceRequest{Node: n.name, Zone: n.zoneKey, Action: coordv1.FenceAction_FENCE_ACTION_REBOOT,
			Evidence: []string{why}, LastContact: n.lastContact, NotReadySince: since, At: now})
		e.event(now, "fence-requested", n.name, "node %s: power cycle requested: %s (its pods are not released)", n.name, why)
	}
}
