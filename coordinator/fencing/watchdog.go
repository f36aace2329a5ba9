package fencing

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nodefence/nodefence/coordinator/fenceconfig"
	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/services/wdlease"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
)

// The watchdog method (issue 24): no driver service. Its "power off" tells the node's agent to stop
// feeding its watchdog now (the stop-feeding pill, sent with the answer to the agent's next
// heartbeat on its own stream; the node gets no lease from this term after it), then waits until
// the timing rule (services/wdlease, Leader.SelfFenced) takes the node as self-fenced: its agent's
// last report said "armed", its safe time after its last lease passed, and a majority of the other
// agents provably held this leader's lease for the whole window. That rule is the confirmation:
// the record is then confirmed off with the proof FENCE_PROOF_WATCHDOG_TIMEOUT, and from there the
// release is gated exactly like a read-back's (every witness must still fall silent).

// WatchdogMethod is the name of the watchdog operation a fallback or an operator's
// `fencectl fence --method watchdog` runs (a configured watchdog method keeps its own name).
const WatchdogMethod = "watchdog"

// SelfFence is a term's side of the watchdog method (implemented over the term's leases and the
// engine's record of each node's watchdog).
type SelfFence interface {
	// Poison sends the node's agent the stop-feeding pill of fence id and grants it no more leases
	// in this term.
	Poison(node, fence string)
	// Judge applies the timing rule to node at now.
	Judge(node string, now time.Time) ByTime
	// Armed says whether the node's agent last reported an armed watchdog.
	Armed(node string) bool
}

// ByTime is the timing rule's answer for one node at one instant: the leader's SelfFenced with
// the node's last watchdog report, its safe time and the rule's refusal.
type ByTime struct {
	OK      bool
	Refusal wdlease.Refusal
	// SafeTime is when the node's watchdog has certainly reset it (zero: not armed).
	SafeTime time.Time
	// Connected: the node's agent has a stream to the leader now. A node that is heard is not taken
	// as self-fenced, whatever the time: its watchdog has not fired yet (the pill's wait), did not
	// fire at all, or it reset and its agent is back from a new boot — the record then fails.
	Connected bool
}

// WatchdogVerdict is the pure judgement of a watchdog operation at now that began at start: proven
// (the node is off by its watchdog), failed for good (why), or wait. It waits at most patience past
// the later of start and the safe time for a majority's leases; a node whose agent's last report
// was not "armed" fails at once, whatever the time.
func WatchdogVerdict(j ByTime, start, now time.Time, patience time.Duration) (proven, failed bool, why string) {
	why = j.Refusal.String()
	switch {
	case j.Refusal == wdlease.NotArmed:
		return false, true, "no proof by time: " + why
	case j.Connected:
		why = "its agent is still connected to the leader"
	case j.OK:
		return true, false, ""
	}
	deadline := start
	if j.SafeTime.After(deadline) {
		deadline = j.SafeTime
	}
	if deadline = deadline.Add(patience); !now.Before(deadline) {
		return false, true, fmt.Sprintf("no proof by time by %s: %s", stamp(deadline), why)
	}
	return false, false, why
}

// WatchdogPatience is how long past a node's safe time the watchdog method waits for the leader to
// hold leases with a majority before it fails (the record then retries with backoff).
const WatchdogPatience = 2 * time.Minute

// judgeEvery is how often the waiting method asks the rule again.
const judgeEvery = 200 * time.Millisecond

// IsWatchdog says whether an operation is the watchdog method's.
func IsWatchdog(op *coordv1.Operation) bool { return op.GetDriver() == fenceconfig.WatchdogDriver }

// watchdogOff runs a watchdog operation: the pill, then the wait for the timing rule.
func (r *Runner) watchdogOff(ctx context.Context, rec *coordv1.NodeFence, op *coordv1.Operation) (driverv1.PowerState, error) {
	unknown := driverv1.PowerState_POWER_STATE_UNKNOWN
	if op.Action != "off" {
		return unknown, fmt.Errorf("method %s: a watchdog method cannot power a node on: %w", op.Method, fault.ErrFailedPrecondition)
	}
	if r.SelfFence == nil {
		return unknown, fmt.Errorf("method %s: this coordinator grants no watchdog leases: %w", op.Method, fault.ErrFailedPrecondition)
	}
	start := r.now()
	r.SelfFence.Poison(rec.Node, rec.Id)
	r.Log.Warn("watchdog fence: told the node's agent to stop feeding its watchdog; waiting for the timing rule", "fence", rec.Id, "node", rec.Node,
		"operation_id", op.OperationId)
	for {
		proven, failed, why := WatchdogVerdict(r.SelfFence.Judge(rec.Node, r.now()), start, r.now(), WatchdogPatience)
		switch {
		case proven:
			return driverv1.PowerState_POWER_STATE_OFF, nil
		case failed:
			return unknown, fmt.Errorf("node %s: %s: %w", rec.Node, why, fault.ErrNotConfirmed)
		}
		select {
		case <-ctx.Done():
			return unknown, ctx.Err()
		case <-r.after(judgeEvery):
		}
	}
}

// Unreachable says whether a failed operation's device (or its driver host) did not answer, as
// recorded from the call's error code and structured details (Operation.unreachable,
// fault.Unreachable), never from its text. A device that answered with an error is reachable. An
// operation recorded before the field existed reads as reachable: no fallback, the record retries.
func Unreachable(op *coordv1.Operation) bool {
	return op.GetResult() == coordv1.OperationResult_OPERATION_RESULT_FAILED && op.GetUnreachable()
}

// fallback is the watchdog operation a power-off record of a node that opted in (Facts.WatchdogFallback)
// appends when every power_management method of the attempt failed as unreachable (nil: none).
func fallback(rec *coordv1.NodeFence, ops []*coordv1.Operation, f Facts) *coordv1.Operation {
	if !f.WatchdogFallback || rec.Action != coordv1.FenceAction_FENCE_ACTION_OFF || rec.Step != coordv1.FenceStep_FENCE_STEP_POWER_MANAGEMENT || len(ops) == 0 {
		return nil
	}
	for _, op := range ops {
		if IsWatchdog(op) || !Unreachable(op) {
			return nil
		}
	}
	return watchdogOp(rec, f.Now)
}

// watchdogOp is the record's watchdog operation of its current attempt.
func watchdogOp(rec *coordv1.NodeFence, now time.Time) *coordv1.Operation {
	return newOp(rec, fenceconfig.Resolved{Name: WatchdogMethod, Driver: fenceconfig.WatchdogDriver, Action: "off"}, now)
}

// watchdogOnly is the plan of a record that runs the watchdog method alone (FenceRequest.method).
func watchdogOnly(rec *coordv1.NodeFence) ([]fenceconfig.Resolved, error) {
	if rec.Method != fenceconfig.WatchdogDriver {
		return nil, fmt.Errorf("record %s: method %q is not %q", rec.Id, rec.Method, fenceconfig.WatchdogDriver)
	}
	if rec.Action != coordv1.FenceAction_FENCE_ACTION_OFF || rec.Step != coordv1.FenceStep_FENCE_STEP_POWER_MANAGEMENT {
		return nil, errors.New("the watchdog method only powers a node off, in power_management")
	}
	return []fenceconfig.Resolved{{Name: WatchdogMethod, Driver: fenceconfig.WatchdogDriver, Action: "off"}}, nil
}

// ProofName is the word for a record's proof: read-back, operator, watchdog-timeout ("" for none).
func ProofName(p coordv1.FenceProof) string {
	switch p {
	case coordv1.FenceProof_FENCE_PROOF_READ_BACK:
		return "read-back"
	case coordv1.FenceProof_FENCE_PROOF_OPERATOR:
		return "operator"
	case coordv1.FenceProof_FENCE_PROOF_WATCHDOG_TIMEOUT:
		return "watchdog-timeout"
	}
	return ""
}
