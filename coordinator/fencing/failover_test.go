package fencing_test

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
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

// startHosts is a fence of n1 through three IPMI driver hosts, each a real driver server over TCP
// with its own state directory (its own operation and epoch tables, as on separate machines), the
// first behind a proxy that can kill it; a real BMC (held power changes when external) and etcd.
func startHosts(t *testing.T, external bool, beforeRun func(e *resendEnv)) *resendEnv {
	endpoint, cli := etcdtest.Start(t)
	log := slog.New(slog.DiscardHandler)
	var addrs []string
	for range 3 {
		a, _ := kittest.Serve(t, ipmi.New(), kit.Options{PollInterval: 20 * time.Millisecond, Log: log, DefaultTimeout: 20 * time.Second})
		addrs = append(addrs, a)
	}
	proxy, err := tcpproxy.Start(addrs[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	drivers := fencing.NewDrivers(tlsfiles.Files{Insecure: true}, log)
	t.Cleanup(drivers.Close)
	st := store.New(cli, "/failover")
	bmc, err := ipmisim.Start(filepath.Join(t.TempDir(), "bmc"), 0, "admin", "password")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bmc.Stop() })
	if err := bmc.SetExternalPower(external); err != nil {
		t.Fatal(err)
	}
	cfg, err := fenceconfig.Parse([]byte(fmt.Sprintf("drivers: {ipmi: {endpoints: [%q, %q, %q]}}\nnodes:\n  n1:\n    methods: {bmc: {driver: ipmi, parameters: {ip: 127.0.0.1, ipport: \"%d\", username: admin, password: password, cipher: \"3\"}}}\n    steps: {power_management: [bmc]}\n",
		proxy.Addr(), addrs[1], addrs[2], bmc.Port)), "failover")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	term, err := leader.NewElector(etcdtest.Client(t, endpoint), "/failover/leader", leader.Info{ID: "c1"}, 5, log).Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = term.Resign(context.Background()) })
	plan := func(step string) ([]fenceconfig.Resolved, error) { return cfg.Plan("n1", step) }
	rec := fencing.NewRecord("n1-failover", "n1", coordv1.FenceAction_FENCE_ACTION_OFF, plan, 0, time.Now())
	rec.Epoch = term.Epoch
	if _, _, _, err := st.CreateFence(ctx, term, rec); err != nil {
		t.Fatal(err)
	}
	r := &fencing.Runner{Store: st, Term: term, Config: func() *fenceconfig.Config { return cfg }, Drivers: drivers,
		OpTimeout: 15 * time.Second, Policy: fencing.Policy{Retries: 1, Backoff: 10 * time.Millisecond, PollInterval: time.Millisecond}, Log: log}
	e := &resendEnv{ctx: ctx, st: st, bmc: bmc, proxy: proxy, rec: rec, run: make(chan error, 1)}
	if beforeRun != nil {
		beforeRun(e)
	}
	go func() { e.run <- r.Run(ctx, rec.Id) }()
	return e
}

// The first of three driver hosts is down when the fence starts. The runner moves on to the
// second, after a status read-back through it: the fence is confirmed off with one operation, no
// retry, and the BMC switched off once. Before several endpoints per driver, the only endpoint was
// the dead host: the fence failed.
func TestFenceCompletesWhileFirstDriverHostIsDown(t *testing.T) {
	e := startHosts(t, false, func(e *resendEnv) { e.proxy.Cut() })
	e.check(t)
}

// The first driver host dies while its power-off is at the BMC (sent, not yet applied); the BMC
// then completes it. The runner reads the status back through the next host, sees the node off,
// and takes that as the outcome: nothing is resent, and the second host — which never saw the
// operation and has no entry for it in its own operation table — never switches the BMC a second
// time. The BMC is switched off once.
func TestFirstDriverHostDiesMidPowerOff(t *testing.T) {
	e := startHosts(t, true, nil)
	e.offAtTheBMC(t)
	e.proxy.Cut() // the host is gone: its connection is closed, new ones refused
	if err := e.bmc.CompletePower(false); err != nil {
		t.Fatal(err)
	}
	e.check(t)
}
