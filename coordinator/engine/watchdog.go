package engine

import (
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/nodefence/nodefence/services/wdlease"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// watchdog is a node's watchdog as its agent last reported it: in its hello, and in a report when
// it changes (disarmed before a clean stop). Issue 24's proof by time may only ever use a node whose
// last report was "armed".
type watchdog struct {
	armed   bool
	timeout time.Duration
	// notBefore is the safe time a leader persisted when it sent the node its stop-feeding pill
	// (WatchdogBound): no later term proves the node off by time before it.
	notBefore time.Time
}

// WatchdogBound is the safe time a leader computed for a node when it sent it the stop-feeding
// pill (its last grant of the term is then fixed): persisted with the node's record, so that a new
// leader continuing the watchdog fence never takes the node as self-fenced before it.
type WatchdogBound struct {
	Node      string
	NotBefore time.Time
}

func (WatchdogBound) isInput() {}

// watchdogBound records a pill's safe time (the later of it and one recorded before).
func (e *Engine) watchdogBound(in WatchdogBound) {
	n, ok := e.nodes[in.Node]
	if !ok || !in.NotBefore.After(n.watchdog.notBefore) {
		return
	}
	n.watchdog.notBefore = in.NotBefore
	e.persistNode(n)
}

// WatchdogNotBefore is the node's persisted safe time (WatchdogBound; zero: none).
func (e *Engine) WatchdogNotBefore(node string) time.Time {
	if n, ok := e.nodes[node]; ok {
		return n.watchdog.notBefore
	}
	return time.Time{}
}

// watchdogReported records a report (nil: the agent runs without a watchdog) and says so when the
// state changes.
func (e *Engine) watchdogReported(n *node, s *agentv1.WatchdogState, at time.Time) {
	w := watchdog{armed: s.GetArmed(), timeout: s.GetTimeout().AsDuration(), notBefore: n.watchdog.notBefore}
	if !w.armed {
		w.timeout = 0
	}
	if w == n.watchdog {
		return
	}
	old := n.watchdog
	n.watchdog = w
	e.persistNode(n) // a new leader needs the last report (restoredWatchdog)
	switch {
	case w.armed:
		e.event(at, "watchdog", n.name, "node %s: watchdog armed (timeout %s)", n.name, w.timeout)
	case old.armed:
		e.event(at, "watchdog", n.name, "node %s: watchdog disarmed by its agent (a clean stop, or an agent without one)", n.name)
	}
}

// watchdogView fills the API view's watchdog fields.
func (w watchdog) view(v *coordv1.Node) {
	v.WatchdogArmed = w.armed
	if w.armed {
		v.WatchdogTimeout = durationpb.New(w.timeout)
	}
}

// restoredWatchdog is the watchdog report a node's record kept from an earlier term: armed only
// with a timeout in the range the timing rule accepts (wdlease.MaxWatchdog), else none.
func restoredWatchdog(r NodeRecord) watchdog {
	if !r.WatchdogArmed || r.WatchdogTimeout <= 0 || r.WatchdogTimeout > wdlease.MaxWatchdog {
		return watchdog{notBefore: r.WatchdogNotBefore}
	}
	return watchdog{armed: true, timeout: r.WatchdogTimeout, notBefore: r.WatchdogNotBefore}
}
