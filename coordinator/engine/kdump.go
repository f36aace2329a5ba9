package engine

import (
	"time"

	"github.com/nodefence/nodefence/coordinator/fencing"
	"github.com/nodefence/nodefence/coordinator/nodes"
)

// fence_kdump and the witnesses. A fence_kdump datagram is unauthenticated: it is evidence that a
// node is dumping, never proof that it is off, and it never outweighs a witness. A message from a
// node heard within the grace period is dropped; any witness contact after the first message of a
// dump ends the dump; a dump stands for the node's silence (not ready at once, no fresh grace owed
// before its fence) only when every witness has been silent for more than a grace period. The fence
// runner re-checks an automatic fence against the witnesses (LastWitness) before every driver call.

// kdump records a fence_kdump message of a known node. A message from a node whose witness was
// heard within the grace period is dropped: that node is running and reaching us, so the message
// is stale or spoofed.
func (e *Engine) kdump(in Kdump) {
	n, ok := e.nodes[in.Node]
	if !ok || e.reaching(n, in.At) {
		return
	}
	if !e.dumping(n, in.At) {
		n.kdumpFirst = in.At
		e.event(in.At, "kdump", n.name, "node %s: fence_kdump message: the node crashed and is dumping its memory", n.name)
	}
	n.kdumpLast = in.At
}

// dumping reports whether the node sent a fence_kdump message within the idle time.
func (e *Engine) dumping(n *node, now time.Time) bool {
	return !n.kdumpLast.IsZero() && now.Sub(n.kdumpLast) <= e.cfg.KdumpIdle
}

// kdumpDown reports whether the node's dump stands for its silence: it is dumping, and a witness
// was last heard more than one grace period ago (before the dump began). A fence_kdump datagram is
// unauthenticated: it never shortens the grace period of a node that reported less than one grace
// period ago, nor of a node no witness has reported in this term (it may have reported just before
// the term began).
func (e *Engine) kdumpDown(n *node, now time.Time) bool {
	heard := n.heard()
	return e.dumping(n, now) && !heard.IsZero() && n.kdumpFirst.After(heard) && now.Sub(heard) > e.cfg.NodeMonitorGracePeriod
}

// heard is the latest contact of any witness of the node: an agent message or hello, or (Kubernetes
// mode) a kubelet heartbeat seen advancing; zero when none was heard in this term.
func (n *node) heard() time.Time {
	if n.kubeletProbe.After(n.lastContact) {
		return n.kubeletProbe
	}
	return n.lastContact
}

// reaching reports whether a witness of the node was heard at most one grace period before at.
func (e *Engine) reaching(n *node, at time.Time) bool {
	heard := n.heard()
	return !heard.IsZero() && at.Sub(heard) <= e.cfg.NodeMonitorGracePeriod
}

// witnessed records a witness's contact at: contact after the first fence_kdump message of a dump
// ends the dump (the node is running, so the messages were stale or spoofed).
func (n *node) witnessed(who string, at time.Time) {
	if !n.kdumpFirst.IsZero() && !at.Before(n.kdumpFirst) {
		n.kdumpFirst, n.kdumpLast, n.kdumpCancel = time.Time{}, time.Time{}, who
	}
}

// KdumpUntil is how long power management of the node should wait for its kernel dump: until the
// dump stops (no message for the idle time) or the kdump timeout since the first message. Zero when
// the node is not dumping.
func (e *Engine) KdumpUntil(name string) time.Time {
	n, ok := e.nodes[name]
	if !ok || !e.dumping(n, e.now) {
		return time.Time{}
	}
	end := n.kdumpLast.Add(e.cfg.KdumpIdle)
	if limit := n.kdumpFirst.Add(e.cfg.KdumpTimeout); limit.Before(end) {
		end = limit
	}
	return end
}

// Reaching reports whether a witness of the node (its agent; in Kubernetes mode its kubelet too)
// was heard at most one grace period before now, connected or between two streams: the node is
// running and reaching us, and a fence_kdump message from its address is stale or spoofed.
func (e *Engine) Reaching(name string, now time.Time) bool {
	n, ok := e.nodes[name]
	return ok && e.reaching(n, now)
}

// LastWitness is the latest contact of the node's witnesses that count for its readiness (as the
// fence trigger judges them: the agent's in standalone mode; in Kubernetes mode the later of the
// agent's and the kubelet's, or the kubelet's alone under the kubelet-down policy fence), and which
// witness it was ("agent" or "kubelet"). Zero when none was heard in this term. The fence runner
// re-checks an automatic fence against it before every driver call.
func (e *Engine) LastWitness(name string) (who string, at time.Time) {
	n, ok := e.nodes[name]
	if !ok {
		return "", time.Time{}
	}
	// The kubelet counts only when this term saw its heartbeat advance: the value a new leader
	// reads first is old news (a running fence a previous leader decided is not aborted for it).
	var kubelet time.Time
	if e.cfg.KubeletWitness {
		kubelet = n.kubeletAdvanced
		if e.cfg.KubeletDownPolicy == nodes.KubeletDownFence {
			return witnessAt("kubelet", kubelet)
		}
	}
	if kubelet.After(n.lastContact) {
		return "kubelet", kubelet
	}
	return witnessAt("agent", n.lastContact)
}

// Contact is the node's latest witness contact for the fence runner's re-check (fencing.Reaching):
// LastWitness, with the grace period as the silence after which it no longer counts — or, under fast
// detection, with the span that reaches to the end of the later of the witnesses' own windows, so
// that the re-check lets a call go exactly when the fence decision could have been made.
func (e *Engine) Contact(name string) fencing.Contact {
	who, at := e.LastWitness(name)
	c := fencing.Contact{Witness: who, At: at, Grace: e.cfg.NodeMonitorGracePeriod}
	n, ok := e.nodes[name]
	if !ok || !e.fastDetect() || at.IsZero() {
		return c
	}
	r := e.proofRule()
	end := n.lastContact.Add(r.AgentWindow())
	if k := n.kubeletAdvanced; !k.IsZero() {
		if kend := k.Add(nodes.KubeletWindow(n.renew())); kend.After(end) {
			end = kend
		}
	}
	c.Grace = end.Sub(at)
	return c
}

// witnessAt names the witness heard at at, or none when at is zero.
func witnessAt(who string, at time.Time) (string, time.Time) {
	if at.IsZero() {
		return "", at
	}
	return who, at
}
