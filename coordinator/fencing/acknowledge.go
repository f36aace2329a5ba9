package fencing

import (
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/services/identity"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// The Acknowledge rules: an operator confirms that a node is off, without any driver call. The
// operator is the caller's certificate; a node one of whose witnesses is alive is refused unless
// the acknowledgement is forced with a reason; either way it goes to the audit trail (AckAudit).

// AckCaller returns the name an acknowledgement is recorded under: an operator's certificate name;
// for a caller of a server without client certificates (identity.Any), the caller and what the
// request says. An operator may not name another operator in the request's operator field.
func AckCaller(caller identity.Identity, operator string) (string, error) {
	if operator != "" && caller.Role == identity.Operator && operator != caller.Name {
		var v fault.Invalid
		v.Add("operator", "%q is not the caller: the operator is %s, from the client certificate", operator, caller.Name)
		return "", v.Err()
	}
	switch {
	case caller.Role == identity.Operator:
		return caller.Name, nil
	case caller.Role == identity.Any && operator != "":
		return fmt.Sprintf("%s (says %q)", caller, operator), nil
	}
	return caller.String(), nil
}

// Witness says why a node looks alive, "" when every witness is silent: its agent is connected or
// the engine judges it ready (n is the engine's view, nil for a node it does not know), or
// (Kubernetes mode) its kubelet reports Ready.
func Witness(n *coordv1.Node, kubeletReports bool) string {
	switch {
	case n != nil && n.Connected:
		return "its agent is connected"
	case Alive(n):
		return "its agent reported within the grace period"
	case kubeletReports:
		return "its kubelet reports Ready"
	}
	return ""
}

// Alive is the one reading of the engine's view of a node as running: it is Ready and its
// witnesses are not both silent past their own windows (Node.silent_since, fast detection). A node
// the engine does not know (nil) is not alive by this rule; callers decide what that means.
func Alive(n *coordv1.Node) bool {
	return n != nil && n.GetReadiness() == coordv1.Readiness_READINESS_READY && n.GetSilentSince() == nil
}

// AckNote applies the witness rule: a node with a live witness (live, from Witness) is refused
// (fault.ErrFailedPrecondition) unless forced; a forced acknowledgement's note says so. It returns
// the note recorded with the acknowledgement.
func AckNote(node, live, reason string, force bool) (string, error) {
	if live == "" {
		return reason, nil
	}
	if !force {
		return "", fmt.Errorf("node %s is not silent (%s): it may be running; acknowledge only a node you know is off, with force and a reason: %w",
			node, live, fault.ErrFailedPrecondition)
	}
	return fmt.Sprintf("FORCED while %s: %s", live, reason), nil
}

// AckAudit is the audit entry of an accepted acknowledgement.
func AckAudit(operator, node, note string) string {
	return fmt.Sprintf("%s acknowledged node %s off: %s", operator, node, note)
}

// Ack is an accepted acknowledgement.
type Ack struct {
	Node string
	// Operator is AckCaller's name; Note is AckNote's.
	Operator, Note string
	// RequestedBy is the caller's identity, recorded on a record the acknowledgement creates.
	RequestedBy string
	// Epoch is the leader's.
	Epoch int64
}

// Acknowledged returns the record the acknowledgement writes. With no active record (cur nil) it is
// a new power-off record, DONE and confirmed off without any driver call. An active power-off record
// is finished DONE (confirmed off now unless a driver confirmed it earlier). An active unfence or
// reboot is refused (fault.ErrFailedPrecondition). cur is not modified.
func Acknowledged(cur *coordv1.NodeFence, a Ack, now time.Time) (*coordv1.NodeFence, error) {
	ts := func() *timestamppb.Timestamp { return timestamppb.New(now) }
	evidence := "acknowledged by " + a.Operator + ": " + a.Note
	if cur == nil {
		return &coordv1.NodeFence{
			Id: NewID(a.Node, now), Node: a.Node, Action: coordv1.FenceAction_FENCE_ACTION_OFF,
			Step: coordv1.FenceStep_FENCE_STEP_POWER_MANAGEMENT, Status: coordv1.FenceStatus_FENCE_STATUS_DONE,
			Reason: "acknowledged: " + a.Note, RequestedBy: a.RequestedBy, AcknowledgedBy: a.Operator,
			Epoch: a.Epoch, CreatedAt: ts(), UpdatedAt: ts(), FinishedAt: ts(), ConfirmedOffAt: ts(), Evidence: []string{evidence},
			Proof: coordv1.FenceProof_FENCE_PROOF_OPERATOR,
		}, nil
	}
	if cur.Action != coordv1.FenceAction_FENCE_ACTION_OFF {
		verb := "unfence"
		if cur.Action == coordv1.FenceAction_FENCE_ACTION_REBOOT {
			verb = "reboot"
		}
		return nil, fmt.Errorf("node %s has an active %s %s: %w", a.Node, verb, cur.Id, fault.ErrFailedPrecondition)
	}
	f := proto.Clone(cur).(*coordv1.NodeFence)
	f.Status, f.AcknowledgedBy, f.Error = coordv1.FenceStatus_FENCE_STATUS_DONE, a.Operator, ""
	f.Reason = strings.TrimSpace(f.Reason + "; acknowledged: " + a.Note)
	f.Epoch, f.UpdatedAt, f.FinishedAt = a.Epoch, ts(), ts()
	if f.ConfirmedOffAt == nil {
		f.ConfirmedOffAt = ts()
	}
	// The operator's word is what the release now goes by (NeedsProof: an acknowledged record is not
	// checked), whatever a driver confirmed before.
	f.Proof = coordv1.FenceProof_FENCE_PROOF_OPERATOR
	f.Evidence = append(f.Evidence, evidence)
	return f, nil
}
