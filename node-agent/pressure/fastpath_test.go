package pressure

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nodefence/nodefence/node-agent/eviction"
)

// TestFastPathDetectsMemoryPressure: with housekeeping far away, only the fast path can see the
// crossing; the condition change must be sent within 200 ms. Memory starts 64Mi above the threshold,
// close enough for the fast path to read at its shortest interval.
func TestFastPathDetectsMemoryPressure(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := &reader{mem: gi + 64*mi, pid: 900}
	s := make(sender, 16)
	m, err := New(Config{
		Eviction:             parse(t, eviction.Flags{HardSet: true, Hard: "memory.available<1Gi,pid.available<10", PressureTransitionPeriod: time.Minute}),
		HousekeepingInterval: time.Hour, FastInterval: 20 * time.Millisecond, Log: slog.New(slog.DiscardHandler),
	}, r, s, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	for _, want := range []string{
		"CONDITION_TYPE_MEMORY_PRESSURE=CONDITION_STATUS_FALSE",
		"CONDITION_TYPE_DISK_PRESSURE=CONDITION_STATUS_FALSE",
		"CONDITION_TYPE_PID_PRESSURE=CONDITION_STATUS_FALSE",
	} {
		if got := describe(next(t, ctx, s)); got != want {
			t.Fatalf("initial condition %q, want %q", got, want)
		}
	}
	start := time.Now()
	r.set(gi - 1)
	got := next(t, ctx, s)
	took := time.Since(start)
	if describe(got) != "CONDITION_TYPE_MEMORY_PRESSURE=CONDITION_STATUS_TRUE" {
		t.Fatalf("got %s, want MemoryPressure true", describe(got))
	}
	if c := got.GetCondition(); c.Reason != "KubeletHasInsufficientMemory" || !strings.Contains(c.Message, "memory.available<1073741824") {
		t.Errorf("condition %v: want kubelet's reason and the threshold in the message", c)
	}
	t.Logf("detected in %v", took)
	if took > 200*time.Millisecond {
		t.Errorf("detection took %v, want <= 200ms", took)
	}
	// Back above: the condition stays for the transition period (a minute): nothing is sent.
	r.set(2 * gi)
	select {
	case m := <-s:
		t.Fatalf("unexpected %s within the transition period", describe(m))
	case <-time.After(100 * time.Millisecond):
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if r.fullReads != 1 {
		t.Errorf("%d full reads, want only the first housekeeping", r.fullReads)
	}
}

func TestFastDelay(t *testing.T) {
	const rate = 4 * gi
	tests := []struct {
		headroom int64
		want     time.Duration
	}{
		{-1, 50 * time.Millisecond}, // already met
		{0, 50 * time.Millisecond},
		{64 * mi, 50 * time.Millisecond}, // 15.6 ms at 4Gi/s: the floor
		{400 * mi, time.Duration(float64(400*mi) / float64(rate) * float64(time.Second))}, // ~98 ms
		{2 * gi, 500 * time.Millisecond},
		{20 * gi, time.Second}, // the ceiling
	}
	for _, tt := range tests {
		if got := FastDelay(tt.headroom, rate, 50*time.Millisecond, time.Second); got != tt.want {
			t.Errorf("FastDelay(%d) = %v, want %v", tt.headroom, got, tt.want)
		}
	}
}

// TestFastPathAdapts: far from every memory threshold the fast path reads at its longest interval,
// near one at its shortest.
func TestFastPathAdapts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reads := func(mem int64) int {
		r := &reader{mem: mem, pid: 900}
		m, err := New(Config{
			Eviction:             parse(t, eviction.Flags{HardSet: true, Hard: "memory.available<1Gi"}),
			HousekeepingInterval: time.Hour, FastInterval: 10 * time.Millisecond, FastCeiling: 200 * time.Millisecond,
			Log: slog.New(slog.DiscardHandler),
		}, r, make(sender, 16), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		rctx, stop := context.WithTimeout(ctx, 500*time.Millisecond)
		defer stop()
		_ = m.Run(rctx)
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.memReads
	}
	far, near := reads(7*gi), reads(gi+16*mi)
	t.Logf("reads in 500ms: far %d, near %d", far, near)
	if far > 3 || near < 20 {
		t.Errorf("reads in 500ms: far from the threshold %d (want <= 3), near it %d (want >= 20)", far, near)
	}
}

// allocReader is a reader that also reads allocatableMemory.available alone, as signals.Reader
// does for the fast path.
type allocReader struct {
	reader
	allocReads int
}

func (r *allocReader) setAlloc(v int64) {
	r.mu.Lock()
	r.alloc = v
	r.mu.Unlock()
}

func (r *allocReader) Allocatable() (int64, int64, bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.allocReads++
	return r.alloc, 6 * gi, r.alloc > 0, nil
}

// TestFastPathReadsAllocatable: the pods' cgroup crossing the allocatable copy of the hard
// memory threshold, with the node's memory plentiful and housekeeping an hour away, is seen by the
// fast path alone.
func TestFastPathReadsAllocatable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := &allocReader{reader: reader{mem: 6 * gi, pid: 900, alloc: 512 * mi}}
	s := make(sender, 16)
	m, err := New(Config{
		Eviction:             parse(t, eviction.Flags{HardSet: true, Hard: "memory.available<400Mi", AllocatableMemory: true, PressureTransitionPeriod: time.Minute}),
		HousekeepingInterval: time.Hour, FastInterval: 10 * time.Millisecond, FastCeiling: 50 * time.Millisecond, Log: slog.New(slog.DiscardHandler),
	}, r, s, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	for range 3 {
		if got := describe(next(t, ctx, s)); !strings.HasSuffix(got, "=CONDITION_STATUS_FALSE") {
			t.Fatalf("initial condition %q, want no pressure", got)
		}
	}
	r.setAlloc(300 * mi)
	got := next(t, ctx, s)
	if describe(got) != "CONDITION_TYPE_MEMORY_PRESSURE=CONDITION_STATUS_TRUE" || !strings.Contains(got.GetCondition().Message, eviction.SignalAllocatableMemoryAvailable) {
		t.Fatalf("got %s (%s), want MemoryPressure true for %s", describe(got), got.GetCondition().GetMessage(), eviction.SignalAllocatableMemoryAvailable)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if r.fullReads != 1 || r.allocReads == 0 {
		t.Errorf("%d full reads and %d allocatable reads, want only the first housekeeping and fast reads", r.fullReads, r.allocReads)
	}
}
