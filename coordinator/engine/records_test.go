package engine

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nodefence/nodefence/coordinator/fenceconfig"
	"github.com/nodefence/nodefence/coordinator/fencing"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// TestFenceRequestRecord: an automatic request's record carries the request's action, timing and
// reason, after the node's delay; in observe mode the record says would fence, is finished when
// written, and records the node, evidence and kernel dump only (a power-off, whatever the request).
func TestFenceRequestRecord(t *testing.T) {
	now := time.Date(2026, 11, 28, 3, 0, 0, 0, time.UTC)
	plan := func(step string) ([]fenceconfig.Resolved, error) {
		if step == fenceconfig.StepPowerManagement {
			return []fenceconfig.Resolved{{Name: "bmc", Driver: "d"}}, nil
		}
		return nil, nil
	}
	req := FenceRequest{Node: "n1", Evidence: []string{"why"}, Action: coordv1.FenceAction_FENCE_ACTION_REBOOT, Silent: true,
		LastContact: now.Add(-time.Minute), NotReadySince: now.Add(-30 * time.Second), KdumpSince: now.Add(-time.Second)}
	rec := req.Record(plan, 5*time.Second, 3, now)
	if rec.Action != coordv1.FenceAction_FENCE_ACTION_REBOOT || rec.Reason != fencing.AutoRebootReason || !rec.Automatic || rec.Epoch != 3 ||
		rec.LastContactAt == nil || rec.NotReadySince == nil || rec.FinishedAt != nil || !rec.NextAttemptAt.AsTime().Equal(now.Add(5*time.Second)) {
		t.Errorf("automatic record = %v", rec)
	}
	req.Observe = true
	obs := req.Record(plan, 5*time.Second, 3, now)
	if !fencing.Observed(obs) || obs.FinishedAt == nil || obs.Action != coordv1.FenceAction_FENCE_ACTION_OFF ||
		obs.LastContactAt != nil || obs.NextAttemptAt != nil || obs.Evidence[0] != "why" {
		t.Errorf("observed record = %v", obs)
	}
}

// TestRecordWritten: every version reaches the engine as the node's record; a confirmed power-off
// also as the confirmation, at the time it was confirmed.
func TestRecordWritten(t *testing.T) {
	now := time.Date(2026, 11, 28, 3, 0, 0, 0, time.UTC)
	off := &coordv1.NodeFence{Id: "f", Node: "n1", Action: coordv1.FenceAction_FENCE_ACTION_OFF}
	if in := RecordWritten(off, now); len(in) != 1 {
		t.Errorf("unconfirmed: %d inputs, want the record only", len(in))
	}
	off.ConfirmedOffAt = timestamppb.New(now.Add(-time.Second))
	in := RecordWritten(off, now)
	if len(in) != 2 {
		t.Fatalf("confirmed: %d inputs, want 2", len(in))
	}
	if p, ok := in[1].(PoweredOff); !ok || p.Node != "n1" || p.Fence != "f" || !p.At.Equal(now.Add(-time.Second)) {
		t.Errorf("confirmation = %#v", in[1])
	}
	cycle := &coordv1.NodeFence{Id: "g", Node: "n1", Action: coordv1.FenceAction_FENCE_ACTION_REBOOT, ConfirmedOffAt: off.ConfirmedOffAt}
	if in := RecordWritten(cycle, now); len(in) != 1 {
		t.Errorf("reboot: %d inputs, want the record only", len(in))
	}
}
