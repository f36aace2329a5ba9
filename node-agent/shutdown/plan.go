// Package shutdown is the node agent's graceful node shutdown (seed 000): it holds a logind delay
// inhibitor lock, and when logind announces the shutdown (PrepareForShutdown(true)) it tells the
// coordinator at once, terminates the node's pods in phases by priority, and only then releases the
// lock so that the shutdown goes on.
//
// Plan is pure: it turns the configuration and the pods into the phases. Manager does the I/O.
// EnsureInhibitDelay, run before the Manager, raises logind's InhibitDelayMaxSec to the grace
// period with a drop-in, as kubelet does.
package shutdown

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nodefence/nodefence/node-agent/eviction"
)

// SystemCriticalPriority is Kubernetes' scheduling.SystemCriticalPriority: pods at or above it
// (system-cluster-critical, system-node-critical) are the "critical pods" of
// shutdownGracePeriodCriticalPods.
const SystemCriticalPriority = 2_000_000_000

// PriorityGrace is one shutdownGracePeriodByPodPriority entry: pods whose priority is at least
// Priority (and below the next entry's) get GracePeriod.
type PriorityGrace struct {
	Priority    int32
	GracePeriod time.Duration
}

// Config is the kubelet's graceful shutdown configuration.
type Config struct {
	// GracePeriod is shutdownGracePeriod: how long the node's shutdown is delayed in total.
	GracePeriod time.Duration
	// CriticalGracePeriod is shutdownGracePeriodCriticalPods: the part of GracePeriod kept for
	// critical pods, which are terminated last.
	CriticalGracePeriod time.Duration
	// ByPriority is shutdownGracePeriodByPodPriority; when set, it replaces the two values above.
	ByPriority []PriorityGrace
}

// Enabled reports whether graceful shutdown is on: both grace periods 0 and no ByPriority mean off.
func (c Config) Enabled() bool {
	return c.GracePeriod > 0 || c.CriticalGracePeriod > 0 || len(c.ByPriority) > 0
}

// Validate returns every problem with c.
func (c Config) Validate() []error {
	var errs []error
	if c.GracePeriod < 0 {
		errs = append(errs, fmt.Errorf("--shutdown-grace-period: %v must not be negative", c.GracePeriod))
	}
	if c.CriticalGracePeriod < 0 {
		errs = append(errs, fmt.Errorf("--shutdown-grace-period-critical-pods: %v must not be negative", c.CriticalGracePeriod))
	}
	if c.GracePeriod >= 0 && c.CriticalGracePeriod > c.GracePeriod {
		errs = append(errs, fmt.Errorf("--shutdown-grace-period-critical-pods: %v must not exceed --shutdown-grace-period %v", c.CriticalGracePeriod, c.GracePeriod))
	}
	if len(c.ByPriority) > 0 && (c.GracePeriod > 0 || c.CriticalGracePeriod > 0) {
		errs = append(errs, errors.New("--shutdown-grace-period-by-pod-priority: cannot be combined with --shutdown-grace-period or --shutdown-grace-period-critical-pods"))
	}
	return errs
}

// Ranges returns the priority ranges in termination order (lowest priority first). Without
// ByPriority, the two-phase configuration becomes two ranges, as kubelet migrates it: priority 0 gets
// GracePeriod - CriticalGracePeriod, SystemCriticalPriority gets CriticalGracePeriod.
func (c Config) Ranges() []PriorityGrace {
	if !c.Enabled() {
		return nil
	}
	if len(c.ByPriority) > 0 {
		out := slices.Clone(c.ByPriority)
		slices.SortFunc(out, func(a, b PriorityGrace) int { return cmp.Compare(a.Priority, b.Priority) })
		return out
	}
	return []PriorityGrace{
		{Priority: 0, GracePeriod: c.GracePeriod - c.CriticalGracePeriod},
		{Priority: SystemCriticalPriority, GracePeriod: c.CriticalGracePeriod},
	}
}

// Total is the longest the shutdown is delayed: the sum of the ranges' grace periods.
func (c Config) Total() time.Duration {
	var d time.Duration
	for _, r := range c.Ranges() {
		d += r.GracePeriod
	}
	return d
}

// ParseByPriority parses the --shutdown-grace-period-by-pod-priority syntax: comma-separated
// priority:duration pairs, e.g. "100000:10s,10000:180s,1000:120s,0:60s" (seed 000's table). Each
// priority may appear once; durations must not be negative; order does not matter. The empty
// string is no configuration.
func ParseByPriority(s string) ([]PriorityGrace, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []PriorityGrace
	var errs []error
	seen := map[int32]bool{}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		ps, ds, ok := strings.Cut(item, ":")
		if !ok {
			errs = append(errs, fmt.Errorf("%q: want priority:duration", item))
			continue
		}
		p, err := strconv.ParseInt(ps, 10, 32)
		if err != nil {
			errs = append(errs, fmt.Errorf("%q: priority %q is not a 32-bit integer", item, ps))
			continue
		}
		d, err := time.ParseDuration(ds)
		if err != nil {
			errs = append(errs, fmt.Errorf("%q: %w", item, err))
			continue
		}
		if d < 0 {
			errs = append(errs, fmt.Errorf("%q: grace period must not be negative", item))
			continue
		}
		if seen[int32(p)] {
			errs = append(errs, fmt.Errorf("%q: priority %d given twice", item, p))
			continue
		}
		seen[int32(p)] = true
		out = append(out, PriorityGrace{Priority: int32(p), GracePeriod: d})
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	slices.SortFunc(out, func(a, b PriorityGrace) int { return cmp.Compare(b.Priority, a.Priority) })
	return out, nil
}

// FormatByPriority is the inverse of ParseByPriority (highest priority first).
func FormatByPriority(ranges []PriorityGrace) string {
	sorted := slices.Clone(ranges)
	slices.SortFunc(sorted, func(a, b PriorityGrace) int { return cmp.Compare(b.Priority, a.Priority) })
	parts := make([]string, len(sorted))
	for i, r := range sorted {
		parts[i] = fmt.Sprintf("%d:%s", r.Priority, r.GracePeriod)
	}
	return strings.Join(parts, ",")
}

// Phase is one step of the shutdown: the pods of one priority range, terminated together within
// GracePeriod.
type Phase struct {
	// Priority is the range's lowest priority (inclusive); the next phase's Priority bounds it.
	Priority int32
	// GracePeriod is how long the phase may take, and the grace period its pods get.
	GracePeriod time.Duration
	// Pods are the pods in the range, sorted by namespace/name. A phase without pods is skipped at
	// once: nothing waits for an empty range.
	Pods []eviction.Pod
}

// Skip reports whether the phase has nothing to wait for.
func (p Phase) Skip() bool { return len(p.Pods) == 0 }

// Plan returns the shutdown phases in order — lowest priority range first, critical pods last —
// with each pod in the range of the highest Priority not above its own (pods below every range
// go to the lowest). Empty ranges are kept, with no pods, so that the plan shows them being skipped.
func Plan(c Config, pods []eviction.Pod) []Phase {
	ranges := c.Ranges()
	if len(ranges) == 0 {
		return nil
	}
	phases := make([]Phase, len(ranges))
	for i, r := range ranges {
		phases[i] = Phase{Priority: r.Priority, GracePeriod: r.GracePeriod}
	}
	for _, p := range pods {
		i := 0
		for j, r := range ranges {
			if p.Priority >= r.Priority {
				i = j
			}
		}
		phases[i].Pods = append(phases[i].Pods, p)
	}
	for i := range phases {
		slices.SortFunc(phases[i].Pods, func(a, b eviction.Pod) int {
			return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
		})
	}
	return phases
}
