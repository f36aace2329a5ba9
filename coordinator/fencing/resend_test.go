package fencing_test

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
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
	"github.com/nodefence/nodefence/testbed/tcpproxy"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// resendEnv is a fence of n1 through a real ipmi driver behind a proxy, with a real BMC and etcd.
type resendEnv struct {
	ctx   context.Context
	st    *store.Store
	bmc   *ipmisim.BMC
	proxy *tcpproxy.Proxy
	rec   *coordv1.NodeFence
	run   chan error
}

func startResend(t *testing.T) *resendEnv {
	endpoint, cli := etcdtest.Start(t)
	log := slog.New(slog.DiscardHandler)
	driverAddr, _ := kittest.Serve(t, ipmi.New(), kit.Options{PollInterval: 20 * time.Millisecond, Log: log, DefaultTimeout: 20 * time.Second})
	proxy, err := tcpproxy.Start(driverAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	drivers := fencing.NewDrivers(tlsfiles.Files{Insecure: true}, log)
	t.Cleanup(drivers.Close)
	st := store.New(cli, "/resend")
	bmc, err := ipmisim.Start(filepath.Join(t.TempDir(), "bmc"), 0, "admin", "password")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bmc.Stop() })
	if err := bmc.SetExternalPower(true); err != nil {
		t.Fatal(err)
	}
	cfg, err := fenceconfig.Parse([]byte(fmt.Sprintf("drivers: {ipmi: {endpoint: %q}}\nnodes:\n  n1:\n    methods: {bmc: {driver: ipmi, parameters: {ip: 127.0.0.1, ipport: \"%d\", username: admin, password: password, cipher: \"3\"}}}\n    steps: {power_management: [bmc]}\n", proxy.Addr(), bmc.Port)), "resend")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	term, err := leader.NewElector(etcdtest.Client(t, endpoint), "/resend/leader", leader.Info{ID: "c1"}, 5, log).Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = term.Resign(context.Background()) })
	plan := func(step string) ([]fenceconfig.Resolved, error) { return cfg.Plan("n1", step) }
	rec := fencing.NewRecord("n1-resend", "n1", coordv1.FenceAction_FENCE_ACTION_OFF, plan, 0, time.Now())
	rec.Epoch = term.Epoch
	if _, _, _, err := st.CreateFence(ctx, term, rec); err != nil {
		t.Fatal(err)
	}
	r := &fencing.Runner{Store: st, Term: term, Config: func() *fenceconfig.Config { return cfg }, Drivers: drivers,
		OpTimeout: 15 * time.Second, Policy: fencing.Policy{Retries: 1, Backoff: 10 * time.Millisecond, PollInterval: time.Millisecond}, Log: log}
	e := &resendEnv{ctx: ctx, st: st, bmc: bmc, proxy: proxy, rec: rec, run: make(chan error, 1)}
	go func() { e.run <- r.Run(ctx, rec.Id) }()
	return e
}

// offAtTheBMC waits until the power-off reached the BMC (held there, not yet done).
func (e *resendEnv) offAtTheBMC(t *testing.T) {
	for {
		req, err := e.bmc.PendingPower()
		if err != nil {
			t.Fatal(err)
		}
		if req == ipmisim.RequestOff {
			return
		}
		select {
		case <-e.ctx.Done():
			t.Fatal("no power-off reached the BMC")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// check waits for the fence and checks it confirmed the node off with one operation, no retry and
// one power-off at the BMC.
func (e *resendEnv) check(t *testing.T) {
	if err := <-e.run; err != nil {
		t.Fatalf("Run: %v", err)
	}
	v, err := e.st.GetFence(e.ctx, e.rec.Id)
	if err != nil {
		t.Fatal(err)
	}
	got := v.Fence
	if got.Status != coordv1.FenceStatus_FENCE_STATUS_DONE || got.ConfirmedOffAt == nil {
		t.Fatalf("fence ended %s (confirmed off %v): %s", got.Status, got.ConfirmedOffAt, got.Error)
	}
	if len(got.Operations) != 1 || got.Retries != 0 {
		t.Errorf("%d operations, %d retries; want the one operation, no retry", len(got.Operations), got.Retries)
	}
	calls, err := e.bmc.Calls()
	if err != nil {
		t.Fatal(err)
	}
	offs := 0
	for _, c := range calls {
		if strings.HasPrefix(c, "set power 0") {
			offs++
		}
	}
	if offs != 1 {
		t.Errorf("the BMC was switched off %d times, want once (calls %q)", offs, calls)
	}
}

// The connection to the driver dies while the power-off is at the BMC (the call's outcome is
// unknown). The runner reads the status back and resends the SAME operation id, which the driver
// joins to the power-off already under way: the BMC is switched off once, the record has one
// operation and no retry. Before the fix the call was recorded failed and retried as a new
// operation after the backoff: two power-offs.
func TestUnknownOutcomeResentWithSameOperationID(t *testing.T) {
	e := startResend(t)
	e.offAtTheBMC(t)
	e.proxy.Cut()
	time.Sleep(300 * time.Millisecond)
	e.proxy.Restore()
	if err := e.bmc.CompletePower(false); err != nil {
		t.Fatal(err)
	}
	e.check(t)
}

// The driver process dies while the power-off is at the BMC and a new one (its state lost, as a
// pod rescheduled elsewhere) answers in its place; the BMC completes the power-off meanwhile. The
// status read-back shows the node off: that is the outcome, and nothing is resent — the new driver
// does not know the operation and would switch the BMC off a second time (as it did before).
func TestDriverRestartedMidPowerOffSwitchesOffOnce(t *testing.T) {
	e := startResend(t)
	e.offAtTheBMC(t)
	log := slog.New(slog.DiscardHandler)
	second, _ := kittest.Serve(t, ipmi.New(), kit.Options{PollInterval: 20 * time.Millisecond, Log: log, DefaultTimeout: 20 * time.Second})
	e.proxy.Cut()
	e.proxy.Retarget(second)
	if err := e.bmc.CompletePower(false); err != nil {
		t.Fatal(err)
	}
	e.proxy.Restore()
	e.check(t)
}
