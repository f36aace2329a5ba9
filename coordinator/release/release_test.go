package release

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nodefence/nodefence/coordinator/fenceconfig"
	"github.com/nodefence/nodefence/coordinator/fencing"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

func TestDecideRelease(t *testing.T) {
	now := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	confirmed := &coordv1.NodeFence{Id: "n-1", Action: coordv1.FenceAction_FENCE_ACTION_OFF, ConfirmedOffAt: timestamppb.New(now.Add(-time.Minute))}
	unconfirmed := &coordv1.NodeFence{Id: "n-1", Action: coordv1.FenceAction_FENCE_ACTION_OFF}
	dark := Proven{Fence: "n-1", Verdict: fencing.ProofDark} // the leader proved the node dark
	delay := time.Minute
	for _, tc := range []struct {
		name  string
		s     State
		want  Action
		after time.Duration
	}{
		{"no record", State{}, Nothing, 0},
		{"not confirmed yet", State{Fence: unconfirmed, Running: true}, Nothing, 0},
		{"confirmed, witnesses silent", State{Proof: dark, Fence: confirmed, Running: true}, Apply, 0},
		{"confirmed, finished, still silent: completes the release", State{Proof: dark, Fence: confirmed, Tainted: true}, Apply, 0},
		{"confirmed but a witness reports while it runs", State{Proof: dark, Fence: confirmed, Running: true, WitnessesBack: true}, Hold, 0},
		{"back but a fence runs", State{Proof: dark, Fence: confirmed, Running: true, Tainted: true, WitnessesBack: true, NodeReady: true}, Nothing, 0},
		{"back, Node not Ready", State{Proof: dark, Fence: confirmed, Tainted: true, WitnessesBack: true}, Nothing, 0},
		{"back and Ready, not long enough", State{Proof: dark, Fence: confirmed, Tainted: true, WitnessesBack: true, BackSince: now.Add(-20 * time.Second), NodeReady: true, ReadySince: now.Add(-time.Hour)}, Hold, 40 * time.Second},
		{"Ready only recently", State{Proof: dark, Fence: confirmed, Tainted: true, WitnessesBack: true, BackSince: now.Add(-time.Hour), NodeReady: true, ReadySince: now.Add(-50 * time.Second)}, Hold, 10 * time.Second},
		{"back and Ready long enough", State{Proof: dark, Fence: confirmed, Tainted: true, WitnessesBack: true, BackSince: now.Add(-2 * time.Minute), NodeReady: true, ReadySince: now.Add(-time.Hour)}, Remove, 0},
		{"silent, proof pending: hold", State{Fence: confirmed, Running: true}, Hold, ProofPoll},
		{"a new term's pending proof does not keep a node that came back tainted", State{Fence: confirmed, Tainted: true, WitnessesBack: true, BackSince: now.Add(-2 * time.Minute), NodeReady: true, ReadySince: now.Add(-time.Hour)}, Remove, 0},
		{"an operator's taint, proof pending, silent: nothing deleted", State{Fence: confirmed, Tainted: true}, Hold, ProofPoll},
		{"an operator's taint without a record of ours stays", State{Tainted: true, WitnessesBack: true, NodeReady: true}, Nothing, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, after, why := Decide(tc.s, now, delay)
			if got != tc.want || after != tc.after {
				t.Errorf("DecideRelease = %v after %s (%s), want %v after %s", got, after, why, tc.want, tc.after)
			}
		})
	}
}

// TestDecideReleaseObserveMode: a record made in observe mode never releases, taints or deletes
// anything; with the node's witnesses silent it yields "would release" once, until the record says
// it would have.
func TestDecideReleaseObserveMode(t *testing.T) {
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	plan := func(string) ([]fenceconfig.Resolved, error) { return nil, nil }
	observed := fencing.ObservedRecord(fencing.AutoRequest{Node: "n"}, plan, 1, now.Add(-time.Minute))
	said := fencing.WouldRelease(observed, now.Add(-30*time.Second), 1)
	if said == nil || fencing.WouldRelease(said, now, 1) != nil {
		t.Fatal("WouldRelease: want the first time only")
	}
	// Even a record that claims a confirmed power-off is never applied once it says observed.
	claimed := fencing.ObservedRecord(fencing.AutoRequest{Node: "n"}, plan, 1, now.Add(-time.Minute))
	claimed.ConfirmedOffAt = timestamppb.New(now.Add(-time.Minute))
	dark := Proven{Fence: observed.GetId(), Verdict: fencing.ProofDark}
	for _, tc := range []struct {
		name string
		s    State
		want Action
	}{
		{"witnesses silent: would release", State{Fence: observed}, Would},
		{"proven dark too: still only would release", State{Fence: observed, Proof: dark}, Would},
		{"already said: nothing", State{Fence: said}, Nothing},
		{"a witness reports: nothing", State{Fence: observed, WitnessesBack: true}, Nothing},
		{"an earlier enforced taint on a healthy node comes off", State{Fence: observed, Tainted: true, WitnessesBack: true,
			BackSince: now.Add(-time.Hour), NodeReady: true, ReadySince: now.Add(-time.Hour)}, Remove},
		{"a forged confirmation on an observed record: nothing", State{Fence: claimedDone(claimed), Proof: Proven{Fence: claimed.GetId(), Verdict: fencing.ProofDark}}, Nothing},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _, why := Decide(tc.s, now, time.Minute)
			if got != tc.want {
				t.Errorf("DecideRelease = %v (%s), want %v", got, why, tc.want)
			}
			if got == Apply {
				t.Errorf("an observed record released pods: %s", why)
			}
		})
	}
}

// claimedDone marks the claimed record as already having said would release, so that only the
// confirmed-off claim could make it
func claimedDone(f *coordv1.NodeFence) *coordv1.NodeFence {
	f.WouldReleaseAt = f.GetCreatedAt()
	return f
}

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
		s    State
		want Action
	}{
		{"alarm recorded, witnesses back", State{Fence: alarmed, WitnessesBack: true, Proof: dark}, Hold},
		{"alarm recorded, witnesses silent again", State{Fence: alarmed, Proof: dark}, Hold},
		{"alarm recorded, tainted: withdraw", State{Fence: alarmed, Tainted: true, Proof: dark}, Withdraw},
		{"the leader's verdict is the alarm (not yet written)", State{Fence: off, Proof: Proven{Fence: "f1", Verdict: fencing.ProofWrongMachine}}, Hold},
		{"the kubelet spoke after the power-off, engine not ready-judged", State{Fence: off, Proof: Proven{Fence: "f1", Verdict: fencing.ProofDark, Spoke: "its kubelet renewed its heartbeat"}}, Hold},
		{"a witness spoke after the power-off, tainted: withdraw", State{Fence: off, Tainted: true, Proof: Proven{Fence: "f1", Spoke: "its agent reported"}}, Withdraw},
		{"witnesses silent, proof pending: hold", State{Fence: off, Proof: Proven{Fence: "f1"}}, Hold},
		{"witnesses silent, the proof is of an older record: hold", State{Fence: off, Proof: Proven{Fence: "f0", Verdict: fencing.ProofDark}}, Hold},
		{"witnesses silent, no proof from a new leader yet: hold", State{Fence: off}, Hold},
		{"proven dark: release", State{Fence: off, Proof: dark}, Apply},
		{"acknowledged by an operator: no proof needed", State{Fence: acked}, Apply},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, _, why := Decide(tc.s, now, time.Minute); got != tc.want {
				t.Errorf("DecideRelease = %v (%s), want %v", got, why, tc.want)
			}
		})
	}
}

// TestStateWitnesses: the witnesses are back when the engine's view is alive (fencing.Alive), since
// the later of its readiness change and its witnesses' return; a node the engine does not know
// counts as back once it has a record, so nothing is released on its silence alone.
func TestStateWitnesses(t *testing.T) {
	now := time.Date(2026, 11, 28, 3, 0, 0, 0, time.UTC)
	rec := &coordv1.NodeFence{Id: "f"}
	ready := &coordv1.Node{Readiness: coordv1.Readiness_READINESS_READY, ReadinessChangedAt: timestamppb.New(now.Add(-time.Hour)),
		HeardAgainAt: timestamppb.New(now.Add(-time.Minute))}
	silent := &coordv1.Node{Readiness: coordv1.Readiness_READINESS_READY, SilentSince: timestamppb.New(now.Add(-time.Minute))}
	for _, tc := range []struct {
		name  string
		fence *coordv1.NodeFence
		view  *coordv1.Node
		back  bool
		since time.Time
	}{
		{"ready, heard again after its readiness changed", rec, ready, true, now.Add(-time.Minute)},
		{"ready but both witnesses silent", rec, silent, false, time.Time{}},
		{"unknown to the engine, with a record", rec, nil, true, time.Time{}},
		{"unknown to the engine, no record", nil, nil, false, time.Time{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := State{Fence: tc.fence}
			s.Witnesses(tc.view)
			if s.WitnessesBack != tc.back || !s.BackSince.Equal(tc.since) {
				t.Errorf("back %v since %v, want %v since %v", s.WitnessesBack, s.BackSince, tc.back, tc.since)
			}
		})
	}
}
