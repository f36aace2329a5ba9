package engine

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nodefence/nodefence/coordinator/nodes"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// Config holds the controller's parameters, with kube-controller-manager's flag names and defaults.
type Config struct {
	// NodeMonitorGracePeriod: silence after which a node that has reported is Unknown (50s, the
	// default of kube-controller-manager since Kubernetes 1.32).
	NodeMonitorGracePeriod time.Duration
	// NodeStartupGracePeriod: silence after which a node that never reported is Unknown (60s).
	NodeStartupGracePeriod time.Duration
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
	// KubeletWitness is Kubernetes mode: the kubelet (its Lease, read from the apiserver) is a
	// second witness, and a node is not ready only when both its agent and its kubelet are silent.
	// The engine then starts blind (nothing judged) until an APIServer input says it can see.
	KubeletWitness bool
	// KubeletDownPolicy is what a silent kubelet means while the agent reports (KubeletWitness).
	KubeletDownPolicy nodes.KubeletDownPolicy
	// PodEviction is the per-zone budget of soft-threshold pod evictions (see pods.go).
	PodEviction PodEvictionConfig
	// AgentHeartbeat is the agents' heartbeat interval, the proof's cadence for the agent witness
	// (proof.go; default 1s).
	AgentHeartbeat time.Duration
	// AgentEvents bounds the writes one node's agent can cause (see agentlimit.go).
	AgentEvents AgentEventConfig
	// UnhealthyConditions are the Node conditions that make a reporting node a candidate for a
	// power cycle (conditions.go; Kubernetes mode).
	UnhealthyConditions []ConditionTrigger
}

// DefaultConfig is kube-controller-manager's defaults, and the defaults of what the engine adds
// (automatic fencing, kdump, pod-eviction pacing). It is the one place they are written; the
// coordinator's flags take their defaults from it.
func DefaultConfig() Config {
	c := Config{NodeEvictionRate: DefaultNodeEvictionRate, SecondaryNodeEvictionRate: DefaultSecondaryNodeEvictionRate,
		Fence: FenceConfig{Enabled: DefaultFenceEnabled, Timeout: DefaultFenceTimeout, MaxUnresponsivePercent: DefaultMaxUnresponsivePercent,
			Budget: DefaultFenceBudget, BudgetWindow: DefaultFenceBudgetWindow, Settle: DefaultFenceSettle, Detect: DetectWitnesses},
		PodEviction: PodEvictionConfig{Rate: DefaultPodEvictionRate}}
	c.SetDefaults()
	return c
}

// SetDefaults fills zero durations and thresholds with the Kubernetes defaults. Zero rates stay zero:
// a rate of 0 means no node is ever released (use DefaultConfig for the default rates).
func (c *Config) SetDefaults() {
	if c.NodeMonitorGracePeriod == 0 {
		c.NodeMonitorGracePeriod = DefaultNodeMonitorGracePeriod
	}
	if c.NodeStartupGracePeriod == 0 {
		c.NodeStartupGracePeriod = DefaultNodeStartupGracePeriod
	}
	if c.LargeClusterSizeThreshold == 0 {
		c.LargeClusterSizeThreshold = DefaultLargeClusterSizeThreshold
	}
	if c.UnhealthyZoneThreshold == 0 {
		c.UnhealthyZoneThreshold = DefaultUnhealthyZoneThreshold
	}
	if c.KdumpIdle == 0 {
		c.KdumpIdle = DefaultKdumpIdle
	}
	if c.KdumpTimeout == 0 {
		c.KdumpTimeout = DefaultKdumpTimeout
	}
	if c.Fence.BudgetWindow == 0 {
		c.Fence.BudgetWindow = DefaultFenceBudgetWindow
	}
	if c.Fence.Settle == 0 {
		c.Fence.Settle = DefaultFenceSettle
	}
	if c.AgentHeartbeat == 0 {
		c.AgentHeartbeat = DefaultAgentHeartbeat
	}
	c.PodEviction.SetDefaults()
	c.AgentEvents.SetDefaults()
}

// kube-controller-manager's defaults (pkg/controller/nodelifecycle/config/v1alpha1/defaults.go).
const (
	DefaultNodeMonitorGracePeriod    = 50 * time.Second
	DefaultNodeStartupGracePeriod    = 60 * time.Second
	DefaultNodeEvictionRate          = 0.1
	DefaultSecondaryNodeEvictionRate = 0.01
	DefaultLargeClusterSizeThreshold = 50
	DefaultUnhealthyZoneThreshold    = 0.55
)

// Defaults of what the engine adds to kube-controller-manager (DefaultFenceSettle is in fence.go,
// the pod-eviction defaults in pods.go).
const (
	// DefaultKdumpIdle is three of fence_kdump_send's default 10 s intervals.
	DefaultKdumpIdle    = 30 * time.Second
	DefaultKdumpTimeout = 10 * time.Minute
	// Automatic fencing is on by default: a node whose agent and kubelet have both been silent
	// past their own windows for three more seconds (Kubernetes mode; in standalone mode: not ready
	// past the grace and released by its zone's pacing three seconds ago) is fenced, unless more than
	// half of the cluster or zone is not ready, or its zone used its three fences in ten minutes.
	// The timeout is a margin on top of the witnesses' windows, not a wait: each window already
	// spans more than one missed heartbeat (the agent's three, the kubelet's two renewals).
	DefaultFenceEnabled           = true
	DefaultFenceTimeout           = 3 * time.Second
	DefaultMaxUnresponsivePercent = 50.0
	DefaultFenceBudget            = 3
	DefaultFenceBudgetWindow      = 10 * time.Minute
	// DefaultAgentHeartbeat is the coordinator's default --agent-heartbeat-interval.
	DefaultAgentHeartbeat = time.Second
)

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
	cfg       Config
	floor     time.Time // start of the current leadership term: no silence before it counts
	now       time.Time // latest Tick
	nodes     map[string]*node
	order     []*node // the nodes in natural order of their names, kept sorted as nodes are added
	zones     map[string]*zone
	paused    bool
	pauseNote string // who paused and why (Paused.Note)
	halted    bool
	// blind is set in Kubernetes mode while the apiserver cannot be read: nothing is re-judged.
	blind bool
	ready Ready

	podZones map[string]*podZone // pod-eviction budgets, by zone key (pods.go)
	pending  []*node             // nodes with a candidate waiting for a grant
	limited  []*node             // nodes whose agent limit holds or counts something (agentlimit.go)
	stormAt  time.Time           // the last time the storm guard held a fence back for a storm (fence.go)
	// kubeletLast is when any kubelet's heartbeat was last seen advancing; kubeletResumed when they
	// resumed after a cluster-wide quiet (silence.go).
	kubeletLast, kubeletResumed time.Time
}

type node struct {
	name, region, zone string
	zoneKey            string // nodes.ZoneKey(region, zone), kept by enterZone
	zoneOf             *zone  // e.zones[zoneKey], kept by enterZone (a Tick reads it for every node)
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
	signals            signalValues
	conditions         map[string]*coordv1.NodeCondition
	bootID             string
	newBootAt          time.Time // when the agent said hello from a boot other than the one known before
	streams            int
	fenceable          bool
	known              bool       // restored from the store: reported in an earlier term
	kdumpFirst         time.Time  // first fence_kdump message of the current dump
	kdumpLast          time.Time  // latest fence_kdump message
	kdumpCancel        string     // which witness cancelled the dump since the last Tick ("" if none), for its event
	fenceRequested     bool       // automatic fencing requested in this not-ready episode
	fenceBlocked       string     // why the storm guard holds fencing back
	releasedAt         time.Time  // when pacing released the node (its taint was granted); zero otherwise
	flap               flap       // the latest not-ready episode the node came back from (flap.go)
	watchdog           watchdog   // the node's watchdog as its agent last reported it (watchdog.go)
	guardClearSince    time.Time  // since when the storm guard has let the released node's fence pass
	excluded           bool       // node.kubernetes.io/exclude-disruption: not counted in its zone's state
	controlPlane       bool       // matches the control-plane selector
	kubeletSeen        bool       // the kubelet witness was observed (Kubernetes mode)
	kubeletBeat        time.Time  // latest kubelet heartbeat (Lease renewTime), on the node's clock
	kubeletProbe       time.Time  // when the coordinator saw kubeletBeat advance, on its own clock
	agentDown          bool       // agent silent while the kubelet reports
	kubeletDown        bool       // kubelet silent while the agent reports
	candidate          *candidate // soft-threshold eviction proposal waiting for a grant
	poweredOff         string     // a fence confirmed the node off ("" once an agent says hello again)
	helloAt            time.Time  // the latest agent hello
	kubeletAdvanced    time.Time  // when this engine last saw kubeletBeat advance (its first sight is none)
	kubeletRenew       time.Duration
	kubeletBack        time.Time // when kubeletBeat last advanced after a silence past its window (nodes.KubeletWindow)
	fence              *standing // the node's newest fence record and its proof (proof.go)
	silentSince        time.Time // both witnesses silent past their windows since (silence.go); zero otherwise
	silentJudged       time.Time // when this silence began (silentSince may be an earlier episode's, flap.go)
	silentWhy          string    // which witness fell silent last
	silentEarlier      time.Time // the silence of the episode the node last came back from
	silentBack         time.Time // when a witness was heard again after it
	limit              *agentLimit
	observeMode        bool                     // the node alone is in observe mode (observe.go)
	excludeFencing     bool                     // never fenced automatically (observe.go)
	maintenance        string                   // why the node is in maintenance, "" when it is not (observe.go)
	modeNote           string                   // what was wrong with the node's fence-mode annotation, said once
	floor              time.Time                // the node's own grace restart (it left observe mode); see graceFloor
	wouldFence         bool                     // an automatic fence was observed (not requested) in this not-ready episode
	conds              map[string]conditionSeen // the trigger conditions' statuses (conditions.go)
	condFenced         string                   // the trigger type whose power cycle was requested in this episode
	condBlocked        string                   // why the guard holds the power cycle back (said once)
}

// New returns an engine with cfg (defaults filled).
func New(cfg Config) *Engine {
	cfg.SetDefaults()
	return &Engine{cfg: cfg, nodes: map[string]*node{}, zones: map[string]*zone{}, blind: cfg.KubeletWitness}
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
	e.prove(now)
	e.fence(now)
	e.conditionFences(now)
	e.tickAgentLimits(now)
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

// judge recomputes one node's readiness and reacts to a change. Like kube-controller-manager's
// monitorNodeHealth it is level-triggered: a not-ready node without a granted taint is (re)queued on
// every pass, so the queues refill after the all-zones halt emptied them.
func (e *Engine) judge(n *node, now time.Time) {
	if e.cfg.KubeletWitness && e.blind {
		return // the kubelet witness cannot be read: keep every judgement as it is
	}
	grace := e.cfg.NodeMonitorGracePeriod
	obs := nodes.Observation{LastContact: n.lastContact, GraceFloor: e.graceFloor(n), ShuttingDown: n.shuttingDown, Known: n.known}
	if n.lastContact.IsZero() && !n.known {
		grace = e.cfg.NodeStartupGracePeriod
		if n.firstSeen.After(obs.GraceFloor) {
			obs.GraceFloor = n.firstSeen
		}
	}
	rd, reason := nodes.Judge(obs, now, grace)
	if e.cfg.KubeletWitness {
		silent, why := nodes.KubeletSilent(nodes.KubeletObservation{Probe: n.kubeletProbe, Registered: n.firstSeen, GraceFloor: e.graceFloor(n), Renew: n.renew()},
			now, e.cfg.NodeMonitorGracePeriod, e.cfg.NodeStartupGracePeriod)
		w := nodes.Combine(rd, reason, silent, why, e.cfg.KubeletDownPolicy)
		rd, reason = w.Readiness, w.Reason
		e.setWitnesses(n, w, now)
		e.judgeSilence(n, now)
	}
	if n.kdumpCancel != "" {
		e.event(now, "kdump", n.name, "node %s: its %s reported after the first fence_kdump message: not dumping (the messages were stale or spoofed)", n.name, n.kdumpCancel)
		n.kdumpCancel = ""
	}
	if e.kdumpDown(n, now) && !n.shuttingDown {
		// A node silent past its grace that sends fence_kdump messages crashed: it is not ready
		// now, even while a fresh grace period (a leader change, the end of the halt) runs.
		rd, reason = coordv1.Readiness_READINESS_NOT_READY, "kernel dump in progress (fence_kdump)"
	}
	if rd == coordv1.Readiness_READINESS_READY && n.readiness != rd && e.contact(n).Before(e.graceFloor(n)) {
		// A fresh grace period (a leader change, the end of the all-zones halt, the apiserver seen
		// again) only delays new judgements; it never declares a node that was already not ready
		// healthy again. Only contact does.
		e.requeue(n, now)
		return
	}
	n.reason = reason
	if rd != n.readiness {
		e.transition(n, rd, reason, now)
	}
	e.requeue(n, now)
}

// contact is the latest sign of life of the witnesses that count: the agent's in standalone mode;
// in Kubernetes mode the later of the agent's and the kubelet's, or the kubelet's alone under
// KubeletDownFence.
func (e *Engine) contact(n *node) time.Time {
	if !e.cfg.KubeletWitness {
		return n.lastContact
	}
	if e.cfg.KubeletDownPolicy == nodes.KubeletDownFence || n.kubeletProbe.After(n.lastContact) {
		return n.kubeletProbe
	}
	return n.lastContact
}

// setWitnesses records which single witness is down and says so when that changes.
func (e *Engine) setWitnesses(n *node, w nodes.Witnesses, now time.Time) {
	if w.AgentDown != n.agentDown {
		n.agentDown = w.AgentDown
		if w.AgentDown {
			e.event(now, "agent-down", n.name, "node %s: %s: never tainted or fenced for it", n.name, w.Reason)
		} else {
			e.event(now, "agent-down", n.name, "node %s: agent no longer down alone", n.name)
		}
	}
	if w.KubeletDown != n.kubeletDown {
		n.kubeletDown = w.KubeletDown
		if w.KubeletDown {
			e.event(now, "kubelet-down", n.name, "node %s: %s", n.name, w.Reason)
		} else {
			e.event(now, "kubelet-down", n.name, "node %s: kubelet no longer down alone", n.name)
		}
	}
}

// transition moves a node to readiness rd.
func (e *Engine) transition(n *node, rd coordv1.Readiness, reason string, now time.Time) {
	from := n.readiness
	n.readiness, n.transition = rd, now
	change := fmt.Sprintf("node %s: %s -> %s (%s)", n.name, word(from), word(rd), reason)
	defer func() { e.event(now, "readiness", n.name, "%s", change) }()
	if rd == coordv1.Readiness_READINESS_READY {
		n.flap = cameBack(n, now)
		n.notReadySince, n.fenceRequested, n.fenceBlocked, n.wouldFence = time.Time{}, false, "", false
		n.releasedAt, n.guardClearSince = time.Time{}, time.Time{}
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
		if e.flapped(n, now) {
			change += fmt.Sprintf("; it came back for %s only: keeps its earlier episode's evidence (not ready since %s)",
				n.lastContact.Sub(n.flap.back).Round(time.Second), n.notReadySince.UTC().Format(time.RFC3339))
		}
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

// requeue puts a not-ready node without a granted taint back in its zone's queue: the queues are
// emptied on entering the all-zones halt and refill on the next pass, as kube-controller-manager's
// markNodeForTainting does on every monitor pass.
func (e *Engine) requeue(n *node, now time.Time) {
	if n.readiness == coordv1.Readiness_READINESS_READY || n.shuttingDown || n.taint != TaintNone || n.queued {
		return
	}
	e.event(now, "eviction", n.name, "node %s: %s", n.name, e.enqueue(n, now))
	e.persistNode(n)
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

func (e *Engine) persistNode(n *node) {
	e.ready.Writes = append(e.ready.Writes, Write{Node: &NodeRecord{
		Name: n.name, Region: n.region, Zone: n.zone, Readiness: n.readiness, Reason: n.reason,
		TransitionAt: n.transition, NotReadySince: n.notReadySince, Taint: n.taint, Queued: n.queued, QueuedAt: n.queuedAt,
		ShuttingDown: n.shuttingDown, FenceRequested: n.fenceRequested, ReleasedAt: n.releasedAt, BootID: n.bootID,
		WouldFence: n.wouldFence, WatchdogArmed: n.watchdog.armed, WatchdogTimeout: n.watchdog.timeout,
		WatchdogNotBefore: n.watchdog.notBefore,
	}})
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
