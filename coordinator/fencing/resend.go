package fencing

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nodefence/nodefence/services/fault"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
)

// outcomeUnknown reports a driver call error after which the device may or may not have acted:
// the driver could not be reached, died mid-call or did not answer in time. A live driver's own
// answers (a stale epoch, a bad target, a device failure it saw) are known outcomes.
func outcomeUnknown(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Unknown, codes.Aborted:
		return true
	}
	return false
}

// resendPause is the first pause before a read-back after an unknown outcome; it doubles up to
// resendPauseMax.
const (
	resendPause    = 200 * time.Millisecond
	resendPauseMax = 2 * time.Second
)

// invokeKnown sends the operation to its driver's first endpoint and, while its outcome is unknown
// (the driver host is down or died while the power-off was at the BMC, the call timed out), reads
// the device's status back through the driver's endpoints in order: a device already in the
// operation's state is the outcome (the read-back is the proof); otherwise it resends the SAME
// operation id to the endpoint that answered the read-back — never a new operation, which would
// act a second time and wait out the retry backoff. It gives up, with the last error, after
// OpTimeout of unknown outcomes.
//
// Why a resend to another driver host does not act twice. Each driver host keeps its own
// operation table (fence-drivers/kit, operations.jsonl) and its own epoch table (epochs.json);
// neither is shared between hosts. So:
//
//  1. A host never acts twice on one operation id: a resend it has seen joins the operation under
//     way or gets its first answer, even after a restart (successful operations are persisted
//     before they are answered).
//  2. A resend goes to another host only when the first gave no answer, and only after a status
//     read-back that another host answered. A first host that was down never received the
//     operation: the second is the only one to act. A first host that died mid-operation may have
//     switched the device already: the read-back then shows the device in the operation's state,
//     that is the outcome, and nothing is resent.
//  3. Where it can act twice: (a) the first host's command is still in flight at the BMC (sent,
//     not yet applied) when the read-back runs: the read-back shows the old state, the second host
//     sends the same command, and the BMC gets two; (b) a leader failed over to the second host
//     and died before recording the answer: the next leader resumes the operation at the first
//     host again, which has no entry for it. Both times it is the same action of the same
//     operation (off twice, or on twice), so the device ends in the state the operation asked
//     for; no opposite command is ever sent for it. The first host's command cannot outlive its
//     deadline (the operation's timeout): the kit stops acting on it then.
//  4. The epoch guards each host separately: a host refuses an epoch lower than the highest it has
//     seen for the device. A deposed leader's new operations never reach any host, because each
//     is written to etcd under the leader's key before it is sent (write-before-call); what it
//     could still send until its term's context ends is a resend of an operation already written.
//     A host the new leader has not called yet does not know the new epoch. Every coordinator
//     tries the endpoints in the same order, so both leaders reach the same first host whenever
//     it is up; the window is the one a single driver host has while the new leader has not yet
//     called it.
//
// An endpoint's answer that the device never answered before anything was sent to it (fault.NotSent,
// a structured detail: a dark BMC) is a known outcome: the operation did not happen. The next
// endpoint is then tried once (its path to the device may differ) and, when every endpoint says so,
// the operation fails at once as unreachable instead of reading a dark device back for OpTimeout.
func (r *Runner) invokeKnown(ctx context.Context, rec *coordv1.NodeFence, op *coordv1.Operation) (driverv1.PowerState, error) {
	state, err := r.invokeFirst(ctx, rec, op)
	if !outcomeUnknown(err) || fault.NotSent(err) {
		return state, err
	}
	deadline := r.now().Add(r.OpTimeout)
	pause := resendPause
	for resends := 0; outcomeUnknown(err) && ctx.Err() == nil; {
		if !r.now().Before(deadline) {
			return state, fmt.Errorf("outcome unknown after %d resends of %s: %w", resends, op.OperationId, err)
		}
		select {
		case <-ctx.Done():
			return state, err
		case <-r.after(pause):
		}
		pause = min(2*pause, resendPauseMax)
		seen, at, rerr := r.readBack(ctx, rec, op)
		if rerr != nil {
			r.Log.Warn("driver call outcome unknown; status read-back failed at every endpoint, waiting for the driver", "fence", rec.Id,
				"operation_id", op.OperationId, "call_error", err, "read_back_error", rerr)
			continue // no resend without a read-back
		}
		if reached(op, seen) {
			r.Log.Warn("driver call outcome unknown; the status read-back shows the device as the operation leaves it: not resent", "fence", rec.Id,
				"operation_id", op.OperationId, "read_back", seen.String(), "endpoint", at, "call_error", err)
			return seen, nil
		}
		resends++
		r.Log.Warn("driver call outcome unknown; resending the same operation after a status read-back", "fence", rec.Id,
			"operation_id", op.OperationId, "read_back", seen.String(), "endpoint", at, "call_error", err)
		state, err = r.invoke(ctx, rec, op, at)
	}
	return state, err
}

// invokeFirst sends the operation to the driver's first endpoint and, while an endpoint answers that
// nothing was sent to the device (fault.NotSent), to the next one, each once.
func (r *Runner) invokeFirst(ctx context.Context, rec *coordv1.NodeFence, op *coordv1.Operation) (driverv1.PowerState, error) {
	state, err := r.invoke(ctx, rec, op, 0)
	if !fault.NotSent(err) {
		return state, err
	}
	m, _, derr := r.dispatch(rec, op)
	if derr != nil {
		return state, err
	}
	for at := 1; at < len(m.Endpoints) && fault.NotSent(err) && ctx.Err() == nil; at++ {
		state, err = r.invoke(ctx, rec, op, at)
	}
	return state, err
}

// reached reports whether a read-back state is the one the operation leaves the device in.
func reached(op *coordv1.Operation, seen driverv1.PowerState) bool {
	switch op.GetAction() {
	case "off":
		return seen == driverv1.PowerState_POWER_STATE_OFF
	case "on":
		return seen == driverv1.PowerState_POWER_STATE_ON
	}
	return false
}

// readBack asks the operation's driver for the device's power state, through its endpoints in
// order, and returns the first answer with the index of the endpoint that gave it.
func (r *Runner) readBack(ctx context.Context, rec *coordv1.NodeFence, op *coordv1.Operation) (driverv1.PowerState, int, error) {
	m, target, err := r.dispatch(rec, op)
	if err != nil {
		return driverv1.PowerState_POWER_STATE_UNKNOWN, 0, err
	}
	var errs []error
	for i, endpoint := range m.Endpoints {
		cli, err := r.Drivers.Client(endpoint, m.Identity)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, r.OpTimeout)
		resp, err := cli.Status(cctx, &driverv1.StatusRequest{Target: target})
		cancel()
		if err == nil {
			return resp.GetState(), i, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", endpoint, err))
		if ctx.Err() != nil {
			break
		}
	}
	return driverv1.PowerState_POWER_STATE_UNKNOWN, 0, errors.Join(errs...)
}
