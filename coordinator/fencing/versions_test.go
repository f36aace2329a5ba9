package fencing

import (
	"errors"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
)

// TestStamp: a version carries its writer's epoch, on the record and on every call not yet
// answered (an answered call keeps the epoch it was sent with); it is updated now, and a version
// that finishes the record finishes it now.
func TestStamp(t *testing.T) {
	now := time.Date(2026, 11, 28, 3, 0, 0, 0, time.UTC)
	rec := &coordv1.NodeFence{Id: "f", Epoch: 1, FinishedAt: timestamppb.New(now.Add(-time.Hour)), Operations: []*coordv1.Operation{
		{OperationId: "answered", Epoch: 1, Result: coordv1.OperationResult_OPERATION_RESULT_CONFIRMED},
		{OperationId: "pending", Epoch: 1},
	}}
	Stamp(rec, 7, now)
	if rec.Epoch != 7 || rec.Operations[0].Epoch != 1 || rec.Operations[1].Epoch != 7 {
		t.Errorf("epochs = record %d, answered %d, pending %d; want 7, 1, 7", rec.Epoch, rec.Operations[0].Epoch, rec.Operations[1].Epoch)
	}
	if !rec.UpdatedAt.AsTime().Equal(now) || !rec.FinishedAt.AsTime().Equal(now) {
		t.Errorf("updated %v finished %v, want both %v", rec.UpdatedAt.AsTime(), rec.FinishedAt.AsTime(), now)
	}
	open := &coordv1.NodeFence{Id: "g"}
	if Stamp(open, 7, now); open.FinishedAt != nil {
		t.Error("Stamp finished an unfinished record")
	}
}

// TestAnswer: the answered call carries the epoch it was sent with (this term's), and the answer is
// Record's: a read-back of the requested state confirms the power-off.
func TestAnswer(t *testing.T) {
	now := time.Date(2026, 11, 28, 3, 0, 0, 0, time.UTC)
	rec := &coordv1.NodeFence{Id: "f", Action: coordv1.FenceAction_FENCE_ACTION_OFF, Operations: []*coordv1.Operation{
		{OperationId: "op", Action: "off", Epoch: 3},
	}}
	Answer(rec, "op", driverv1.PowerState_POWER_STATE_OFF, nil, "", now, time.Second, 5)
	op := rec.Operations[0]
	if op.Epoch != 5 || op.Result != coordv1.OperationResult_OPERATION_RESULT_CONFIRMED || rec.ConfirmedOffAt == nil {
		t.Errorf("answered op epoch %d result %s confirmed %v; want 5, confirmed, set", op.Epoch, op.Result, rec.ConfirmedOffAt)
	}
	failed := &coordv1.NodeFence{Id: "f", Action: coordv1.FenceAction_FENCE_ACTION_OFF, Operations: []*coordv1.Operation{{OperationId: "op", Action: "off", Epoch: 3}}}
	Answer(failed, "op", driverv1.PowerState_POWER_STATE_UNKNOWN, errors.New("timeout"), "timeout", now, time.Second, 5)
	if failed.Operations[0].Epoch != 5 || failed.ConfirmedOffAt != nil {
		t.Errorf("failed call: epoch %d confirmed %v; want 5, unset", failed.Operations[0].Epoch, failed.ConfirmedOffAt)
	}
}

// TestWrongMachine: the alarm's version says when and why, the first alarm stands, and the record
// given is not modified.
func TestWrongMachine(t *testing.T) {
	at := time.Date(2026, 11, 28, 3, 0, 0, 0, time.UTC)
	rec := &coordv1.NodeFence{Id: "f", ConfirmedOffAt: timestamppb.New(at.Add(-time.Minute)), Evidence: []string{"e"}}
	next := WrongMachine(rec, at, "its agent reported")
	if next == nil || !next.WrongMachineAt.AsTime().Equal(at) {
		t.Fatalf("WrongMachine = %v, want the alarm at %v", next, at)
	}
	if got := next.Evidence[len(next.Evidence)-1]; got != "wrong machine: its agent reported" {
		t.Errorf("evidence %q", got)
	}
	if rec.WrongMachineAt != nil || len(rec.Evidence) != 1 {
		t.Error("WrongMachine modified the record it was given")
	}
	if again := WrongMachine(next, at.Add(time.Minute), "later"); again != nil {
		t.Errorf("a second alarm was written: %v", again)
	}
}
