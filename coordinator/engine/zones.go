package engine

import (
	"sort"
	"time"

	"golang.org/x/time/rate"

	"github.com/nodefence/nodefence/coordinator/nodes"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// zone is one failure zone: its state, its eviction rate and queue, and its automatic-fence budget.
type zone struct {
	key     string
	state   coordv1.ZoneState
	rate    float64
	limiter *rate.Limiter
	queue   []string
	members int // nodes in the zone, excluded ones too
	size    int // nodes counted in the zone's state (not excluded), as of the last Tick
	ready   int
	fences  []time.Time // automatic fences within the budget window
}

func (e *Engine) enterZone(n *node) {
	k := nodes.ZoneKey(n.region, n.zone)
	n.zoneKey = k
	z, ok := e.zones[k]
	if !ok {
		z = &zone{key: k, state: coordv1.ZoneState_ZONE_STATE_INITIAL}
		e.zones[k] = z
	}
	n.zoneOf = z
	z.members++
}

func (e *Engine) leaveZone(n *node) {
	k := n.zoneKey
	z := e.zones[k]
	z.members--
	z.queue = remove(z.queue, n.name)
	n.queued = false
	if z.members == 0 {
		delete(e.zones, k)
		if z.state != coordv1.ZoneState_ZONE_STATE_INITIAL {
			e.event(e.now, "zone", "", "zone %s: removed (no nodes left)", k)
		}
	}
}

func (e *Engine) setLocation(n *node, region, zone string) {
	if n.region == region && n.zone == zone {
		return
	}
	queued := n.queued
	e.leaveZone(n)
	n.region, n.zone = region, zone
	e.enterZone(n)
	if queued {
		e.enqueue(n, n.queuedAt)
	}
}

func (e *Engine) sortedZones() []string {
	keys := make([]string, 0, len(e.zones))
	for k := range e.zones {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// updateZones recomputes every zone's state and rate, and the all-zones halt, as
// kube-controller-manager's handleDisruption: nodes labelled node.kubernetes.io/exclude-disruption
// are not counted, a node that never reported counts as not ready, entering the halt removes every
// granted taint and empties the queues, and leaving it gives every node a fresh grace period and
// every zone an empty bucket.
func (e *Engine) updateZones(now time.Time) {
	for _, z := range e.zones {
		z.size, z.ready = 0, 0
	}
	for _, n := range e.order {
		if n.excluded {
			continue
		}
		z := n.zoneOf
		z.size++
		if n.readiness == coordv1.Readiness_READINESS_READY && e.reported(n) {
			z.ready++
		}
	}
	allFull, counted := true, 0
	for _, k := range e.sortedZones() {
		z := e.zones[k]
		if z.size == 0 {
			continue // only excluded nodes: the controller does not see the zone
		}
		counted++
		st := nodes.ZoneStateOf(z.ready, z.size-z.ready, e.cfg.UnhealthyZoneThreshold)
		if st != coordv1.ZoneState_ZONE_STATE_FULL_DISRUPTION {
			allFull = false
		}
		if st != z.state {
			e.event(now, "zone", "", "zone %s: %s -> %s (%d ready, %d not ready)", k, word(z.state), word(st), z.ready, z.size-z.ready)
			z.state = st
			e.ready.Writes = append(e.ready.Writes, Write{Zone: &ZoneRecord{Key: k, State: st, At: now}})
		}
	}
	allFull = allFull && counted > 0
	if allFull != e.halted {
		e.halted = allFull
		if allFull {
			e.event(now, "halt", "", "all zones FullDisruption: assuming this coordinator is cut off; evictions and fencing halted, granted taints removed, queues emptied")
			e.enterHalt(now)
		} else {
			e.floor = now
			e.event(now, "halt", "", "a zone recovered: evictions and fencing resume; every node gets a fresh grace period and every zone an empty bucket")
		}
		e.ready.Writes = append(e.ready.Writes, Write{Halted: &allFull})
	}
	for _, k := range e.sortedZones() {
		z := e.zones[k]
		e.setRate(z, e.rateFor(z), now)
	}
}

// reported tells whether a witness of the node has ever reported (in this term or an earlier one):
// kube-controller-manager counts a Node without a Ready condition as not ready in its zone.
func (e *Engine) reported(n *node) bool {
	return n.known || !n.lastContact.IsZero() || n.kubeletSeen
}

// enterHalt is markNodeAsReachable for every node: granted taints removed, queues emptied.
func (e *Engine) enterHalt(now time.Time) {
	for _, n := range e.order {
		if n.taint == TaintNone && !n.queued {
			continue
		}
		if n.taint != TaintNone {
			e.ready.Taints = append(e.ready.Taints, TaintChange{Node: n.name, From: n.taint, To: TaintNone})
			e.event(now, "eviction", n.name, "node %s: halt: remove taint %s", n.name, n.taint)
		}
		n.taint, n.queued, n.releasedAt, n.guardClearSince = TaintNone, false, time.Time{}, time.Time{}
		e.persistNode(n)
	}
	for _, z := range e.zones {
		z.queue = nil
	}
}

// rateFor is kube-controller-manager's setLimiterInZone; every zone's rate is 0 during the halt.
func (e *Engine) rateFor(z *zone) float64 {
	switch {
	case e.halted:
		return 0
	case z.state == coordv1.ZoneState_ZONE_STATE_PARTIAL_DISRUPTION:
		if z.size > e.cfg.LargeClusterSizeThreshold {
			return e.cfg.SecondaryNodeEvictionRate
		}
		return 0
	default:
		return e.cfg.NodeEvictionRate
	}
}

// setRate swaps a zone's limiter when its rate changes, as RateLimitedTimedQueue.SwapLimiter does:
// the new bucket (burst 1) starts full, unless the old one had no token left (or a rate of 0), in
// which case the new one starts empty — a zone leaving PartialDisruption or the halt releases its
// next node one period later, not at once.
func (e *Engine) setRate(z *zone, r float64, now time.Time) {
	if z.limiter != nil && z.rate == r {
		return
	}
	drain := false
	if z.limiter != nil {
		e.event(now, "zone", "", "zone %s: eviction rate %g -> %g nodes/s", z.key, z.rate, r)
		drain = z.rate <= 0 || !z.limiter.AllowN(now, 1)
	}
	z.rate = r
	z.limiter = rate.NewLimiter(rate.Limit(r), 1)
	if drain && r > 0 {
		z.limiter.AllowN(now, 1)
	}
}

// release takes nodes off the zone queues, FIFO, one limiter token each.
func (e *Engine) release(now time.Time) {
	if e.halted || e.paused {
		return
	}
	for _, k := range e.sortedZones() {
		z := e.zones[k]
		for len(z.queue) > 0 && z.rate > 0 && z.limiter.AllowN(now, 1) {
			n := e.nodes[z.queue[0]]
			z.queue = z.queue[1:]
			n.queued = false
			n.taint = taintFor(n.readiness)
			n.releasedAt = n.flap.release(now) // the guard judged it from the release on, or earlier (fast detection): its settle window keeps running
			e.ready.Taints = append(e.ready.Taints, TaintChange{Node: n.name, From: TaintNone, To: n.taint})
			e.ready.Evictions = append(e.ready.Evictions, Eviction{Node: n.name, Zone: k, At: now, NotReadySince: n.notReadySince})
			e.event(now, "eviction", n.name, "node %s: eviction granted in zone %s (taint %s)", n.name, k, n.taint)
			e.persistNode(n)
		}
	}
}

func remove(q []string, name string) []string {
	for i, v := range q {
		if v == name {
			return append(q[:i:i], q[i+1:]...)
		}
	}
	return q
}
