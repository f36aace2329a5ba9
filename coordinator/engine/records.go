package engine

import (
	"time"

	"github.com/nodefence/nodefence/coordinator/fenceconfig"
	"github.com/nodefence/nodefence/coordinator/fencing"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// What the caller of the engine does with a fence record, in one place: the coordinator's term
// (coordinator/app) and the scenario scripts run exactly these.

// Record is the fence record an automatic request creates (the caller's Kubernetes policy may
// have added to its Evidence). In observe mode it is a record that says would fence, finished when
// written and never run (fencing.ObservedRecord of the request's node, evidence and kernel dump).
// Otherwise it is an automatic power-off or power cycle after the
// node's delay (fencing.AutoRecord). plan is the node's configured steps.
func (r FenceRequest) Record(plan func(string) ([]fenceconfig.Resolved, error), delay time.Duration, epoch int64, now time.Time) *coordv1.NodeFence {
	dumping := !r.KdumpSince.IsZero()
	if r.Observe {
		return fencing.ObservedRecord(fencing.AutoRequest{Node: r.Node, Evidence: r.Evidence, Dumping: dumping}, plan, epoch, now)
	}
	return fencing.AutoRecord(fencing.AutoRequest{Node: r.Node, Evidence: r.Evidence, Dumping: dumping,
		Reboot: r.Action == coordv1.FenceAction_FENCE_ACTION_REBOOT, LastContact: r.LastContact,
		NotReadySince: r.NotReadySince, Silent: r.Silent}, plan, delay, epoch, now)
}

// RecordWritten is what the engine hears of a record's new version, at at: the record (the node's
// newest: its proof, the hold on automatic fences) and, for a confirmed power-off, the confirmation
// (the node's view says powered off at once).
func RecordWritten(f *coordv1.NodeFence, at time.Time) []Input {
	in := []Input{FenceRecord{Record: f, At: at}}
	if f.GetAction() == coordv1.FenceAction_FENCE_ACTION_OFF && f.GetConfirmedOffAt() != nil {
		in = append(in, PoweredOff{Node: f.GetNode(), Fence: f.GetId(), At: f.GetConfirmedOffAt().AsTime()})
	}
	return in
}
