package engine

import (
	"time"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// Ready is what the engine decided since the last Advance. The caller persists Writes (under the
// leader's epoch) BEFORE acting on anything else in it.
type Ready struct {
	// Writes are state changes to persist.
	Writes []Write
	// Taints are taint changes to apply to Kubernetes Nodes.
	Taints []TaintChange
	// Evictions are nodes released from their zone's queue: the pacing token for evicting (and,
	// when configured, fencing) that node.
	Evictions []Eviction
	// Fences are nodes to fence automatically (persisted first: a request is made once per episode).
	Fences []FenceRequest
	// Skips are nodes whose automatic fencing the storm guard holds back, with the reason.
	Skips []Skip
	// Conditions are the agents' pressure condition changes (MemoryPressure, DiskPressure,
	// PIDPressure), to mirror on the Kubernetes Node.
	Conditions []ConditionChange
	// Grants are soft-threshold pod evictions allowed by their zone's budget, to send on the
	// nodes' agent streams.
	Grants []Grant
	// Proofs are new verdicts on the nodes' driver-confirmed power-offs (proof.go).
	Proofs []ProofResult
	// Events describe every decision in words, in order.
	Events []Event
	// Dropped are the agent events whose writes their nodes' limits held back or dropped
	// (agentlimit.go), to count.
	Dropped []Drop
}

// Empty reports whether there is nothing to do.
func (r Ready) Empty() bool {
	return len(r.Writes) == 0 && len(r.Taints) == 0 && len(r.Evictions) == 0 &&
		len(r.Fences) == 0 && len(r.Skips) == 0 && len(r.Conditions) == 0 && len(r.Events) == 0 && len(r.Grants) == 0 &&
		len(r.Proofs) == 0 && len(r.Dropped) == 0
}

// Write is one record to persist; exactly one field is set.
type Write struct {
	Node   *NodeRecord
	Zone   *ZoneRecord
	Halted *bool
	// Forget names a node whose record is deleted.
	Forget string
}

// NodeRecord is a node's persisted state.
type NodeRecord struct {
	Name, Region, Zone string
	Readiness          coordv1.Readiness
	Reason             string
	TransitionAt       time.Time
	NotReadySince      time.Time
	Taint              Taint
	Queued             bool
	QueuedAt           time.Time
	ShuttingDown       bool
	FenceRequested     bool
	// ReleasedAt is when pacing released the node: the fence timeout counts from it.
	ReleasedAt time.Time `json:",omitzero"`
	// BootID is the agent's boot when the record was written: a later term tells a node that
	// booted again (it went off) from one that never stopped (the proof, fencing.Spoke).
	BootID string `json:",omitempty"`
	// WouldFence: an automatic fence of this not-ready episode was observed (observe mode), so a
	// new leader in observe mode does not record it twice; an enforcing leader ignores it.
	WouldFence bool `json:",omitempty"`
	// WatchdogArmed and WatchdogTimeout are the node's watchdog as its agent last reported it
	// (written when the report changes; the agent's "disarmed" before a clean stop is acknowledged
	// only once it is written): a new leader that never hears the node's agent — a dark node whose
	// watchdog fence it takes over — may still prove it off by time, and never one whose last
	// report was "disarmed" (issue 24).
	WatchdogArmed   bool          `json:",omitempty"`
	WatchdogTimeout time.Duration `json:",omitempty"`
	// WatchdogNotBefore is the safe time a leader computed when it sent the node its stop-feeding
	// pill (WatchdogBound): no later term proves the node off by time before it.
	WatchdogNotBefore time.Time `json:",omitzero"`
}

// ZoneRecord is a zone's persisted state.
type ZoneRecord struct {
	Key   string
	State coordv1.ZoneState
	At    time.Time
}

// TaintChange moves a node from one NoExecute taint to another (or none).
type TaintChange struct {
	Node     string
	From, To Taint
}

// Eviction is a paced release of a not-ready node.
type Eviction struct {
	Node, Zone    string
	At            time.Time
	NotReadySince time.Time
}

// ConditionChange is a node condition an agent changed.
type ConditionChange struct {
	Node, Type, Status, Reason, Message string
}

// Event is one decision in words.
type Event struct {
	At time.Time
	// Kind classifies it: readiness, zone, halt, eviction, fence-requested, would-fence,
	// fence-held-back, fence-mode, fence-exclusion, pause, kdump, condition, shutdown, agent-down,
	// kubelet-down, node, apiserver, proof, alarm.
	Kind string
	// Node is the node concerned, or "".
	Node string
	Text string
}

// Ready returns the pending decisions.
func (e *Engine) Ready() Ready { return e.ready }

// Advance acknowledges that everything returned by Ready was handled.
func (e *Engine) Advance() { e.ready = Ready{} }
