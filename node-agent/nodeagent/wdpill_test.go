package nodeagent

import (
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodefence/nodefence/node-agent/watchdog"
	"github.com/nodefence/nodefence/testbed/watchdogsim"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

// After the leader's stop-feeding pill, even a clean stop (SIGTERM, a rollout) neither reports
// "disarmed" nor writes the magic close: the watchdog stays armed and resets the node, which the
// leader is about to take as self-fenced.
func TestPoisonedCleanStopLeavesTheWatchdogArmed(t *testing.T) {
	resets := make(chan struct{}, 1)
	sim, err := watchdogsim.Start(filepath.Join(t.TempDir(), "watchdog"), time.Second, func() { resets <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Stop()
	opts := Config{watchdogDevice: sim.Path, watchdogTimeout: 3 * time.Second}
	opts.agent.NodeName = "n1"
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	f, ok := prepareWatchdog(&opts, log)
	if !ok {
		t.Fatal("prepareWatchdog refused a writable device")
	}
	d, err := watchdog.Open(sim.Path, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	f.dev = d
	if err := d.Feed(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(2 * time.Second); sim.State() != watchdogsim.Armed && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
	}
	f.lease.Poison(&agentv1.StopFeeding{Epoch: 1, FenceId: "f"})
	f.reportDisarm(nil) // would use the agent to report "disarmed": poisoned, it must not
	f.stop(true, log)
	time.Sleep(100 * time.Millisecond) // a magic close would have reached the device by now
	if sim.State() != watchdogsim.Armed {
		t.Fatalf("after a clean stop of a poisoned agent the device is %v, want still armed", sim.State())
	}
	select {
	case <-resets:
	case <-time.After(5 * time.Second):
		t.Fatal("the device did not reset the node")
	}
}
