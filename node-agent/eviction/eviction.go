// Package eviction parses kubelet's node-pressure eviction flags with kubelet's syntax and rules:
// hard and soft thresholds ("memory.available<100Mi,nodefs.available<10%"), soft grace periods
// ("memory.available=1m30s"), minimum reclaims ("memory.available=500Mi" or "5%"), the pressure
// transition period and the maximum pod grace period.
//
// Beyond parsing, everything here is pure (no clock, no I/O; time comes in as now):
//   - Tracker applies a Config to a series of signal observations: thresholds met, soft grace
//     periods, node conditions with the pressure transition period, and minimum reclaim.
//   - Rank and Candidates order pods for eviction with composable comparators, per signal and
//     filesystem Layout, and give each candidate its eviction grace period.
package eviction

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Signals kubelet knows (allocatableMemory.available is accepted by kubelet's --eviction-* too).
var validSignals = map[string]bool{
	"memory.available": true, "allocatableMemory.available": true,
	"nodefs.available": true, "nodefs.inodesFree": true,
	"imagefs.available": true, "imagefs.inodesFree": true,
	"containerfs.available": true, "containerfs.inodesFree": true,
	"pid.available": true,
}

// DefaultHard is kubelet's default --eviction-hard on Linux. Setting --eviction-hard replaces all of
// it: a signal left out has no hard threshold.
const DefaultHard = "memory.available<100Mi,nodefs.available<10%,imagefs.available<15%,nodefs.inodesFree<5%,imagefs.inodesFree<5%"

// Value is a threshold or reclaim amount: either an absolute Quantity or a Percent of capacity.
type Value struct {
	// Quantity is the absolute amount (bytes, inodes or pids) when IsPercent is false.
	Quantity int64
	// Percent is the share of capacity, in (0, 100], when IsPercent.
	Percent float64
	// IsPercent says which of the two is meant.
	IsPercent bool
}

func (v Value) String() string {
	if v.IsPercent {
		return strconv.FormatFloat(v.Percent, 'f', -1, 64) + "%"
	}
	return strconv.FormatInt(v.Quantity, 10)
}

// Threshold is one "signal<value" statement.
type Threshold struct {
	// Signal is the kubelet signal name.
	Signal string
	// Value is met when the signal's available amount falls below it.
	Value Value
	// GracePeriod is how long a soft threshold must be met before evicting; 0 for hard thresholds.
	GracePeriod time.Duration
	// MinReclaim is how far past the threshold eviction reclaims; the zero Value means none.
	MinReclaim Value
}

// Flags are the raw flag values, as typed. Like kubelet's map flags, a flag given several times
// accumulates (join the values with ","): a signal given again takes its later value.
type Flags struct {
	Hard, Soft, SoftGracePeriod, MinimumReclaim string
	// HardSet says whether --eviction-hard was given; when not, DefaultHard applies.
	HardSet bool
	// PressureTransitionPeriod is --eviction-pressure-transition-period (kubelet default 5m).
	PressureTransitionPeriod time.Duration
	// MaxPodGracePeriod is --eviction-max-pod-grace-period in seconds. Soft evictions use the
	// smaller of it and the pod's own grace period, so 0 (the default) kills at once, as the seed
	// says: "if you do not specify an upper bound, the kubelet kills evicted pods immediately".
	MaxPodGracePeriod int
	// AllocatableMemory says --enforce-node-allocatable holds "pods" (kubelet's default): every
	// hard memory.available threshold is then copied to allocatableMemory.available, as kubelet's
	// ParseThresholdConfig does.
	AllocatableMemory bool
}

// Config is the parsed eviction configuration.
type Config struct {
	// Hard and Soft are the thresholds, sorted by signal.
	Hard, Soft []Threshold
	// PressureTransitionPeriod is how long a condition stays set after its threshold stops being met.
	PressureTransitionPeriod time.Duration
	// MaxPodGracePeriod caps the grace period of soft evictions; <= 0 means pods get none.
	MaxPodGracePeriod time.Duration
}

// Parse checks the flags with kubelet's rules and returns every problem found, each error naming
// its flag.
func Parse(f Flags) (Config, []error) {
	var errs []error
	hardText := f.Hard
	if !f.HardSet {
		hardText = DefaultHard
	}
	hard, e := parseStatements("--eviction-hard", hardText, '<')
	errs = append(errs, e...)
	soft, e := parseStatements("--eviction-soft", f.Soft, '<')
	errs = append(errs, e...)
	graces, e := parsePairs("--eviction-soft-grace-period", f.SoftGracePeriod)
	errs = append(errs, e...)
	reclaims, e := parsePairs("--eviction-minimum-reclaim", f.MinimumReclaim)
	errs = append(errs, e...)

	cfg := Config{PressureTransitionPeriod: f.PressureTransitionPeriod, MaxPodGracePeriod: time.Duration(f.MaxPodGracePeriod) * time.Second}
	if f.PressureTransitionPeriod < 0 {
		errs = append(errs, fmt.Errorf("--eviction-pressure-transition-period: %v must not be negative", f.PressureTransitionPeriod))
	}
	for _, s := range sortedKeys(graces) {
		d, err := time.ParseDuration(graces[s])
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("--eviction-soft-grace-period: %s: %w", s, err))
			continue
		case d < 0:
			errs = append(errs, fmt.Errorf("--eviction-soft-grace-period: %s: %v must be positive", s, d))
			continue
		}
		if i := find(soft, s); i >= 0 {
			soft[i].GracePeriod = d
		}
	}
	for _, t := range soft {
		if _, ok := graces[t.Signal]; !ok {
			errs = append(errs, fmt.Errorf("--eviction-soft: %s: a grace period must be set with --eviction-soft-grace-period", t.Signal))
		}
	}
	for _, s := range sortedKeys(reclaims) {
		v, err := parseValue(reclaims[s], true)
		if err != nil {
			errs = append(errs, fmt.Errorf("--eviction-minimum-reclaim: %s: %w", s, err))
			continue
		}
		for _, list := range [][]Threshold{hard, soft} {
			if i := find(list, s); i >= 0 {
				list[i].MinReclaim = v
			}
		}
	}
	if f.AllocatableMemory {
		hard = addAllocatableThresholds(hard)
	}
	cfg.Hard, cfg.Soft = hard, soft
	return cfg, errs
}

// addAllocatableThresholds copies every hard memory.available threshold, with its minimum
// reclaim, to allocatableMemory.available (kubelet's addAllocatableThresholds); a copy equal to a
// configured threshold is not added twice.
func addAllocatableThresholds(hard []Threshold) []Threshold {
	out := slices.Clone(hard)
	for _, t := range hard {
		if t.Signal != SignalMemoryAvailable || !t.IsHard() {
			continue
		}
		c := t
		c.Signal = SignalAllocatableMemoryAvailable
		if !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	slices.SortStableFunc(out, func(a, b Threshold) int { return strings.Compare(a.Signal, b.Signal) })
	return out
}

func find(ts []Threshold, signal string) int {
	for i, t := range ts {
		if t.Signal == signal {
			return i
		}
	}
	return -1
}

// parseStatements parses "signal<value,..." into thresholds sorted by signal.
func parseStatements(flag, text string, op byte) ([]Threshold, []error) {
	pairs, errs := split(flag, text, op)
	var out []Threshold
	for _, s := range sortedKeys(pairs) {
		v, err := parseValue(pairs[s], false)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %s: %w", flag, s, err))
			continue
		}
		if v == (Value{}) {
			continue // 0% and 100% mean "no threshold", as in kubelet
		}
		out = append(out, Threshold{Signal: s, Value: v})
	}
	return out, errs
}

// parsePairs parses "signal=value,..." (values checked by the caller).
func parsePairs(flag, text string) (map[string]string, []error) {
	return split(flag, text, '=')
}

// split parses kubelet's map flag syntax: comma-separated "signal<op>value" statements; empty
// statements (a trailing comma) are skipped and spaces around the signal and the value are trimmed,
// as kubelet's flag types do; a signal given again takes its later value, as in kubelet's map.
func split(flag, text string, op byte) (map[string]string, []error) {
	out := map[string]string{}
	var errs []error
	for _, stmt := range strings.Split(text, ",") {
		if len(stmt) == 0 {
			continue
		}
		signal, value, ok := strings.Cut(stmt, string(op))
		signal, value = strings.TrimSpace(signal), strings.TrimSpace(value)
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("%s: %q: want signal%cvalue", flag, stmt, op))
		case !validSignals[signal]:
			errs = append(errs, fmt.Errorf("%s: %q: unknown signal %q", flag, stmt, signal))
		case value == "":
			errs = append(errs, fmt.Errorf("%s: %q: want signal%cvalue", flag, stmt, op))
		default:
			out[signal] = value
		}
	}
	return out, errs
}

// parseValue parses a quantity or a percentage with kubelet's rules. A threshold of exactly "0%"
// or "100%" disables it and yields the zero Value; a threshold must be positive; a minimum reclaim
// percentage must be positive (kubelet refuses "0%") while a minimum reclaim quantity may be 0.
// As kubelet's parsePercentage, every trailing "%" is removed and the number is read with 32-bit
// precision; unlike kubelet, NaN and infinities are refused rather than accepted as thresholds that
// never or always hold.
func parseValue(s string, reclaim bool) (Value, error) {
	if strings.HasSuffix(s, "%") {
		if !reclaim && (s == "0%" || s == "100%") {
			return Value{}, nil
		}
		f, err := strconv.ParseFloat(strings.TrimRight(s, "%"), 32)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return Value{}, fmt.Errorf("%q: bad percentage", s)
		}
		switch {
		case reclaim && f <= 0:
			return Value{}, fmt.Errorf("%q: a minimum reclaim percentage must be positive", s)
		case f < 0 || f > 100:
			return Value{}, fmt.Errorf("%q: percentage must be within [0%%, 100%%]", s)
		}
		return Value{Percent: f, IsPercent: true}, nil
	}
	q, err := ParseQuantity(s)
	if err != nil {
		return Value{}, err
	}
	if q < 0 || (!reclaim && q == 0) {
		return Value{}, errors.New(s + ": must be positive")
	}
	return Value{Quantity: q}, nil
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
