package watchdog_test

import (
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodefence/nodefence/node-agent/watchdog"
	"github.com/nodefence/nodefence/testbed/watchdogsim"
)

// startSim starts a testbed watchdog with timeout and counts its resets.
func startSim(t *testing.T, timeout time.Duration) (*watchdogsim.Device, *atomic.Int32) {
	t.Helper()
	var resets atomic.Int32
	sim, err := watchdogsim.Start(filepath.Join(t.TempDir(), "watchdog"), timeout, func() { resets.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sim.Stop)
	return sim, &resets
}

// waitFor polls cond for up to d.
func waitFor(d time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// Opening arms; feeding keeps the node up past many timeouts; the magic close on a clean stop
// resets nothing.
func TestFedThenDisarmedNeverResets(t *testing.T) {
	sim, resets := startSim(t, 300*time.Millisecond)
	d, err := watchdog.Open(sim.Path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if d.Ioctl || d.Timeout() != time.Second {
		t.Fatalf("a FIFO stand-in: ioctl %v, timeout %s; want the configured 1s without ioctl", d.Ioctl, d.Timeout())
	}
	if !waitFor(time.Second, func() bool { return sim.State() == watchdogsim.Armed }) {
		t.Fatal("opening did not arm the device")
	}
	for range 15 { // 1.5 s: five of the device's timeouts
		if err := d.Feed(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := d.Disarm(); err != nil {
		t.Fatal(err)
	}
	if !waitFor(time.Second, func() bool { return sim.State() == watchdogsim.Disarmed }) {
		t.Fatal("the magic close did not disarm the device")
	}
	time.Sleep(600 * time.Millisecond)
	if n := resets.Load(); n != 0 {
		t.Fatalf("%d resets of a fed, then disarmed, watchdog", n)
	}
	if err := d.Feed(); err == nil {
		t.Fatal("fed after the magic close")
	}
}

// A feeder that dies (closes without the magic close) or hangs (keeps the device open, writes
// nothing) resets its node after the timeout, once.
func TestAbandonedOrHungFeederResets(t *testing.T) {
	for _, tc := range []struct {
		name string
		stop func(*watchdog.Device) error
	}{
		{"closed without the magic close", (*watchdog.Device).Abandon},
		{"held open, unfed", func(*watchdog.Device) error { return nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sim, resets := startSim(t, 300*time.Millisecond)
			d, err := watchdog.Open(sim.Path, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Disarm()
			if err := tc.stop(d); err != nil {
				t.Fatal(err)
			}
			stopped := time.Now()
			if !waitFor(2*time.Second, func() bool { return resets.Load() == 1 }) {
				t.Fatalf("no reset %s after the feeder stopped", time.Since(stopped))
			}
			if took := time.Since(stopped); took < 250*time.Millisecond {
				t.Fatalf("reset %s after the feeder stopped, before the 300ms timeout", took)
			}
			time.Sleep(500 * time.Millisecond)
			if n := resets.Load(); n != 1 {
				t.Fatalf("%d resets, want one", n)
			}
		})
	}
}

// A device that cannot be armed, or a timeout out of range, is an error naming it: the agent must
// not run as if armed.
func TestOpenRefusals(t *testing.T) {
	if _, err := watchdog.Open(filepath.Join(t.TempDir(), "missing"), 10*time.Second); err == nil || !strings.Contains(err.Error(), "arm watchdog") {
		t.Fatalf("missing device: %v", err)
	}
	for _, to := range []time.Duration{0, 500 * time.Millisecond, 1500 * time.Millisecond, time.Hour} {
		if _, err := watchdog.Open("/dev/null", to); err == nil || !strings.Contains(err.Error(), "whole seconds") {
			t.Errorf("timeout %s: %v", to, err)
		}
	}
}
