// Package pressure runs the node agent's eviction thresholds: it reads every signal each
// housekeeping interval (kubelet's --housekeeping-interval, 10 s by default) and memory.available on
// a fast path (every 50 ms by default), feeds them to an eviction.Tracker, sends every pressure
// condition change to the coordinator at once and, when the node has a pod source, evicts as
// kubelet's eviction manager does (act.go): one pod per evaluation, then a wait for its resources;
// hard thresholds at once on the node; soft thresholds through the coordinator's grants, with a
// local fallback when no grant comes.
//
// Why a sampler rather than kernel notifications: a memory.available threshold is a threshold on
// usage - inactive_file, which neither cgroup v1 usage notifications (cgroup.event_control on
// memory.usage_in_bytes, which counts all page cache: near full memory the kernel turns inactive
// cache into anon memory with usage flat) nor PSI triggers (which fire on stalls, not on an amount)
// can express; both would only be hints to sample.
//
// Why an adaptive one: on this host (a Firecracker VM) a 50 ms ticker reading memory.available costs
// about 1.2% of a core — wakeups and cold reads, not the parsing. So the fast path waits
// FastDelay(headroom): the time the memory above the nearest memory threshold would take to go at
// MemoryRate (default 4 GiB/s, faster than two cores can fault pages in), within [FastInterval,
// FastCeiling]. Far from the thresholds it reads about once a second; within a few hundred MiB of
// one it reads every FastInterval, which bounds detection at FastInterval plus the send.
//
// The decisions are eviction.Tracker's (pure); Monitor only does the reading, the sending and the
// metrics.
package pressure

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nodefence/nodefence/node-agent/eviction"
	"github.com/nodefence/nodefence/node-agent/signals"
	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

// Defaults.
const (
	DefaultHousekeepingInterval = 10 * time.Second
	DefaultFastInterval         = 50 * time.Millisecond
	DefaultFastCeiling          = time.Second
	DefaultMemoryRate           = 4 << 30 // bytes per second
)

// FastDelay is how long the fast path may wait before the next memory read: the time headroom bytes
// take to go at rate bytes/s, within [floor, ceiling]. No headroom (a threshold already met) is
// floor.
func FastDelay(headroom, rate int64, floor, ceiling time.Duration) time.Duration {
	if headroom <= 0 || rate <= 0 {
		return floor
	}
	d := time.Duration(float64(headroom) / float64(rate) * float64(time.Second))
	return min(max(d, floor), ceiling)
}

// Reader reads the signals: all of them, or memory alone for the fast path. signals.Reader is one.
type Reader interface {
	Read() ([]*agentv1.Signal, error)
	Memory() (signals.Memory, error)
}

// Sender queues a message for the coordinator (agent.Agent.Send: condition changes and candidates
// are never dropped).
type Sender interface {
	Send(msg *agentv1.ConnectRequest)
}

// AllocatableReader is a Reader that also reads allocatableMemory.available alone (ok false: not
// measured); signals.Reader is one. The fast path then reads it too when a threshold is on it.
type AllocatableReader interface {
	Allocatable() (available, capacity int64, ok bool, err error)
}

// PodSource lists the node's pods with their usage, for ranking. Standalone mode has none.
type PodSource interface {
	Pods(ctx context.Context) ([]eviction.Pod, error)
}

// DiskPodSource is a PodSource that can also measure its pods' disk use, which walking their
// directories makes costly: only ranking for a filesystem signal asks for it (kubepods.Source).
type DiskPodSource interface {
	PodsWithDisk(ctx context.Context) ([]eviction.Pod, error)
}

// Recorder receives signal values and condition states (metrics.Metrics is one); may be nil.
type Recorder interface {
	Signal(name string, available, capacity int64)
	Condition(name string, pressure bool)
}

// Config configures a Monitor.
type Config struct {
	// Eviction are the thresholds (after eviction.DeriveContainerFS for the Layout).
	Eviction eviction.Config
	// Layout is the filesystem layout, for disk ranking.
	Layout eviction.Layout
	// HousekeepingInterval is how often every signal is read and evaluated. Default 10s.
	HousekeepingInterval time.Duration
	// FastInterval is how often memory.available alone is read; negative turns the fast path off.
	// It runs only when a memory threshold is configured. It is the shortest wait; see FastDelay.
	// Default 50ms.
	FastInterval time.Duration
	// FastCeiling is the longest wait of the fast path, and so the detection bound whatever the
	// rate memory falls at. Default 1s.
	FastCeiling time.Duration
	// MemoryRate is the fastest memory.available is assumed to fall, in bytes per second. Default
	// 4 GiB/s.
	MemoryRate int64
	// CleanupTimeout is kubelet's podCleanupTimeout: after an eviction no other pod is evicted
	// until the evicted pod's resources are reclaimed or this long has passed. Default 30s.
	CleanupTimeout time.Duration
	// GrantTimeout is how long a soft-threshold candidate waits for the coordinator's grant before
	// the agent evicts it itself. Default 2m.
	GrantTimeout time.Duration
	// EvaluateDuringCleanup keeps reading and evaluating the signals (node conditions included)
	// while an evicted pod's cleanup is waited for. Off by default, as kubelet: its eviction
	// manager evaluates nothing during that wait (waitForPodsCleanup, up to CleanupTimeout), so a
	// condition cannot change then. On, only the next eviction is held back.
	EvaluateDuringCleanup bool
	// Actions evict the node's pods in Kubernetes mode; the zero value only reports.
	Actions Actions
	// Log nil means slog.Default().
	Log *slog.Logger
}

// SetDefaults fills zero fields.
func (c *Config) SetDefaults() {
	if c.HousekeepingInterval == 0 {
		c.HousekeepingInterval = DefaultHousekeepingInterval
	}
	if c.FastInterval == 0 {
		c.FastInterval = DefaultFastInterval
	}
	if c.FastCeiling == 0 {
		c.FastCeiling = max(DefaultFastCeiling, c.FastInterval)
	}
	if c.MemoryRate == 0 {
		c.MemoryRate = DefaultMemoryRate
	}
	if c.CleanupTimeout == 0 {
		c.CleanupTimeout = DefaultCleanupTimeout
	}
	if c.GrantTimeout == 0 {
		c.GrantTimeout = DefaultGrantTimeout
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
}

// Monitor evaluates the thresholds over time. Create it with New and call Run once.
type Monitor struct {
	cfg     Config
	reader  Reader
	send    Sender
	pods    PodSource
	rec     Recorder
	tracker *eviction.Tracker
	obs     eviction.Observations
	log     *slog.Logger
	actions Actions
	act     actor
	grants  chan *agentv1.EvictionGrant
	streams chan struct{} // a new coordinator stream; capacity 1
}

// New returns a Monitor; pods and rec may be nil.
func New(cfg Config, r Reader, send Sender, pods PodSource, rec Recorder) (*Monitor, error) {
	cfg.SetDefaults()
	if cfg.HousekeepingInterval < 0 {
		return nil, fmt.Errorf("housekeeping interval %v must be positive", cfg.HousekeepingInterval)
	}
	if r == nil || send == nil {
		return nil, fmt.Errorf("pressure: a Reader and a Sender are required")
	}
	return &Monitor{cfg: cfg, reader: r, send: send, pods: pods, rec: rec,
		tracker: eviction.NewTracker(cfg.Eviction), obs: eviction.Observations{}, log: cfg.Log.With("component", "pressure"),
		actions: cfg.Actions, act: actor{cleanupTimeout: cfg.CleanupTimeout, grantTimeout: cfg.GrantTimeout},
		grants: make(chan *agentv1.EvictionGrant, 16), streams: make(chan struct{}, 1)}, nil
}

func (m *Monitor) hasMemoryThreshold() bool {
	return m.hasThreshold(eviction.SignalMemoryAvailable) || m.hasThreshold(eviction.SignalAllocatableMemoryAvailable)
}

func (m *Monitor) hasThreshold(signal string) bool {
	for _, t := range slices.Concat(m.cfg.Eviction.Hard, m.cfg.Eviction.Soft) {
		if t.Signal == signal {
			return true
		}
	}
	return false
}

// memoryHeadroom is how far memory.available and allocatableMemory.available are above their
// nearest threshold (counting the minimum reclaim of a threshold being reclaimed would only make it
// smaller; thresholds alone are enough to time the next read). A signal not observed (the pods'
// cgroup without a limit) is left out; with none observed there is no headroom.
func (m *Monitor) memoryHeadroom() int64 {
	var headroom int64
	found := false
	for _, t := range slices.Concat(m.cfg.Eviction.Hard, m.cfg.Eviction.Soft) {
		if !eviction.IsMemorySignal(t.Signal) {
			continue
		}
		o, ok := m.obs[t.Signal]
		if !ok {
			continue
		}
		if h := o.Available - t.Value.Resolve(o.Capacity); !found || h < headroom {
			headroom, found = h, true
		}
	}
	return max(headroom, 0)
}

// Run evaluates until ctx is done, then returns nil.
func (m *Monitor) Run(ctx context.Context) error {
	m.housekeeping(ctx, time.Now())
	hk := time.NewTicker(m.cfg.HousekeepingInterval)
	defer hk.Stop()
	var fast <-chan time.Time
	var timer *time.Timer
	if m.cfg.FastInterval > 0 && m.hasMemoryThreshold() {
		timer = time.NewTimer(m.nextFast())
		defer timer.Stop()
		fast = timer.C
		m.log.Info("fast memory path on", "min_interval", m.cfg.FastInterval, "max_interval", m.cfg.FastCeiling, "assumed_rate", m.cfg.MemoryRate)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-hk.C:
			m.housekeeping(ctx, now)
		case now := <-fast:
			m.fast(ctx, now)
			timer.Reset(m.nextFast())
		case g := <-m.grants:
			m.handleGrant(g, time.Now())
		case <-m.streams:
			m.repropose()
		}
	}
}

func (m *Monitor) nextFast() time.Duration {
	return FastDelay(m.memoryHeadroom(), m.cfg.MemoryRate, m.cfg.FastInterval, m.cfg.FastCeiling)
}

// housekeeping reads every signal, evaluates, and proposes eviction candidates.
func (m *Monitor) housekeeping(ctx context.Context, now time.Time) {
	if m.waitingForCleanup(ctx, now) {
		return
	}
	sigs, err := m.reader.Read()
	if err != nil {
		m.log.Warn("reading the eviction signals failed", "error", err)
		return
	}
	m.obs = signals.Observations(sigs)
	for name, o := range m.obs {
		o.Time = now // measured now: kubelet acts only on thresholds whose stats are new
		m.obs[name] = o
	}
	res := m.evaluate(now)
	if len(res.Reclaim) > 0 {
		m.reclaim(ctx, res.Reclaim[0], now)
		return
	}
	// Nothing to reclaim any more: a grant that comes now for an earlier candidate is declined.
	m.act.proposed = nil
}

// fast reads memory.available alone (and allocatableMemory.available when a threshold is on it
// and the reader can) and evaluates; a memory threshold to reclaim is acted on at once (kubelet
// waits for its next housekeeping).
func (m *Monitor) fast(ctx context.Context, now time.Time) {
	if m.waitingForCleanup(ctx, now) {
		return
	}
	mem, err := m.reader.Memory()
	if err != nil {
		m.log.Debug("fast memory read failed", "error", err)
		return
	}
	// Only memory.available (and allocatableMemory.available, below) is measured again: the other
	// signals keep their housekeeping time, so their thresholds are not acted on again here
	// (eviction.ThresholdsUpdatedStats).
	m.obs[eviction.SignalMemoryAvailable] = eviction.Observation{Available: mem.Available, Capacity: mem.Capacity, Time: now}
	// allocatableMemory.available only where the last housekeeping could measure it (a pods' cgroup
	// with a memory limit): elsewhere the reads would find nothing every time.
	_, measured := m.obs[eviction.SignalAllocatableMemoryAvailable]
	if ar, ok := m.reader.(AllocatableReader); ok && measured && m.hasThreshold(eviction.SignalAllocatableMemoryAvailable) {
		avail, capacity, ok, err := ar.Allocatable()
		switch {
		case err != nil:
			m.log.Debug("fast allocatable memory read failed", "error", err)
			return
		case ok:
			m.obs[eviction.SignalAllocatableMemoryAvailable] = eviction.Observation{Available: avail, Capacity: capacity, Time: now}
		default:
			delete(m.obs, eviction.SignalAllocatableMemoryAvailable)
		}
	}
	res := m.evaluate(now)
	if len(res.Reclaim) > 0 && eviction.IsMemorySignal(res.Reclaim[0].Threshold.Signal) {
		m.reclaim(ctx, res.Reclaim[0], now)
	}
}

// waitingForCleanup reports whether evaluation is suspended: kubelet's eviction manager does
// nothing else while it waits for an evicted pod's cleanup (unless EvaluateDuringCleanup).
func (m *Monitor) waitingForCleanup(ctx context.Context, now time.Time) bool {
	return !m.cfg.EvaluateDuringCleanup && m.act.busy(now, m.cleanedUp(ctx))
}

// cleanedUp asks the CleanupChecker whether an evicted pod's resources are reclaimed; without
// one they count as reclaimed at once.
func (m *Monitor) cleanedUp(ctx context.Context) func(eviction.Candidate) bool {
	return func(c eviction.Candidate) bool {
		return m.actions.Cleanup == nil || m.actions.Cleanup.CleanedUp(ctx, c)
	}
}

// evaluate runs the tracker on the latest observations and sends the condition changes.
func (m *Monitor) evaluate(now time.Time) eviction.Result {
	res := m.tracker.Observe(now, m.obs)
	for _, c := range res.Changed {
		m.send.Send(ConditionChange(c, now))
		m.log.Info("node condition changed", "condition", c.Condition.String(), "pressure", c.Pressure, "reason", c.Reason)
	}
	if m.rec != nil {
		for _, name := range sortedKeys(m.obs) {
			o := m.obs[name]
			m.rec.Signal(name, o.Available, o.Capacity)
		}
		for _, c := range res.Conditions {
			m.rec.Condition(c.Condition.String(), c.Pressure)
		}
	}
	return res
}

// ConditionChange converts a condition state to the API message.
func ConditionChange(c eviction.ConditionState, at time.Time) *agentv1.ConnectRequest {
	types := map[eviction.Condition]agentv1.ConditionType{
		eviction.MemoryPressure: agentv1.ConditionType_CONDITION_TYPE_MEMORY_PRESSURE,
		eviction.DiskPressure:   agentv1.ConditionType_CONDITION_TYPE_DISK_PRESSURE,
		eviction.PIDPressure:    agentv1.ConditionType_CONDITION_TYPE_PID_PRESSURE,
	}
	// kubelet's reasons for the three conditions.
	reasons := map[eviction.Condition][2]string{
		eviction.MemoryPressure: {"KubeletHasSufficientMemory", "KubeletHasInsufficientMemory"},
		eviction.DiskPressure:   {"KubeletHasNoDiskPressure", "KubeletHasDiskPressure"},
		eviction.PIDPressure:    {"KubeletHasSufficientPID", "KubeletHasInsufficientPID"},
	}
	status, reason := agentv1.ConditionStatus_CONDITION_STATUS_FALSE, reasons[c.Condition][0]
	if c.Pressure {
		status, reason = agentv1.ConditionStatus_CONDITION_STATUS_TRUE, reasons[c.Condition][1]
	}
	return &agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Condition{Condition: &agentv1.ConditionChange{
		Type: types[c.Condition], Status: status, Reason: reason, Message: c.Reason, TransitionTime: timestamppb.New(at),
	}}}
}

func sortedKeys(o eviction.Observations) []string {
	out := make([]string, 0, len(o))
	for k := range o {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
