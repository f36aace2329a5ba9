package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

const timelineHelp = `The node's newest fence record and its audit trail, merged into phases in time order: for an
automatic fence the node's last witness contact (where the recovery's clock starts), when it was
judged failed (both witnesses silent past their windows, or not ready after the grace period), every time the storm guard or a policy held the fence
back, the decision, each driver call and its read-back, the confirmed power-off, the release of its
pods (Kubernetes mode) and the end. SINCE counts from the first phase, so an operator can tell which
wait a recovery spent its time in. The phases of nodefence_recovery_seconds are the same.`

// phase is one row of a timeline.
type phase struct {
	At     time.Time `json:"at"`
	Phase  string    `json:"phase"`
	Detail string    `json:"detail"`
}

// timelineAuditKinds are the audit entries about a fence's progress that a timeline shows.
var timelineAuditKinds = map[string]string{
	"readiness":       "readiness",
	"agent-down":      "agent",
	"kubelet-down":    "kubelet",
	"witness":         "witnesses",
	"fence-held-back": "held back",
	"fence-requested": "requested",
	"release":         "released",
	"proof":           "proof",
	"maintenance":     "maintenance",
	"kdump":           "kdump",
}

func (c *ctl) timeline(ctx context.Context, node string) error {
	var rec *coordv1.NodeFence
	var audit []*coordv1.AuditEntry
	err := c.call(ctx, func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error {
		fr, err := fenceClient(conn).ListFences(ctx, &coordv1.ListFencesRequest{Node: node, Limit: 1}, opts...)
		if err != nil {
			return err
		}
		if len(fr.Fences) == 0 {
			return fmt.Errorf("node %s has no fence record", node)
		}
		rec = fr.Fences[0]
		audit, err = auditAround(ctx, conn, node, rec, opts...)
		return err
	})
	if err != nil {
		return err
	}
	phases := timelinePhases(rec, audit)
	t := table{title: fmt.Sprintf("fence %s of %s (%s, %s):", rec.Id, rec.Node, word(rec.Action), word(rec.Status)),
		header: []string{"AT", "SINCE", "PHASE", "DETAIL"}}
	for _, p := range phases {
		t.rows = append(t.rows, []string{p.At.Local().Format("15:04:05.000"), "+" + p.At.Sub(phases[0].At).Round(time.Millisecond).String(), p.Phase, p.Detail})
	}
	return c.show(view{data: object{{"fence", rec}, {"phases", phases}}, tables: []table{t}})
}

// auditPages bounds how many pages of a node's audit trail a timeline reads.
const auditPages = 20

// auditAround reads the node's audit entries from a minute before the record's first moment on.
func auditAround(ctx context.Context, conn *grpc.ClientConn, node string, rec *coordv1.NodeFence, opts ...grpc.CallOption) ([]*coordv1.AuditEntry, error) {
	from := firstMoment(rec).Add(-time.Minute)
	var out []*coordv1.AuditEntry
	after := int64(0)
	for range auditPages {
		r, err := clusterClient(conn).ListAudit(ctx, &coordv1.ListAuditRequest{Node: node, AfterRevision: after, Limit: 1000}, opts...)
		if err != nil {
			return nil, err
		}
		for _, e := range r.Entries {
			if !e.At.AsTime().Before(from) {
				out = append(out, e)
			}
			after = e.Revision
		}
		if len(r.Entries) < 1000 {
			break
		}
	}
	return out, nil
}

// firstMoment is where a record's timeline starts: the node's last contact for an automatic fence,
// else the record's creation.
func firstMoment(rec *coordv1.NodeFence) time.Time {
	if rec.LastContactAt != nil {
		return rec.LastContactAt.AsTime()
	}
	return rec.CreatedAt.AsTime()
}

// timelinePhases merges a record and the audit entries about its node into phases, in time order.
func timelinePhases(rec *coordv1.NodeFence, audit []*coordv1.AuditEntry) []phase {
	var out []phase
	add := func(ts *timestamppb.Timestamp, name, detail string) {
		if ts != nil {
			out = append(out, phase{At: ts.AsTime(), Phase: name, Detail: detail})
		}
	}
	add(rec.LastContactAt, "last contact", "the node's last witness contact (agent or kubelet): the recovery's clock starts")
	add(rec.NotReadySince, "judged failed", "the fence clock started: agent and kubelet silent past their own windows (--fence-detect witnesses), or not ready past --node-monitor-grace-period and released by the zone's pacing (grace); the fence timeout counts from here")
	decided := "requested by " + rec.RequestedBy + ": " + rec.Reason
	if rec.Automatic {
		decided = "automatic fence decided after the fence timeout (--fence-timeout) and the storm guard's settle window: " + strings.Join(rec.Evidence, "; ")
	}
	add(rec.CreatedAt, "decision", decided)
	for _, op := range rec.Operations {
		add(op.StartedAt, "driver call", fmt.Sprintf("%s %s via %s (%s, attempt %d)", op.Method, op.Action, op.Driver, word(op.Step), op.Attempt+1))
		if op.FinishedAt != nil {
			res := fmt.Sprintf("%s %s: %s, read back %s", op.Method, op.Action, word(op.Result), word(op.State))
			if op.Error != "" {
				res += ": " + op.Error
			}
			add(op.FinishedAt, "driver answer", res)
		}
	}
	add(rec.ConfirmedOffAt, "confirmed off", confirmedBy(rec.Proof))
	add(rec.WrongMachineAt, "wrong machine", "the node kept reporting after its confirmed power-off: nothing is released")
	fin := word(rec.Status)
	if rec.Error != "" {
		fin += ": " + rec.Error
	}
	add(rec.FinishedAt, "finished", fin)
	start := firstMoment(rec)
	for _, e := range audit {
		name, ok := timelineAuditKinds[e.Kind]
		if !ok || e.At.AsTime().Before(start) {
			continue
		}
		if e.Kind == "release" && e.At.AsTime().Before(rec.CreatedAt.AsTime()) {
			continue // an earlier fence's release
		}
		add(e.At, name, e.Text)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	return out
}

// confirmedBy says what confirmed a record off, by its proof.
func confirmedBy(p coordv1.FenceProof) string {
	switch p {
	case coordv1.FenceProof_FENCE_PROOF_WATCHDOG_TIMEOUT:
		return "proof watchdog-timeout: the node's watchdog, unfed past its safe time while a majority of agents held the leader's lease, has reset it: its pods may be released once its witnesses are silent"
	case coordv1.FenceProof_FENCE_PROOF_OPERATOR:
		return "proof operator: an operator acknowledged the node off"
	}
	return "a status read-back (or an acknowledgement) confirmed the node off: its pods may be released once its witnesses are silent"
}

// proofWord is a record's proof as the coordinator names it (read-back, operator,
// watchdog-timeout), "" for none.
func proofWord(p coordv1.FenceProof) string {
	if p == coordv1.FenceProof_FENCE_PROOF_UNSPECIFIED {
		return ""
	}
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(p.String(), "FENCE_PROOF_")), "_", "-")
}
