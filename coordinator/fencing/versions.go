package fencing

import (
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
)

// What every writer of a record version does to it, in one place: the runner and the leader's
// alarm write them, and the scenario scripts of coordinator/engine replay exactly these.

// Stamp makes next a version written under epoch at now: the epoch on the record and on every call
// not yet answered (the epoch the call is (re)sent with), the update time, and the finish time when
// the version finishes the record.
func Stamp(next *coordv1.NodeFence, epoch int64, now time.Time) {
	next.Epoch = epoch
	for _, op := range next.Operations {
		if op.Result == coordv1.OperationResult_OPERATION_RESULT_UNSPECIFIED {
			op.Epoch = epoch
		}
	}
	next.UpdatedAt = timestamppb.New(now)
	if next.FinishedAt != nil {
		next.FinishedAt = next.UpdatedAt
	}
}

// Answer records a driver's answer to the call opID (Record) sent under epoch: the call keeps the
// epoch it was sent with, this term's even for an operation a previous leader wrote.
func Answer(rec *coordv1.NodeFence, opID string, state driverv1.PowerState, callErr error, errText string, now time.Time, elapsed time.Duration, epoch int64) {
	Record(rec, opID, state, callErr, errText, now, elapsed)
	for _, op := range rec.Operations {
		if op.OperationId == opID {
			op.Epoch = epoch
		}
	}
}

// WrongMachine returns the version of f that raises the wrong-machine alarm (ProofWrongMachine):
// when at, and why in its evidence. It returns nil when f already carries the alarm (the first one
// stands). f is not modified.
func WrongMachine(f *coordv1.NodeFence, at time.Time, why string) *coordv1.NodeFence {
	if f.GetWrongMachineAt() != nil {
		return nil
	}
	next := proto.Clone(f).(*coordv1.NodeFence)
	next.WrongMachineAt = timestamppb.New(at)
	next.Evidence = append(next.Evidence, "wrong machine: "+why)
	return next
}
