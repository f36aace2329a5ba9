package pressure

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodefence/nodefence/node-agent/eviction"
	"github.com/nodefence/nodefence/node-agent/signals"
	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

const (
	mi = int64(1) << 20
	gi = int64(1) << 30
)

// reader serves settable values.
type reader struct {
	mu        sync.Mutex
	mem       int64
	pid       int64
	fullReads int
	memReads  int
}

func (r *reader) set(mem int64) {
	r.mu.Lock()
	r.mem = mem
	r.mu.Unlock()
}

func (r *reader) Read() ([]*agentv1.Signal, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fullReads++
	return []*agentv1.Signal{
		{Name: eviction.SignalMemoryAvailable, Available: r.mem, Capacity: 8 * gi},
		{Name: eviction.SignalPIDAvailable, Available: r.pid, Capacity: 1000},
	}, nil
}

func (r *reader) Memory() (signals.Memory, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.memReads++
	return signals.Memory{Available: r.mem, Capacity: 8 * gi}, nil
}

type sender chan *agentv1.ConnectRequest

func (s sender) Send(m *agentv1.ConnectRequest) { s <- m }

type podList []eviction.Pod

func (p podList) Pods(context.Context) ([]eviction.Pod, error) { return p, nil }

func next(t *testing.T, ctx context.Context, s sender) *agentv1.ConnectRequest {
	t.Helper()
	select {
	case m := <-s:
		return m
	case <-ctx.Done():
		t.Fatal("timed out waiting for a message")
		return nil
	}
}

func describe(m *agentv1.ConnectRequest) string {
	if c := m.GetCondition(); c != nil {
		return c.Type.String() + "=" + c.Status.String()
	}
	if c := m.GetCandidates(); c != nil {
		var names []string
		for _, p := range c.Candidates {
			names = append(names, p.Name+"/"+p.GracePeriod.AsDuration().String())
		}
		return "candidates " + c.Signal + " " + strings.Join(names, ",")
	}
	return m.String()
}

func parse(t *testing.T, f eviction.Flags) eviction.Config {
	t.Helper()
	cfg, errs := eviction.Parse(f)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	return cfg
}

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

// TestCandidatesProposed: with a pod source, a hard threshold met at housekeeping proposes the ranked
// pods that cover the minimum reclaim, with grace 0.
func TestCandidatesProposed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := &reader{mem: 900 * mi, pid: 900}
	s := make(sender, 16)
	pods := podList{
		{Namespace: "a", Name: "guaranteed", MemoryRequest: gi, MemoryUsage: 500 * mi, GracePeriod: time.Minute},
		{Namespace: "a", Name: "besteffort", MemoryUsage: 200 * mi, GracePeriod: time.Minute},
		{Namespace: "a", Name: "burstable", MemoryRequest: 100 * mi, MemoryUsage: 300 * mi, GracePeriod: time.Minute},
	}
	m, err := New(Config{
		Eviction: parse(t, eviction.Flags{HardSet: true, Hard: "memory.available<1Gi", MinimumReclaim: "memory.available=200Mi"}),
		// 1Gi + 200Mi - 900Mi = 324Mi to reclaim: besteffort (200Mi) and burstable (300Mi).
		HousekeepingInterval: time.Hour, FastInterval: -1, Log: slog.New(slog.DiscardHandler),
	}, r, s, pods, nil)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = m.Run(ctx) }()
	var got []string
	for range 4 {
		got = append(got, describe(next(t, ctx, s)))
	}
	want := []string{
		"CONDITION_TYPE_MEMORY_PRESSURE=CONDITION_STATUS_TRUE",
		"CONDITION_TYPE_DISK_PRESSURE=CONDITION_STATUS_FALSE",
		"CONDITION_TYPE_PID_PRESSURE=CONDITION_STATUS_FALSE",
		"candidates memory.available besteffort/0s,burstable/0s",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
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

// diskAwarePods records which listing ranking asked for.
type diskAwarePods struct {
	podList
	mu               sync.Mutex
	plain, withDisks int
}

func (d *diskAwarePods) Pods(ctx context.Context) ([]eviction.Pod, error) {
	d.mu.Lock()
	d.plain++
	d.mu.Unlock()
	return d.podList, nil
}

func (d *diskAwarePods) PodsWithDisk(ctx context.Context) ([]eviction.Pod, error) {
	d.mu.Lock()
	d.withDisks++
	d.mu.Unlock()
	return d.podList, nil
}

// TestOnlyDiskRankingMeasuresDisk: pods' disk use, costly to measure, is asked for when ranking on
// a filesystem signal and not for memory or pids.
func TestOnlyDiskRankingMeasuresDisk(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pods := &diskAwarePods{podList: podList{{Namespace: "a", Name: "p", GracePeriod: time.Minute}}}
	m, err := New(Config{
		Eviction:             parse(t, eviction.Flags{HardSet: true, Hard: "memory.available<1Gi"}),
		HousekeepingInterval: time.Hour, FastInterval: -1, Log: slog.New(slog.DiscardHandler),
	}, &reader{mem: 8 * gi, pid: 900}, make(sender, 16), pods, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		signal           string
		plain, withDisks int
	}{
		{eviction.SignalMemoryAvailable, 1, 0}, {eviction.SignalPIDAvailable, 2, 0},
		{eviction.SignalNodeFSAvailable, 2, 1}, {eviction.SignalImageFSInodesFree, 2, 2},
	} {
		m.propose(ctx, eviction.Reclaim{Threshold: eviction.Threshold{Signal: tc.signal}, Need: 1})
		pods.mu.Lock()
		if pods.plain != tc.plain || pods.withDisks != tc.withDisks {
			t.Errorf("after ranking for %s: Pods %d times, PodsWithDisk %d times; want %d, %d", tc.signal, pods.plain, pods.withDisks, tc.plain, tc.withDisks)
		}
		pods.mu.Unlock()
	}
}
