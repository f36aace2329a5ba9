package fencing

import (
	"reflect"
	"strings"
	"testing"
	"time"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
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
