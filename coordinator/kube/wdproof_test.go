package kube

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/nodefence/nodefence/coordinator/fencing"
	"github.com/nodefence/nodefence/coordinator/release"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// A record proven off by the watchdog's timing rule is released exactly like one proven by a
// read-back: only once the leader proved its witnesses silent, never while a witness spoke after
// it, never with the wrong-machine alarm. Its NodeFence status names the proof.
func TestReleaseWatchdogProof(t *testing.T) {
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	for _, p := range []coordv1.FenceProof{coordv1.FenceProof_FENCE_PROOF_READ_BACK, coordv1.FenceProof_FENCE_PROOF_WATCHDOG_TIMEOUT} {
		rec := &coordv1.NodeFence{Id: "n-1", Node: "n", Action: coordv1.FenceAction_FENCE_ACTION_OFF, ConfirmedOffAt: timestamppb.New(now.Add(-time.Minute)), Proof: p}
		for _, tc := range []struct {
			name string
			s    release.State
			want release.Action
		}{
			{"witnesses not yet proven silent", release.State{Fence: rec, Running: true}, release.Hold},
			{"proven dark", release.State{Fence: rec, Running: true, Proof: release.Proven{Fence: "n-1", Verdict: fencing.ProofDark}}, release.Apply},
			{"a witness spoke after", release.State{Fence: rec, Running: true, Proof: release.Proven{Fence: "n-1", Verdict: fencing.ProofWrongMachine, Spoke: "its agent"}}, release.Hold},
		} {
			if got, _, why := release.Decide(tc.s, now, time.Minute); got != tc.want {
				t.Errorf("%s, %s: %v (%s), want %v", p, tc.name, got, why, tc.want)
			}
		}
	}
	rec := &coordv1.NodeFence{Id: "n-1", Node: "n", Action: coordv1.FenceAction_FENCE_ACTION_OFF, Proof: coordv1.FenceProof_FENCE_PROOF_WATCHDOG_TIMEOUT}
	obj, err := FenceObject(rec)
	if err != nil {
		t.Fatal(err)
	}
	if got, _, _ := unstructured.NestedString(obj.Object, "status", "proof"); got != "watchdog-timeout" {
		t.Fatalf("NodeFence status.proof = %q, want watchdog-timeout", got)
	}
}
