package fencing

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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

// invokeKnown sends the operation and, while its outcome is unknown (the driver died while the
// power-off was at the BMC), reads the device's status back through the driver: a device already
// in the operation's state is the outcome (the read-back is the proof, and a driver restarted
// since would not know the operation and act a second time); otherwise it resends the SAME
// operation id — never a new operation, which would act a second time and wait out the retry
// backoff. It gives up, with the last error, after OpTimeout of unknown outcomes.
func (r *Runner) invokeKnown(ctx context.Context, rec *coordv1.NodeFence, op *coordv1.Operation) (driverv1.PowerState, error) {
	state, err := r.invoke(ctx, rec, op)
	if !outcomeUnknown(err) {
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
		case <-time.After(pause):
		}
		pause = min(2*pause, resendPauseMax)
		seen, rerr := r.readBack(ctx, rec, op)
		if rerr != nil {
			r.Log.Warn("driver call outcome unknown; status read-back failed, waiting for the driver", "fence", rec.Id,
				"operation_id", op.OperationId, "call_error", err, "read_back_error", rerr)
			continue // no resend without a read-back
		}
		if reached(op, seen) {
			r.Log.Warn("driver call outcome unknown; the status read-back shows the device as the operation leaves it: not resent", "fence", rec.Id,
				"operation_id", op.OperationId, "read_back", seen.String(), "call_error", err)
			return seen, nil
		}
		resends++
		r.Log.Warn("driver call outcome unknown; resending the same operation after a status read-back", "fence", rec.Id,
			"operation_id", op.OperationId, "read_back", seen.String(), "call_error", err)
		state, err = r.invoke(ctx, rec, op)
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

// readBack asks the operation's driver for the device's power state.
func (r *Runner) readBack(ctx context.Context, rec *coordv1.NodeFence, op *coordv1.Operation) (driverv1.PowerState, error) {
	cli, target, err := r.dispatch(rec, op)
	if err != nil {
		return driverv1.PowerState_POWER_STATE_UNKNOWN, err
	}
	cctx, cancel := context.WithTimeout(ctx, r.OpTimeout)
	defer cancel()
	resp, err := cli.Status(cctx, &driverv1.StatusRequest{Target: target})
	return resp.GetState(), err
}
