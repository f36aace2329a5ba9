package fencing

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nodefence/nodefence/coordinator/fenceconfig"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
)

const oneBMC = `
drivers: {ipmi: {endpoint: "x:1"}}
nodes:
  nd:
    methods: {bmc: {driver: ipmi}}
    steps: {power_management: [bmc]}
`

const onlyOn = `
drivers: {pdu: {endpoint: "x:1"}}
nodes:
  nd:
    methods: {outlet-on: {driver: pdu, action: "on"}}
    steps: {power_management: [outlet-on]}
`

// A reboot record powers off, and only once a power-off is confirmed, powers on; it ends DONE only
// when a power-on is confirmed too. It is never proof that the node is off: its pods stay.
func TestRebootRecord(t *testing.T) {
	never := func(time.Duration) bool { return false }
	for _, tc := range []struct {
		name, cfg string
		outcome   func(method, action string) bool
		status    coordv1.FenceStatus
		trace     []string
		err       string
	}{
		{"one method off then on", oneBMC, always, coordv1.FenceStatus_FENCE_STATUS_DONE,
			[]string{"power_management bmc/off true", "power_management bmc/on true"}, ""},
		{"seed's off and on methods", seedLike, always, coordv1.FenceStatus_FENCE_STATUS_DONE,
			[]string{"power_management eaton-off/off true", "power_management eaton-on/on true"}, ""},
		{"power-off fails: never powered on", oneBMC, func(_, a string) bool { return a == "on" }, coordv1.FenceStatus_FENCE_STATUS_ERROR,
			[]string{"power_management bmc/off false", "power_management bmc/off false", "power_management bmc/off false"}, "not powered on"},
		{"required power-off fails", seedLike, func(m, _ string) bool { return m != "eaton-off" }, coordv1.FenceStatus_FENCE_STATUS_ERROR,
			[]string{"power_management eaton-off/off false", "power_management eaton-off/off false", "power_management eaton-off/off false"}, "required method eaton-off off failed"},
		{"power-on fails", oneBMC, func(_, a string) bool { return a == "off" }, coordv1.FenceStatus_FENCE_STATUS_ERROR,
			[]string{"power_management bmc/off true", "power_management bmc/on false", "power_management bmc/off true", "power_management bmc/on false",
				"power_management bmc/off true", "power_management bmc/on false"}, "no power-on was confirmed"},
		{"no power-off method", onlyOn, always, coordv1.FenceStatus_FENCE_STATUS_ERROR, nil, "no power-off was confirmed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec, trace := simulate(t, tc.cfg, coordv1.FenceAction_FENCE_ACTION_REBOOT, tc.outcome, never)
			if rec.Status != tc.status || !reflect.DeepEqual(trace, tc.trace) || !strings.Contains(rec.Error, tc.err) {
				t.Fatalf("status %s error %q trace %q; want %s %q %q", rec.Status, rec.Error, trace, tc.status, tc.err, tc.trace)
			}
			if rec.ConfirmedOffAt != nil {
				t.Fatal("a reboot record is marked confirmed off: its pods would be released")
			}
		})
	}
}

// A reboot waits PowerWait between its confirmed power-off and its power-on, as fence-agents'
// power_wait does, so a machine whose BMC confirms off at once really loses power.
func TestRebootWaitsBetweenOffAndOn(t *testing.T) {
	c, err := fenceconfig.Parse([]byte(oneBMC), "test")
	if err != nil {
		t.Fatal(err)
	}
	plan := func(step string) ([]fenceconfig.Resolved, error) { return c.Plan("nd", step) }
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	policy := DefaultPolicy()
	rec := NewRecord("f", "nd", coordv1.FenceAction_FENCE_ACTION_REBOOT, plan, 0, now)
	decide := func() Decision { return Decide(rec, Facts{Now: now, Plan: plan, NodeReady: true, Policy: policy}) }
	var offDone time.Time
	for i := 0; i < 20; i++ {
		d := decide()
		switch {
		case d.Resend != nil && d.Resend.Action == "off":
			Record(rec, d.Resend.OperationId, driverv1.PowerState_POWER_STATE_OFF, nil, "", now, time.Millisecond)
			offDone = now
		case d.Resend != nil && d.Resend.Action == "on":
			if waited := now.Sub(offDone); offDone.IsZero() || waited < policy.PowerWait {
				t.Fatalf("power-on sent %s after the confirmed off, want at least %s", waited, policy.PowerWait)
			}
			return
		case d.Next != nil:
			if ops := d.Next.Operations; len(ops) > 0 && ops[len(ops)-1].Action == "on" && now.Sub(offDone) < policy.PowerWait {
				t.Fatalf("power-on decided %s after the confirmed off", now.Sub(offDone))
			}
			rec = d.Next
		case d.Wait > 0:
			if !offDone.IsZero() && d.Wait > policy.PowerWait {
				t.Fatalf("waits %s, more than the power wait", d.Wait)
			}
			now = now.Add(d.Wait)
		default:
			t.Fatal("no decision")
		}
	}
	t.Fatal("the power-on was never sent")
}
