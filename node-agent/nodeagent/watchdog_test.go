package nodeagent

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodefence/nodefence/testbed/watchdogsim"
)

// An agent without a lease — a fresh start, or a restart while the control plane is away — never
// opens the device: opening arms and feeds it, which would keep a partitioned node alive past the
// leader's safe time (and a crash loop would keep it alive for ever).
func TestNoLeaseNeverOpensTheDevice(t *testing.T) {
	sim, err := watchdogsim.Start(filepath.Join(t.TempDir(), "watchdog"), time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Stop()
	opts := Config{watchdogDevice: sim.Path, watchdogTimeout: 3 * time.Second}
	opts.agent.NodeName = "n1"
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	f, ok := prepareWatchdog(&opts, log)
	if !ok || opts.agent.Lease == nil {
		t.Fatal("prepareWatchdog refused a writable device, or set no lease")
	}
	// The feeder reports to its agent only once it armed the device: without a lease it needs none.
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	if err := f.run(nil)(ctx); err != nil {
		t.Fatal(err)
	}
	if f.device() != nil || sim.Feeds() != 0 || sim.State() != watchdogsim.Disarmed {
		t.Fatalf("without a lease: device opened %v, %d feeds, state %v", f.device() != nil, sim.Feeds(), sim.State())
	}
	for _, path := range []string{filepath.Join(t.TempDir(), "missing"), t.TempDir()} {
		opts := Config{watchdogDevice: path, watchdogTimeout: 3 * time.Second}
		if _, ok := prepareWatchdog(&opts, log); ok {
			t.Errorf("%s: prepared as a watchdog device", path)
		}
	}
}
