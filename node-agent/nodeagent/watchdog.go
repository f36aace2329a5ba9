package nodeagent

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/nodefence/nodefence/node-agent/agent"
	"github.com/nodefence/nodefence/node-agent/peer"
	"github.com/nodefence/nodefence/node-agent/watchdog"
	"github.com/nodefence/nodefence/services/wdlease"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

// defaultWatchdogTimeout is --watchdog-timeout's default: the agent feeds every third of it, so two
// feeds may be lost to a stalled process before the node resets.
const defaultWatchdogTimeout = 15 * time.Second

// disarmReportWait bounds how long a clean stop waits for the coordinator to acknowledge the
// "disarmed" report before the magic close.
const disarmReportWait = 2 * time.Second

// feeder keeps the node's watchdog: it opens (arms) the device only when the lease rule first lets
// the agent feed — opening feeds it, so an agent restarted without a lease must not open it — and
// feeds it every third of its timeout while the rule says so. The rule (services/wdlease) is the
// only judge: the feeder never feeds on its own say.
type feeder struct {
	path    string
	timeout time.Duration
	self    string
	lease   *agent.Lease
	log     *slog.Logger
	now     func() time.Time
	bounds  wdlease.Bounds
	peers   *peer.Checker // nil: no peers to ask (--peer)
	vouched string        // the agents whose word the feeder last fed on, as logged

	mu      sync.Mutex
	dev     *watchdog.Device // nil until armed
	closing bool             // a clean stop began: never arm now
	// disarmHeard is set once the coordinator acknowledged the "disarmed" report of a clean stop:
	// only then may the stop write the magic close.
	disarmHeard bool
}

// prepareWatchdog checks the device named by --watchdog-device, if any, and sets up the lease the
// agent asks for with its heartbeats. A device that is missing or not writable stops the agent from
// starting. The device is not opened here: opening arms and feeds it, which only the lease may allow.
func prepareWatchdog(opts *Config, log *slog.Logger) (*feeder, bool) {
	if opts.watchdogDevice == "" {
		return nil, true
	}
	if err := checkDevice(opts.watchdogDevice); err != nil {
		log.Error("cannot arm the watchdog; not starting", "error", err)
		return nil, false
	}
	b := wdlease.Defaults(opts.watchdogTimeout)
	b.Lease = wdlease.MaxGrant // a longer grant is refused: neither held nor echoed
	now := time.Now
	f := &feeder{path: opts.watchdogDevice, timeout: opts.watchdogTimeout, self: opts.agent.NodeName, log: log, now: now,
		bounds: b, lease: agent.NewLease(b, now(), log)}
	opts.agent.Lease = f.lease
	opts.agent.MaxBackoff = reconnectCap(opts.agent.MaxBackoff, opts.watchdogTimeout)
	log.Info("watchdog mode: the device is armed once the leader grants a lease; a clean stop disarms it; a killed agent not restarted within the timeout resets this node",
		"device", f.path, "timeout", f.timeout)
	return f, true
}

// reconnectCap is the longest wait between two rounds of reconnection attempts in watchdog mode: a
// quarter of the timeout. When the control plane comes back after being away, the agents that reach
// the new leader first hold leases at once and stop vouching for the others, so an agent still
// waiting out a long backoff (10 s by default) would have its node reset although it could have
// had a lease: after its peers' last word it has two thirds of the timeout to get one.
func reconnectCap(maxBackoff, timeout time.Duration) time.Duration {
	c := max(timeout/4, agent.DefaultMinBackoff)
	if maxBackoff == 0 {
		maxBackoff = agent.DefaultMaxBackoff
	}
	return min(maxBackoff, c)
}

// checkDevice refuses a watchdog device that does not exist, is a directory, or is not writable.
func checkDevice(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("arm watchdog %s: %w", path, err)
	}
	if st.IsDir() {
		return fmt.Errorf("arm watchdog %s: a directory", path)
	}
	if err := unix.Access(path, unix.W_OK); err != nil {
		return fmt.Errorf("arm watchdog %s: not writable: %w", path, err)
	}
	return nil
}

func watchdogState(d *watchdog.Device, armed bool) *agentv1.WatchdogState {
	return &agentv1.WatchdogState{Armed: armed, Timeout: durationpb.New(d.Timeout()), Ioctl: d.Ioctl}
}

// device is the armed device, or nil.
func (f *feeder) device() *watchdog.Device {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.dev
}

// run checks the rule every third of the timeout (and every 200 ms until armed, so that the first
// grant arms at once) until ctx ends. A device that cannot be armed or fed ends the agent (the node
// resets unless it is restarted in time).
func (f *feeder) run(a *agent.Agent) func(context.Context) error {
	return func(ctx context.Context) error {
		every := f.timeout / 3
		t := time.NewTimer(0)
		defer t.Stop()
		feeding := false
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
			d := f.decide(ctx)
			if d == wdlease.Stop {
				if feeding && f.lease.Poisoned() {
					f.log.Error("watchdog: not feeding (the leader's stop-feeding pill); this node resets within the timeout", "timeout", f.timeout)
				} else if feeding {
					f.log.Warn("watchdog: no lease from the leader; not feeding — this node resets unless a lease comes back within the timeout",
						"lease_expired", f.lease.Expiry(), "timeout", f.timeout)
				}
				feeding = false
			} else {
				if err := f.feed(a); err != nil {
					return err
				}
				if !feeding {
					f.log.Info("watchdog: feeding under the leader's lease", "lease_until", f.lease.Expiry())
				}
				feeding = true
			}
			next := every
			if f.device() == nil {
				next = min(every, 200*time.Millisecond)
			}
			t.Reset(next)
		}
	}
}

// decide asks the rule: on the lease alone, and when it holds none, on the peers' answers.
func (f *feeder) decide(ctx context.Context) wdlease.Decision {
	d := f.lease.MayFeed(f.now(), f.self, 0, wdlease.Confirmation{})
	if d != wdlease.Stop || f.peers == nil {
		return d
	}
	n := f.peers.Cluster()
	conf := f.peers.Confirm(ctx, f.now, f.bounds.PeerAge/2, f.bounds.PeerQuorum(n))
	d = f.lease.MayFeed(f.now(), f.self, n, conf)
	if d == wdlease.FeedPeers {
		ids := make([]string, len(conf.NoLease))
		for i, p := range conf.NoLease {
			ids[i] = "agent/" + p // each verified in the TLS handshake: a liar is named here
		}
		if said := strings.Join(ids, ","); said != f.vouched { // once per set, not every feed
			f.vouched = said
			f.log.Warn("watchdog: no lease from the leader; feeding because these agents say nobody holds one", "peers", ids, "cluster", n)
		}
	}
	return d
}

// feed arms the device on the first call (reporting it armed) and feeds it after.
func (f *feeder) feed(a *agent.Agent) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.dev != nil {
		return f.dev.Feed()
	}
	if f.closing {
		return nil
	}
	d, err := watchdog.Open(f.path, f.timeout)
	if err != nil {
		return fmt.Errorf("the lease allows feeding, but the watchdog cannot be armed: %w", err)
	}
	if !d.Ioctl {
		f.log.Warn("the watchdog device has no timeout ioctl: its own timeout applies, and the configured one is reported", "device", d.Path(), "timeout", d.Timeout())
	}
	f.dev = d
	f.log.Info("watchdog armed", "device", d.Path(), "timeout", d.Timeout())
	a.ReportWatchdog(watchdogState(d, true))
	return nil
}

// stop ends the watchdog with the agent. A clean stop (stopping: the agent was asked to stop)
// writes the magic close once the coordinator acknowledged the "disarmed" report; any other end —
// a failure, the leader's pill, a report nobody acknowledged — leaves the watchdog armed, so the
// node resets unless an agent feeds it again within the timeout.
func (f *feeder) stop(stopping bool, log *slog.Logger) {
	d := f.device()
	if d == nil {
		return
	}
	if f.lease.Poisoned() {
		_ = d.Abandon()
		log.Error("the agent stops after the leader's stop-feeding pill: the watchdog stays armed and resets this node", "timeout", d.Timeout())
		return
	}
	if !stopping {
		_ = d.Abandon()
		log.Error("the agent stopped on a failure with the watchdog armed: this node resets unless the agent is restarted in time", "timeout", d.Timeout())
		return
	}
	f.mu.Lock()
	heard := f.disarmHeard
	f.mu.Unlock()
	if !heard {
		// The leader may still hold "armed" for this node and prove it off by time once it is
		// silent: a node that keeps running without its watchdog would make that proof false.
		_ = d.Abandon()
		log.Error("the coordinator did not acknowledge the \"disarmed\" report: the watchdog stays armed and resets this node unless an agent feeds it again in time",
			"timeout", d.Timeout(), "waited", disarmReportWait)
		return
	}
	if err := d.Disarm(); err != nil {
		log.Error("watchdog magic close failed: this node may reset", "error", err)
		return
	}
	log.Info("watchdog disarmed (magic close): a clean stop")
}

// runWithWatchdog runs the tasks (and the watchdog's feeder, if any) until ctx ends or one stops,
// reporting "disarmed" before the tasks stop on a clean stop and disarming or abandoning the device
// after.
func runWithWatchdog(ctx context.Context, tasks []task, f *feeder, a *agent.Agent, log *slog.Logger) int {
	if f == nil {
		return runTasks(ctx, tasks, log)
	}
	tasks = append(tasks, task{"watchdog", f.run(a)})
	runCtx, stopRun := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRun()
	go func() {
		select {
		case <-ctx.Done():
			f.reportDisarm(a) // the stream is still up: the coordinator hears it first
			stopRun()
		case <-runCtx.Done():
		}
	}()
	code := runTasks(runCtx, tasks, log)
	f.stop(ctx.Err() != nil, log)
	if f.peers != nil {
		f.peers.Close()
	}
	return code
}

// reportDisarm tells the coordinator the watchdog is about to be disarmed and waits (bounded) for
// the acknowledgement, so the node is never taken as self-fenced by a watchdog it no longer has.
func (f *feeder) reportDisarm(a *agent.Agent) {
	f.mu.Lock()
	f.closing = true // a grant arriving now must not arm a device this stop would not report
	d := f.dev
	f.mu.Unlock()
	if d == nil || f.lease.Poisoned() {
		return // poisoned: the watchdog stays armed; "disarmed" would be false
	}
	seq := a.ReportWatchdog(watchdogState(d, false))
	for deadline := time.Now().Add(disarmReportWait); !a.Acked(seq) && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
	}
	f.mu.Lock()
	f.disarmHeard = a.Acked(seq) // samples and heartbeats queued after it may still wait for theirs
	f.mu.Unlock()
}
