package engine

import (
	"fmt"
	"testing"
	"testing/quick"
	"time"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

// releasedReference is the token bucket written plainly: burst 1, full at the start, one token every
// period seconds, ticks every second (never longer than a period, so no token is lost to the cap).
// Nodes queued at t0 are released one per token: by t0+n seconds, 1 + n/period of them.
func releasedReference(queued, period, elapsed int) int {
	if elapsed < 0 {
		return 0
	}
	return min(queued, 1+elapsed/period)
}

// TestPacingMatchesReference drives the engine with a zone of 100 nodes, k of which go silent (under
// 55%, so the zone stays Normal at the configured rate), and checks how many were released at every
// tick against the reference.
func TestPacingMatchesReference(t *testing.T) {
	f := func(kSeed, pSeed uint8) bool {
		k := 1 + int(kSeed)%50          // 1..50 silent of 100: Normal
		period := 1 << (int(pSeed) % 5) // 1, 2, 4, 8 or 16 s: exact in binary
		start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		e := New(Config{NodeMonitorGracePeriod: 40 * time.Second, NodeEvictionRate: 1 / float64(period), LargeClusterSizeThreshold: 50})
		e.Step(LeaderElected{At: start})
		for i := 0; i < 100; i++ {
			e.Step(Hello{Node: fmt.Sprintf("n%d", i), Zone: "z", At: start})
		}
		released := 0
		t0 := start.Add(41 * time.Second) // the silent nodes become Unknown on the first tick past 40 s
		for s := 1; s <= 41+50*period; s++ {
			now := start.Add(time.Duration(s) * time.Second)
			for i := k; i < 100; i++ {
				e.Step(Message{Node: fmt.Sprintf("n%d", i), At: now, Msg: &agentv1.ConnectRequest{}})
			}
			e.Tick(now)
			released += len(e.Ready().Evictions)
			e.Advance()
			if want := releasedReference(k, period, int(now.Sub(t0)/time.Second)); released != want {
				t.Logf("k=%d period=%ds at t=%ds: released %d, reference %d", k, period, s, released, want)
				return false
			}
		}
		return released == k
	}
	if err := quick.Check(f, &quick.Config{MaxCount: 60}); err != nil {
		t.Fatal(err)
	}
}

// TestQueueIsFIFOAndRecoveredNodesLeave checks the release order against the order nodes went
// unready, with a recovered node skipped.
func TestQueueIsFIFOAndRecoveredNodesLeave(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	e := New(Config{NodeMonitorGracePeriod: 40 * time.Second, NodeEvictionRate: 0.5})
	e.Step(LeaderElected{At: start})
	names := []string{"x", "c", "a", "b", "d", "e", "f", "g", "h", "i"}
	for _, n := range names {
		e.Step(Hello{Node: n, Zone: "z", At: start})
	}
	// x, c, b, a go silent one second apart, so they become Unknown at 41, 42, 43 and 44 s and are
	// queued in that order (not in name order). At 0.5 nodes/s x goes at 41 s and c at 43 s; b speaks
	// again at 44 s, before its turn at 45 s, and leaves the queue; a goes at 45 s.
	type window struct{ from, to time.Duration }
	silent := map[string]window{"x": {0, time.Hour}, "c": {2 * time.Second, time.Hour}, "b": {3 * time.Second, 44 * time.Second}, "a": {4 * time.Second, time.Hour}}
	var order []string
	for s := 1; s <= 60; s++ {
		now := start.Add(time.Duration(s) * time.Second)
		for _, n := range names {
			if w, ok := silent[n]; ok && time.Duration(s)*time.Second >= w.from && time.Duration(s)*time.Second < w.to {
				continue
			}
			e.Step(Message{Node: n, At: now, Msg: &agentv1.ConnectRequest{}})
		}
		e.Tick(now)
		for _, ev := range e.Ready().Evictions {
			order = append(order, ev.Node)
		}
		e.Advance()
	}
	if fmt.Sprint(order) != "[x c a]" {
		t.Fatalf("release order %v, want [x c a]", order)
	}
}
