package agent

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

// kinds of test messages, by letter: h heartbeat, s sample, c condition, x shutdown.
func msg(kind byte) *agentv1.ConnectRequest {
	switch kind {
	case 'h':
		return &agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Heartbeat{Heartbeat: &agentv1.Heartbeat{}}}
	case 's':
		return &agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Sample{Sample: &agentv1.SignalSample{}}}
	case 'c':
		return &agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Condition{Condition: &agentv1.ConditionChange{}}}
	case 'x':
		return &agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Shutdown{Shutdown: &agentv1.ShutdownEvent{}}}
	}
	panic("unknown kind " + string(kind))
}

func seqs(ms []*agentv1.ConnectRequest) []uint64 {
	var out []uint64
	for _, m := range ms {
		out = append(out, m.Seq)
	}
	return out
}

func TestOutbox(t *testing.T) {
	tests := []struct {
		name        string
		limit       int
		push        string // kinds pushed in order; seq i+1 for the i-th
		ack         uint64
		wantDropped []uint64 // over all pushes
		wantKept    []uint64 // after the ack
		wantHello   uint64
		wantResume  uint64
	}{
		{name: "empty", limit: 4, wantHello: 0, wantResume: 0},
		{name: "all acked", limit: 4, push: "scs", ack: 3, wantHello: 3, wantResume: 0},
		{name: "partly acked", limit: 4, push: "sccs", ack: 2, wantKept: []uint64{3, 4}, wantHello: 2, wantResume: 3},
		{name: "ack beyond last", limit: 4, push: "cc", ack: 99, wantHello: 2},
		{name: "heartbeats coalesce", limit: 8, push: "hchh", wantKept: []uint64{2, 4}, wantHello: 1, wantResume: 2},
		{name: "overflow drops the heartbeat first", limit: 3, push: "shsc", wantDropped: []uint64{2}, wantKept: []uint64{1, 3, 4}, wantResume: 1},
		{name: "overflow drops the oldest sample", limit: 3, push: "scssc", wantDropped: []uint64{1, 3}, wantKept: []uint64{2, 4, 5}, wantHello: 1, wantResume: 2},
		{name: "events are never dropped", limit: 2, push: "ccxcs", wantDropped: []uint64{5}, wantKept: []uint64{1, 2, 3, 4}, wantResume: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := NewOutbox(tt.limit)
			var dropped []uint64
			for i := range len(tt.push) {
				m := msg(tt.push[i])
				seq, d := o.Push(m)
				if seq != uint64(i+1) || m.Seq != seq {
					t.Fatalf("push %d: seq %d (m.Seq %d); want %d", i, seq, m.Seq, i+1)
				}
				dropped = append(dropped, d...)
			}
			o.Ack(tt.ack)
			if diff := cmp.Diff(tt.wantDropped, dropped); diff != "" {
				t.Errorf("dropped (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantKept, seqs(o.After(0))); diff != "" {
				t.Errorf("kept (-want +got):\n%s", diff)
			}
			if o.Len() != len(tt.wantKept) {
				t.Errorf("Len() = %d; want %d", o.Len(), len(tt.wantKept))
			}
			if h, r := o.Resume(); h != tt.wantHello || r != tt.wantResume {
				t.Errorf("Resume() = %d, %d; want %d, %d", h, r, tt.wantHello, tt.wantResume)
			}
		})
	}
}

// AckedThrough tells whether one message (an event: never dropped) was acknowledged, whatever was
// queued after it: a clean stop's "disarmed" report waits for exactly that.
func TestOutboxAckedThrough(t *testing.T) {
	o := NewOutbox(8)
	if o.AckedThrough(1) {
		t.Fatal("seq 1 acknowledged before it was assigned")
	}
	for _, k := range "sxs" { // a sample, the event at seq 2, a sample after it
		o.Push(msg(byte(k)))
	}
	if o.AckedThrough(2) {
		t.Fatal("seq 2 acknowledged before any ack")
	}
	o.Ack(2)
	if !o.AckedThrough(2) || o.AckedThrough(3) || o.Len() != 1 {
		t.Fatalf("after ack 2: through 2 %v, through 3 %v, %d unacked; want true, false, 1", o.AckedThrough(2), o.AckedThrough(3), o.Len())
	}
}

func TestOutboxAfterAndSeqsLiveForever(t *testing.T) {
	o := NewOutbox(10)
	for range 5 {
		o.Push(msg('c'))
	}
	if diff := cmp.Diff([]uint64{4, 5}, seqs(o.After(3))); diff != "" {
		t.Errorf("After(3) (-want +got):\n%s", diff)
	}
	if got := o.After(5); got != nil {
		t.Errorf("After(5) = %v; want nil", got)
	}
	if n := o.Ack(5); n != 5 || o.Len() != 0 {
		t.Fatalf("Ack(5) removed %d, left %d", n, o.Len())
	}
	// An ack going backwards (a new leader that knows less) removes nothing and seqs keep growing.
	if n := o.Ack(2); n != 0 {
		t.Errorf("Ack(2) removed %d", n)
	}
	if seq, _ := o.Push(msg('c')); seq != 6 {
		t.Errorf("seq after acks = %d; want 6", seq)
	}
}

func TestBackoff(t *testing.T) {
	const minD, maxD = 100 * time.Millisecond, 10 * time.Second
	tests := []struct {
		n      int
		u      float64
		want   time.Duration
		detail string
	}{
		{n: 0, u: 0, want: 50 * time.Millisecond},
		{n: 0, u: 0.5, want: 75 * time.Millisecond},
		{n: 1, u: 0, want: 100 * time.Millisecond},
		{n: 3, u: 0, want: 400 * time.Millisecond},
		{n: 3, u: 0.5, want: 600 * time.Millisecond},
		{n: 6, u: 0, want: 3200 * time.Millisecond},
		{n: 7, u: 0, want: 5 * time.Second, detail: "capped at max"},
		{n: 1000, u: 0, want: 5 * time.Second, detail: "no overflow"},
		{n: 1000, u: 2, want: 10 * time.Second, detail: "u clamped"},
	}
	for _, tt := range tests {
		if got := Backoff(tt.n, minD, maxD, tt.u); got != tt.want {
			t.Errorf("Backoff(%d, u=%v) = %v; want %v %s", tt.n, tt.u, got, tt.want, tt.detail)
		}
	}
	// Grows with n (for the same u) and is jittered (different u give different waits in [d/2, d]).
	for n := range 10 {
		lo, hi := Backoff(n, minD, maxD, 0), Backoff(n, minD, maxD, 0.999)
		if lo >= hi {
			t.Errorf("n=%d: no jitter: %v >= %v", n, lo, hi)
		}
		if next := Backoff(n+1, minD, maxD, 0); next < lo || (next == lo && lo < maxD/2) {
			t.Errorf("n=%d: does not grow: %v then %v", n, lo, next)
		}
		if hi > maxD || lo < minD/2 {
			t.Errorf("n=%d: [%v, %v] outside [%v, %v]", n, lo, hi, minD/2, maxD)
		}
	}
}
