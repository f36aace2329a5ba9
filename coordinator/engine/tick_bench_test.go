package engine

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkTick10k is one time-based pass over 10,000 healthy nodes in 10 zones.
func BenchmarkTick10k(b *testing.B) {
	e := New(DefaultConfig())
	now := time.Unix(1_700_000_000, 0)
	e.Step(LeaderElected{At: now})
	for i := range 10000 {
		e.Step(Hello{Node: fmt.Sprintf("node-%d", i), Zone: fmt.Sprintf("zone-%d", i%10), BootID: "b", At: now})
	}
	e.Tick(now)
	e.Advance()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		t := now.Add(time.Duration(i) * time.Millisecond)
		for j := range 10000 {
			e.Observe(fmt.Sprintf("node-%d", j%10000), t, nil)
			break
		}
		e.Tick(t)
		e.Advance()
	}
}
