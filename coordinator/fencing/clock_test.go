package fencing_test

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodefence/nodefence/coordinator/fenceconfig"
	"github.com/nodefence/nodefence/coordinator/fencing"
	"github.com/nodefence/nodefence/coordinator/leader"
	"github.com/nodefence/nodefence/coordinator/store"
	"github.com/nodefence/nodefence/services/clock"
	"github.com/nodefence/nodefence/services/tlsfiles"
	"github.com/nodefence/nodefence/testbed/etcdtest"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// The runner decides by its clock and waits on the same clock: a record delayed by an hour is not
// looked at again while the runner's clock stands still (a runner waiting on the machine's timers
// re-decided every second of the machine's time), and goes on as soon as the clock is moved past
// the delay.
func TestRunnerWaitsOnItsClock(t *testing.T) {
	endpoint, cli := etcdtest.Start(t)
	log := slog.New(slog.DiscardHandler)
	st := store.New(cli, "/clock")
	cfg, err := fenceconfig.Parse([]byte("drivers: {ipmi: {endpoint: \"127.0.0.1:1\"}}\nnodes:\n  n1:\n    methods: {bmc: {driver: ipmi, parameters: {ip: 127.0.0.1, username: admin, password: password}}}\n    steps: {power_management: [bmc]}\n"), "clock")
	if err != nil {
		t.Fatal(err)
	}
	drivers := fencing.NewDrivers(tlsfiles.Files{Insecure: true}, nil)
	t.Cleanup(drivers.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	term, err := leader.NewElector(etcdtest.Client(t, endpoint), "/clock/leader", leader.Info{ID: "a"}, 5, log).Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer term.Resign(context.Background())

	fake := clock.NewFake(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	plan := func(step string) ([]fenceconfig.Resolved, error) { return cfg.Plan("n1", step) }
	rec := fencing.NewRecord("n1-clock", "n1", coordv1.FenceAction_FENCE_ACTION_OFF, plan, time.Hour, fake.Now())
	rec.Epoch = term.Epoch
	if _, _, _, err := st.CreateFence(ctx, term, rec); err != nil {
		t.Fatal(err)
	}
	var decisions atomic.Int32
	r := &fencing.Runner{Store: st, Term: term, Config: func() *fenceconfig.Config { return cfg }, Drivers: drivers,
		OpTimeout: time.Second, Policy: fencing.DefaultPolicy(), Log: log, Now: fake.Now, After: fake.After,
		Facts: func(context.Context, string) (bool, time.Time) { decisions.Add(1); return false, time.Time{} }}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(rctx, rec.Id) }()
	defer func() { stop(); <-done }()

	waitFor(t, func() bool { return decisions.Load() == 1 })
	time.Sleep(1500 * time.Millisecond) // the machine's time goes on, the runner's clock does not
	if n := decisions.Load(); n != 1 {
		t.Fatalf("the runner decided %d times while its clock stood still: it waits on another clock", n)
	}
	waitFor(t, func() bool { return fake.Waiters() == 1 })
	fake.Advance(time.Hour)
	waitFor(t, func() bool { return decisions.Load() >= 2 })
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
