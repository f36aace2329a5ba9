package kube

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nodefence/nodefence/coordinator/fencing"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// A power-off that hit another machine (a witness kept reporting after it) never releases the
// node, not even once its witnesses fall silent later, and withdraws a taint already applied; a
// driver-confirmed power-off releases only once the leader proved the node dark.
func TestDecideReleaseNeverAfterTheWrongMachine(t *testing.T) {
	now := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	off := &coordv1.NodeFence{Id: "f1", Node: "n1", Action: coordv1.FenceAction_FENCE_ACTION_OFF, ConfirmedOffAt: timestamppb.New(now.Add(-time.Minute))}
	alarmed := &coordv1.NodeFence{Id: "f1", Node: "n1", Action: coordv1.FenceAction_FENCE_ACTION_OFF,
		ConfirmedOffAt: timestamppb.New(now.Add(-time.Minute)), WrongMachineAt: timestamppb.New(now.Add(-50 * time.Second))}
	acked := &coordv1.NodeFence{Id: "f1", Node: "n1", Action: coordv1.FenceAction_FENCE_ACTION_OFF, ConfirmedOffAt: timestamppb.New(now.Add(-time.Minute)), AcknowledgedBy: "alice"}
	dark := Proven{Fence: "f1", Verdict: fencing.ProofDark}
	for _, tc := range []struct {
		name string
		s    ReleaseState
		want ReleaseAction
	}{
		{"alarm recorded, witnesses back", ReleaseState{Fence: alarmed, WitnessesBack: true, Proof: dark}, ReleaseHold},
		{"alarm recorded, witnesses silent again", ReleaseState{Fence: alarmed, Proof: dark}, ReleaseHold},
		{"alarm recorded, tainted: withdraw", ReleaseState{Fence: alarmed, Tainted: true, Proof: dark}, ReleaseWithdraw},
		{"the leader's verdict is the alarm (not yet written)", ReleaseState{Fence: off, Proof: Proven{Fence: "f1", Verdict: fencing.ProofWrongMachine}}, ReleaseHold},
		{"the kubelet spoke after the power-off, engine not ready-judged", ReleaseState{Fence: off, Proof: Proven{Fence: "f1", Verdict: fencing.ProofDark, Spoke: "its kubelet renewed its heartbeat"}}, ReleaseHold},
		{"a witness spoke after the power-off, tainted: withdraw", ReleaseState{Fence: off, Tainted: true, Proof: Proven{Fence: "f1", Spoke: "its agent reported"}}, ReleaseWithdraw},
		{"witnesses silent, proof pending: hold", ReleaseState{Fence: off, Proof: Proven{Fence: "f1"}}, ReleaseHold},
		{"witnesses silent, the proof is of an older record: hold", ReleaseState{Fence: off, Proof: Proven{Fence: "f0", Verdict: fencing.ProofDark}}, ReleaseHold},
		{"witnesses silent, no proof from a new leader yet: hold", ReleaseState{Fence: off}, ReleaseHold},
		{"proven dark: release", ReleaseState{Fence: off, Proof: dark}, ReleaseApply},
		{"acknowledged by an operator: no proof needed", ReleaseState{Fence: acked}, ReleaseApply},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, _, why := DecideRelease(tc.s, now, time.Minute); got != tc.want {
				t.Errorf("DecideRelease = %v (%s), want %v", got, why, tc.want)
			}
		})
	}
}
