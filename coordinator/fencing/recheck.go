package fencing

import (
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// The witness re-check: an automatic fence is decided on a node's silence, and carried out
// seconds or minutes later (a node delay, a retry's backoff, a kernel dump waited for, a leader
// change). Before each of its driver calls the node is judged again against its witnesses: one
// heard since the fence was requested, or within its grace period, means the node is running and
// reaching us, and the fence is aborted without the call. An operator's fence is not re-checked
// (the operator decided, and Acknowledge has its own witness rule), nor a power-on.

// Contact is a node's latest sign of life from a witness that counts for its readiness, as the
// coordinator's engine saw it.
type Contact struct {
	// Witness names it: "agent" or "kubelet"; "" when none was heard (in this leader's term).
	Witness string
	// At is when it was heard, on the coordinator's clock.
	At time.Time
	// Grace is the silence after which the witness counts as gone (the node-monitor grace period).
	Grace time.Duration
}

// AbortedPrefix starts the error of a record the witness re-check aborted.
const AbortedPrefix = "aborted: the node is reaching us"

// Reaching says why an automatic fence's call (action: "off", "on", ...) must not be made now:
// a witness of the node was heard after the record was created, or at most its grace period ago.
// "" lets the call go: the record is an operator's, the call powers the node on, the record is an
// automatic power cycle (a condition trigger found the node broken while it reports: engine's
// conditions.go), or every witness has been silent since before the request and for longer than
// the grace period.
func Reaching(rec *coordv1.NodeFence, action string, c Contact, now time.Time) string {
	if !rec.GetAutomatic() || action == "on" || c.At.IsZero() || rec.GetAction() == coordv1.FenceAction_FENCE_ACTION_REBOOT {
		return ""
	}
	at := c.At.UTC().Format(time.RFC3339Nano)
	if created := rec.GetCreatedAt().AsTime(); c.At.After(created) {
		return fmt.Sprintf("its %s reported at %s, after the fence was requested at %s", c.Witness, at, created.UTC().Format(time.RFC3339Nano))
	}
	if ago := now.Sub(c.At); ago <= c.Grace {
		return fmt.Sprintf("its %s reported at %s, %s ago, within the grace period of %s", c.Witness, at, ago.Round(time.Millisecond), c.Grace)
	}
	return ""
}

// abortReaching finishes the record without the call, saying why; op is the operation written
// for the call (nil when the call was not written yet): it is marked failed, not sent.
func abortReaching(next *coordv1.NodeFence, opID, why string, now time.Time) Decision {
	text := AbortedPrefix + ": " + why + "; no driver call was made"
	for _, op := range next.Operations {
		if op.OperationId == opID && op.Result == coordv1.OperationResult_OPERATION_RESULT_UNSPECIFIED {
			op.Result, op.Error, op.FinishedAt = coordv1.OperationResult_OPERATION_RESULT_FAILED, "not sent: "+why, timestamppb.New(now)
		}
	}
	next.Evidence = append(next.Evidence, text)
	finish(next, now, coordv1.FenceStatus_FENCE_STATUS_ERROR, text)
	return Decision{Next: next}
}

// AbortedReaching reports whether the witness re-check aborted the record.
func AbortedReaching(f *coordv1.NodeFence) bool {
	return f.GetFinishedAt() != nil && strings.HasPrefix(f.GetError(), AbortedPrefix)
}
