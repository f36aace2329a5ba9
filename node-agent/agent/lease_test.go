package agent

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/nodefence/nodefence/services/wdlease"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

// The agent's lease counts from the heartbeat's queue time, echoes what it took, refuses a grant for
// a heartbeat it does not remember, and remembers a bounded number of heartbeats.
func TestLeaseFromQueueTime(t *testing.T) {
	t0 := time.Unix(100, 0)
	l := NewLease(wdlease.Defaults(15*time.Second), t0, slog.New(slog.NewTextHandler(io.Discard, nil)))
	hb := &agentv1.Heartbeat{}
	l.stamp(hb)
	if !hb.LeaseWanted || hb.LeaseEpoch != 0 || hb.LeaseGrantId != 0 {
		t.Fatalf("first heartbeat: %+v", hb)
	}
	l.queued(7, t0)
	grant := func(seq uint64, id uint64) *agentv1.LeaseGrant {
		return &agentv1.LeaseGrant{Epoch: 5, GrantId: id, Duration: durationpb.New(4 * time.Second), RequestSeq: seq}
	}
	l.granted(grant(8, 1), t0.Add(time.Second)) // a heartbeat it never queued
	if !l.Expiry().IsZero() {
		t.Fatal("took a grant for an unknown heartbeat")
	}
	l.granted(grant(7, 2), t0.Add(3*time.Second)) // arrived 3 s late: the lease still ends at t0 + 4 s
	if got := l.Expiry(); !got.Equal(t0.Add(4 * time.Second)) {
		t.Fatalf("expiry %s after the queue time, want 4s", got.Sub(t0))
	}
	if d := l.MayFeed(t0.Add(3900*time.Millisecond), "n1", 0, wdlease.Confirmation{}); d != wdlease.FeedLease {
		t.Fatalf("within the lease: %s", d)
	}
	if d := l.MayFeed(t0.Add(4*time.Second), "n1", 0, wdlease.Confirmation{}); d != wdlease.Stop {
		t.Fatalf("at the lease's end: %s", d)
	}
	l.stamp(hb)
	if hb.LeaseEpoch != 5 || hb.LeaseGrantId != 2 {
		t.Fatalf("echo %d/%d, want 5/2", hb.LeaseEpoch, hb.LeaseGrantId)
	}
	for seq := uint64(10); seq < 10_000; seq += 3 { // heartbeats between samples: sparse seqs
		l.queued(seq, t0)
	}
	if n := len(l.sends); n > keptSends+1 {
		t.Fatalf("%d heartbeats remembered, want at most %d", n, keptSends+1)
	}
}
