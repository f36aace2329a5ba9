package eviction

import (
	"math/rand"
	"reflect"
	"slices"
	"testing"
	"testing/quick"
	"time"

	"github.com/google/go-cmp/cmp"
)

const (
	mi = int64(1) << 20
	gi = int64(1) << 30
)

func mustParse(t *testing.T, f Flags) Config {
	t.Helper()
	cfg, errs := Parse(f)
	if len(errs) > 0 {
		t.Fatalf("Parse(%+v): %v", f, errs)
	}
	return cfg
}

func TestValueResolve(t *testing.T) {
	tests := []struct {
		v        Value
		capacity int64
		want     int64
	}{
		{Value{Quantity: 100 * mi}, 8 * gi, 100 * mi},
		// Seed: on a 10GiB node memory.available<10% is about 1GiB; float32 like kubelet.
		{Value{Percent: 10, IsPercent: true}, 10 * gi, int64(float64(10*gi) * float64(float32(10)/100))},
		{Value{Percent: 100, IsPercent: true}, 1000, 1000},
		{Value{Percent: 5, IsPercent: true}, 1_000_000, 50000},
		{Value{}, 1000, 0},
	}
	for _, tt := range tests {
		if got := tt.v.Resolve(tt.capacity); got != tt.want {
			t.Errorf("%v.Resolve(%d) = %d, want %d", tt.v, tt.capacity, got, tt.want)
		}
	}
	// The float32 fraction is what makes 10% of 10Gi a little above 1Gi.
	if got := (Value{Percent: 10, IsPercent: true}).Resolve(10 * gi); got <= gi {
		t.Errorf("10%% of 10Gi = %d, want just above 1Gi as kubelet computes it", got)
	}
}

func TestThresholdsMet(t *testing.T) {
	cfg := mustParse(t, Flags{}) // kubelet's defaults
	capacity := 10 * gi
	tests := []struct {
		name string
		obs  Observations
		want []string
	}{
		{"nothing observed", Observations{}, nil},
		{"all fine", Observations{
			SignalMemoryAvailable:   {Available: 2 * gi, Capacity: capacity},
			SignalNodeFSAvailable:   {Available: 50 * gi, Capacity: 100 * gi},
			SignalNodeFSInodesFree:  {Available: 900, Capacity: 1000},
			SignalImageFSAvailable:  {Available: 50 * gi, Capacity: 100 * gi},
			SignalImageFSInodesFree: {Available: 900, Capacity: 1000},
		}, nil},
		{"memory exactly at 100Mi is not below it", Observations{SignalMemoryAvailable: {Available: 100 * mi, Capacity: capacity}}, nil},
		{"memory one byte below", Observations{SignalMemoryAvailable: {Available: 100*mi - 1, Capacity: capacity}}, []string{SignalMemoryAvailable}},
		{"nodefs 9% and imagefs 14%", Observations{
			SignalNodeFSAvailable:  {Available: 9 * gi, Capacity: 100 * gi},
			SignalImageFSAvailable: {Available: 14 * gi, Capacity: 100 * gi},
		}, []string{SignalImageFSAvailable, SignalNodeFSAvailable}},
		// float32(15)/100 is a little above 0.15, so exactly 15% is met, as in kubelet.
		{"imagefs exactly 15% is met (float32)", Observations{SignalImageFSAvailable: {Available: 15 * gi, Capacity: 100 * gi}}, []string{SignalImageFSAvailable}},
		{"imagefs 15.1%", Observations{SignalImageFSAvailable: {Available: 151 * gi / 10, Capacity: 100 * gi}}, nil},
		{"inodes below 5%", Observations{SignalNodeFSInodesFree: {Available: 49, Capacity: 1000}}, []string{SignalNodeFSInodesFree}},
		{"pid has no default threshold", Observations{SignalPIDAvailable: {Available: 0, Capacity: 1000}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, th := range ThresholdsMet(cfg.Hard, tt.obs, false) {
				got = append(got, th.Signal)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("met (-want +got):\n%s", diff)
			}
		})
	}
}

// TestMinimumReclaim is seed 002's example: evictionHard nodefs.available 1Gi, imagefs.available
// 100Gi; minimum reclaims 500Mi and 2Gi.
func TestMinimumReclaim(t *testing.T) {
	cfg := mustParse(t, Flags{HardSet: true, Hard: "memory.available<500Mi,nodefs.available<1Gi,imagefs.available<100Gi",
		MinimumReclaim: "memory.available=0Mi,nodefs.available=500Mi,imagefs.available=2Gi", PressureTransitionPeriod: 5 * time.Minute})
	t0 := time.Unix(1_700_000_000, 0)
	obs := func(nodefs, imagefs int64) Observations {
		return Observations{
			SignalMemoryAvailable:  {Available: 4 * gi, Capacity: 8 * gi},
			SignalNodeFSAvailable:  {Available: nodefs, Capacity: 100 * gi},
			SignalImageFSAvailable: {Available: imagefs, Capacity: 1000 * gi},
		}
	}
	type reclaim struct {
		Signal       string
		Target, Need int64
	}
	steps := []struct {
		nodefs, imagefs int64
		want            []reclaim
		pressure        bool
	}{
		{2 * gi, 200 * gi, nil, false},
		// Below 1Gi: reclaim until 1.5Gi.
		{900 * mi, 200 * gi, []reclaim{{SignalNodeFSAvailable, 1524 * mi, 624 * mi}}, true},
		// Above the threshold but below threshold + min reclaim: still reclaiming.
		{1200 * mi, 200 * gi, []reclaim{{SignalNodeFSAvailable, 1524 * mi, 324 * mi}}, true},
		// imagefs below 100Gi: reclaim to 102Gi.
		{1200 * mi, 99 * gi, []reclaim{{SignalImageFSAvailable, 102 * gi, 3 * gi}, {SignalNodeFSAvailable, 1524 * mi, 324 * mi}}, true},
		// nodefs reached 1Gi+500Mi: done; imagefs at 101Gi still short of 102Gi.
		{1536 * mi, 101 * gi, []reclaim{{SignalImageFSAvailable, 102 * gi, gi}}, true},
		{1536 * mi, 102 * gi, nil, true}, // DiskPressure stays for the transition period
	}
	tr := NewTracker(cfg)
	for i, s := range steps {
		res := tr.Observe(t0.Add(time.Duration(i)*time.Second), obs(s.nodefs, s.imagefs))
		var got []reclaim
		for _, r := range res.Reclaim {
			got = append(got, reclaim{r.Threshold.Signal, r.Target, r.Need})
		}
		if diff := cmp.Diff(s.want, got); diff != "" {
			t.Errorf("step %d: reclaim (-want +got):\n%s", i, diff)
		}
		if p := res.Conditions[1]; p.Condition != DiskPressure || p.Pressure != s.pressure {
			t.Errorf("step %d: %+v, want DiskPressure=%v", i, p, s.pressure)
		}
	}
}

// TestSoftGraceAndTransition follows seed 002: a soft threshold memory.available<1.5Gi with grace
// 1m30s sets MemoryPressure at once but reclaims only after 90 s; the condition is cleared only after
// the 5m transition period without the threshold met; oscillation restarts the grace period.
func TestSoftGraceAndTransition(t *testing.T) {
	cfg := mustParse(t, Flags{HardSet: true, Hard: "memory.available<100Mi", Soft: "memory.available<1.5Gi",
		SoftGracePeriod: "memory.available=1m30s", PressureTransitionPeriod: 5 * time.Minute})
	t0 := time.Unix(1_700_000_000, 0)
	mem := func(avail int64) Observations {
		return Observations{SignalMemoryAvailable: {Available: avail, Capacity: 10 * gi}}
	}
	type step struct {
		at       time.Duration
		avail    int64
		pressure bool
		changed  bool
		reclaim  []string // "hard" or "soft"
	}
	steps := []step{
		{0, 4 * gi, false, true, nil}, // first observation reports every condition
		{10 * time.Second, gi, true, true, nil},
		{99 * time.Second, gi, true, false, nil}, // 89 s into the grace period
		{100 * time.Second, gi, true, false, []string{"soft"}},
		{110 * time.Second, 50 * mi, true, false, []string{"hard", "soft"}},
		{120 * time.Second, 2 * gi, true, false, nil}, // not met: within the transition period
		{130 * time.Second, gi, true, false, nil},     // met again: grace starts afresh
		{219 * time.Second, gi, true, false, nil},
		{220 * time.Second, gi, true, false, []string{"soft"}},
		{230 * time.Second, 3 * gi, true, false, nil},
		{220*time.Second + 5*time.Minute - 1, 3 * gi, true, false, nil}, // last met at 220 s
		{220*time.Second + 5*time.Minute, 3 * gi, false, true, nil},
	}
	tr := NewTracker(cfg)
	for i, s := range steps {
		res := tr.Observe(t0.Add(s.at), mem(s.avail))
		var got []string
		for _, r := range res.Reclaim {
			got = append(got, map[bool]string{true: "hard", false: "soft"}[r.Hard()])
		}
		if diff := cmp.Diff(s.reclaim, got); diff != "" {
			t.Errorf("step %d (%v): reclaim (-want +got):\n%s", i, s.at, diff)
		}
		mp := res.Conditions[0]
		if mp.Condition != MemoryPressure || mp.Pressure != s.pressure {
			t.Errorf("step %d (%v): %+v, want pressure %v", i, s.at, mp, s.pressure)
		}
		changed := slices.ContainsFunc(res.Changed, func(c ConditionState) bool { return c.Condition == MemoryPressure })
		if changed != s.changed {
			t.Errorf("step %d (%v): changed=%v, want %v (%+v)", i, s.at, changed, s.changed, res.Changed)
		}
	}
}

func TestZeroTransitionPeriod(t *testing.T) {
	cfg := mustParse(t, Flags{HardSet: true, Hard: "pid.available<10"})
	tr := NewTracker(cfg)
	t0 := time.Unix(0, 0)
	for i, s := range []struct {
		avail    int64
		pressure bool
	}{{100, false}, {5, false}, {50, false}} { // kubelet: now - last < 0 never holds
		res := tr.Observe(t0.Add(time.Duration(i)*time.Second), Observations{SignalPIDAvailable: {Available: s.avail, Capacity: 1000}})
		if got := res.Conditions[2]; got.Condition != PIDPressure || got.Pressure != s.pressure {
			t.Errorf("step %d: %+v, want PIDPressure=%v", i, got, s.pressure)
		}
	}
}

func TestDeriveContainerFS(t *testing.T) {
	cfg := mustParse(t, Flags{HardSet: true, Hard: "nodefs.available<10%,imagefs.available<15%,containerfs.available<1Gi,nodefs.inodesFree<5%"})
	sig := func(c Config) []string {
		var out []string
		for _, th := range c.Hard {
			out = append(out, th.Signal+"<"+th.Value.String())
		}
		return out
	}
	for _, tt := range []struct {
		layout Layout
		want   []string
	}{
		{LayoutSingle, []string{"containerfs.available<10%", "containerfs.inodesFree<5%", "imagefs.available<15%", "nodefs.available<10%", "nodefs.inodesFree<5%"}},
		{LayoutSplitDisk, []string{"containerfs.available<15%", "imagefs.available<15%", "nodefs.available<10%", "nodefs.inodesFree<5%"}},
		{LayoutSplitImage, []string{"containerfs.available<10%", "containerfs.inodesFree<5%", "imagefs.available<15%", "nodefs.available<10%", "nodefs.inodesFree<5%"}},
	} {
		got, warnings := DeriveContainerFS(cfg, tt.layout)
		if diff := cmp.Diff(tt.want, sig(got)); diff != "" {
			t.Errorf("%v (-want +got):\n%s", tt.layout, diff)
		}
		if len(warnings) != 1 {
			t.Errorf("%v: warnings %q, want one about containerfs.available", tt.layout, warnings)
		}
	}
}

// history is a random series of memory and pid observations for the reference check.
type history struct {
	Times []time.Duration // offsets from t0, increasing
	Mem   []int64
	PID   []int64
}

func (history) Generate(r *rand.Rand, size int) reflect.Value {
	n := 1 + r.Intn(40)
	h := history{}
	var at time.Duration
	for range n {
		at += time.Duration(r.Intn(4)) * 20 * time.Second
		h.Times = append(h.Times, at)
		h.Mem = append(h.Mem, int64(r.Intn(6))*256*mi)
		h.PID = append(h.PID, int64(r.Intn(4))*10)
	}
	return reflect.ValueOf(h)
}

// reference computes, by brute force over the whole history, the conditions and the thresholds to
// reclaim at each step, for thresholds without minimum reclaim.
func reference(cfg Config, t0 time.Time, h history) []string {
	thresholds := append(slices.Clone(cfg.Hard), cfg.Soft...)
	obsAt := func(i int) Observations {
		return Observations{
			SignalMemoryAvailable: {Available: h.Mem[i], Capacity: 4 * gi},
			SignalPIDAvailable:    {Available: h.PID[i], Capacity: 100},
		}
	}
	metAt := func(th Threshold, i int) bool { return th.Met(obsAt(i)[th.Signal], false) }
	var out []string
	for i := range h.Times {
		line := ""
		for _, c := range Conditions {
			pressure := false
			for j := 0; j <= i; j++ {
				for _, th := range thresholds {
					if cc, _ := ConditionOf(th.Signal); cc == c && metAt(th, j) && (j == i || h.Times[i]-h.Times[j] < cfg.PressureTransitionPeriod) {
						pressure = true
					}
				}
			}
			line += c.String() + "=" + map[bool]string{true: "T ", false: "F "}[pressure]
		}
		var reclaim []Threshold
		for _, th := range thresholds {
			// Met continuously since step j, and for at least its grace period.
			j := i
			for j >= 0 && metAt(th, j) {
				j--
			}
			if j < i && h.Times[i]-h.Times[j+1] >= th.GracePeriod {
				reclaim = append(reclaim, th)
			}
		}
		slices.SortFunc(reclaim, EvictionOrder)
		for _, th := range reclaim {
			line += th.Signal + "<" + th.Value.String() + "/" + th.GracePeriod.String() + " "
		}
		out = append(out, line)
	}
	return out
}

func tracked(cfg Config, t0 time.Time, h history) []string {
	tr := NewTracker(cfg)
	var out []string
	for i, at := range h.Times {
		res := tr.Observe(t0.Add(at), Observations{
			SignalMemoryAvailable: {Available: h.Mem[i], Capacity: 4 * gi},
			SignalPIDAvailable:    {Available: h.PID[i], Capacity: 100},
		})
		line := ""
		for _, c := range res.Conditions {
			line += c.Condition.String() + "=" + map[bool]string{true: "T ", false: "F "}[c.Pressure]
		}
		for _, r := range res.Reclaim {
			line += r.Threshold.Signal + "<" + r.Threshold.Value.String() + "/" + r.Threshold.GracePeriod.String() + " "
		}
		out = append(out, line)
	}
	return out
}

// TestTrackerAgainstReference checks the Tracker against a brute-force reading of the rules over
// random histories.
func TestTrackerAgainstReference(t *testing.T) {
	cfg := mustParse(t, Flags{HardSet: true, Hard: "memory.available<512Mi,pid.available<10",
		Soft: "memory.available<1Gi,pid.available<20", SoftGracePeriod: "memory.available=1m,pid.available=40s",
		PressureTransitionPeriod: 80 * time.Second})
	t0 := time.Unix(1_700_000_000, 0)
	if err := quick.CheckEqual(func(h history) []string { return reference(cfg, t0, h) },
		func(h history) []string { return tracked(cfg, t0, h) }, &quick.Config{MaxCount: 500}); err != nil {
		t.Fatal(err)
	}
}

// TestKubeletThresholdTables are kubelet's helpers_test.go tables for thresholdsFirstObservedAt,
// thresholdsMetGracePeriod, nodeConditionsObservedSince and parsePercentage, on this package's
// functions.
func TestKubeletThresholdTables(t *testing.T) {
	now := time.Unix(10000, 0)
	old := now.Add(-time.Minute)
	hard := Threshold{Signal: SignalMemoryAvailable, Value: Value{Quantity: 1 << 30}}
	soft := Threshold{Signal: SignalMemoryAvailable, Value: Value{Quantity: 2 << 30}, GracePeriod: time.Minute}

	// thresholdsFirstObservedAt
	for name, tc := range map[string]struct {
		met  []Threshold
		prev map[Threshold]time.Time
		want map[Threshold]time.Time
	}{
		"empty":                   {nil, map[Threshold]time.Time{}, map[Threshold]time.Time{}},
		"no-previous-observation": {[]Threshold{hard}, map[Threshold]time.Time{}, map[Threshold]time.Time{hard: now}},
		"previous-observation":    {[]Threshold{hard}, map[Threshold]time.Time{hard: old}, map[Threshold]time.Time{hard: old}},
	} {
		if diff := cmp.Diff(tc.want, ThresholdsFirstObservedAt(tc.met, tc.prev, now)); diff != "" {
			t.Errorf("thresholdsFirstObservedAt %s (-want +got):\n%s", name, diff)
		}
	}

	// thresholdsMetGracePeriod
	older := now.Add(-2 * time.Minute)
	for name, tc := range map[string]struct {
		observed map[Threshold]time.Time
		want     []Threshold
	}{
		"empty":                  {map[Threshold]time.Time{}, nil},
		"hard-threshold-met":     {map[Threshold]time.Time{hard: now}, []Threshold{hard}},
		"soft-threshold-not-met": {map[Threshold]time.Time{soft: now}, nil},
		"soft-threshold-met":     {map[Threshold]time.Time{soft: older}, []Threshold{soft}},
	} {
		if diff := cmp.Diff(tc.want, ThresholdsMetGracePeriod(tc.observed, now)); diff != "" {
			t.Errorf("thresholdsMetGracePeriod %s (-want +got):\n%s", name, diff)
		}
	}

	// nodeConditionsObservedSince: a condition last observed 1m ago is reported within a 2m
	// transition period and not within 30s.
	for name, tc := range map[string]struct {
		period time.Duration
		want   bool
	}{"in-period": {2 * time.Minute, true}, "out-of-period": {30 * time.Second, false}} {
		tr := NewTracker(Config{Hard: []Threshold{hard}, PressureTransitionPeriod: tc.period})
		tr.Observe(old, Observations{SignalMemoryAvailable: {Available: 1, Capacity: 8 << 30}})
		res := tr.Observe(now, Observations{SignalMemoryAvailable: {Available: 4 << 30, Capacity: 8 << 30}})
		if got := res.Conditions[0].Pressure; got != tc.want {
			t.Errorf("nodeConditionsObservedSince %s: MemoryPressure %v, want %v", name, got, tc.want)
		}
	}

	// parsePercentage, through a threshold.
	for in, tc := range map[string]struct {
		bad  bool
		want float64
	}{"blah": {bad: true}, "25.5%": {want: float64(float32(25.5))}, "foo%": {bad: true}, "12%345": {bad: true}} {
		v, err := parseValue(in, false)
		if (err != nil) != tc.bad || (!tc.bad && v.Percent != tc.want) {
			t.Errorf("parsePercentage %q = %+v, %v; want %v (error %v)", in, v, err, tc.want, tc.bad)
		}
	}
}

// TestThresholdsUpdatedStats is kubelet's table for thresholdsUpdatedStats: a threshold is acted
// on only when its signal's observation is newer than the last one, or has no time, or has no
// last one.
func TestThresholdsUpdatedStats(t *testing.T) {
	mem := Threshold{Signal: SignalMemoryAvailable}
	at := func(min int) Observation { return Observation{Time: time.Date(2016, 1, 1, 0, min, 0, 0, time.UTC)} }
	for _, tc := range []struct {
		name      string
		ts        []Threshold
		obs, last Observations
		want      []Threshold
	}{
		{"nothing", nil, Observations{}, Observations{}, nil},
		{"observation without a time", []Threshold{mem}, Observations{SignalMemoryAvailable: {}}, Observations{}, []Threshold{mem}},
		{"no last observation", []Threshold{mem}, Observations{SignalMemoryAvailable: at(0)}, Observations{}, []Threshold{mem}},
		{"older than the last", []Threshold{mem}, Observations{SignalMemoryAvailable: at(0)}, Observations{SignalMemoryAvailable: at(1)}, nil},
		{"the same observation", []Threshold{mem}, Observations{SignalMemoryAvailable: at(0)}, Observations{SignalMemoryAvailable: at(0)}, nil},
		{"a new observation", []Threshold{mem}, Observations{SignalMemoryAvailable: at(1)}, Observations{SignalMemoryAvailable: at(0)}, []Threshold{mem}},
		{"signal not observed", []Threshold{mem}, Observations{SignalPIDAvailable: at(1)}, Observations{}, nil},
	} {
		if got := ThresholdsUpdatedStats(tc.ts, tc.obs, tc.last); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestTrackerActsOnFreshStatsOnly: the Tracker offers a met hard threshold for reclaim once per
// measurement; the same measurement seen again is not offered, a newer one is.
func TestTrackerActsOnFreshStatsOnly(t *testing.T) {
	tr := NewTracker(mustParse(t, Flags{HardSet: true, Hard: "memory.available<1Gi", PressureTransitionPeriod: time.Minute}))
	t0 := time.Unix(100, 0)
	low := func(at time.Time) Observations {
		return Observations{SignalMemoryAvailable: {Available: 1 << 29, Capacity: 8 << 30, Time: at}}
	}
	if res := tr.Observe(t0, low(t0)); len(res.Reclaim) != 1 {
		t.Fatalf("first measurement: reclaim %v, want memory.available", res.Reclaim)
	}
	res := tr.Observe(t0.Add(time.Second), low(t0))
	if len(res.Reclaim) != 0 {
		t.Errorf("same measurement again: reclaim %v, want none", res.Reclaim)
	}
	if len(res.Met) != 1 || !res.Conditions[0].Pressure {
		t.Errorf("same measurement again: met %v, conditions %v; the threshold is still met", res.Met, res.Conditions)
	}
	if res := tr.Observe(t0.Add(2*time.Second), low(t0.Add(2*time.Second))); len(res.Reclaim) != 1 {
		t.Errorf("new measurement: reclaim %v, want memory.available", res.Reclaim)
	}
}
