package fencing

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nodefence/nodefence/coordinator/fenceconfig"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// The witness re-check: only an automatic fence's calls that fence are re-checked, against a
// contact after the request or within the grace period.
func TestReaching(t *testing.T) {
	created := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	auto := &coordv1.NodeFence{Node: "n1", Automatic: true, CreatedAt: timestamppb.New(created)}
	operator := &coordv1.NodeFence{Node: "n1", CreatedAt: timestamppb.New(created)}
	grace := 12 * time.Second
	for _, tc := range []struct {
		name   string
		rec    *coordv1.NodeFence
		action string
		at     time.Time // the contact; zero: none
		now    time.Time
		abort  bool
	}{
		{"no contact in this term", auto, "off", time.Time{}, created.Add(time.Minute), false},
		{"silent since long before the request", auto, "off", created.Add(-time.Minute), created.Add(time.Second), false},
		{"contact after the request", auto, "off", created.Add(time.Second), created.Add(time.Minute), true},
		{"contact within the grace period", auto, "off", created.Add(-5 * time.Second), created.Add(time.Second), true},
		{"contact exactly one grace ago", auto, "off", created.Add(-grace), created, true},
		{"power-on of recovery", auto, "on", created.Add(time.Second), created.Add(2 * time.Second), false},
		{"operator's fence", operator, "off", created.Add(time.Second), created.Add(2 * time.Second), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			why := Reaching(tc.rec, tc.action, Contact{Witness: "agent", At: tc.at, Grace: grace}, tc.now)
			if (why != "") != tc.abort {
				t.Fatalf("Reaching = %q, want abort %v", why, tc.abort)
			}
		})
	}
}

// Decide aborts an automatic fence instead of re-sending its written call when the node reached us,
// and marks the call as not sent.
func TestDecideAbortsResendWhenReaching(t *testing.T) {
	created := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	rec := &coordv1.NodeFence{Id: "n1-x", Node: "n1", Automatic: true, Action: coordv1.FenceAction_FENCE_ACTION_OFF,
		Step: coordv1.FenceStep_FENCE_STEP_POWER_MANAGEMENT, Status: coordv1.FenceStatus_FENCE_STATUS_RUNNING, CreatedAt: timestamppb.New(created),
		Operations: []*coordv1.Operation{{OperationId: "n1-x/0/power_management/bmc/off", Method: "bmc", Action: "off", Step: coordv1.FenceStep_FENCE_STEP_POWER_MANAGEMENT}}}
	plan := func(string) ([]fenceconfig.Resolved, error) {
		return []fenceconfig.Resolved{{Name: "bmc", Action: "off"}}, nil
	}
	now := created.Add(10 * time.Second)
	d := Decide(rec, Facts{Now: now, Plan: plan, Policy: DefaultPolicy()})
	if d.Resend == nil {
		t.Fatalf("without a contact the call is sent: %+v", d)
	}
	d = Decide(rec, Facts{Now: now, Plan: plan, Policy: DefaultPolicy(), Contact: Contact{Witness: "agent", At: created.Add(9 * time.Second), Grace: 12 * time.Second}})
	if d.Resend != nil || d.Next == nil || !AbortedReaching(d.Next) || d.Next.Status != coordv1.FenceStatus_FENCE_STATUS_ERROR {
		t.Fatalf("a contact after the request must abort: %+v", d)
	}
	if op := d.Next.Operations[0]; op.Result != coordv1.OperationResult_OPERATION_RESULT_FAILED || op.FinishedAt == nil {
		t.Fatalf("the call not sent is not marked: %v", op)
	}
}
