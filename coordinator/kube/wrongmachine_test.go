package kube

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// A power-off that hit another machine (the node kept reporting after it) never releases the node,
// not even once its witnesses fall silent later.
func TestDecideReleaseNeverAfterTheWrongMachine(t *testing.T) {
	now := time.Now()
	f := &coordv1.NodeFence{Id: "f1", Node: "n1", Action: coordv1.FenceAction_FENCE_ACTION_OFF,
		ConfirmedOffAt: timestamppb.New(now.Add(-time.Minute)), WrongMachineAt: timestamppb.New(now.Add(-50 * time.Second))}
	for _, back := range []bool{true, false} {
		if got, _, why := DecideRelease(ReleaseState{Fence: f, WitnessesBack: back}, now, time.Minute); got != ReleaseHold {
			t.Errorf("witnesses back=%v: %v (%s), want ReleaseHold", back, got, why)
		}
	}
	f.WrongMachineAt = nil
	if got, _, _ := DecideRelease(ReleaseState{Fence: f}, now, time.Minute); got != ReleaseApply {
		t.Errorf("without the alarm: %v, want ReleaseApply", got)
	}
}
