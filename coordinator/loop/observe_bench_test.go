package loop

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodefence/nodefence/coordinator/engine"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

// BenchmarkObserve10kParallel is the ingest hot path as the streams run it: samples of 10,000
// nodes recorded through Loop.Observe (the engine's lock, the engine, the ingest metrics) from
// concurrent goroutines.
func BenchmarkObserve10kParallel(b *testing.B) {
	l := New(Config{Metrics: NewMetrics(prometheus.NewRegistry())})
	e := engine.New(engine.DefaultConfig())
	now := time.Unix(1_800_000_000, 0)
	e.Step(engine.LeaderElected{At: now})
	names := make([]string, 10000)
	for i := range names {
		names[i] = fmt.Sprintf("agent-%d", i)
		e.Step(engine.Hello{Node: names[i], Zone: fmt.Sprintf("zone-%d", i%10), BootID: "b", At: now})
	}
	l.eng = e
	l.cfg.Now = func() time.Time { return now }
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		sample := &agentv1.SignalSample{Signals: []*agentv1.Signal{
			{Name: "memory.available", Available: 8 << 30}, {Name: "pid.available", Available: 4000000}}}
		for i := int(next.Add(1)) * 7919; pb.Next(); i += 7919 { // a stride through the nodes
			if ok, err := l.Observe(names[i%len(names)], now, sample); !ok || err != nil {
				b.Fatalf("observe: %v %v", ok, err)
			}
		}
	})
}
