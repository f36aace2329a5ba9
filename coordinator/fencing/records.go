package fencing

import (
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nodefence/nodefence/coordinator/fenceconfig"
	"github.com/nodefence/nodefence/services/fault"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// The rules in this file and in acknowledge.go and proof.go decide what a fence record says. They
// are pure — state, identity and time come in as arguments, nothing is read or written — so that the
// API handlers, the wiring and the engine's scenario scripts (coordinator/engine/testdata) all apply
// the same rules and a script can replay them.

// NewID returns a record id that sorts by creation time per node.
func NewID(node string, now time.Time) string {
	return fmt.Sprintf("%s-%s", node, now.UTC().Format("20060102T150405.000000000"))
}

// NodeDelay is how long a node's automatic fence waits before its first dispatch: the node's fixed
// delay plus a random part below randomDelay (Pacemaker's pcmk_delay_base and pcmk_delay_max).
// draw returns a number in [0, n), math/rand/v2's Int64N in production; the part is drawn once, when
// the record is built, so that every leader honours the same delay.
func NodeDelay(delay, randomDelay time.Duration, draw func(n int64) int64) time.Duration {
	if randomDelay > 0 {
		delay += time.Duration(draw(int64(randomDelay)))
	}
	return delay
}

// AutoRequest is an automatic fence request as the record rules see it (the engine's FenceRequest,
// with what the caller learnt besides).
type AutoRequest struct {
	Node string
	// Evidence says why the node is fenced, in order: the engine's judgement and signals, then
	// anything the caller added (Kubernetes mode: what the node runs).
	Evidence []string
	// Dumping is set when the node sends fence_kdump messages.
	Dumping bool
	// Reboot asks for a power cycle instead of a power-off (a reporting node a condition trigger
	// found broken: engine/conditions.go).
	Reboot bool
	// LastContact and NotReadySince are the engine's: the node's last witness contact and when it
	// was judged not ready (zero: unknown).
	LastContact, NotReadySince time.Time
	// Silent is set when the decision was made on the witnesses' silence (the engine's fast
	// detection) rather than on the node's readiness.
	Silent bool
}

// AutoRebootReason is the reason of an automatic power cycle.
const AutoRebootReason = "node condition trigger: alive but broken"

// AutoReason is the reason of an automatic fence record decided on the node's readiness, and
// AutoSilentReason of one decided on its witnesses' silence (AutoRequest.Silent).
const (
	AutoReason       = "node not ready past the fence timeout"
	AutoSilentReason = "agent and kubelet silent past their own windows and the fence timeout"
)

// AutoRecord returns the record an automatic fence creates under the leader's epoch: a power-off
// requested by the coordinator, held back by the node's delay.
func AutoRecord(req AutoRequest, plan func(string) ([]fenceconfig.Resolved, error), delay time.Duration, epoch int64, now time.Time) *coordv1.NodeFence {
	action, reason := coordv1.FenceAction_FENCE_ACTION_OFF, AutoReason
	switch {
	case req.Reboot:
		action, reason = coordv1.FenceAction_FENCE_ACTION_REBOOT, AutoRebootReason
	case req.Silent:
		reason = AutoSilentReason
	}
	rec := NewRecord(NewID(req.Node, now), req.Node, action, plan, delay, now)
	rec.Reason, rec.RequestedBy, rec.Automatic, rec.Epoch = reason, "coordinator", true, epoch
	rec.Evidence = append(append([]string(nil), req.Evidence...), rec.Evidence...)
	if !req.LastContact.IsZero() {
		rec.LastContactAt = timestamppb.New(req.LastContact)
	}
	if !req.NotReadySince.IsZero() {
		rec.NotReadySince = timestamppb.New(req.NotReadySince)
	}
	if req.Dumping {
		// Evidence only: an unauthenticated datagram never confirms a power-off. The record is
		// confirmed by the driver's read-back after power management, which waits for the dump.
		rec.Evidence = append(rec.Evidence, "dumping its memory (fence_kdump, unauthenticated evidence); power management waits for the dump")
	}
	return rec
}

// OperatorRecord returns the record an operator's fence (power-off) or unfence (power-on) creates
// under the leader's epoch. It is not delayed: the node delay exists for automatic fencing races.
func OperatorRecord(node string, action coordv1.FenceAction, reason, requestedBy string, plan func(string) ([]fenceconfig.Resolved, error), epoch int64, now time.Time) *coordv1.NodeFence {
	rec := NewRecord(NewID(node, now), node, action, plan, 0, now)
	rec.Reason, rec.RequestedBy, rec.Epoch = reason, requestedBy, epoch
	return rec
}

// Joined applies the rule for an operator's request that meets the node's active record (one
// active record per node): the request joins a record of the same action, and is refused
// (fault.ErrFailedPrecondition) while a record of the other action runs.
func Joined(active *coordv1.NodeFence, action coordv1.FenceAction) error {
	if active.Action == action {
		return nil
	}
	return fmt.Errorf("node %s has an active %s record %s; wait for it to finish: %w",
		active.Node, strings.ToLower(strings.TrimPrefix(active.Action.String(), "FENCE_ACTION_")), active.Id, fault.ErrFailedPrecondition)
}

// StandingOff applies the rule for an operator's fence of a node that is already off: the node's
// newest record (latest, nil for none) stands when it is a power-off confirmed by read-back or
// acknowledged by an operator, not marked wrong machine, and no witness of the node has shown life
// since the confirmation (n is the engine's view of the node, nil if unknown; slack is ProofWindow's,
// for a heartbeat sent before the power-off and received after). It returns what the standing
// record says, "" when the node does not stand confirmed off and a fence is to run.
func StandingOff(latest *coordv1.NodeFence, n *coordv1.Node, slack time.Duration) string {
	if latest.GetAction() != coordv1.FenceAction_FENCE_ACTION_OFF || latest.GetStatus() != coordv1.FenceStatus_FENCE_STATUS_DONE ||
		latest.GetConfirmedOffAt() == nil || latest.GetWrongMachineAt() != nil {
		return ""
	}
	off := latest.GetConfirmedOffAt().AsTime()
	if n.GetConnected() || n.GetLastSeen().AsTime().After(off.Add(slack)) ||
		(n.GetKubeletLastSeen() != nil && n.GetKubeletLastSeen().AsTime().After(off.Add(slack))) {
		return ""
	}
	how := "by read-back"
	if latest.GetAcknowledgedBy() != "" {
		how = "by " + latest.GetAcknowledgedBy() + "'s acknowledgement"
	}
	return fmt.Sprintf("node %s stands confirmed off: fence %s confirmed it off %s at %s, and neither its agent nor its kubelet has reported since",
		latest.GetNode(), latest.GetId(), how, off.UTC().Format(time.RFC3339))
}
