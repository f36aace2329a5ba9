package main

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// fencectl status shows the record's proof, and the timeline says the watchdog's timing rule, not a
// read-back, confirmed a watchdog-timeout record off.
func TestStatusAndTimelineShowTheProof(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	rec := &coordv1.NodeFence{Id: "n2-1", Node: "n2", CreatedAt: timestamppb.New(t0), ConfirmedOffAt: timestamppb.New(t0.Add(30 * time.Second)),
		Status: coordv1.FenceStatus_FENCE_STATUS_DONE, Proof: coordv1.FenceProof_FENCE_PROOF_WATCHDOG_TIMEOUT}
	found := false
	for _, row := range recordTables(rec)[0].rows {
		found = found || row[0] == "proof:" && row[1] == "watchdog-timeout"
	}
	if !found {
		t.Fatalf("fencectl status rows lack proof: watchdog-timeout: %v", recordTables(rec)[0].rows)
	}
	for _, p := range timelinePhases(rec, nil) {
		if p.Phase == "confirmed off" && !strings.Contains(p.Detail, "watchdog-timeout") {
			t.Fatalf("timeline's confirmed off says %q", p.Detail)
		}
	}
	if w := proofWord(coordv1.FenceProof_FENCE_PROOF_READ_BACK); w != "read-back" {
		t.Fatalf("proofWord(read-back) = %q", w)
	}
}
