package main

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/nodefence/nodefence/coordinator/fencing"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// darkPhaseNames are a dark-BMC round's phases in the order of the recovery: the node's last
// contact (the power loss is 0), both witnesses judged silent, the decision, the IPMI method's
// first call and its last answer (unreachable), the watchdog fallback's start, the proof by time,
// the release of the node's pods, the taint, and the pod deleted, scheduled and Running elsewhere.
// safe_time is the timing rule's earliest proof (the last contact + the safe time): the proof can
// come no earlier than the leader's last grant, which is at most the last contact.
var darkPhaseNames = []string{"agent_last_contact", "kubelet_last_renew", "witnesses_silent", "decision", "ipmi_start", "ipmi_end",
	"watchdog_start", "safe_time", "confirmed_off", "released", "taint", "pod_deleted", "pod_scheduled", "pod_running"}

// darkDetail is what a dark round's record says beyond its phases: the IPMI operations and their
// last error.
type darkDetail struct {
	ipmiOps int
	ipmiErr string
	proof   string
}

func (d darkDetail) String() string {
	return fmt.Sprintf("ipmi_operations=%d proof=%s ipmi_error=%q", d.ipmiOps, d.proof, d.ipmiErr)
}

// darkPhases adds a dark round's record phases to p (seconds from t0): the IPMI operations, the
// watchdog fallback, the release from the leader's audit trail and the safe time.
func (b *bench) darkPhases(ctx context.Context, node string, t0 time.Time, p phases, safe time.Duration) darkDetail {
	at := func(name string, t time.Time) {
		if !t.IsZero() {
			p[name] = math.Round(t.Sub(t0).Seconds()*10) / 10
		}
	}
	var d darkDetail
	f := b.fenceOf(ctx, node)
	if f == nil {
		return d
	}
	d.proof = fencing.ProofName(f.GetProof())
	if f.GetLastContactAt() != nil {
		at("safe_time", f.GetLastContactAt().AsTime().Add(safe))
	}
	for _, op := range f.GetOperations() {
		if fencing.IsWatchdog(op) {
			if _, ok := p["watchdog_start"]; !ok && op.GetStartedAt() != nil {
				at("watchdog_start", op.GetStartedAt().AsTime())
			}
			continue
		}
		d.ipmiOps++
		if _, ok := p["ipmi_start"]; !ok && op.GetStartedAt() != nil {
			at("ipmi_start", op.GetStartedAt().AsTime())
		}
		if op.GetFinishedAt() != nil {
			at("ipmi_end", op.GetFinishedAt().AsTime())
			d.ipmiErr = op.GetError()
		}
	}
	if t, ok := b.releasedAt(ctx, node, f.GetCreatedAt().AsTime()); ok {
		at("released", t)
	}
	return d
}

// releasedAt is the node's first "release" audit entry at or after from (the record's decision).
func (b *bench) releasedAt(ctx context.Context, node string, from time.Time) (time.Time, bool) {
	co := b.d.Leader(ctx)
	if co == nil {
		return time.Time{}, false
	}
	cl, _, closeConn, err := b.d.Conn(co.Addr)
	if err != nil {
		return time.Time{}, false
	}
	defer closeConn()
	after := int64(0)
	for range 20 {
		r, err := cl.ListAudit(ctx, &coordv1.ListAuditRequest{Node: node, AfterRevision: after, Limit: 1000})
		if err != nil {
			return time.Time{}, false
		}
		for _, e := range r.GetEntries() {
			after = e.GetRevision()
			if e.GetKind() == "release" && !e.GetAt().AsTime().Before(from) {
				return e.GetAt().AsTime(), true
			}
		}
		if len(r.GetEntries()) < 1000 {
			break
		}
	}
	return time.Time{}, false
}

// darkString prints a dark round's phases in darkPhaseNames' order.
func darkString(p phases) string {
	var s strings.Builder
	for _, n := range darkPhaseNames {
		if v, ok := p[n]; ok {
			fmt.Fprintf(&s, "%s=%.1f ", n, v)
		}
	}
	return strings.TrimSpace(s.String())
}
