package fencing_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/nodefence/nodefence/coordinator/fenceconfig"
	"github.com/nodefence/nodefence/coordinator/fencing"
	"github.com/nodefence/nodefence/coordinator/leader"
	"github.com/nodefence/nodefence/coordinator/store"
	"github.com/nodefence/nodefence/fence-drivers/ipmi"
	"github.com/nodefence/nodefence/fence-drivers/kit"
	"github.com/nodefence/nodefence/fence-drivers/kit/kittest"
	"github.com/nodefence/nodefence/services/tlsfiles"
	"github.com/nodefence/nodefence/testbed/etcdtest"
	"github.com/nodefence/nodefence/testbed/ipmisim"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// A BMC that answers nothing (a UDP black hole: the node and its BMC lost power together) behind
// two real ipmi driver hosts. Each host answers that the BMC never answered the session's opening
// (fault.ErrNotSent, a structured detail): the power-off certainly did not happen, so the runner
// tries the second host once and then records the operation failed as unreachable, in about two
// of the driver's session timeouts — not after reading the dark BMC back for the whole
// --fence-op-timeout (here 20 s) as an outcome it could not know. Before the fix the operation
// took the whole op timeout (the dark-BMC benchmark row's largest phase).
func TestDarkBMCFailsFastAsUnreachable(t *testing.T) {
	endpoint, cli := etcdtest.Start(t)
	log := slog.New(slog.DiscardHandler)
	opts := kit.Options{PollInterval: 20 * time.Millisecond, Log: log, DefaultTimeout: 20 * time.Second}
	first, _ := kittest.Serve(t, ipmi.New(), opts)
	second, _ := kittest.Serve(t, ipmi.New(), opts)
	port, closeHole, err := ipmisim.Blackhole()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeHole)
	drivers := fencing.NewDrivers(tlsfiles.Files{Insecure: true}, log)
	t.Cleanup(drivers.Close)
	cfg, err := fenceconfig.Parse([]byte(fmt.Sprintf("drivers: {ipmi: {endpoints: [%q, %q]}}\nnodes:\n  n1:\n    methods: {bmc: {driver: ipmi, parameters: {ip: 127.0.0.1, ipport: \"%d\", username: admin, password: password, ipmitool_timeout: \"0.2\"}}}\n    steps: {power_management: [bmc]}\n",
		first, second, port)), "dark")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	term, err := leader.NewElector(etcdtest.Client(t, endpoint), "/dark/leader", leader.Info{ID: "c1"}, 5, log).Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = term.Resign(context.Background()) })
	st := store.New(cli, "/dark")
	rec := fencing.NewRecord("n1-dark", "n1", coordv1.FenceAction_FENCE_ACTION_OFF, func(step string) ([]fenceconfig.Resolved, error) { return cfg.Plan("n1", step) }, 0, time.Now())
	rec.Epoch = term.Epoch
	if _, _, _, err := st.CreateFence(ctx, term, rec); err != nil {
		t.Fatal(err)
	}
	r := &fencing.Runner{Store: st, Term: term, Config: func() *fenceconfig.Config { return cfg }, Drivers: drivers,
		OpTimeout: 20 * time.Second, Policy: fencing.Policy{Retries: 0, Backoff: 10 * time.Millisecond, PollInterval: time.Millisecond}, Log: log}
	start := time.Now()
	if err := r.Run(ctx, rec.Id); err != nil {
		t.Fatalf("Run: %v", err)
	}
	took := time.Since(start)
	v, err := st.GetFence(ctx, rec.Id)
	if err != nil {
		t.Fatal(err)
	}
	got := v.Fence
	if got.Status != coordv1.FenceStatus_FENCE_STATUS_ERROR || got.ConfirmedOffAt != nil || len(got.Operations) != 1 {
		t.Fatalf("fence ended %s with %d operations (confirmed off %v): %s", got.Status, len(got.Operations), got.ConfirmedOffAt, got.Error)
	}
	op := got.Operations[0]
	if !fencing.Unreachable(op) {
		t.Errorf("operation failed with %q: want unreachable (the watchdog fallback's trigger)", op.Error)
	}
	if el := op.GetElapsed().AsDuration(); el > 8*time.Second || took > 10*time.Second {
		t.Errorf("the operation took %s (the fence %s): want about two session timeouts, far less than the 20 s op timeout", el, took)
	}
}
