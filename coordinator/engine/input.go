package engine

import (
	"sort"
	"time"

	"github.com/nodefence/nodefence/coordinator/nodes"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// Input is one thing that happened, given to Step.
type Input interface{ isInput() }

// Configured declares a node with its location: from the fence configuration (Fenceable) or from
// the cluster's Node objects. A node that is not Fenceable is judged and counted in its zone, but
// never fenced.
type Configured struct {
	Node, Region, Zone string
	Fenceable          bool
	// ExcludeDisruption: the Node carries node.kubernetes.io/exclude-disruption; it is judged and
	// fenced like any node but not counted in its zone's state.
	ExcludeDisruption bool
	// ControlPlane: the Node matches the control-plane selector; it is never fenced automatically
	// unless FenceConfig.AllowControlPlane, and never when it is the last ready member.
	ControlPlane bool
	// Observe: the node alone is in observe mode (its nodefence.io/fence-mode annotation; observe.go).
	Observe bool
	// ExcludeFencing: never fenced automatically (its nodefence.io/exclude-from-fencing label).
	ExcludeFencing bool
	// Maintenance is why the node is in maintenance ("" when it is not; its nodefence.io/maintenance
	// annotation): never fenced automatically, counted unhealthy by the storm guard.
	Maintenance string
	// ModeNote: what was wrong with the node's fence-mode annotation ("" if nothing), said once.
	ModeNote string
	// Conditions are the Node's condition statuses by type (Kubernetes mode), for the triggers of
	// Config.UnhealthyConditions (conditions.go); nil leaves what the engine saw as it is.
	Conditions map[string]string
	At         time.Time
}

// Kubelet is one observation of a node's kubelet through the apiserver (Kubernetes mode):
// Heartbeat is the later of its Lease's renewTime and its Ready condition's lastHeartbeatTime,
// observed at At. The engine, like kube-controller-manager, counts silence from when it saw the
// heartbeat advance, never from the node's clock.
type Kubelet struct {
	Node      string
	Heartbeat time.Time
	At        time.Time
	Renew     time.Duration // how often the kubelet renews its Lease (zero: unknown)
}

// Removed forgets a node: its Node object was deleted. A node deleted while silent no longer holds
// its zone in a disruption state.
type Removed struct {
	Node string
	At   time.Time
}

// APIServer says whether the apiserver (and so the kubelet witness) can be read (Kubernetes mode).
// While it cannot, nothing is re-judged and no node is a fence candidate; when it can again, every
// node gets a fresh grace period.
type APIServer struct {
	Reachable bool
	At        time.Time
}

// Hello is an agent stream's hello: the node is connected and reports its location.
type Hello struct {
	Node, Region, Zone, BootID string
	At                         time.Time
	// Watchdog is the node's watchdog as the agent's hello reports it (nil: none).
	Watchdog *agentv1.WatchdogState
}

// Disconnected is the end of one agent stream of the node.
type Disconnected struct {
	Node string
}

// Message is any agent message after the hello: contact, and its payload (samples, conditions,
// shutdown announcements).
type Message struct {
	Node string
	At   time.Time
	Msg  *agentv1.ConnectRequest
}

// LeaderElected starts a leadership term at At: every node gets a fresh grace period from At.
type LeaderElected struct {
	At time.Time
}

// Kdump is a fence_kdump message from the node: it crashed and is dumping its memory.
type Kdump struct {
	Node string
	At   time.Time
}

// PoweredOff is a fence record's confirmation, by read-back from the node's device (or an operator's
// acknowledgement), that the node is off or isolated. The node's view says so until an agent of it
// says hello again; its readiness stays the judgement of the grace period, as kube-controller-manager's
// would.
type PoweredOff struct {
	Node, Fence string
	At          time.Time
}

// Paused pauses or resumes evictions cluster-wide.
type Paused struct {
	Paused bool
	// Note says who paused and why ("paused by operator/alice: storage upgrade"); it is in every
	// fence held back and in the pause's event.
	Note string
}

// Restored replays the persisted state at the start of a term (nodes' readiness, taints, queue).
type Restored struct {
	Nodes []NodeRecord
}

func (Configured) isInput()    {}
func (Hello) isInput()         {}
func (Disconnected) isInput()  {}
func (Message) isInput()       {}
func (LeaderElected) isInput() {}
func (Paused) isInput()        {}
func (PoweredOff) isInput()    {}
func (Kdump) isInput()         {}
func (Restored) isInput()      {}
func (Kubelet) isInput()       {}
func (Removed) isInput()       {}
func (APIServer) isInput()     {}

// Step applies one input. It decides nothing time-based: that happens in Tick.
func (e *Engine) Step(in Input) {
	switch in := in.(type) {
	case Message:
		n := e.node(in.Node, "", "", in.At)
		n.contact(in.At)
		e.apply(n, in)
	case Hello:
		e.hello(in)
	case Disconnected:
		if n, ok := e.nodes[in.Node]; ok && n.streams > 0 {
			n.streams--
		}
	case PoweredOff:
		// A confirmation older than the node's latest hello is history (a record's later versions
		// repeat it).
		if n, ok := e.nodes[in.Node]; ok && !in.At.Before(n.helloAt) {
			n.poweredOff = "powered off: fence " + in.Fence + " confirmed it at " + in.At.UTC().Format(time.RFC3339)
		}
	case Configured:
		n := e.node(in.Node, in.Region, in.Zone, in.At)
		n.fenceable, n.excluded, n.controlPlane = in.Fenceable, in.ExcludeDisruption, in.ControlPlane
		e.configureModes(n, in)
		if in.Conditions != nil {
			e.observeConditions(n, in.Conditions, in.At)
		}
		if in.Region != "" || in.Zone != "" {
			e.setLocation(n, in.Region, in.Zone)
		}
	case Kubelet:
		e.kubelet(in)
	case Removed:
		e.forget(in.Node)
	case APIServer:
		e.apiServer(in)
	case LeaderElected:
		e.floor = in.At
		if in.At.After(e.now) {
			e.now = in.At
		}
	case Paused:
		e.pause(in)
	case Restored:
		e.restore(in.Nodes)
	case Kdump:
		e.kdump(in)
	case FenceRecord:
		e.fenceRecord(in)
	case WatchdogBound:
		e.watchdogBound(in)
	}
}

// hello records an agent's hello: a new boot clears the previous boot's announcement and conditions.
func (e *Engine) hello(in Hello) {
	n := e.node(in.Node, in.Region, in.Zone, in.At)
	if n.bootID != "" && n.bootID != in.BootID {
		n.newBootAt = in.At
		// A new boot: the previous boot's announcement and conditions are history.
		n.conditions = map[string]*coordv1.NodeCondition{}
		if n.shuttingDown {
			n.shuttingDown = false
			e.persistNode(n)
		}
	}
	n.bootID = in.BootID
	n.poweredOff, n.helloAt = "", in.At // the node is up again
	e.watchdogReported(n, in.Watchdog, in.At)
	n.streams++
	n.contact(in.At)
	if in.Region != "" || in.Zone != "" {
		e.setLocation(n, in.Region, in.Zone)
	}
}

// kubelet records a kubelet heartbeat read from the apiserver.
func (e *Engine) kubelet(in Kubelet) {
	n := e.node(in.Node, "", "", in.At)
	if in.Heartbeat.IsZero() {
		return // the kubelet never posted: the startup grace period runs from the node's registration
	}
	n.kubeletRenew = max(n.kubeletRenew, in.Renew)
	if n.kubeletSeen && in.Heartbeat.After(n.kubeletBeat) {
		prev := n.kubeletAdvanced
		if prev.IsZero() {
			prev = n.kubeletProbe
		}
		if in.At.Sub(prev) > nodes.KubeletWindow(n.renew()) {
			n.kubeletBack = in.At // silent past its window, and back
		}
		n.kubeletAdvanced = in.At // the kubelet spoke while this engine listened (first sight: not)
		e.heardKubelet(n, in.At)
	}
	if !n.kubeletSeen || in.Heartbeat.After(n.kubeletBeat) {
		n.kubeletSeen, n.kubeletBeat, n.kubeletProbe = true, in.Heartbeat, in.At
		n.witnessed("kubelet", in.At)
	}
}

// apiServer records a change of the apiserver's readability: judgements freeze while it is unreadable.
func (e *Engine) apiServer(in APIServer) {
	if in.Reachable != e.blind {
		return
	}
	e.blind = !in.Reachable
	if in.At.After(e.now) {
		e.now = in.At
	}
	if in.Reachable {
		if in.At.After(e.floor) {
			e.floor = in.At
		}
		e.event(in.At, "apiserver", "", "apiserver readable: kubelets judged again; every node gets a fresh grace period")
	} else {
		e.event(in.At, "apiserver", "", "apiserver unreadable: judgements frozen; no node becomes a fence candidate")
	}
}

// pause records an operator pausing or resuming evictions.
func (e *Engine) pause(in Paused) {
	if in.Paused != e.paused {
		e.paused, e.pauseNote = in.Paused, in.Note
		if in.Paused {
			e.event(e.now, "pause", "", "%s", e.pausedWhy())
		} else {
			e.event(e.now, "pause", "", "evictions resumed by an operator")
		}
	}
}

// forget removes a node that was deleted from the cluster.
func (e *Engine) forget(name string) {
	n, ok := e.nodes[name]
	if !ok {
		return
	}
	e.leaveZone(n)
	delete(e.nodes, name)
	for i, o := range e.order {
		if o == n {
			e.order = append(e.order[:i:i], e.order[i+1:]...)
			break
		}
	}
	e.event(e.now, "node", name, "node %s: deleted; forgotten", name)
	e.ready.Writes = append(e.ready.Writes, Write{Forget: name})
}

// Observe is the hot path for heartbeats and signal samples (sample may be nil) of a node the
// engine already knows: it records the contact and the sample and returns true, touching nothing
// that Ready reports, so it may run while the loop persists a batch. For an unknown node it changes
// nothing and returns false; the caller steps a Message instead.
func (e *Engine) Observe(name string, at time.Time, sample *agentv1.SignalSample) bool {
	n, ok := e.nodes[name]
	if !ok {
		return false
	}
	n.contact(at)
	if sample != nil {
		n.observe(sample)
	}
	return true
}

func (n *node) contact(at time.Time) {
	if at.After(n.lastContact) {
		n.lastContact = at
	}
	n.witnessed("agent", at)
}

func (n *node) observe(s *agentv1.SignalSample) {
	for _, sig := range s.Signals {
		n.signals.set(sig.Name, sig.Available, sig.Capacity)
	}
}

func (e *Engine) apply(n *node, in Message) {
	switch m := in.Msg.GetMsg().(type) {
	case *agentv1.ConnectRequest_Sample:
		n.observe(m.Sample)
	case *agentv1.ConnectRequest_Condition:
		c := m.Condition
		status := "False"
		if c.Status == agentv1.ConditionStatus_CONDITION_STATUS_TRUE {
			status = "True"
		}
		name := conditionName(c.Type)
		old, ok := n.conditions[name]
		n.conditions[name] = &coordv1.NodeCondition{Type: name, Status: status, Reason: c.Reason, TransitionTime: c.TransitionTime}
		if !ok || old.Status != status {
			e.conditionChanged(n, in.At, ConditionChange{Node: n.name, Type: name, Status: status, Reason: c.Reason, Message: c.Message})
		}
	case *agentv1.ConnectRequest_Candidates:
		e.onCandidates(n, m.Candidates, in.At)
	case *agentv1.ConnectRequest_Eviction:
		e.onEvictionReport(n, m.Eviction, in.At)
	case *agentv1.ConnectRequest_Watchdog:
		e.watchdogReported(n, m.Watchdog, in.At)
	case *agentv1.ConnectRequest_Shutdown:
		switch m.Shutdown.Phase {
		case agentv1.ShutdownPhase_SHUTDOWN_PHASE_STARTED, agentv1.ShutdownPhase_SHUTDOWN_PHASE_PODS_TERMINATED:
			if !n.shuttingDown {
				n.shuttingDown = true
				// A new leader must know: a shutting-down node is never fenced.
				e.recordChanged(n, in.At, "node %s: announced a graceful shutdown", n.name)
			}
		case agentv1.ShutdownPhase_SHUTDOWN_PHASE_CANCELLED:
			if n.shuttingDown {
				n.shuttingDown = false
				e.recordChanged(n, in.At, "node %s: shutdown cancelled", n.name)
			}
		}
	}
}

func conditionName(t agentv1.ConditionType) string {
	switch t {
	case agentv1.ConditionType_CONDITION_TYPE_MEMORY_PRESSURE:
		return "MemoryPressure"
	case agentv1.ConditionType_CONDITION_TYPE_DISK_PRESSURE:
		return "DiskPressure"
	case agentv1.ConditionType_CONDITION_TYPE_PID_PRESSURE:
		return "PIDPressure"
	}
	return t.String()
}

// restore replays persisted node records. Readiness is NOT restored from the past (the new term's
// grace period judges anew); taints already granted and the queue order are.
func (e *Engine) restore(recs []NodeRecord) {
	sort.SliceStable(recs, func(i, j int) bool { return recs[i].QueuedAt.Before(recs[j].QueuedAt) })
	for _, r := range recs {
		n := e.node(r.Name, r.Region, r.Zone, e.now)
		if r.Region != "" || r.Zone != "" {
			e.setLocation(n, r.Region, r.Zone)
		}
		n.readiness, n.transition, n.notReadySince, n.reason = r.Readiness, r.TransitionAt, r.NotReadySince, r.Reason
		n.taint, n.known, n.shuttingDown, n.fenceRequested, n.releasedAt = r.Taint, true, r.ShuttingDown, r.FenceRequested, r.ReleasedAt
		n.wouldFence = r.WouldFence
		if n.helloAt.IsZero() {
			n.watchdog = restoredWatchdog(r) // an agent heard in this term reported its own
		} else if r.WatchdogNotBefore.After(n.watchdog.notBefore) {
			n.watchdog.notBefore = r.WatchdogNotBefore
		}
		if n.bootID == "" {
			n.bootID = r.BootID
		}
		if r.Queued && n.taint == TaintNone && !n.queued {
			e.event(e.now, "eviction", n.name, "node %s: restored to the eviction queue; %s", n.name, e.enqueue(n, r.QueuedAt))
		}
	}
}
