package kube

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodefence/nodefence/coordinator/fencing"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

func TestDecideRemediation(t *testing.T) {
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	created := now.Add(-time.Minute)
	ts := func(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(now.Add(d)) }
	rec := func(id string, at time.Duration, mut func(*coordv1.NodeFence)) *coordv1.NodeFence {
		f := &coordv1.NodeFence{Id: id, Node: "n1", Action: coordv1.FenceAction_FENCE_ACTION_OFF, CreatedAt: ts(at), Status: coordv1.FenceStatus_FENCE_STATUS_RUNNING}
		if mut != nil {
			mut(f)
		}
		return f
	}
	confirmed := func(f *coordv1.NodeFence) {
		f.ConfirmedOffAt, f.Status = ts(-10*time.Second), coordv1.FenceStatus_FENCE_STATUS_DONE
	}
	silent := &coordv1.Node{Name: "n1", Readiness: coordv1.Readiness_READINESS_UNKNOWN, Reason: "no agent contact"}
	alive := &coordv1.Node{Name: "n1", Readiness: coordv1.Readiness_READINESS_READY}
	agentDown := &coordv1.Node{Name: "n1", Readiness: coordv1.Readiness_READINESS_READY, AgentDown: true}
	base := RemediationState{Node: "n1", Created: created, Fenceable: true}
	with := func(mut func(*RemediationState)) RemediationState { s := base; mut(&s); return s }
	F, T, U := metav1.ConditionFalse, metav1.ConditionTrue, metav1.ConditionUnknown
	for _, tc := range []struct {
		name          string
		s             RemediationState
		proc, ok      metav1.ConditionStatus
		reason, fence string
		request       bool
	}{
		{"the checker timed it out", with(func(s *RemediationState) { s.TimedOut, s.View = true, silent }), F, F, ReasonTimedOut, "", false},
		{"a Machine without a node", with(func(s *RemediationState) { s.Node = "" }), U, U, ReasonMachineNotMapped, "", false},
		{"not in the fence configuration", with(func(s *RemediationState) { s.Fenceable = false }), F, F, ReasonNodeUnknown, "", false},
		{"witnesses report: escalate", with(func(s *RemediationState) { s.View = alive }), F, F, ReasonWitnessesReport, "", false},
		{"one witness reports: escalate", with(func(s *RemediationState) { s.View = agentDown }), F, F, ReasonWitnessesReport, "", false},
		{"witnesses report, the spec allows it: fence", with(func(s *RemediationState) { s.View, s.AllowLiveWitnesses = alive, true }), T, U, ReasonFencing, "", true},
		{"silent: nodefence's own decision", with(func(s *RemediationState) { s.View = silent }), T, U, ReasonWaiting, "", false},
		{"a record running", with(func(s *RemediationState) { s.View, s.Fence, s.Running = silent, rec("r1", -time.Hour, nil), true }), T, U, ReasonFencing, "r1", false},
		{"confirmed, proof pending", with(func(s *RemediationState) { s.View, s.Fence = silent, rec("r1", -30*time.Second, confirmed) }), T, U, ReasonFencing, "r1", false},
		{"confirmed and proven dark", with(func(s *RemediationState) {
			s.View, s.Fence, s.Proof = silent, rec("r1", -30*time.Second, confirmed), Proven{Fence: "r1", Verdict: fencing.ProofDark}
		}), F, T, ReasonFenced, "r1", false},
		{"the proof of another record does not count", with(func(s *RemediationState) {
			s.View, s.Fence, s.Proof = silent, rec("r1", -30*time.Second, confirmed), Proven{Fence: "r0", Verdict: fencing.ProofDark}
		}), T, U, ReasonFencing, "r1", false},
		{"fenced long before the checker noticed", with(func(s *RemediationState) {
			s.View, s.Fence, s.Proof = silent, rec("r1", -time.Hour, confirmed), Proven{Fence: "r1", Verdict: fencing.ProofDark}
		}), F, T, ReasonFenced, "r1", false},
		{"acknowledged by an operator", with(func(s *RemediationState) {
			s.View, s.Fence = silent, rec("r1", -30*time.Second, func(f *coordv1.NodeFence) { confirmed(f); f.AcknowledgedBy = "operator/alice" })
		}), F, T, ReasonFenced, "r1", false},
		{"the wrong machine", with(func(s *RemediationState) {
			s.View, s.Fence = alive, rec("r1", -30*time.Second, func(f *coordv1.NodeFence) { confirmed(f); f.WrongMachineAt = ts(-5 * time.Second) })
		}), F, F, ReasonWrongMachine, "r1", false},
		{"the fence failed", with(func(s *RemediationState) {
			s.View, s.Fence = silent, rec("r1", -30*time.Second, func(f *coordv1.NodeFence) {
				f.Status, f.Error = coordv1.FenceStatus_FENCE_STATUS_ERROR, "bmc unreachable"
			})
		}), F, F, ReasonFenceFailed, "r1", false},
		{"an old unfence does not count", with(func(s *RemediationState) {
			s.View, s.Fence = alive, rec("r0", -time.Hour, func(f *coordv1.NodeFence) {
				f.Action, f.Status = coordv1.FenceAction_FENCE_ACTION_ON, coordv1.FenceStatus_FENCE_STATUS_DONE
			})
		}), F, F, ReasonWitnessesReport, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := DecideRemediation(tc.s)
			if v.Processing != tc.proc || v.Succeeded != tc.ok || v.Reason != tc.reason || v.Fence != tc.fence || v.Request != tc.request {
				t.Errorf("DecideRemediation = Processing %s, Succeeded %s, %s, fence %q, request %v (%s); want %s, %s, %s, fence %q, request %v",
					v.Processing, v.Succeeded, v.Reason, v.Fence, v.Request, v.Message, tc.proc, tc.ok, tc.reason, tc.fence, tc.request)
			}
		})
	}
}
