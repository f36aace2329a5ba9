package main

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
)

// An automatic fence's timeline starts at the node's last contact and orders the record's moments
// and the node's audit entries (held back, released) in time; an earlier fence's release and
// entries from before the last contact are left out.
func TestTimelinePhases(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	at := func(s float64) *timestamppb.Timestamp {
		return timestamppb.New(t0.Add(time.Duration(s * float64(time.Second))))
	}
	rec := &coordv1.NodeFence{Id: "n2-1", Node: "n2", Automatic: true, RequestedBy: "coordinator", Evidence: []string{"no agent contact for 20s"},
		LastContactAt: at(0), NotReadySince: at(20), CreatedAt: at(22.5), ConfirmedOffAt: at(23.4), FinishedAt: at(23.5),
		Status: coordv1.FenceStatus_FENCE_STATUS_DONE,
		Operations: []*coordv1.Operation{{Method: "bmc", Action: "off", Driver: "ipmi", StartedAt: at(22.6), FinishedAt: at(23.4),
			Result: coordv1.OperationResult_OPERATION_RESULT_CONFIRMED, State: driverv1.PowerState_POWER_STATE_OFF,
			Step: coordv1.FenceStep_FENCE_STEP_POWER_MANAGEMENT}}}
	audit := []*coordv1.AuditEntry{
		{At: at(-30), Kind: "release", Text: "an earlier fence's release"},
		{At: at(21), Kind: "fence-held-back", Text: "zone a is in partial disruption"},
		{At: at(21.5), Kind: "config", Text: "not a phase"},
		{At: at(25), Kind: "release", Text: "fence n2-1 confirmed off: out-of-service taint"},
	}
	var got []string
	for _, p := range timelinePhases(rec, audit) {
		got = append(got, p.At.Sub(t0).String()+" "+p.Phase)
	}
	want := "0s last contact|20s judged failed|21s held back|22.5s decision|22.6s driver call|23.4s driver answer|23.4s confirmed off|23.5s finished|25s released"
	if g := strings.Join(got, "|"); g != want {
		t.Fatalf("timeline\n got %s\nwant %s", g, want)
	}
}

// fencectl timeline on a running coordinator: an operator's fence shows its decision, the driver's
// call and answer, the read-back and the end; a node without a fence says so.
func TestTimelineCommand(t *testing.T) {
	r := startRig(t)
	if res := r.run(t, r.operator, "fence", "good", "--reason", "timeline test"); res.code != 0 {
		t.Fatalf("fence: %+v", res)
	}
	res := r.run(t, r.viewer, "timeline", "good")
	if res.code != 0 {
		t.Fatalf("timeline: %+v", res)
	}
	for _, want := range []string{"decision", "requested by spiffe://nodefence/operator/alice: timeline test", "driver call", "driver answer", "confirmed off", "finished", "+"} {
		if !strings.Contains(res.out, want) {
			t.Errorf("timeline lacks %q:\n%s", want, res.out)
		}
	}
	if res := r.run(t, r.viewer, "timeline", "good", "-o", "json"); res.code != 0 || !strings.Contains(res.out, `"phase": "confirmed off"`) {
		t.Errorf("timeline -o json: %+v", res)
	}
	if res := r.run(t, r.viewer, "timeline", "stuck"); res.code != 1 || !strings.Contains(res.errOut, "no fence record") {
		t.Errorf("timeline of a node never fenced: %+v", res)
	}
}
