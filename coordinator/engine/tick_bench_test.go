package engine

import (
	"fmt"
	"testing"
	"time"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
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
		e.Tick(now.Add(time.Duration(i) * time.Millisecond)) // within the grace period: nodes stay Ready
		e.Advance()
	}
}

// BenchmarkObserve10k is the hot path: one sample of two signals from one of 10,000 nodes.
func BenchmarkObserve10k(b *testing.B) {
	e := New(DefaultConfig())
	now := time.Unix(1_700_000_000, 0)
	names := make([]string, 10000)
	for i := range names {
		names[i] = fmt.Sprintf("agent-%d", i)
		e.Step(Hello{Node: names[i], Zone: fmt.Sprintf("zone-%d", i%10), BootID: "b", At: now})
	}
	sample := &agentv1.SignalSample{Signals: []*agentv1.Signal{
		{Name: "memory.available", Available: 8 << 30}, {Name: "pid.available", Available: 4000000}}}
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		// A stride through the nodes, like samples arriving from many agents.
		e.Observe(names[(i*7919)%len(names)], now, sample)
	}
}
