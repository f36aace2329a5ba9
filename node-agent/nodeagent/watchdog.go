package nodeagent

import (
	"context"
	"log/slog"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/nodefence/nodefence/node-agent/agent"
	"github.com/nodefence/nodefence/node-agent/watchdog"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

// defaultWatchdogTimeout is --watchdog-timeout's default: the agent feeds every third of it, so two
// feeds may be lost to a stalled process before the node resets.
const defaultWatchdogTimeout = 15 * time.Second

// disarmReportWait bounds how long a clean stop waits for the coordinator to acknowledge the
// "disarmed" report before the magic close.
const disarmReportWait = 2 * time.Second

// armWatchdog arms the device named by --watchdog-device, if any, and puts its state in the agent's
// hello. A device that cannot be armed stops the agent from starting: running as if armed would
// make a silent node look self-fenced when it is not.
func armWatchdog(opts *Config, log *slog.Logger) (*watchdog.Device, bool) {
	if opts.watchdogDevice == "" {
		return nil, true
	}
	d, err := watchdog.Open(opts.watchdogDevice, opts.watchdogTimeout)
	if err != nil {
		log.Error("cannot arm the watchdog; not starting", "error", err)
		return nil, false
	}
	if !d.Ioctl {
		log.Warn("the watchdog device has no timeout ioctl: its own timeout applies, and the configured one is reported", "device", d.Path(), "timeout", d.Timeout())
	}
	log.Info("watchdog armed: a clean stop disarms it; a killed agent not restarted within the timeout resets this node",
		"device", d.Path(), "timeout", d.Timeout())
	opts.agent.Watchdog = watchdogState(d, true)
	return d, true
}

func watchdogState(d *watchdog.Device, armed bool) *agentv1.WatchdogState {
	return &agentv1.WatchdogState{Armed: armed, Timeout: durationpb.New(d.Timeout()), Ioctl: d.Ioctl}
}

// feedWatchdog feeds d every third of its timeout until ctx ends; a feed that fails ends the agent
// (the node resets unless it is restarted in time).
func feedWatchdog(d *watchdog.Device) func(context.Context) error {
	return func(ctx context.Context) error {
		t := time.NewTicker(d.Timeout() / 3)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
				if err := d.Feed(); err != nil {
					return err
				}
			}
		}
	}
}

// stopWatchdog ends the watchdog with the agent. A clean stop (stopping: the agent was asked to
// stop) reports "disarmed" to the coordinator, waits for the acknowledgement (bounded), and writes
// the magic close; any other end leaves the watchdog armed, so the node resets unless the agent is
// restarted within the timeout.
func stopWatchdog(d *watchdog.Device, stopping bool, log *slog.Logger) {
	if d == nil {
		return
	}
	if !stopping {
		_ = d.Abandon()
		log.Error("the agent stopped on a failure with the watchdog armed: this node resets unless the agent is restarted in time", "timeout", d.Timeout())
		return
	}
	if err := d.Disarm(); err != nil {
		log.Error("watchdog magic close failed: this node may reset", "error", err)
		return
	}
	log.Info("watchdog disarmed (magic close): a clean stop")
}

// runWithWatchdog runs the tasks (and the watchdog's feeding, if armed) until ctx ends or one stops,
// reporting "disarmed" before the tasks stop on a clean stop and disarming or abandoning the device
// after.
func runWithWatchdog(ctx context.Context, tasks []task, d *watchdog.Device, a *agent.Agent, log *slog.Logger) int {
	if d == nil {
		return runTasks(ctx, tasks, log)
	}
	tasks = append(tasks, task{"watchdog", feedWatchdog(d)})
	runCtx, stopRun := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRun()
	go func() {
		select {
		case <-ctx.Done():
			reportDisarm(d, a) // the stream is still up: the coordinator hears it first
			stopRun()
		case <-runCtx.Done():
		}
	}()
	code := runTasks(runCtx, tasks, log)
	stopWatchdog(d, ctx.Err() != nil, log)
	return code
}

// reportDisarm tells the coordinator the watchdog is about to be disarmed and waits (bounded) for
// the acknowledgement, so the node is never taken as self-fenced by a watchdog it no longer has.
func reportDisarm(d *watchdog.Device, a *agent.Agent) {
	a.Send(&agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Watchdog{Watchdog: watchdogState(d, false)}})
	for deadline := time.Now().Add(disarmReportWait); a.Unacked() > 0 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
	}
}
