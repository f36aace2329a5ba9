package fencing

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

func TestProofVerdict(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	off := at(time.Minute) // confirmed off
	rec := &coordv1.NodeFence{Id: "n1-1", Node: "n1", Action: coordv1.FenceAction_FENCE_ACTION_OFF, ConfirmedOffAt: timestamppb.New(off)}
	cycled := &coordv1.NodeFence{Id: "n1-1", Node: "n1", Action: coordv1.FenceAction_FENCE_ACTION_OFF, ConfirmedOffAt: timestamppb.New(off),
		Operations: []*coordv1.Operation{{Step: coordv1.FenceStep_FENCE_STEP_POWER_MANAGEMENT, Action: "on", StartedAt: timestamppb.New(off.Add(3 * time.Second))}}}
	acked := &coordv1.NodeFence{Id: "n1-1", Node: "n1", Action: coordv1.FenceAction_FENCE_ACTION_OFF, ConfirmedOffAt: timestamppb.New(off), AcknowledgedBy: "alice"}
	rule := ProofRule{Grace: 5 * time.Second, Heartbeat: 500 * time.Millisecond}
	kube := func(w Witnessed) Witnessed { w.KubeletRenew = 10 * time.Second; return w }
	for _, tc := range []struct {
		name string
		rec  *coordv1.NodeFence
		w    Witnessed
		now  time.Time
		want Proof
	}{
		{"agent heard after the power-off", rec, Witnessed{Since: t0, Agent: off.Add(2 * time.Second)}, off.Add(3 * time.Second), ProofWrongMachine},
		{"agent heartbeat in flight", rec, Witnessed{Since: t0, Agent: off.Add(400 * time.Millisecond)}, off.Add(time.Second), ProofPending},
		{"agent silent for the grace period after the power-off", rec, Witnessed{Since: t0, Agent: off.Add(-time.Minute)}, off.Add(8 * time.Second), ProofDark},
		{"the kubelet's renewal after the power-off", rec, kube(Witnessed{Since: t0, Kubelet: off.Add(9 * time.Second)}), off.Add(9 * time.Second), ProofWrongMachine},
		{"the kubelet's renewal before dark was proven is the alarm", rec, kube(Witnessed{Since: t0, Kubelet: off.Add(time.Hour)}), off.Add(time.Hour), ProofWrongMachine},
		{"the kubelet resuming after a silence past its window is the node coming back", rec, kube(Witnessed{Since: t0, Kubelet: off.Add(time.Hour), KubeletBack: off.Add(time.Hour)}), off.Add(time.Hour), ProofPending},
		{"the agent from the same boot an hour later is the alarm", rec, Witnessed{Since: t0, Agent: off.Add(time.Hour)}, off.Add(time.Hour), ProofWrongMachine},
		{"the agent from a new boot is the machine that went off", rec, kube(Witnessed{Since: t0, Agent: off.Add(30 * time.Second), Kubelet: off.Add(29 * time.Second), KubeletBack: off.Add(29 * time.Second), NewBoot: off.Add(30 * time.Second)}), off.Add(31 * time.Second), ProofDark},
		{"the kubelet keeping its cadence across the power-off is the alarm", rec, kube(Witnessed{Since: t0, Agent: off.Add(30 * time.Second), Kubelet: off.Add(10 * time.Second), NewBoot: off.Add(30 * time.Second)}), off.Add(31 * time.Second), ProofWrongMachine},
		{"a renewal in flight", rec, kube(Witnessed{Since: t0, Kubelet: off.Add(1500 * time.Millisecond)}), off.Add(2 * time.Second), ProofPending},
		{"the kubelet renewed 3s before the power-off: wait two renewals", rec, kube(Witnessed{Since: t0, Kubelet: off.Add(-3 * time.Second)}), off.Add(18 * time.Second), ProofPending},
		{"two kubelet renewals without a word", rec, kube(Witnessed{Since: t0, Kubelet: off.Add(-3 * time.Second)}), off.Add(19 * time.Second), ProofDark},
		{"the agent reported 1s before the power-off: wait three heartbeats", rec, Witnessed{Since: t0, Agent: off.Add(-time.Second)}, off.Add(1400 * time.Millisecond), ProofPending},
		{"the agent silent for three heartbeats", rec, Witnessed{Since: t0, Agent: off.Add(-time.Second)}, off.Add(1600 * time.Millisecond), ProofDark},
		{"both witnesses silent long before the power-off: the slack alone", rec, kube(Witnessed{Since: t0}), off.Add(1900 * time.Millisecond), ProofPending},
		{"both witnesses silent long before the power-off: dark after the slack", rec, kube(Witnessed{Since: t0}), off.Add(2 * time.Second), ProofDark},
		{"a term begun just before the power-off counts its silence from its start", rec, kube(Witnessed{Since: off.Add(-time.Second)}), off.Add(20 * time.Second), ProofPending},
		{"a new leader observes a full window of its own", rec, Witnessed{Since: off.Add(30 * time.Second)}, off.Add(33 * time.Second), ProofPending},
		{"a new leader's agent reconnects", rec, Witnessed{Since: off.Add(30 * time.Second), Agent: off.Add(34 * time.Second)}, off.Add(34 * time.Second), ProofWrongMachine},
		{"a new leader after its window", rec, Witnessed{Since: off.Add(30 * time.Second)}, off.Add(36 * time.Second), ProofDark},
		{"blind: silence proves nothing", rec, Witnessed{Since: t0, Blind: true}, off.Add(time.Hour), ProofPending},
		{"a power cycle's node coming back", cycled, Witnessed{Since: t0, Agent: off.Add(4 * time.Second)}, off.Add(10 * time.Second), ProofDark},
		{"a power cycle's node heard before its power-on", cycled, Witnessed{Since: t0, Agent: off.Add(2 * time.Second)}, off.Add(10 * time.Second), ProofWrongMachine},
		{"an acknowledgement is not judged", acked, Witnessed{Since: t0, Agent: off.Add(time.Minute)}, off.Add(time.Hour), ProofPending},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, why := Verdict(tc.rec, tc.w, tc.now, rule); got != tc.want {
				t.Errorf("Verdict = %s (%s), want %s", got, why, tc.want)
			}
		})
	}
}

func TestProofWindow(t *testing.T) {
	r := ProofRule{Grace: 50 * time.Second, Heartbeat: time.Second}
	if got := r.Window(0); got != 50*time.Second {
		t.Errorf("standalone window %s, want the grace period 50s", got)
	}
	r.Grace = 5 * time.Second
	if got := r.Window(10 * time.Second); got != 22*time.Second {
		t.Errorf("window with a 10s kubelet renewal %s, want 22s (two renewals and the slack)", got)
	}
	r.Heartbeat = 5 * time.Second
	if got := r.Window(0); got != 16*time.Second {
		t.Errorf("window with 5s agent heartbeats %s, want 16s (three heartbeats and a second)", got)
	}
}

func TestHoldsAutoFence(t *testing.T) {
	now := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	off := timestamppb.New(now)
	for _, tc := range []struct {
		name string
		rec  *coordv1.NodeFence
		want bool
	}{
		{"none", nil, false},
		{"running, not confirmed", &coordv1.NodeFence{Action: coordv1.FenceAction_FENCE_ACTION_OFF}, false},
		{"confirmed off by a driver", &coordv1.NodeFence{Action: coordv1.FenceAction_FENCE_ACTION_OFF, ConfirmedOffAt: off}, true},
		{"the wrong-machine alarm", &coordv1.NodeFence{Action: coordv1.FenceAction_FENCE_ACTION_OFF, ConfirmedOffAt: off, WrongMachineAt: off}, true},
		{"acknowledged by an operator", &coordv1.NodeFence{Action: coordv1.FenceAction_FENCE_ACTION_OFF, ConfirmedOffAt: off, AcknowledgedBy: "alice"}, false},
		{"an unfence", &coordv1.NodeFence{Action: coordv1.FenceAction_FENCE_ACTION_ON}, false},
		{"a power cycle that powered the node on", &coordv1.NodeFence{Action: coordv1.FenceAction_FENCE_ACTION_OFF, ConfirmedOffAt: off,
			Operations: []*coordv1.Operation{{Step: coordv1.FenceStep_FENCE_STEP_POWER_MANAGEMENT, Action: "on", StartedAt: off}}}, false},
	} {
		if got := HoldsAutoFence(tc.rec); got != tc.want {
			t.Errorf("%s: HoldsAutoFence = %v, want %v", tc.name, got, tc.want)
		}
	}
}
