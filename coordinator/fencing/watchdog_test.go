package fencing

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nodefence/nodefence/coordinator/fenceconfig"
	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/services/wdlease"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
)

// The watchdog operation is proven only by the rule's yes; a node not armed fails at once, whatever
// the time; a missing majority is waited for until the patience past the safe time runs out.
func TestWatchdogVerdict(t *testing.T) {
	t0 := time.Unix(1000, 0)
	safe := t0.Add(30 * time.Second)
	for _, tc := range []struct {
		name           string
		j              ByTime
		now            time.Time
		proven, failed bool
	}{
		{"armed, before the safe time", ByTime{Refusal: wdlease.BeforeSafe, SafeTime: safe}, t0.Add(29 * time.Second), false, false},
		{"armed, the rule says yes", ByTime{OK: true, SafeTime: safe}, safe, true, false},
		{"disarmed, long after", ByTime{Refusal: wdlease.NotArmed}, t0.Add(time.Hour), false, true},
		{"no majority, within patience", ByTime{Refusal: wdlease.NoMajority, SafeTime: safe}, safe.Add(WatchdogPatience - time.Second), false, false},
		{"no majority, patience over", ByTime{Refusal: wdlease.NoMajority, SafeTime: safe}, safe.Add(WatchdogPatience), false, true},
		{"the rule says yes, but its agent is connected", ByTime{OK: true, SafeTime: safe, Connected: true}, safe, false, false},
		{"its agent stays connected past the patience", ByTime{OK: true, SafeTime: safe, Connected: true}, safe.Add(WatchdogPatience), false, true},
	} {
		proven, failed, why := WatchdogVerdict(tc.j, t0, tc.now, WatchdogPatience)
		if proven != tc.proven || failed != tc.failed {
			t.Errorf("%s: proven %v failed %v (%s), want %v %v", tc.name, proven, failed, why, tc.proven, tc.failed)
		}
	}
}

const wdCfg = `
drivers:
  ipmi: {endpoint: "127.0.0.1:7101"}
nodes:
  nd:
    methods:
      bmc: {driver: ipmi, must_success: true, parameters: {ip: 127.0.0.1}}
    steps:
      power_management: [bmc]
`

// runWD drives Decide with the BMC failing with bmcErr and the watchdog operation proven, and
// returns the finished record.
func runWD(t *testing.T, rec *coordv1.NodeFence, fallbackOn bool, bmcErr error) *coordv1.NodeFence {
	t.Helper()
	c, err := fenceconfig.Parse([]byte(wdCfg), "test")
	if err != nil {
		t.Fatal(err)
	}
	plan := func(step string) ([]fenceconfig.Resolved, error) { return c.Plan("nd", step) }
	now := rec.CreatedAt.AsTime()
	for i := 0; i < 100 && rec.FinishedAt == nil; i++ {
		d := Decide(rec, Facts{Now: now, Plan: plan, Policy: Policy{}, WatchdogFallback: fallbackOn})
		switch {
		case d.Resend != nil:
			if IsWatchdog(d.Resend) {
				Record(rec, d.Resend.OperationId, driverv1.PowerState_POWER_STATE_OFF, nil, "", now, time.Second)
			} else {
				Record(rec, d.Resend.OperationId, driverv1.PowerState_POWER_STATE_UNKNOWN, bmcErr, bmcErr.Error(), now, time.Second)
			}
		case d.Next != nil:
			d.Next.UpdatedAt = timestamppb.New(now)
			rec = d.Next
		default:
			now = now.Add(d.Wait)
		}
		now = now.Add(time.Second)
	}
	return rec
}

// The fallback: only for a node that opted in (and armed: the runner's fact), only when every
// power method failed as unreachable — as the call's error code and structured detail say, never
// its words; it ends with the watchdog-timeout proof.
func TestWatchdogFallback(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	newRec := func() *coordv1.NodeFence {
		return NewRecord("f", "nd", coordv1.FenceAction_FENCE_ACTION_OFF, func(string) ([]fenceconfig.Resolved, error) { return nil, nil }, 0, t0)
	}
	for name, unreach := range map[string]error{
		"the BMC did not answer":             fault.Status(fmt.Errorf("ipmi 127.0.0.1:9001: %w", fault.ErrUnreachable)),
		"the BMC never answered the session": fault.Status(fmt.Errorf("power off: %w", fault.ErrNotSent)),
		"the driver host is down":            status.Error(codes.Unavailable, "connection refused"),
		"no answer in time":                  status.Error(codes.DeadlineExceeded, "context deadline exceeded"),
	} {
		r := runWD(t, newRec(), true, unreach)
		if r.Status != coordv1.FenceStatus_FENCE_STATUS_DONE || r.Proof != coordv1.FenceProof_FENCE_PROOF_WATCHDOG_TIMEOUT || r.ConfirmedOffAt == nil {
			t.Fatalf("%s: fallback: %s proof %s error %q", name, r.Status, r.Proof, r.Error)
		}
		if n := len(r.Operations); n != 2 || r.Operations[1].Method != WatchdogMethod || !strings.Contains(strings.Join(r.Evidence, "\n"), "falling back") {
			t.Fatalf("%s: fallback operations/evidence: %v %v", name, r.Operations, r.Evidence)
		}
	}
	for _, tc := range []struct {
		name string
		on   bool
		err  error
	}{
		{"not opted in", false, fault.Status(fault.ErrUnreachable)},
		{"the BMC answered with an error", true, fault.Status(fmt.Errorf("ipmi: %w: completion code 0xc1", fault.ErrDevice))},
		{"bad credentials", true, fault.Status(fault.ErrUnauthenticated)},
		// The words of an unreachable device without its code: a driver's text is not the proof.
		{"unreachable in words only", true, errors.New("Unavailable: ipmi 127.0.0.1:9001: device unreachable")},
	} {
		r := runWD(t, newRec(), tc.on, tc.err)
		if r.Status != coordv1.FenceStatus_FENCE_STATUS_ERROR || r.ConfirmedOffAt != nil || len(r.Operations) != 1 {
			t.Errorf("%s: %s with %d operations, want error without fallback", tc.name, r.Status, len(r.Operations))
		}
	}
}

// An operator's watchdog record runs the watchdog method alone, not the node's steps; a read-back
// proves a record by read-back; an acknowledgement by the operator.
func TestProofKinds(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rec := NewRecord("f", "nd", coordv1.FenceAction_FENCE_ACTION_OFF, func(string) ([]fenceconfig.Resolved, error) { return nil, nil }, 0, t0)
	rec.Method = fenceconfig.WatchdogDriver
	r := runWD(t, rec, false, errors.New("never called"))
	if len(r.Operations) != 1 || !IsWatchdog(r.Operations[0]) || r.Proof != coordv1.FenceProof_FENCE_PROOF_WATCHDOG_TIMEOUT || r.Status != coordv1.FenceStatus_FENCE_STATUS_DONE {
		t.Fatalf("watchdog-only record: %s proof %s ops %v", r.Status, r.Proof, r.Operations)
	}
	rb := &coordv1.NodeFence{Action: coordv1.FenceAction_FENCE_ACTION_OFF, Operations: []*coordv1.Operation{{OperationId: "o", Driver: "ipmi", Action: "off"}}}
	Record(rb, "o", driverv1.PowerState_POWER_STATE_OFF, nil, "", t0, time.Second)
	if rb.Proof != coordv1.FenceProof_FENCE_PROOF_READ_BACK || ProofName(rb.Proof) != "read-back" {
		t.Fatalf("read-back proof: %s", rb.Proof)
	}
	ack, err := Acknowledged(rb, Ack{Node: "nd", Operator: "operator/ann", Note: "pulled the plug"}, t0)
	if err != nil || ack.Proof != coordv1.FenceProof_FENCE_PROOF_OPERATOR {
		t.Fatalf("acknowledged: %v %v", ack.GetProof(), err)
	}
}
