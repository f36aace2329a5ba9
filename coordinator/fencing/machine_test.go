package fencing

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nodefence/nodefence/coordinator/fenceconfig"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
)

// simulate drives Decide to the end with drivers answering by outcome(method, action) and the node's
// readiness given by ready(now), and returns the finished record and a trace of the driver calls.
func simulate(t *testing.T, cfg string, action coordv1.FenceAction, outcome func(method, action string) bool, ready func(time.Duration) bool) (*coordv1.NodeFence, []string) {
	t.Helper()
	c, err := fenceconfig.Parse([]byte(cfg), "test")
	if err != nil {
		t.Fatal(err)
	}
	plan := func(step string) ([]fenceconfig.Resolved, error) { return c.Plan("nd", step) }
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := start
	rec := NewRecord("f", "nd", action, plan, 0, now)
	policy := Policy{Retries: 2, Backoff: 10 * time.Second, IsolationWait: time.Minute, Polls: 3, PollInterval: 10 * time.Second}
	var trace []string
	for i := 0; i < 1000 && rec.FinishedAt == nil; i++ {
		d := Decide(rec, Facts{Now: now, Plan: plan, NodeReady: ready(now.Sub(start)), Policy: policy})
		switch {
		case d.Resend != nil:
			ok := outcome(d.Resend.Method, d.Resend.Action)
			state := driverv1.PowerState_POWER_STATE_UNKNOWN
			var callErr error
			if ok {
				state = driverv1.PowerState_POWER_STATE_OFF
				if d.Resend.Action == "on" {
					state = driverv1.PowerState_POWER_STATE_ON
				}
			} else {
				callErr = errors.New("boom")
			}
			trace = append(trace, fmt.Sprintf("%s %s/%s %v", stepName(rec.Step), d.Resend.Method, d.Resend.Action, ok))
			Record(rec, d.Resend.OperationId, state, callErr, "boom", now, time.Millisecond)
			now = now.Add(time.Second)
		case d.Next != nil:
			d.Next.UpdatedAt = timestamppb.New(now)
			rec = d.Next
		case d.Wait > 0:
			now = now.Add(d.Wait)
		default:
			t.Fatal("Decide returned nothing for an unfinished record")
		}
	}
	if rec.FinishedAt == nil {
		t.Fatal("record never finished")
	}
	return rec, trace
}

const seedLike = `
drivers: {brocade: {endpoint: "x:1"}, pdu: {endpoint: "x:2"}}
nodes:
  nd:
    methods:
      fc-off: {driver: brocade, action: "off"}
      eaton-off: {driver: pdu, action: "off", must_success: true}
      eaton-on: {driver: pdu, action: "on", must_success: true}
      fc-on: {driver: brocade, action: "on"}
    steps: {isolation: [fc-off], power_management: [eaton-off, eaton-on], recovery: [fc-on]}
`

func always(string, string) bool { return true }

func TestSeedFlow(t *testing.T) {
	for _, tc := range []struct {
		name       string
		outcome    func(m, a string) bool
		ready      func(time.Duration) bool
		status     coordv1.FenceStatus
		trace      string
		confirmed  bool
		errContain string
	}{
		{"isolated, node comes back: recovery", always, func(d time.Duration) bool { return d > 30*time.Second },
			coordv1.FenceStatus_FENCE_STATUS_DONE, "isolation fc-off/off true, recovery fc-on/on true", true, ""},
		{"isolated, still dead: power cycle, back: recovery", always, func(d time.Duration) bool { return d > 90*time.Second },
			coordv1.FenceStatus_FENCE_STATUS_DONE,
			"isolation fc-off/off true, power_management eaton-off/off true, power_management eaton-on/on true, recovery fc-on/on true", true, ""},
		{"power cycled but never back: error after polls, retried, escalated", always, func(time.Duration) bool { return false },
			coordv1.FenceStatus_FENCE_STATUS_ERROR, "", true, "not ready after 3 polls"},
		{"isolation fails (not required): every method failed, retried twice, escalated",
			func(m, a string) bool { return m != "fc-off" }, func(time.Duration) bool { return false },
			coordv1.FenceStatus_FENCE_STATUS_ERROR, "isolation fc-off/off false, isolation fc-off/off false, isolation fc-off/off false", false, "every method failed"},
		{"required eaton-off fails: never confirmed off",
			func(m, a string) bool { return m != "eaton-off" }, func(time.Duration) bool { return false },
			coordv1.FenceStatus_FENCE_STATUS_ERROR, "", true, "required method eaton-off failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec, trace := simulate(t, seedLike, coordv1.FenceAction_FENCE_ACTION_OFF, tc.outcome, tc.ready)
			if rec.Status != tc.status {
				t.Fatalf("status %s (%s), want %s; trace %q", rec.Status, rec.Error, tc.status, trace)
			}
			if tc.trace != "" && strings.Join(trace, ", ") != tc.trace {
				t.Fatalf("trace\n  %s\nwant\n  %s", strings.Join(trace, ", "), tc.trace)
			}
			if (rec.ConfirmedOffAt != nil) != tc.confirmed {
				t.Fatalf("confirmed_off_at = %v, want set=%v", rec.ConfirmedOffAt, tc.confirmed)
			}
			if tc.errContain != "" && !strings.Contains(rec.Error, tc.errContain) {
				t.Fatalf("error %q lacks %q", rec.Error, tc.errContain)
			}
			if rec.Status == coordv1.FenceStatus_FENCE_STATUS_ERROR && (rec.Retries != 2 || !strings.Contains(strings.Join(rec.Evidence, ";"), "escalated after 3 attempts")) {
				t.Fatalf("want 2 retries then escalation: retries %d evidence %q", rec.Retries, rec.Evidence)
			}
		})
	}
}

// A driver answering without the requested state read back, and a node's fence delay holding the
// first dispatch back, are replayed in coordinator/engine/testdata/fence_flow.txt; the escalation
// from one power-management method to the next and the unfence in fence_levels.txt.
