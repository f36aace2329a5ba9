package eviction

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// Signal names, as kubelet spells them.
const (
	SignalMemoryAvailable            = "memory.available"
	SignalAllocatableMemoryAvailable = "allocatableMemory.available"
	SignalNodeFSAvailable            = "nodefs.available"
	SignalNodeFSInodesFree           = "nodefs.inodesFree"
	SignalImageFSAvailable           = "imagefs.available"
	SignalImageFSInodesFree          = "imagefs.inodesFree"
	SignalContainerFSAvailable       = "containerfs.available"
	SignalContainerFSInodesFree      = "containerfs.inodesFree"
	SignalPIDAvailable               = "pid.available"
)

// Resolve returns the amount v stands for on a resource of the given capacity. A percentage is
// computed as kubelet computes it: the percentage is a float32 fraction (kubelet parses it with
// 32-bit precision and divides by 100), the product is truncated.
func (v Value) Resolve(capacity int64) int64 {
	if !v.IsPercent {
		return v.Quantity
	}
	frac := float32(v.Percent) / 100
	return int64(float64(capacity) * float64(frac))
}

// Observation is one signal's value at one moment: how much is available and of what capacity
// (bytes, inodes or pids). Percentages resolve against Capacity.
type Observation struct {
	Available int64
	Capacity  int64
	// Time is when the value was measured; the zero Time means unknown (always counted as new).
	Time time.Time
}

// Observations are the latest values of the signals, keyed by signal name. A signal that is not
// present is not observed, and its thresholds are never met.
type Observations map[string]Observation

// IsHard reports whether t is a hard threshold: one with no grace period.
func (t Threshold) IsHard() bool { return t.GracePeriod == 0 }

// Met reports whether t is met by o: the available amount is below the threshold, or, with
// withMinReclaim, below the threshold plus the minimum reclaim (the level eviction reclaims to).
func (t Threshold) Met(o Observation, withMinReclaim bool) bool {
	level := t.Value.Resolve(o.Capacity)
	if withMinReclaim {
		level += t.MinReclaim.Resolve(o.Capacity)
	}
	return o.Available < level
}

// ThresholdsMet returns the thresholds in ts that obs meets, in the order of ts (kubelet's
// thresholdsMet). Thresholds of unobserved signals are not met.
func ThresholdsMet(ts []Threshold, obs Observations, withMinReclaim bool) []Threshold {
	var out []Threshold
	for _, t := range ts {
		o, ok := obs[t.Signal]
		if ok && t.Met(o, withMinReclaim) {
			out = append(out, t)
		}
	}
	return out
}

// ThresholdsUpdatedStats returns the thresholds of ts whose signal was measured again since last
// (kubelet's thresholdsUpdatedStats): a threshold whose signal is not observed is dropped; one
// whose observation has no time, or whose signal was not observed last time, is kept; otherwise it
// is kept only when its observation is newer than last's. Acting only on fresh measurements keeps
// a value already acted on (a pod evicted for it) from causing a second eviction before the
// signal is read again.
func ThresholdsUpdatedStats(ts []Threshold, obs, last Observations) []Threshold {
	var out []Threshold
	for _, t := range ts {
		o, ok := obs[t.Signal]
		if !ok {
			continue
		}
		if l, seen := last[t.Signal]; !seen || o.Time.IsZero() || o.Time.After(l.Time) {
			out = append(out, t)
		}
	}
	return out
}

// ThresholdsFirstObservedAt returns when each threshold in met was first observed met: its time in
// prev if there, else now. Thresholds not in met are forgotten, so a threshold that stops being met
// starts its grace period afresh.
func ThresholdsFirstObservedAt(met []Threshold, prev map[Threshold]time.Time, now time.Time) map[Threshold]time.Time {
	out := make(map[Threshold]time.Time, len(met))
	for _, t := range met {
		if at, ok := prev[t]; ok {
			out[t] = at
		} else {
			out[t] = now
		}
	}
	return out
}

// ThresholdsMetGracePeriod returns the thresholds of firstObserved that have been met for at least
// their grace period at now, sorted by EvictionOrder. Hard thresholds (grace 0) qualify at once.
func ThresholdsMetGracePeriod(firstObserved map[Threshold]time.Time, now time.Time) []Threshold {
	var out []Threshold
	for t, at := range firstObserved {
		if now.Sub(at) >= t.GracePeriod {
			out = append(out, t)
		}
	}
	slices.SortFunc(out, EvictionOrder)
	return out
}

// EvictionOrder orders thresholds the way kubelet picks the one to reclaim first: memory signals
// first, pid.available last, the filesystem signals between; then by signal name, hard before soft,
// and by value, so that the order is total and deterministic.
func EvictionOrder(a, b Threshold) int {
	rank := func(s string) int {
		switch s {
		case SignalMemoryAvailable, SignalAllocatableMemoryAvailable:
			return 0
		case SignalPIDAvailable:
			return 2
		}
		return 1
	}
	if c := rank(a.Signal) - rank(b.Signal); c != 0 {
		return c
	}
	if c := strings.Compare(a.Signal, b.Signal); c != 0 {
		return c
	}
	if c := int64(a.GracePeriod - b.GracePeriod); c != 0 {
		return sign(c)
	}
	if a.Value.IsPercent != b.Value.IsPercent {
		if a.Value.IsPercent {
			return 1
		}
		return -1
	}
	if a.Value.Percent != b.Value.Percent {
		if a.Value.Percent < b.Value.Percent {
			return -1
		}
		return 1
	}
	return sign(a.Value.Quantity - b.Value.Quantity)
}

func sign(v int64) int {
	switch {
	case v < 0:
		return -1
	case v > 0:
		return 1
	}
	return 0
}

// Condition is a node condition that reports pressure on a resource.
type Condition int

// The pressure conditions, in the order they are reported.
const (
	MemoryPressure Condition = iota + 1
	DiskPressure
	PIDPressure
)

// Conditions lists every pressure condition, in report order.
var Conditions = []Condition{MemoryPressure, DiskPressure, PIDPressure}

func (c Condition) String() string {
	switch c {
	case MemoryPressure:
		return "MemoryPressure"
	case DiskPressure:
		return "DiskPressure"
	case PIDPressure:
		return "PIDPressure"
	}
	return fmt.Sprintf("Condition(%d)", int(c))
}

// ConditionOf maps a signal to the condition it drives (kubelet's signalToNodeCondition); ok is
// false for an unknown signal.
func ConditionOf(signal string) (c Condition, ok bool) {
	switch signal {
	case SignalMemoryAvailable, SignalAllocatableMemoryAvailable:
		return MemoryPressure, true
	case SignalNodeFSAvailable, SignalNodeFSInodesFree, SignalImageFSAvailable, SignalImageFSInodesFree,
		SignalContainerFSAvailable, SignalContainerFSInodesFree:
		return DiskPressure, true
	case SignalPIDAvailable:
		return PIDPressure, true
	}
	return 0, false
}

// ConditionState is the status of one condition after an observation.
type ConditionState struct {
	Condition Condition
	// Pressure is the condition's status: true while a threshold behind it is met and for the
	// pressure transition period after it was last met.
	Pressure bool
	// Reason explains the status, e.g. "threshold memory.available<104857600 met".
	Reason string
}

// Reclaim is a threshold whose grace period has passed: resources must be reclaimed (pods evicted)
// until the signal reaches Target.
type Reclaim struct {
	Threshold Threshold
	// Observed is the signal's value when the decision was made.
	Observed Observation
	// Target is the threshold plus its minimum reclaim: eviction goes on until Available >= Target.
	Target int64
	// Need is Target - Observed.Available (> 0 while the threshold is being reclaimed).
	Need int64
}

// Hard reports whether the threshold is hard: evicted pods get no grace period.
func (r Reclaim) Hard() bool { return r.Threshold.IsHard() }

// Result is what one observation decided.
type Result struct {
	// Met are the thresholds met at this observation whatever their grace period, including
	// thresholds still being reclaimed up to their minimum reclaim; in EvictionOrder.
	Met []Threshold
	// Conditions is the status of every condition, in Conditions order.
	Conditions []ConditionState
	// Changed are the conditions whose status differs from the previous observation's, in
	// Conditions order. The first observation reports every condition as changed.
	Changed []ConditionState
	// Reclaim are the thresholds whose grace period has passed, in EvictionOrder: the first one is
	// the one to act on.
	Reclaim []Reclaim
}

// Tracker applies an eviction Config to a series of observations, kubelet's synchronize step without
// the pods: grace periods of soft thresholds, minimum reclaim and the pressure transition period. It
// holds no clock: every call takes now. It is not safe for concurrent use.
type Tracker struct {
	cfg           Config
	thresholds    []Threshold
	firstObserved map[Threshold]time.Time
	lastMet       map[Condition]time.Time
	reclaiming    []Threshold
	reported      map[Condition]bool
	last          Observations
}

// NewTracker returns a Tracker for cfg's hard and soft thresholds.
func NewTracker(cfg Config) *Tracker {
	return &Tracker{
		cfg:        cfg,
		thresholds: append(slices.Clone(cfg.Hard), cfg.Soft...),
		lastMet:    map[Condition]time.Time{},
	}
}

// Observe evaluates obs taken at now.
//
//  1. The thresholds met now, plus the thresholds reclaimed at the previous observation that the
//     signal has not yet passed by their minimum reclaim, are "met".
//  2. A condition is under pressure when one of its thresholds was met (grace periods
//     notwithstanding) less than the pressure transition period before now; with a period of 0 it
//     never is, as in kubelet.
//  3. Met thresholds whose grace period has passed (hard ones at once) are to be reclaimed, each up to
//     its threshold plus its minimum reclaim - but only those whose signal was measured again since
//     the previous observation (ThresholdsUpdatedStats): a stale value is never acted on twice.
func (t *Tracker) Observe(now time.Time, obs Observations) Result {
	met := ThresholdsMet(t.thresholds, obs, false)
	for _, r := range ThresholdsMet(t.reclaiming, obs, true) {
		if !slices.Contains(met, r) {
			met = append(met, r)
		}
	}
	slices.SortFunc(met, EvictionOrder)
	t.firstObserved = ThresholdsFirstObservedAt(met, t.firstObserved, now)

	var res Result
	res.Met = met
	reasons := map[Condition][]string{}
	for _, th := range met {
		c, _ := ConditionOf(th.Signal)
		t.lastMet[c] = now
		reasons[c] = append(reasons[c], fmt.Sprintf("%s<%s", th.Signal, th.Value))
	}
	for _, c := range Conditions {
		last, ok := t.lastMet[c]
		// kubelet's nodeConditionsObservedSince: reported while now - last < the period, so with
		// a transition period of 0 a condition is never reported.
		pressure := ok && now.Sub(last) < t.cfg.PressureTransitionPeriod
		st := ConditionState{Condition: c, Pressure: pressure}
		switch {
		case len(reasons[c]) > 0 && pressure:
			st.Reason = "threshold met: " + strings.Join(reasons[c], ",")
		case len(reasons[c]) > 0:
			st.Reason = "threshold met: " + strings.Join(reasons[c], ",") + "; not reported with a pressure transition period of 0, as kubelet"
		case pressure:
			st.Reason = fmt.Sprintf("threshold not met since %s, within the pressure transition period %s", last.UTC().Format(time.RFC3339Nano), t.cfg.PressureTransitionPeriod)
		default:
			st.Reason = "no threshold met"
		}
		res.Conditions = append(res.Conditions, st)
		if prev, seen := t.reported[c]; !seen || prev != pressure {
			res.Changed = append(res.Changed, st)
		}
	}
	if t.reported == nil {
		t.reported = map[Condition]bool{}
	}
	for _, st := range res.Conditions {
		t.reported[st.Condition] = st.Pressure
	}

	t.reclaiming = ThresholdsMetGracePeriod(t.firstObserved, now)
	fresh := ThresholdsUpdatedStats(t.reclaiming, obs, t.last)
	t.last = maps.Clone(obs)
	for _, th := range fresh {
		o := obs[th.Signal]
		target := th.Value.Resolve(o.Capacity) + th.MinReclaim.Resolve(o.Capacity)
		res.Reclaim = append(res.Reclaim, Reclaim{Threshold: th, Observed: o, Target: target, Need: target - o.Available})
	}
	return res
}

// Layout is how the node's filesystems are split (seed 002, "three container filesystem options").
type Layout int

const (
	// LayoutSingle: everything on one nodefs; imagefs and containerfs are the same filesystem.
	LayoutSingle Layout = iota
	// LayoutSplitDisk: a dedicated imagefs holds images (read-only layers) and the containers'
	// writable layers; nodefs holds local volumes and logs.
	LayoutSplitDisk
	// LayoutSplitImage: containerfs (nodefs plus the writable layers) is on the root filesystem and a
	// separate imagefs holds only the images.
	LayoutSplitImage
)

func (l Layout) String() string {
	switch l {
	case LayoutSingle:
		return "single"
	case LayoutSplitDisk:
		return "split-disk"
	case LayoutSplitImage:
		return "split-image"
	}
	return fmt.Sprintf("Layout(%d)", int(l))
}

// DeriveContainerFS sets the containerfs thresholds as kubelet does: they cannot be configured, they
// follow the filesystem the writable layers live on — nodefs in LayoutSingle and LayoutSplitImage
// (where containerfs is the root filesystem), imagefs in LayoutSplitDisk. Configured containerfs
// thresholds are dropped and reported in warnings.
func DeriveContainerFS(cfg Config, layout Layout) (out Config, warnings []string) {
	from := "nodefs"
	if layout == LayoutSplitDisk {
		from = "imagefs"
	}
	derive := func(kind string, ts []Threshold) []Threshold {
		var res []Threshold
		for _, t := range ts {
			if strings.HasPrefix(t.Signal, "containerfs.") {
				warnings = append(warnings, fmt.Sprintf("--eviction-%s: %s<%s ignored: containerfs thresholds follow %s", kind, t.Signal, t.Value, from))
				continue
			}
			res = append(res, t)
		}
		for _, t := range ts {
			if rest, ok := strings.CutPrefix(t.Signal, from+"."); ok {
				t.Signal = "containerfs." + rest
				res = append(res, t)
			}
		}
		slices.SortFunc(res, func(a, b Threshold) int { return strings.Compare(a.Signal, b.Signal) })
		return res
	}
	out = cfg
	out.Hard = derive("hard", cfg.Hard)
	out.Soft = derive("soft", cfg.Soft)
	return out, warnings
}
