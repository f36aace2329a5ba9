// Package engine is the coordinator's judgement, as a pure state machine in the style of etcd's raft
// RawNode: no goroutines, no clock, no I/O. Inputs arrive through Step (agent contact, samples,
// conditions, shutdown announcements, configuration, leadership) and Tick (the passage of time, as a
// value); decisions leave through Ready — store writes to persist first, then taint changes, paced
// evictions, pod-eviction eligibility and events — and the caller acknowledges them with Advance.
//
// The semantics are kube-controller-manager's node lifecycle controller (seed 004): a node is Unknown
// after the node-monitor grace period without contact (the startup grace period if it never reported,
// and a fresh grace period for every node after a leader change); zones are Normal, PartialDisruption
// or FullDisruption by ComputeZoneState; not-ready nodes are queued per zone and released one token at
// a time by a token bucket whose rate follows the zone state; when every zone is fully disrupted the
// engine assumes it is the one cut off and halts all evictions.
//
// Beyond kube-controller-manager, the engine paces the agents' soft-threshold pod evictions per
// zone (pods.go): candidates in, grants out through Ready.Grants, under a token bucket and a cap on
// grants in flight.
package engine

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"golang.org/x/time/rate"

	"github.com/nodefence/nodefence/coordinator/nodes"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// Config holds the controller's parameters, with kube-controller-manager's flag names and defaults.
type Config struct {
	// NodeMonitorGracePeriod: silence after which a node that has reported is Unknown (40s).
	NodeMonitorGracePeriod time.Duration
	// NodeStartupGracePeriod: silence after which a node that never reported is Unknown (60s).
	NodeStartupGracePeriod time.Duration
	// PodEvictionTimeout: how long a node is not ready before its pods are eligible for eviction (5m).
	PodEvictionTimeout time.Duration
	// NodeEvictionRate: nodes per second released from a Normal or FullDisruption zone's queue (0.1).
	NodeEvictionRate float64
	// SecondaryNodeEvictionRate: the rate for a PartialDisruption zone larger than
	// LargeClusterSizeThreshold (0.01); smaller partially disrupted zones get 0.
	SecondaryNodeEvictionRate float64
	// LargeClusterSizeThreshold: the zone size above which the secondary rate applies (50).
	LargeClusterSizeThreshold int
	// UnhealthyZoneThreshold: the not-ready fraction that makes a zone PartialDisruption (0.55).
	UnhealthyZoneThreshold float64
	// Fence is the automatic fencing trigger and storm guard.
	Fence FenceConfig
	// KdumpIdle: a node is dumping while its fence_kdump messages are at most this far apart
	// (fence_kdump_send sends every 10 s by default).
	KdumpIdle time.Duration
	// KdumpTimeout bounds how long power management waits for a dump.
	KdumpTimeout time.Duration
	// PodEviction is the per-zone budget of soft-threshold pod evictions (see pods.go).
	PodEviction PodEvictionConfig
}

// DefaultConfig is kube-controller-manager's defaults.
func DefaultConfig() Config {
	c := Config{NodeEvictionRate: 0.1, SecondaryNodeEvictionRate: 0.01,
		Fence:       FenceConfig{Enabled: true, Timeout: time.Minute, MaxUnresponsivePercent: 50, Budget: 3, BudgetWindow: 10 * time.Minute},
		PodEviction: PodEvictionConfig{Rate: DefaultPodEvictionRate}}
	c.SetDefaults()
	return c
}

// SetDefaults fills zero durations and thresholds with the Kubernetes defaults. Zero rates stay zero:
// a rate of 0 means no node is ever released (use DefaultConfig for the default rates).
func (c *Config) SetDefaults() {
	if c.NodeMonitorGracePeriod == 0 {
		c.NodeMonitorGracePeriod = 40 * time.Second
	}
	if c.NodeStartupGracePeriod == 0 {
		c.NodeStartupGracePeriod = 60 * time.Second
	}
	if c.PodEvictionTimeout == 0 {
		c.PodEvictionTimeout = 5 * time.Minute
	}
	if c.LargeClusterSizeThreshold == 0 {
		c.LargeClusterSizeThreshold = 50
	}
	if c.UnhealthyZoneThreshold == 0 {
		c.UnhealthyZoneThreshold = 0.55
	}
	if c.KdumpIdle == 0 {
		c.KdumpIdle = 30 * time.Second
	}
	if c.KdumpTimeout == 0 {
		c.KdumpTimeout = 10 * time.Minute
	}
	if c.Fence.BudgetWindow == 0 {
		c.Fence.BudgetWindow = 10 * time.Minute
	}
	c.PodEviction.SetDefaults()
}

// Taint is the NoExecute taint the engine wants on a node.
type Taint int

// Taints, as kube-controller-manager applies them.
const (
	TaintNone        Taint = iota
	TaintNotReady          // node.kubernetes.io/not-ready:NoExecute
	TaintUnreachable       // node.kubernetes.io/unreachable:NoExecute
)

func (t Taint) String() string {
	switch t {
	case TaintNotReady:
		return "node.kubernetes.io/not-ready:NoExecute"
	case TaintUnreachable:
		return "node.kubernetes.io/unreachable:NoExecute"
	}
	return "none"
}

// Engine is the state machine. It is not safe for concurrent use: one goroutine owns it.
type Engine struct {
	cfg    Config
	floor  time.Time // start of the current leadership term: no silence before it counts
	now    time.Time // latest Tick
	nodes  map[string]*node
	order  []*node // the nodes in natural order of their names, kept sorted as nodes are added
	zones  map[string]*zone
	paused bool
	halted bool
	ready  Ready

	podZones map[string]*podZone // pod-eviction budgets, by zone key (pods.go)
	pending  []*node             // nodes with a candidate waiting for a grant
}

type node struct {
	name, region, zone string
	zoneKey            string // nodes.ZoneKey(region, zone), kept by enterZone
	firstSeen          time.Time
	lastContact        time.Time
	shuttingDown       bool
	readiness          coordv1.Readiness
	reason             string
	transition         time.Time
	notReadySince      time.Time // zero while ready
	taint              Taint     // applied (granted) taint
	queued             bool
	queuedAt           time.Time
	eligibleSent       bool
	signals            signalValues
	conditions         map[string]*coordv1.NodeCondition
	bootID             string
	streams            int
	fenceable          bool
	known              bool       // restored from the store: reported in an earlier term
	kdumpFirst         time.Time  // first fence_kdump message of the current dump
	kdumpLast          time.Time  // latest fence_kdump message
	fenceRequested     bool       // automatic fencing requested in this not-ready episode
	fenceBlocked       string     // why the storm guard holds fencing back
	candidate          *candidate // soft-threshold eviction proposal waiting for a grant
}

type zone struct {
	key     string
	state   coordv1.ZoneState
	rate    float64
	limiter *rate.Limiter
	queue   []string
	size    int
	ready   int
	fences  []time.Time // automatic fences within the budget window
}

// New returns an engine with cfg (defaults filled).
func New(cfg Config) *Engine {
	cfg.SetDefaults()
	return &Engine{cfg: cfg, nodes: map[string]*node{}, zones: map[string]*zone{}}
}

// Config returns the engine's configuration.
func (e *Engine) Config() Config { return e.cfg }

// node returns the named node, creating it in region/zone if it is new.
func (e *Engine) node(name, region, zone string, at time.Time) *node {
	n, ok := e.nodes[name]
	if !ok {
		n = &node{name: name, region: region, zone: zone, firstSeen: at, readiness: coordv1.Readiness_READINESS_READY, transition: at,
			conditions: map[string]*coordv1.NodeCondition{}}
		e.nodes[name] = n
		i := sort.Search(len(e.order), func(i int) bool { return !naturalLess(e.order[i].name, name) })
		e.order = append(e.order, nil)
		copy(e.order[i+1:], e.order[i:])
		e.order[i] = n
		e.enterZone(n)
	}
	return n
}

func (e *Engine) enterZone(n *node) {
	k := nodes.ZoneKey(n.region, n.zone)
	n.zoneKey = k
	z, ok := e.zones[k]
	if !ok {
		z = &zone{key: k, state: coordv1.ZoneState_ZONE_STATE_INITIAL}
		e.zones[k] = z
	}
	z.size++
}

func (e *Engine) leaveZone(n *node) {
	k := n.zoneKey
	z := e.zones[k]
	z.size--
	z.queue = remove(z.queue, n.name)
	n.queued = false
	if z.size == 0 {
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

// event records a decision in words; kind classifies it and node names the node concerned, if any.
func (e *Engine) event(at time.Time, kind, node, format string, args ...any) {
	e.ready.Events = append(e.ready.Events, Event{At: at, Kind: kind, Node: node, Text: fmt.Sprintf(format, args...)})
}

// Tick advances the engine's clock to now and makes every time-based decision: readiness, zone
// states, paced releases from the zone queues, and pod-eviction eligibility.
func (e *Engine) Tick(now time.Time) {
	if now.Before(e.now) {
		now = e.now // time never goes backwards inside the engine
	}
	e.now = now
	for _, n := range e.order {
		e.judge(n, now)
	}
	e.updateZones(now)
	e.release(now)
	e.grantPods(now)
	e.markEligible(now)
	e.fence(now)
}

// naturalLess orders names with their digit runs compared as numbers (a2 before a10), so queues
// filled in one tick read in the order an operator expects.
func naturalLess(a, b string) bool {
	for a != "" && b != "" {
		da, db := digits(a), digits(b)
		if da > 0 && db > 0 {
			na, nb := strings.TrimLeft(a[:da], "0"), strings.TrimLeft(b[:db], "0")
			if len(na) != len(nb) {
				return len(na) < len(nb)
			}
			if na != nb {
				return na < nb
			}
			a, b = a[da:], b[db:]
			continue
		}
		if a[0] != b[0] {
			return a[0] < b[0]
		}
		a, b = a[1:], b[1:]
	}
	return len(a) < len(b)
}

func digits(s string) int {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return i
}

func (e *Engine) sortedZones() []string {
	keys := make([]string, 0, len(e.zones))
	for k := range e.zones {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// judge recomputes one node's readiness and reacts to a change.
func (e *Engine) judge(n *node, now time.Time) {
	grace := e.cfg.NodeMonitorGracePeriod
	obs := nodes.Observation{LastContact: n.lastContact, GraceFloor: e.floor, ShuttingDown: n.shuttingDown, Known: n.known}
	if n.lastContact.IsZero() && !n.known {
		grace = e.cfg.NodeStartupGracePeriod
		if n.firstSeen.After(obs.GraceFloor) {
			obs.GraceFloor = n.firstSeen
		}
	}
	rd, reason := nodes.Judge(obs, now, grace)
	if e.dumping(n, now) && !n.shuttingDown {
		// A crashed node that is dumping is down now, whatever its last contact says.
		rd, reason = coordv1.Readiness_READINESS_NOT_READY, "kernel dump in progress (fence_kdump)"
	}
	if rd == coordv1.Readiness_READINESS_READY && n.readiness != rd && n.lastContact.Before(e.floor) {
		// The fresh grace period after a leader change only delays new judgements; it never
		// declares a node that was already not ready healthy again. Only contact does.
		return
	}
	n.reason = reason
	if rd == n.readiness {
		return
	}
	from := n.readiness
	n.readiness, n.transition = rd, now
	change := fmt.Sprintf("node %s: %s -> %s (%s)", n.name, word(from), word(rd), reason)
	defer func() { e.event(now, "readiness", n.name, "%s", change) }()
	if rd == coordv1.Readiness_READINESS_READY {
		n.notReadySince, n.eligibleSent, n.fenceRequested, n.fenceBlocked = time.Time{}, false, false, ""
		if n.queued {
			z := e.zones[n.zoneKey]
			z.queue = remove(z.queue, n.name)
			n.queued = false
			change += "; leaves the eviction queue"
		}
		if n.taint != TaintNone {
			e.ready.Taints = append(e.ready.Taints, TaintChange{Node: n.name, From: n.taint, To: TaintNone})
			change += "; remove taint " + n.taint.String()
			n.taint = TaintNone
		}
		e.persistNode(n)
		return
	}
	if n.notReadySince.IsZero() {
		n.notReadySince = now
	}
	if n.taint != TaintNone && !n.shuttingDown {
		// Already granted: the taint follows the kind of not-readiness without another token.
		if want := taintFor(rd); want != n.taint {
			e.ready.Taints = append(e.ready.Taints, TaintChange{Node: n.name, From: n.taint, To: want})
			change += fmt.Sprintf("; swap taint %s -> %s", n.taint, want)
			n.taint = want
		}
	}
	if n.shuttingDown {
		// A node shutting down gracefully is not failed: its kubelet terminates its pods itself.
		if n.queued {
			z := e.zones[n.zoneKey]
			z.queue = remove(z.queue, n.name)
			n.queued = false
		}
	} else if n.taint == TaintNone && !n.queued {
		change += "; " + e.enqueue(n, now)
	}
	e.persistNode(n)
}

// dumping reports whether the node sent a fence_kdump message within the idle time.
func (e *Engine) dumping(n *node, now time.Time) bool {
	return !n.kdumpLast.IsZero() && now.Sub(n.kdumpLast) <= e.cfg.KdumpIdle
}

// enqueue appends n to its zone's eviction queue and says so.
func (e *Engine) enqueue(n *node, at time.Time) string {
	z := e.zones[n.zoneKey]
	z.queue = append(z.queue, n.name)
	n.queued, n.queuedAt = true, at
	return fmt.Sprintf("queued for eviction in zone %s (position %d)", z.key, len(z.queue))
}

func taintFor(r coordv1.Readiness) Taint {
	if r == coordv1.Readiness_READINESS_UNKNOWN {
		return TaintUnreachable
	}
	return TaintNotReady
}

// updateZones recomputes every zone's state and rate, and the all-zones halt.
func (e *Engine) updateZones(now time.Time) {
	for _, z := range e.zones {
		z.ready = 0
	}
	for _, n := range e.order {
		if n.readiness == coordv1.Readiness_READINESS_READY {
			e.zones[n.zoneKey].ready++
		}
	}
	allFull := len(e.zones) > 0
	for _, k := range e.sortedZones() {
		z := e.zones[k]
		st := nodes.ZoneStateOf(z.ready, z.size-z.ready, e.cfg.UnhealthyZoneThreshold)
		if st != coordv1.ZoneState_ZONE_STATE_FULL_DISRUPTION {
			allFull = false
		}
		if st != z.state {
			e.event(now, "zone", "", "zone %s: %s -> %s (%d ready, %d not ready)", k, word(z.state), word(st), z.ready, z.size-z.ready)
			z.state = st
			e.ready.Writes = append(e.ready.Writes, Write{Zone: &ZoneRecord{Key: k, State: st, At: now}})
		}
		e.setRate(z, e.rateFor(z), now)
	}
	if allFull != e.halted {
		e.halted = allFull
		if allFull {
			e.event(now, "halt", "", "all zones FullDisruption: assuming this coordinator is cut off; evictions and fencing halted")
		} else {
			e.event(now, "halt", "", "a zone recovered: evictions and fencing resume")
		}
		e.ready.Writes = append(e.ready.Writes, Write{Halted: &allFull})
	}
}

// rateFor is kube-controller-manager's setLimiterInZone.
func (e *Engine) rateFor(z *zone) float64 {
	switch z.state {
	case coordv1.ZoneState_ZONE_STATE_PARTIAL_DISRUPTION:
		if z.size > e.cfg.LargeClusterSizeThreshold {
			return e.cfg.SecondaryNodeEvictionRate
		}
		return 0
	default:
		return e.cfg.NodeEvictionRate
	}
}

// setRate swaps a zone's limiter when its rate changes; a new limiter starts with one token, as
// the controller's SwapLimiter does.
func (e *Engine) setRate(z *zone, r float64, now time.Time) {
	if z.limiter != nil && z.rate == r {
		return
	}
	if z.limiter != nil {
		e.event(now, "zone", "", "zone %s: eviction rate %g -> %g nodes/s", z.key, z.rate, r)
	}
	z.rate = r
	z.limiter = rate.NewLimiter(rate.Limit(r), 1)
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
			e.ready.Taints = append(e.ready.Taints, TaintChange{Node: n.name, From: TaintNone, To: n.taint})
			e.ready.Evictions = append(e.ready.Evictions, Eviction{Node: n.name, Zone: k, At: now, NotReadySince: n.notReadySince})
			e.event(now, "eviction", n.name, "node %s: eviction granted in zone %s (taint %s)", n.name, k, n.taint)
			e.persistNode(n)
		}
	}
}

// markEligible reports tainted nodes whose pods may be evicted: not ready for PodEvictionTimeout.
func (e *Engine) markEligible(now time.Time) {
	if e.halted || e.paused {
		return
	}
	for _, n := range e.order {
		name := n.name
		if n.taint == TaintNone || n.eligibleSent || n.notReadySince.IsZero() || now.Sub(n.notReadySince) < e.cfg.PodEvictionTimeout {
			continue
		}
		n.eligibleSent = true
		e.ready.PodsEligible = append(e.ready.PodsEligible, name)
		e.event(now, "eviction", name, "node %s: pods eligible for eviction (not ready for %s)", name, now.Sub(n.notReadySince).Round(time.Second))
	}
}

func (e *Engine) persistNode(n *node) {
	e.ready.Writes = append(e.ready.Writes, Write{Node: &NodeRecord{
		Name: n.name, Region: n.region, Zone: n.zone, Readiness: n.readiness, Reason: n.reason,
		TransitionAt: n.transition, NotReadySince: n.notReadySince, Taint: n.taint, Queued: n.queued, QueuedAt: n.queuedAt,
		ShuttingDown: n.shuttingDown, FenceRequested: n.fenceRequested,
	}})
}

func remove(q []string, name string) []string {
	for i, v := range q {
		if v == name {
			return append(q[:i:i], q[i+1:]...)
		}
	}
	return q
}

// word renders an enum value in the seed's CamelCase ("PartialDisruption", "Unknown").
func word(v fmt.Stringer) string {
	switch v {
	case coordv1.ZoneState_ZONE_STATE_INITIAL:
		return "Initial"
	case coordv1.ZoneState_ZONE_STATE_NORMAL:
		return "Normal"
	case coordv1.ZoneState_ZONE_STATE_PARTIAL_DISRUPTION:
		return "PartialDisruption"
	case coordv1.ZoneState_ZONE_STATE_FULL_DISRUPTION:
		return "FullDisruption"
	case coordv1.Readiness_READINESS_READY:
		return "Ready"
	case coordv1.Readiness_READINESS_NOT_READY:
		return "NotReady"
	case coordv1.Readiness_READINESS_UNKNOWN:
		return "Unknown"
	}
	return v.String()
}
