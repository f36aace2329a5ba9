package watchdogsim_test

import (
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodefence/nodefence/node-agent/watchdog"
	"github.com/nodefence/nodefence/testbed/watchdogsim"
)

const timeout = 300 * time.Millisecond

// start serves a stand-in with timeout and counts its resets.
func start(t *testing.T) (*watchdogsim.Device, *atomic.Int32) {
	t.Helper()
	var resets atomic.Int32
	d, err := watchdogsim.Start(filepath.Join(t.TempDir(), "watchdog"), timeout, func() { resets.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	return d, &resets
}

// arm opens the stand-in with the agent's driver (node-agent/watchdog).
func arm(t *testing.T, d *watchdogsim.Device) *watchdog.Device {
	t.Helper()
	w, err := watchdog.Open(d.Path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Abandon() })
	waitState(t, d, watchdogsim.Armed)
	return w
}

func waitState(t *testing.T, d *watchdogsim.Device, s watchdogsim.State) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Second); d.State() != s; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("device state %d, want %d", d.State(), s)
		}
	}
}

// feedFor feeds w every timeout/3 for dur.
func feedFor(t *testing.T, w *watchdog.Device, dur time.Duration) {
	t.Helper()
	for end := time.Now().Add(dur); time.Now().Before(end); time.Sleep(timeout / 3) {
		if err := w.Feed(); err != nil {
			t.Fatal(err)
		}
	}
}

// A stand-in nobody arms never resets.
func TestNeverArmedNeverResets(t *testing.T) {
	d, resets := start(t)
	time.Sleep(4 * timeout)
	if n := resets.Load(); n != 0 || d.State() != watchdogsim.Disarmed {
		t.Fatalf("never armed: %d resets, state %d", n, d.State())
	}
}

// A writer that dies without the magic close and is replaced within the timeout (an agent killed
// and restarted) keeps the node up: the device takes the new writer's feeds; once that one dies
// too and nobody replaces it, the device resets, once.
func TestReopenWithinTimeoutRearms(t *testing.T) {
	d, resets := start(t)
	first := arm(t, d)
	if err := first.Abandon(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(timeout / 3)
	second := arm(t, d)
	feedFor(t, second, 4*timeout)
	if n := resets.Load(); n != 0 {
		t.Fatalf("%d resets while a re-opened writer fed the device", n)
	}
	if err := second.Abandon(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * timeout)
	if n := resets.Load(); n != 1 {
		t.Fatalf("%d resets after the re-opened writer died too, want 1", n)
	}
	// After the reset the device waits to be armed again, and resets again when abandoned again.
	third := arm(t, d)
	if err := third.Abandon(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * timeout)
	if n := resets.Load(); n != 2 {
		t.Fatalf("%d resets after the next boot's writer died, want 2", n)
	}
}

// PowerLoss disarms an armed device (a node powered off by its BMC does not reset later) and drops
// what its dead writer left unread; the next boot's writer arms it again.
func TestPowerLossDisarms(t *testing.T) {
	d, resets := start(t)
	w := arm(t, d)
	for range 50 { // unread bytes in the FIFO when the power goes
		if err := w.Feed(); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Abandon(); err != nil {
		t.Fatal(err)
	}
	d.PowerLoss()
	if s := d.State(); s != watchdogsim.Disarmed {
		t.Fatalf("state %d after PowerLoss, want disarmed", s)
	}
	time.Sleep(4 * timeout)
	if n, s := resets.Load(), d.State(); n != 0 || s != watchdogsim.Disarmed {
		t.Fatalf("after a power loss: %d resets, state %d; want none, disarmed", n, s)
	}
	next := arm(t, d)
	feedFor(t, next, 2*timeout)
	if err := next.Disarm(); err != nil {
		t.Fatal(err)
	}
	waitState(t, d, watchdogsim.Disarmed)
	time.Sleep(3 * timeout)
	if n := resets.Load(); n != 0 {
		t.Fatalf("%d resets after the next boot's clean stop", n)
	}
	d.Stop()
	d.PowerLoss() // returns at once after Stop
}
