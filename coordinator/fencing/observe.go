package fencing

import (
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nodefence/nodefence/coordinator/fenceconfig"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// Observe mode (docs/observe.md): the engine makes every automatic decision, and the record of a
// decision made while observing says "would fence" and nothing more. Such a record is born
// finished (FENCE_STATUS_OBSERVED, finished_at set), so the store never indexes it as the node's
// active record, no term's runner resumes it, Decide has nothing to do for it, and a switch to
// enforce never executes it: an enforced fence is always a new decision of its own.

// ObservedReason is the reason of every record made in observe mode.
const ObservedReason = "would fence: node not ready past the fence timeout (observe mode: nothing was switched)"

// ObservedEvidence ends the evidence of every record made in observe mode.
const ObservedEvidence = "observe mode: recorded as would fence; no driver was called and nothing is released for it"

// ObservedRecord returns the record of an automatic decision made in observe mode: what AutoRecord
// would have written (the same plan, evidence and epoch), finished at once with the OBSERVED
// status, and without the node's delay (nothing is dispatched).
func ObservedRecord(req AutoRequest, plan func(string) ([]fenceconfig.Resolved, error), epoch int64, now time.Time) *coordv1.NodeFence {
	rec := AutoRecord(req, plan, 0, epoch, now)
	rec.Status, rec.Reason = coordv1.FenceStatus_FENCE_STATUS_OBSERVED, ObservedReason
	rec.FinishedAt = timestamppb.New(now)
	rec.Evidence = append(rec.Evidence, ObservedEvidence)
	return rec
}

// Observed reports whether f is a record made in observe mode (never executed).
func Observed(f *coordv1.NodeFence) bool {
	return f.GetStatus() == coordv1.FenceStatus_FENCE_STATUS_OBSERVED
}

// WouldRelease returns the next version of an observed record, written under epoch, once the
// release reconciler found that it would have released the node's pods at at; nil when f is not an
// observed record or already says so (the first time stands).
func WouldRelease(f *coordv1.NodeFence, at time.Time, epoch int64) *coordv1.NodeFence {
	if !Observed(f) || f.GetWouldReleaseAt() != nil {
		return nil
	}
	next := proto.Clone(f).(*coordv1.NodeFence)
	next.WouldReleaseAt, next.UpdatedAt, next.Epoch = timestamppb.New(at), timestamppb.New(at), epoch
	return next
}
