package main

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodefence/nodefence/testbed/ipmisim"
)

// A simulated node's supply sees every power change its BMC is asked for, however short: an off
// switched on again 40 ms later is an off and then a boot, and a fence then unfence 90 ms apart
// boots the node again. An "on" of a node that is on boots nothing. Driven with ipmitool against
// ipmi_sim.
func TestSupplySeesShortOffs(t *testing.T) {
	bmc, err := ipmisim.Start(filepath.Join(t.TempDir(), "bmc"), 0, "admin", "password")
	if err != nil {
		t.Fatal(err)
	}
	defer bmc.Stop()
	if err := bmc.SetExternalPower(true); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var events []string
	note := func(e string) func() {
		return func() { mu.Lock(); events = append(events, e); mu.Unlock() }
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go followPower(ctx, bmc, note("off"), note("on"), slog.New(slog.DiscardHandler))

	power := func(action string) {
		t.Helper()
		cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
		defer ccancel()
		if err := ipmisim.IpmitoolChassisPower(cctx, bmc.Port, "admin", "password", action); err != nil {
			t.Fatalf("chassis power %s: %v", action, err)
		}
	}
	power("on") // already on: nothing boots
	power("off")
	time.Sleep(40 * time.Millisecond)
	power("on")
	power("off")
	time.Sleep(90 * time.Millisecond)
	power("on")
	power("cycle") // ipmi_sim switches off, then on again a moment later
	want, got := "off on off on off on", ""
	for deadline := time.Now().Add(10 * time.Second); got != want && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		mu.Lock()
		got = strings.Join(events, " ")
		mu.Unlock()
	}
	if got != want {
		t.Fatalf("the supply saw %q, want %q", got, want)
	}
	if on, err := bmc.Power(); err != nil || !on {
		t.Fatalf("BMC reads power %v (%v), want on", on, err)
	}
}
