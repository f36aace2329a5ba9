package nodeagent

import (
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodefence/nodefence/node-agent/agent"
	"github.com/nodefence/nodefence/node-agent/watchdog"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/testbed/pki"
	"github.com/nodefence/nodefence/testbed/syncbuf"
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
	f := armedFeeder(t, sim, &opts, log)
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

// A clean stop whose "disarmed" report the coordinator never acknowledged (it is unreachable, or
// the stream broke) writes no magic close: the leader may still hold "armed" for the node and, once
// it is silent, prove it off by time — a node running on without its watchdog would make that
// proof false. The watchdog stays armed and resets the node.
func TestUnacknowledgedDisarmLeavesTheWatchdogArmed(t *testing.T) {
	p, err := pki.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	files, err := p.Files(identity.Agent, "n1")
	if err != nil {
		t.Fatal(err)
	}
	resets := make(chan struct{}, 1)
	// Its timeout outlasts the report's wait (disarmReportWait), so the state after the stop is the
	// stop's doing.
	sim, err := watchdogsim.Start(filepath.Join(t.TempDir(), "watchdog"), disarmReportWait+2*time.Second, func() { resets <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Stop()
	opts := Config{watchdogDevice: sim.Path, watchdogTimeout: 3 * time.Second}
	opts.agent.NodeName, opts.agent.TLS = "n1", files
	var logs syncbuf.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	f := armedFeeder(t, sim, &opts, log)
	// Nobody listens at the agent's coordinator: its "disarmed" report is never acknowledged.
	a, err := agent.New(agent.Config{Coordinators: []string{"127.0.0.1:1"}, NodeName: "n1", BootID: "b1", TLS: files, Lease: f.lease}, failingSampler{})
	if err != nil {
		t.Fatal(err)
	}
	f.reportDisarm(a)
	f.stop(true, log)
	time.Sleep(100 * time.Millisecond) // a magic close would have reached the device by now
	if sim.State() != watchdogsim.Armed {
		t.Fatalf("after a clean stop whose report was not acknowledged the device is %v, want still armed", sim.State())
	}
	if !strings.Contains(logs.String(), "did not acknowledge") {
		t.Errorf("the stop does not say why the watchdog stays armed:\n%s", logs.String())
	}
	select {
	case <-resets:
	case <-time.After(5 * time.Second):
		t.Fatal("the device did not reset the node")
	}
}

// armedFeeder is the watchdog feeder of opts with the stand-in sim opened, fed and armed, as after
// the agent's first lease.
func armedFeeder(t *testing.T, sim *watchdogsim.Device, opts *Config, log *slog.Logger) *feeder {
	t.Helper()
	f, ok := prepareWatchdog(opts, log)
	if !ok {
		t.Fatal("prepareWatchdog refused a writable device")
	}
	d, err := watchdog.Open(sim.Path, opts.watchdogTimeout)
	if err != nil {
		t.Fatal(err)
	}
	f.dev = d
	if err := d.Feed(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(2 * time.Second); sim.State() != watchdogsim.Armed && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
	}
	return f
}
