package fencing

import (
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nodefence/nodefence/coordinator/fenceconfig"
	"github.com/nodefence/nodefence/services/fault"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
)

// Policy tunes the fencing flow.
type Policy struct {
	// Retries is how many times a record in ERROR is retried before it is escalated (final).
	Retries int
	// Backoff is the first retry's delay; each further retry doubles it.
	Backoff time.Duration
	// IsolationWait is how long after a done isolation the node may come back (-> recovery) before
	// power management starts (the seed's 5 minutes).
	IsolationWait time.Duration
	// Polls and PollInterval: after a power cycle, how many readiness polls, how far apart, before
	// the record is an error (the seed's "N pollings").
	Polls        int
	PollInterval time.Duration
	// PowerWait is how long a reboot waits between its confirmed power-off and its power-on, so that
	// the machine really loses power (fence-agents' power_wait; fence_ipmilan waits 2 s).
	PowerWait time.Duration
}

// DefaultPolicy is the seed's flow with conservative retries.
func DefaultPolicy() Policy {
	return Policy{Retries: 3, Backoff: 10 * time.Second, IsolationWait: 5 * time.Minute, Polls: 30, PollInterval: 10 * time.Second,
		PowerWait: 2 * time.Second}
}

// Facts are what the machine may know besides the record.
type Facts struct {
	Now time.Time
	// Plan returns the node's methods for a step.
	Plan func(step string) ([]fenceconfig.Resolved, error)
	// NodeReady is the coordinator's current judgement of the node.
	NodeReady bool
	// KdumpUntil: a kernel dump is in progress; power management waits until then.
	KdumpUntil time.Time
	// Contact is the node's latest witness contact: an automatic fence is re-checked against it
	// before each driver call (Reaching).
	Contact Contact
	Policy  Policy
	// WatchdogFallback: the node opted in (fenceconfig.Node.WatchdogFallback) and its agent last
	// reported an armed watchdog: a power-off whose power methods all failed as unreachable falls
	// back to the watchdog method.
	WatchdogFallback bool
}

// Decision is what to do next with a record: write Next, send Resend, or wait. A driver call is
// decided in two steps, so that it is durable before it is sent: first Next appends the operation
// (written with compare-and-swap), then, reading the record back, Resend names it while it has no
// result — which is also how a new leader re-sends a call its predecessor wrote.
type Decision struct {
	// Next is the record's next version, to write with compare-and-swap.
	Next *coordv1.NodeFence
	// Resend is an operation written but not answered: send it (again, with the same id).
	Resend *coordv1.Operation
	// Wait is how long until something can change without new facts.
	Wait time.Duration
}

func stepName(s coordv1.FenceStep) string {
	switch s {
	case coordv1.FenceStep_FENCE_STEP_ISOLATION:
		return fenceconfig.StepIsolation
	case coordv1.FenceStep_FENCE_STEP_POWER_MANAGEMENT:
		return fenceconfig.StepPowerManagement
	}
	return fenceconfig.StepRecovery
}

// FirstStep is where a power-off record starts: isolation when the node has isolation methods.
func FirstStep(plan func(string) ([]fenceconfig.Resolved, error)) coordv1.FenceStep {
	if ms, err := plan(fenceconfig.StepIsolation); err == nil && len(ms) > 0 {
		return coordv1.FenceStep_FENCE_STEP_ISOLATION
	}
	return coordv1.FenceStep_FENCE_STEP_POWER_MANAGEMENT
}

// Methods returns the methods a record runs in its current step. A power-on record (unfence) runs
// the recovery methods, then powers the node on with the power-management methods that have an "on"
// action — or, if none has, with every power-management method turned to "on".
//
// A reboot record runs the power-management methods that are not "on" (the power-off), then the
// same "on" methods a power-on runs.
func Methods(rec *coordv1.NodeFence, plan func(string) ([]fenceconfig.Resolved, error)) ([]fenceconfig.Resolved, error) {
	if rec.Method != "" {
		return watchdogOnly(rec)
	}
	switch rec.Action {
	case coordv1.FenceAction_FENCE_ACTION_ON:
		rec0, err := plan(fenceconfig.StepRecovery)
		if err != nil {
			return nil, err
		}
		on, _, err := powerMethods(plan)
		return append(rec0, on...), err
	case coordv1.FenceAction_FENCE_ACTION_REBOOT:
		on, off, err := powerMethods(plan)
		return append(off, on...), err
	}
	return plan(stepName(rec.Step))
}

// powerMethods splits the power-management methods: on are those with an "on" action — or, if none
// has, every one turned to "on"; off are the others.
func powerMethods(plan func(string) ([]fenceconfig.Resolved, error)) (on, off []fenceconfig.Resolved, err error) {
	pm, err := plan(fenceconfig.StepPowerManagement)
	if err != nil {
		return nil, nil, err
	}
	for _, m := range pm {
		if m.Action == "on" {
			on = append(on, m)
		} else {
			off = append(off, m)
		}
	}
	if len(on) == 0 {
		for _, m := range pm {
			if m.Driver == fenceconfig.WatchdogDriver {
				continue // a watchdog powers nothing on
			}
			m.Action = "on"
			on = append(on, m)
		}
	}
	return on, off, nil
}

// offSettled is how much longer a reboot waits before its power-on: PowerWait after its last
// power-off finished.
func offSettled(ops []*coordv1.Operation, wait time.Duration, now time.Time) time.Duration {
	var last time.Time
	for _, op := range ops {
		if op.Action != "on" && op.FinishedAt != nil && op.FinishedAt.AsTime().After(last) {
			last = op.FinishedAt.AsTime()
		}
	}
	if last.IsZero() {
		return 0
	}
	return last.Add(wait).Sub(now)
}

// rebootOffFailed says why a reboot must not power its node on, once its power-off methods ran: a
// required one failed, or none was confirmed. "" lets the power-on go ahead.
func rebootOffFailed(ops []*coordv1.Operation) string {
	confirmed := 0
	for _, op := range ops {
		switch {
		case op.Result == coordv1.OperationResult_OPERATION_RESULT_CONFIRMED:
			confirmed++
		case op.Required:
			return fmt.Sprintf("reboot: required method %s off failed: %s; the node is not powered on", op.Method, op.Error)
		}
	}
	if confirmed == 0 {
		return "reboot: no power-off was confirmed; the node is not powered on"
	}
	return ""
}

func finish(r *coordv1.NodeFence, now time.Time, status coordv1.FenceStatus, errText string) {
	r.Status, r.Error = status, errText
	r.FinishedAt = timestamppb.New(now)
}

// Decide computes the next step for a record. It is pure: the runner does the I/O.
func Decide(rec *coordv1.NodeFence, f Facts) Decision {
	if rec.FinishedAt != nil {
		return Decision{}
	}
	next := proto.Clone(rec).(*coordv1.NodeFence)
	now := f.Now
	switch rec.Status {
	case coordv1.FenceStatus_FENCE_STATUS_NEW:
		if at := rec.GetNextAttemptAt(); at != nil && now.Before(at.AsTime()) {
			return Decision{Wait: at.AsTime().Sub(now)}
		}
		next.Status = coordv1.FenceStatus_FENCE_STATUS_RUNNING
		return Decision{Next: next}

	case coordv1.FenceStatus_FENCE_STATUS_RUNNING:
		return decideRunning(rec, next, f)

	case coordv1.FenceStatus_FENCE_STATUS_DONE:
		return decideDone(rec, next, f)

	case coordv1.FenceStatus_FENCE_STATUS_ERROR:
		if int(rec.Retries) >= f.Policy.Retries {
			next.Evidence = append(next.Evidence, fmt.Sprintf("escalated after %d attempts: %s", rec.Retries+1, rec.Error))
			finish(next, now, coordv1.FenceStatus_FENCE_STATUS_ERROR, rec.Error)
			return Decision{Next: next}
		}
		backoff := f.Policy.Backoff << rec.Retries
		next.Retries++
		next.Status = coordv1.FenceStatus_FENCE_STATUS_NEW
		next.NextAttemptAt = timestamppb.New(now.Add(backoff))
		next.Evidence = append(next.Evidence, fmt.Sprintf("attempt %d failed (%s); retry in %s", rec.Retries+1, rec.Error, backoff))
		return Decision{Next: next}
	}
	return Decision{}
}

// decideRunning is Decide for a running record: the next operation of its step, or the step's result
// once every method was tried.
func decideRunning(rec, next *coordv1.NodeFence, f Facts) Decision {
	now := f.Now
	ops := stepOps(rec)
	if n := len(ops); n > 0 && ops[n-1].Result == coordv1.OperationResult_OPERATION_RESULT_UNSPECIFIED {
		if why := Reaching(rec, ops[n-1].Action, f.Contact, now); why != "" {
			return abortReaching(next, ops[n-1].OperationId, why, now)
		}
		return Decision{Resend: ops[n-1]}
	}
	methods, err := Methods(rec, f.Plan)
	if err != nil || len(methods) == 0 {
		if err == nil {
			err = fmt.Errorf("node %s has no %s methods", rec.Node, stepName(rec.Step))
		}
		next.Status, next.Error = coordv1.FenceStatus_FENCE_STATUS_ERROR, err.Error()
		return Decision{Next: next}
	}
	if len(ops) < len(methods) {
		if why := Reaching(rec, methods[len(ops)].Action, f.Contact, now); why != "" {
			return abortReaching(next, "", why, now)
		}
	}
	if rec.Step == coordv1.FenceStep_FENCE_STEP_POWER_MANAGEMENT && len(ops) == 0 && now.Before(f.KdumpUntil) {
		return Decision{Wait: f.KdumpUntil.Sub(now)}
	}
	// A reboot powers its node on only after its power-off was confirmed.
	if rec.Action == coordv1.FenceAction_FENCE_ACTION_REBOOT && len(ops) < len(methods) && methods[len(ops)].Action == "on" &&
		(len(ops) == 0 || ops[len(ops)-1].Action != "on") {
		if why := rebootOffFailed(ops); why != "" {
			next.Status, next.Error = coordv1.FenceStatus_FENCE_STATUS_ERROR, why
			return Decision{Next: next}
		}
		if wait := offSettled(ops, f.Policy.PowerWait, now); wait > 0 {
			return Decision{Wait: wait}
		}
	}
	if len(ops) < len(methods) {
		next.Operations = append(next.Operations, newOp(rec, methods[len(ops)], now))
		return Decision{Next: next}
	}
	// Every method of the step was tried. All unreachable (a dark BMC), a node that opted in falls
	// back to its watchdog, required methods or not; else the step succeeds when every required
	// method and at least one method was confirmed.
	if op := fallback(rec, ops, f); op != nil {
		next.Operations = append(next.Operations, op)
		next.Evidence = append(next.Evidence, "every power_management method failed as unreachable and the node's agent reported an armed watchdog: falling back to the watchdog method (watchdog_fallback)")
		return Decision{Next: next}
	}
	// A confirmed fallback stands in for the methods that did not answer, required ones too.
	fellBack := len(ops) > len(methods) && IsWatchdog(ops[len(ops)-1]) && ops[len(ops)-1].Result == coordv1.OperationResult_OPERATION_RESULT_CONFIRMED
	var confirmed, confirmedOn int
	var failed []string
	for _, op := range ops {
		if op.Result == coordv1.OperationResult_OPERATION_RESULT_CONFIRMED {
			confirmed++
			if op.Action == "on" {
				confirmedOn++
			}
		} else {
			failed = append(failed, fmt.Sprintf("%s %s: %s", op.Method, op.Action, op.Error))
			if op.Required && !fellBack {
				next.Status = coordv1.FenceStatus_FENCE_STATUS_ERROR
				next.Error = fmt.Sprintf("%s: required method %s failed: %s", stepName(rec.Step), op.Method, op.Error)
				return Decision{Next: next}
			}
		}
	}
	if confirmed == 0 {
		next.Status = coordv1.FenceStatus_FENCE_STATUS_ERROR
		next.Error = fmt.Sprintf("%s: every method failed: %s", stepName(rec.Step), strings.Join(failed, "; "))
		return Decision{Next: next}
	}
	if rec.Action == coordv1.FenceAction_FENCE_ACTION_REBOOT && confirmedOn == 0 {
		next.Status = coordv1.FenceStatus_FENCE_STATUS_ERROR
		next.Error = fmt.Sprintf("reboot: the node was powered off but no power-on was confirmed: %s", strings.Join(failed, "; "))
		return Decision{Next: next}
	}
	next.Status, next.Error, next.Polls = coordv1.FenceStatus_FENCE_STATUS_DONE, "", 0
	return Decision{Next: next}
}

// newOp is the operation of method m in the record's current step and attempt.
func newOp(rec *coordv1.NodeFence, m fenceconfig.Resolved, now time.Time) *coordv1.Operation {
	return &coordv1.Operation{
		OperationId: fmt.Sprintf("%s/%d/%s/%s/%s", rec.Id, rec.Retries, stepName(rec.Step), m.Name, m.Action),
		Method:      m.Name, Driver: m.Driver, Action: m.Action, Step: rec.Step, Attempt: rec.Retries,
		Required: m.Required, StartedAt: timestamppb.New(now),
	}
}

// decideDone is Decide for a record whose step is done: the next step, a wait, or the end.
func decideDone(rec, next *coordv1.NodeFence, f Facts) Decision {
	now := f.Now
	if rec.Action == coordv1.FenceAction_FENCE_ACTION_ON || rec.Action == coordv1.FenceAction_FENCE_ACTION_REBOOT {
		finish(next, now, coordv1.FenceStatus_FENCE_STATUS_DONE, "")
		return Decision{Next: next}
	}
	switch rec.Step {
	case coordv1.FenceStep_FENCE_STEP_ISOLATION:
		if f.NodeReady {
			return toStep(next, coordv1.FenceStep_FENCE_STEP_RECOVERY, f, "node ready again after isolation")
		}
		if ms, _ := f.Plan(fenceconfig.StepPowerManagement); len(ms) == 0 {
			finish(next, now, coordv1.FenceStatus_FENCE_STATUS_DONE, "")
			return Decision{Next: next}
		}
		waitEnd := rec.GetUpdatedAt().AsTime().Add(f.Policy.IsolationWait)
		if now.Before(waitEnd) {
			return Decision{Wait: waitEnd.Sub(now)}
		}
		return toStep(next, coordv1.FenceStep_FENCE_STEP_POWER_MANAGEMENT, f, "node still not ready after isolation")
	case coordv1.FenceStep_FENCE_STEP_POWER_MANAGEMENT:
		if !lastConfirmedIsOn(rec) {
			// The node was left off: fenced until an operator unfences it.
			finish(next, now, coordv1.FenceStatus_FENCE_STATUS_DONE, "")
			return Decision{Next: next}
		}
		if f.NodeReady {
			return toStep(next, coordv1.FenceStep_FENCE_STEP_RECOVERY, f, "node ready after power cycle")
		}
		if int(rec.Polls) >= f.Policy.Polls {
			next.Status = coordv1.FenceStatus_FENCE_STATUS_ERROR
			next.Error = fmt.Sprintf("power_management done but the node is not ready after %d polls", rec.Polls)
			return Decision{Next: next}
		}
		due := rec.GetUpdatedAt().AsTime().Add(f.Policy.PollInterval)
		if now.Before(due) {
			return Decision{Wait: due.Sub(now)}
		}
		next.Polls++
		return Decision{Next: next}
	default:
		finish(next, now, coordv1.FenceStatus_FENCE_STATUS_DONE, "")
		return Decision{Next: next}
	}
}

func toStep(next *coordv1.NodeFence, step coordv1.FenceStep, f Facts, why string) Decision {
	if step == coordv1.FenceStep_FENCE_STEP_RECOVERY {
		if ms, _ := f.Plan(fenceconfig.StepRecovery); len(ms) == 0 {
			next.Evidence = append(next.Evidence, why+"; no recovery methods")
			finish(next, f.Now, coordv1.FenceStatus_FENCE_STATUS_DONE, "")
			return Decision{Next: next}
		}
	}
	next.Step, next.Status, next.Polls = step, coordv1.FenceStatus_FENCE_STATUS_NEW, 0
	next.Evidence = append(next.Evidence, why)
	return Decision{Next: next}
}

// stepOps are the operations of the record's current step and attempt.
func stepOps(rec *coordv1.NodeFence) []*coordv1.Operation {
	var out []*coordv1.Operation
	for _, op := range rec.Operations {
		if op.Step == rec.Step && op.Attempt == rec.Retries {
			out = append(out, op)
		}
	}
	return out
}

func lastConfirmedIsOn(rec *coordv1.NodeFence) bool {
	for i := len(rec.Operations) - 1; i >= 0; i-- {
		op := rec.Operations[i]
		if op.Step == coordv1.FenceStep_FENCE_STEP_POWER_MANAGEMENT && op.Result == coordv1.OperationResult_OPERATION_RESULT_CONFIRMED {
			return op.Action == "on"
		}
	}
	return false
}

// Record stores a driver call's outcome in the operation (the last with that id) and, for a
// confirmed power-off or isolation, marks the record confirmed off: from then on its pods may be
// released. A driver answer without the requested state is never a confirmation.
func Record(rec *coordv1.NodeFence, opID string, state driverv1.PowerState, callErr error, errText string, now time.Time, elapsed time.Duration) {
	for i := len(rec.Operations) - 1; i >= 0; i-- {
		op := rec.Operations[i]
		if op.OperationId != opID {
			continue
		}
		op.FinishedAt, op.State = timestamppb.New(now), state
		op.Elapsed = durationpb.New(elapsed)
		want := driverv1.PowerState_POWER_STATE_OFF
		if op.Action == "on" {
			want = driverv1.PowerState_POWER_STATE_ON
		}
		switch {
		case callErr != nil:
			op.Result, op.Error = coordv1.OperationResult_OPERATION_RESULT_FAILED, errText
			op.Unreachable = fault.Unreachable(callErr)
		case state != want:
			op.Result, op.Error = coordv1.OperationResult_OPERATION_RESULT_FAILED, fmt.Sprintf("driver returned %s, want %s", state, want)
		default:
			op.Result, op.Error = coordv1.OperationResult_OPERATION_RESULT_CONFIRMED, ""
			if want == driverv1.PowerState_POWER_STATE_OFF && rec.Action == coordv1.FenceAction_FENCE_ACTION_OFF && rec.ConfirmedOffAt == nil {
				rec.ConfirmedOffAt = timestamppb.New(now)
				rec.Proof = coordv1.FenceProof_FENCE_PROOF_READ_BACK
				if IsWatchdog(op) {
					rec.Proof = coordv1.FenceProof_FENCE_PROOF_WATCHDOG_TIMEOUT
				}
			}
		}
		return
	}
}

// NewRecord returns a new record for node: a power-off starts at its first step (isolation when the
// node has isolation methods), a power-on (unfence) at recovery, a reboot at power management. A node delay (fixed plus a random
// part, drawn once here so every leader honours the same one) postpones the first dispatch.
func NewRecord(id, node string, action coordv1.FenceAction, plan func(string) ([]fenceconfig.Resolved, error), delay time.Duration, now time.Time) *coordv1.NodeFence {
	step := coordv1.FenceStep_FENCE_STEP_RECOVERY
	switch action {
	case coordv1.FenceAction_FENCE_ACTION_OFF:
		step = FirstStep(plan)
	case coordv1.FenceAction_FENCE_ACTION_REBOOT:
		step = coordv1.FenceStep_FENCE_STEP_POWER_MANAGEMENT
	}
	rec := &coordv1.NodeFence{
		Id: id, Node: node, Action: action, Step: step, Status: coordv1.FenceStatus_FENCE_STATUS_NEW,
		CreatedAt: timestamppb.New(now), UpdatedAt: timestamppb.New(now),
	}
	if delay > 0 {
		rec.NextAttemptAt = timestamppb.New(now.Add(delay))
		rec.Evidence = append(rec.Evidence, fmt.Sprintf("node fence delay %s", delay.Round(time.Millisecond)))
	}
	return rec
}
