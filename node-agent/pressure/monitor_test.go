package pressure

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

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
	alloc     int64 // allocatableMemory.available; 0: not a signal
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
	sigs := []*agentv1.Signal{
		{Name: eviction.SignalMemoryAvailable, Available: r.mem, Capacity: 8 * gi},
		{Name: eviction.SignalPIDAvailable, Available: r.pid, Capacity: 1000},
	}
	if r.alloc > 0 {
		sigs = append(sigs, &agentv1.Signal{Name: eviction.SignalAllocatableMemoryAvailable, Available: r.alloc, Capacity: 6 * gi})
	}
	return sigs, nil
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
	if e := m.GetEviction(); e != nil {
		return "eviction " + e.Kind.String() + " " + e.Namespace + "/" + e.Name + " " + e.GracePeriod.AsDuration().String()
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

// killer records kills; cleaned says whether a killed pod's resources are reclaimed.
type killer struct {
	mu      sync.Mutex
	killed  []string
	cleaned bool
	fail    error // returned by every Kill (the kill is still counted)
}

func (k *killer) Kill(_ context.Context, c eviction.Candidate, r eviction.Reclaim) (string, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.killed = append(k.killed, c.Name+"/"+c.GracePeriod.String())
	return "low on " + r.Threshold.Signal, k.fail
}

func (k *killer) CleanedUp(context.Context, eviction.Candidate) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.cleaned
}

func (k *killer) kills() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.killed)
}

var memPods = podList{
	{Namespace: "a", Name: "guaranteed", UID: "u1", MemoryRequest: gi, MemoryUsage: 500 * mi, GracePeriod: time.Minute},
	{Namespace: "a", Name: "besteffort", UID: "u2", MemoryUsage: 200 * mi, GracePeriod: time.Minute},
	{Namespace: "a", Name: "burstable", UID: "u3", MemoryRequest: 100 * mi, MemoryUsage: 300 * mi, GracePeriod: time.Minute},
}

// TestHardThresholdEvictsOnePodPerInterval: a hard threshold evicts at once, locally, the first
// pod of kubelet's ranking with grace 0 and reports it; the next evaluations evict nobody while the
// pod's resources are not reclaimed (kubelet's waitForPodsCleanup), then the next pod goes.
func TestHardThresholdEvictsOnePodPerInterval(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := &reader{mem: 900 * mi, pid: 900}
	s := make(sender, 64)
	k := &killer{}
	m, err := New(Config{
		Eviction:             parse(t, eviction.Flags{HardSet: true, Hard: "memory.available<1Gi", MinimumReclaim: "memory.available=200Mi", PressureTransitionPeriod: time.Minute}),
		HousekeepingInterval: time.Hour, FastInterval: -1, Log: slog.New(slog.DiscardHandler),
		Actions: Actions{Killer: k, Cleanup: k},
	}, r, s, memPods, nil)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1000, 0)
	m.housekeeping(ctx, t0)
	var got []string
	for len(s) > 0 {
		got = append(got, describe(<-s))
	}
	want := []string{
		"CONDITION_TYPE_MEMORY_PRESSURE=CONDITION_STATUS_TRUE",
		"CONDITION_TYPE_DISK_PRESSURE=CONDITION_STATUS_FALSE",
		"CONDITION_TYPE_PID_PRESSURE=CONDITION_STATUS_FALSE",
		"eviction EVICTION_KIND_HARD a/besteffort 0s",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("messages (-want +got):\n%s", diff)
	}
	// Still under pressure 10 s and 29 s later, the pod not cleaned up: nobody else is evicted.
	m.housekeeping(ctx, t0.Add(10*time.Second))
	m.housekeeping(ctx, t0.Add(29*time.Second))
	if diff := cmp.Diff([]string{"besteffort/0s"}, k.kills()); diff != "" {
		t.Errorf("kills while waiting for reclaim (-want +got):\n%s", diff)
	}
	// 30 s: kubelet's wait is over; the next pod of the ranking (the killed one is still listed).
	m.housekeeping(ctx, t0.Add(30*time.Second))
	if diff := cmp.Diff([]string{"besteffort/0s", "besteffort/0s"}, k.kills()); diff != "" {
		t.Errorf("kills after the wait (-want +got):\n%s", diff)
	}
	// Cleaned up at once: the next evaluation may evict again.
	k.mu.Lock()
	k.cleaned = true
	k.mu.Unlock()
	m.housekeeping(ctx, t0.Add(31*time.Second))
	if got := len(k.kills()); got != 3 {
		t.Errorf("kills after cleanup: %d, want 3", got)
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
		m.reclaim(ctx, eviction.Reclaim{Threshold: eviction.Threshold{Signal: tc.signal}, Need: 1}, time.Unix(0, 0))
		pods.mu.Lock()
		if pods.plain != tc.plain || pods.withDisks != tc.withDisks {
			t.Errorf("after ranking for %s: Pods %d times, PodsWithDisk %d times; want %d, %d", tc.signal, pods.plain, pods.withDisks, tc.plain, tc.withDisks)
		}
		pods.mu.Unlock()
	}
}

// TestNodeReclaimBeforeEvicting: for a filesystem signal the node-level reclaim runs first, with
// kubelet's functions for the layout; when it relieves the pressure no pod is evicted; for memory
// it never runs.
func TestNodeReclaimBeforeEvicting(t *testing.T) {
	tests := []struct {
		layout             eviction.Layout
		signal             string
		containers, images bool
	}{
		{eviction.LayoutSingle, eviction.SignalNodeFSAvailable, true, true},
		{eviction.LayoutSplitDisk, eviction.SignalNodeFSAvailable, false, false},
		{eviction.LayoutSplitDisk, eviction.SignalImageFSAvailable, true, true},
		{eviction.LayoutSplitImage, eviction.SignalImageFSAvailable, false, true},
		{eviction.LayoutSplitImage, eviction.SignalContainerFSInodesFree, true, false},
		{eviction.LayoutSingle, eviction.SignalMemoryAvailable, false, false},
	}
	for _, tt := range tests {
		c, i := nodeReclaimFor(tt.signal, tt.layout)
		if c != tt.containers || i != tt.images {
			t.Errorf("%s/%s: containers %v images %v; want %v %v", tt.layout, tt.signal, c, i, tt.containers, tt.images)
		}
	}

	ctx := context.Background()
	r := &reader{mem: 900 * mi, pid: 900}
	k := &killer{cleaned: true}
	var calls []string
	relieve := false
	m, err := New(Config{
		Eviction:             parse(t, eviction.Flags{HardSet: true, Hard: "pid.available<1000"}),
		HousekeepingInterval: time.Hour, FastInterval: -1, Log: slog.New(slog.DiscardHandler),
		Actions: Actions{Killer: k, Cleanup: k, Node: func(_ context.Context, c, i bool) (string, error) {
			calls = append(calls, fmt.Sprintf("containers=%v images=%v", c, i))
			if relieve {
				r.mu.Lock()
				r.pid = 1000 // what the reclaim freed
				r.mu.Unlock()
			}
			return "", nil
		}},
	}, r, make(sender, 64), memPods, nil)
	if err != nil {
		t.Fatal(err)
	}
	disk := eviction.Reclaim{Threshold: eviction.Threshold{Signal: eviction.SignalNodeFSAvailable, Value: eviction.Value{Quantity: 1}}, Need: 1}
	m.reclaim(ctx, disk, time.Unix(0, 0))
	if diff := cmp.Diff([]string{"containers=true images=true"}, calls); diff != "" || len(k.kills()) != 1 {
		t.Errorf("not relieved: calls %v kills %v", calls, k.kills())
	}
	relieve = true
	m.reclaim(ctx, disk, time.Unix(100, 0))
	if len(calls) != 2 || len(k.kills()) != 1 {
		t.Errorf("relieved: calls %v kills %v; want the reclaim and no eviction", calls, k.kills())
	}
	m.reclaim(ctx, eviction.Reclaim{Threshold: eviction.Threshold{Signal: eviction.SignalMemoryAvailable, Value: eviction.Value{Quantity: 1}}, Need: 1}, time.Unix(200, 0))
	if len(calls) != 2 {
		t.Errorf("memory ran the node-level reclaim: %v", calls)
	}
}

// TestStaleSignalIsNotActedOnTwice is kubelet's thresholdsUpdatedStats in the monitor: a hard
// allocatableMemory.available threshold evicts one pod at housekeeping; the fast path, which
// measures memory.available alone, must not evict again on the allocatable value it did not
// measure again; the next housekeeping (a new measurement, still under the threshold) does.
func TestStaleSignalIsNotActedOnTwice(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := &reader{mem: 4 * gi, pid: 900, alloc: 500 * mi}
	k := &killer{cleaned: true}
	m, err := New(Config{
		Eviction:             parse(t, eviction.Flags{HardSet: true, Hard: "allocatableMemory.available<1Gi", PressureTransitionPeriod: time.Minute}),
		HousekeepingInterval: time.Hour, Log: slog.New(slog.DiscardHandler),
		Actions: Actions{Killer: k, Cleanup: k},
	}, r, make(sender, 64), memPods, nil)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1000, 0)
	m.housekeeping(ctx, t0)
	if got := len(k.kills()); got != 1 {
		t.Fatalf("kills after housekeeping: %d, want 1", got)
	}
	m.fast(ctx, t0.Add(50*time.Millisecond))
	m.fast(ctx, t0.Add(100*time.Millisecond))
	if got := k.kills(); len(got) != 1 {
		t.Errorf("kills after fast reads that did not measure allocatable memory: %v, want 1", got)
	}
	m.housekeeping(ctx, t0.Add(10*time.Second))
	if got := len(k.kills()); got != 2 {
		t.Errorf("kills after a new measurement under the threshold: %d, want 2", got)
	}
}

// TestFailedKillWaitsLikeAnEviction: kubelet's evictPod counts a pod whose kill failed as the
// interval's eviction and waits for its cleanup; the agent does the same rather than trying again
// at every read.
func TestFailedKillWaitsLikeAnEviction(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := &reader{mem: 900 * mi, pid: 900}
	k := &killer{fail: fmt.Errorf("apiserver unreachable")}
	m, err := New(Config{
		Eviction:             parse(t, eviction.Flags{HardSet: true, Hard: "memory.available<1Gi", PressureTransitionPeriod: time.Minute}),
		HousekeepingInterval: time.Hour, Log: slog.New(slog.DiscardHandler),
		Actions: Actions{Killer: k, Cleanup: k},
	}, r, make(sender, 64), memPods, nil)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1000, 0)
	m.housekeeping(ctx, t0)
	for i := 1; i <= 5; i++ {
		m.fast(ctx, t0.Add(time.Duration(i)*50*time.Millisecond))
	}
	if got := k.kills(); len(got) != 1 {
		t.Errorf("kills within the cleanup wait after a failed kill: %v, want 1", got)
	}
	m.fast(ctx, t0.Add(DefaultCleanupTimeout))
	if got := k.kills(); len(got) != 2 {
		t.Errorf("kills once the cleanup wait is over: %v, want 2", got)
	}
}

// TestNothingEvaluatedDuringCleanup: as kubelet's eviction manager, the agent reads and evaluates
// nothing while it waits for an evicted pod's cleanup, so a threshold crossed meanwhile (pids here)
// is reported when the wait ends; with EvaluateDuringCleanup it is reported at once and only the
// next eviction waits.
func TestNothingEvaluatedDuringCleanup(t *testing.T) {
	for _, during := range []bool{false, true} {
		t.Run(fmt.Sprintf("EvaluateDuringCleanup=%v", during), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			r := &reader{mem: 900 * mi, pid: 900}
			s := make(sender, 64)
			k := &killer{}
			m, err := New(Config{
				Eviction:             parse(t, eviction.Flags{HardSet: true, Hard: "memory.available<1Gi,pid.available<100", PressureTransitionPeriod: time.Minute}),
				HousekeepingInterval: time.Hour, Log: slog.New(slog.DiscardHandler), EvaluateDuringCleanup: during,
				Actions: Actions{Killer: k, Cleanup: k},
			}, r, s, memPods, nil)
			if err != nil {
				t.Fatal(err)
			}
			pidPressure := func() bool {
				found := false
				for len(s) > 0 {
					if describe(<-s) == "CONDITION_TYPE_PID_PRESSURE=CONDITION_STATUS_TRUE" {
						found = true
					}
				}
				return found
			}
			t0 := time.Unix(1000, 0)
			m.housekeeping(ctx, t0)
			pidPressure()
			r.mu.Lock()
			r.pid, r.fullReads = 50, 0
			r.mu.Unlock()
			m.housekeeping(ctx, t0.Add(10*time.Second))
			m.fast(ctx, t0.Add(11*time.Second))
			if got := pidPressure(); got != during {
				t.Errorf("PIDPressure reported during the cleanup wait: %v, want %v", got, during)
			}
			if reads := r.fullReads; (reads > 0) != during {
				t.Errorf("%d reads during the cleanup wait", reads)
			}
			m.housekeeping(ctx, t0.Add(30*time.Second)) // the wait is over
			if !during && !pidPressure() {
				t.Error("PIDPressure not reported once the wait is over")
			}
			if got := len(k.kills()); got != 2 {
				t.Errorf("%d kills, want one before and one after the wait", got)
			}
		})
	}
}
