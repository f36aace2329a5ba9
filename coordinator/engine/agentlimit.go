package engine

import (
	"fmt"
	"strings"
	"time"

	"golang.org/x/time/rate"
)

// One agent cannot spend the store. Every agent message that makes the coordinator write — an
// audit entry, the node's record, a condition mirrored on the Kubernetes Node — first takes a token
// from its node's bucket (AgentEventConfig). Over the bucket the message still changes the engine
// at once: the newest condition and the newest shutdown announcement are what the engine decides
// by. Only the writes wait:
//
//   - a condition change held back is written, newest value only, as soon as the bucket has a
//     token again (changes in between are coalesced);
//   - a node record held back (shutdown announced or cancelled) likewise, before any condition;
//   - an eviction report's or candidate's audit line is dropped.
//
// Every message held back or dropped is counted (Ready.Dropped, for the metrics), and once per
// AgentEventConfig.Summary a node with drops gets one audit line saying how many of each kind.

// Defaults of AgentEventConfig: one write a second per node, twenty at once after a quiet spell,
// one summary a minute.
const (
	DefaultAgentEventRate    = 1.0
	DefaultAgentEventBurst   = 20
	DefaultAgentEventSummary = time.Minute
)

// AgentEventConfig bounds the writes one node's agent can cause.
type AgentEventConfig struct {
	// Rate is the writes per second one node's agent may cause (1).
	Rate float64
	// Burst is how many it may cause at once after a quiet spell (20).
	Burst int
	// Summary is how often a node whose events were held back or dropped gets one audit line
	// counting them (1m).
	Summary time.Duration
}

// SetDefaults fills the zero (or negative) fields.
func (c *AgentEventConfig) SetDefaults() {
	if c.Rate <= 0 {
		c.Rate = DefaultAgentEventRate
	}
	if c.Burst <= 0 {
		c.Burst = DefaultAgentEventBurst
	}
	if c.Summary <= 0 {
		c.Summary = DefaultAgentEventSummary
	}
}

// agentKind is a kind of agent event the limit counts.
type agentKind int

const (
	kindCondition agentKind = iota
	kindShutdown
	kindEviction
	kindCandidate
	numAgentKinds
)

// The names of the agent event kinds, in Drop.Kind and in the summaries.
const (
	DropCondition = "condition"
	DropShutdown  = "shutdown"
	DropEviction  = "eviction-report"
	DropCandidate = "eviction-candidate"
)

var agentKinds = [numAgentKinds]string{DropCondition, DropShutdown, DropEviction, DropCandidate}

// summaryKind is the audit kind of a node's summary of its drops.
const summaryKind = "rate-limit"

// Drop is one agent event whose write was held back or dropped by its node's limit.
type Drop struct {
	Node string
	// Kind is DropCondition, DropShutdown, DropEviction or DropCandidate.
	Kind string
}

// agentLimit is one node's bucket and what it holds back.
type agentLimit struct {
	bucket     *rate.Limiter
	held       []ConditionChange // newest value of each condition type held back, in arrival order
	heldRecord string            // the audit text of a node record held back; "" when none
	dropped    [numAgentKinds]int
	since      time.Time // first drop since the last summary
	listed     bool      // in Engine.limited
}

func (l *agentLimit) drops() int {
	total := 0
	for _, d := range l.dropped {
		total += d
	}
	return total
}

func (l *agentLimit) idle() bool { return l.drops() == 0 && len(l.held) == 0 && l.heldRecord == "" }

func (e *Engine) limitOf(n *node) *agentLimit {
	if n.limit == nil {
		c := e.cfg.AgentEvents
		n.limit = &agentLimit{bucket: rate.NewLimiter(rate.Limit(c.Rate), c.Burst)}
	}
	return n.limit
}

// admit takes a token of n's bucket for an agent event of kind at at. Without one, the event is
// counted and n is watched by Tick until its limit is idle again.
func (e *Engine) admit(n *node, at time.Time, kind agentKind) bool {
	l := e.limitOf(n)
	if l.bucket.AllowN(at, 1) {
		return true
	}
	if l.drops() == 0 {
		l.since = at
	}
	l.dropped[kind]++
	e.ready.Dropped = append(e.ready.Dropped, Drop{Node: n.name, Kind: agentKinds[kind]})
	if !l.listed {
		l.listed = true
		e.limited = append(e.limited, n)
	}
	return false
}

// agentEvent records an agent event's audit line if n's limit admits it, and drops it otherwise.
func (e *Engine) agentEvent(n *node, at time.Time, kind agentKind, auditKind, format string, args ...any) {
	if e.admit(n, at, kind) {
		e.event(at, auditKind, n.name, format, args...)
	}
}

// conditionChanged writes (audit line and Kubernetes mirror) a change of one of n's conditions,
// or holds it back: then only the newest value of the condition is written later.
func (e *Engine) conditionChanged(n *node, at time.Time, c ConditionChange) {
	l := e.limitOf(n)
	for i, h := range l.held {
		if h.Type == c.Type {
			l.held = append(l.held[:i:i], l.held[i+1:]...)
			break
		}
	}
	if e.admit(n, at, kindCondition) {
		e.writeCondition(at, c, "")
		return
	}
	l.held = append(l.held, c)
}

func (e *Engine) writeCondition(at time.Time, c ConditionChange, note string) {
	e.event(at, "condition", c.Node, "node %s: %s=%s (%s)%s", c.Node, c.Type, c.Status, c.Reason, note)
	e.ready.Conditions = append(e.ready.Conditions, c)
}

// recordChanged persists n's record after an agent's announcement (format and args are its audit
// line), or
// holds it back: the record is written later with n's newest state.
func (e *Engine) recordChanged(n *node, at time.Time, format string, args ...any) {
	text := fmt.Sprintf(format, args...)
	if e.admit(n, at, kindShutdown) {
		n.limit.heldRecord = ""
		e.event(at, "shutdown", n.name, "%s", text)
		e.persistNode(n)
		return
	}
	n.limit.heldRecord = text
}

// tickAgentLimits writes what the nodes' limits held back as their buckets refill, and the
// summary of each node whose window ended. Only nodes with something held or counted are visited.
func (e *Engine) tickAgentLimits(now time.Time) {
	kept := e.limited[:0]
	for _, n := range e.limited {
		l := n.limit
		if e.nodes[n.name] != n {
			l.listed = false // forgotten
			continue
		}
		if l.heldRecord != "" && l.bucket.AllowN(now, 1) {
			e.event(now, "shutdown", n.name, "%s (the newest of the announcements held back by the agent's rate limit)", l.heldRecord)
			l.heldRecord = ""
			e.persistNode(n)
		}
		for len(l.held) > 0 && l.bucket.AllowN(now, 1) {
			c := l.held[0]
			l.held = l.held[1:]
			if cur := n.conditions[c.Type]; cur != nil && cur.Status == c.Status {
				e.writeCondition(now, c, " (the newest of the changes held back by the agent's rate limit)")
			}
		}
		if l.drops() > 0 && now.Sub(l.since) >= e.cfg.AgentEvents.Summary {
			e.event(now, summaryKind, n.name, "node %s: %s from its agent over the limit of %g a second were not written in the last %s; the newest condition and announcement are kept",
				n.name, l.summary(), e.cfg.AgentEvents.Rate, now.Sub(l.since).Round(time.Second))
			l.dropped = [numAgentKinds]int{}
		}
		if l.idle() {
			l.listed = false
			continue
		}
		kept = append(kept, n)
	}
	clear(e.limited[len(kept):])
	e.limited = kept
}

// summary counts the drops by kind, in the order of agentKinds.
func (l *agentLimit) summary() string {
	var parts []string
	for i, d := range l.dropped {
		if d > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", d, agentKinds[i]))
		}
	}
	return strings.Join(parts, ", ")
}
