package fencing_test

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

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

// TestCrashAtEveryPointFencesExactlyOnce kills the leader at every point of the fence machine — before
// and after each record write, and between a driver's success and the record of it — and lets a new
// leader (a new term, a higher epoch) resume. Every fence must end DONE, confirmed off, with the BMC
// switched off exactly once: the driver de-duplicates the re-sent operation id.
func TestCrashAtEveryPointFencesExactlyOnce(t *testing.T) {
	endpoint, cli := etcdtest.Start(t)
	log := slog.New(slog.DiscardHandler)
	driverAddr, _ := kittest.Serve(t, ipmi.New(), kit.Options{PollInterval: 20 * time.Millisecond, Log: log})
	drivers := fencing.NewDrivers(tlsfiles.Files{Insecure: true}, nil)
	t.Cleanup(drivers.Close)
	st := store.New(cli, "/crash")

	points := []string{"before-write", "after-write", "after-call"}
	for _, point := range points {
		for k := 1; ; k++ {
			name := fmt.Sprintf("%s-%d", point, k)
			bmc, err := ipmisim.Start(filepath.Join(t.TempDir(), name), 0, "admin", "password")
			if err != nil {
				t.Fatal(err)
			}
			cfgYAML := fmt.Sprintf("drivers: {ipmi: {endpoint: %q}}\nnodes:\n  n1:\n    methods: {bmc: {driver: ipmi, parameters: {ip: 127.0.0.1, ipport: \"%d\", username: admin, password: password, cipher: \"3\"}}}\n    steps: {power_management: [bmc]}\n", driverAddr, bmc.Port)
			cfg, err := fenceconfig.Parse([]byte(cfgYAML), name)
			if err != nil {
				t.Fatal(err)
			}
			crashed := false
			seen := 0
			hook := func(p string, rec *coordv1.NodeFence) bool {
				if p != point || crashed {
					return false
				}
				seen++
				if seen == k {
					crashed = true
					return true
				}
				return false
			}
			rec := runCrashing(t, endpoint, st, cfg, drivers, log, hook)
			if rec.Status != coordv1.FenceStatus_FENCE_STATUS_DONE || rec.ConfirmedOffAt == nil || rec.FinishedAt == nil {
				t.Fatalf("%s: fence ended %s (confirmed off %v): %s", name, rec.Status, rec.ConfirmedOffAt, rec.Error)
			}
			calls, err := bmc.Calls()
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
				t.Fatalf("%s: the BMC was switched off %d times, want exactly once (calls %q)", name, offs, calls)
			}
			if on, _ := bmc.Power(); on {
				t.Fatalf("%s: BMC still on", name)
			}
			bmc.Stop()
			if !crashed {
				t.Logf("point %s: %d crash positions, each completed exactly once", point, k-1)
				break
			}
			if k > 20 {
				t.Fatalf("point %s: more than 20 positions", point)
			}
		}
	}
}

// runCrashing creates a fence for n1 under a first leader whose runner crashes at the hook, then
// lets a second leader resume the record to the end.
func runCrashing(t *testing.T, endpoint string, st *store.Store, cfg *fenceconfig.Config, drivers *fencing.Drivers, log *slog.Logger,
	hook func(string, *coordv1.NodeFence) bool) *coordv1.NodeFence {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	campaign := func(id string) *leader.Term {
		term, err := leader.NewElector(etcdtest.Client(t, endpoint), "/crash/leader", leader.Info{ID: id}, 1, log).Campaign(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return term
	}
	plan := func(step string) ([]fenceconfig.Resolved, error) { return cfg.Plan("n1", step) }
	policy := fencing.Policy{Retries: 0, Backoff: time.Millisecond, PollInterval: time.Millisecond}
	// The runners' clock runs 100 days ahead of the machine's: every time they write must be read
	// from it (one clock), never from the machine's.
	ahead := 100 * 24 * time.Hour
	clock := func() time.Time { return time.Now().Add(ahead) }

	first := campaign("first")
	rec := fencing.NewRecord(fmt.Sprintf("n1-%d", time.Now().UnixNano()), "n1", coordv1.FenceAction_FENCE_ACTION_OFF, plan, 0, time.Now())
	rec.Epoch = first.Epoch
	if _, _, _, err := st.CreateFence(ctx, first, rec); err != nil {
		t.Fatal(err)
	}
	r1 := &fencing.Runner{Store: st, Term: first, Config: func() *fenceconfig.Config { return cfg }, Drivers: drivers, OpTimeout: 5 * time.Second, Policy: policy, Log: log, Crash: hook, Now: clock}
	_ = r1.Run(ctx, rec.Id) // crashes at the hook (or completes when the hook never fires)
	first.Abandon()         // the process died: its lease expires on its own

	second := campaign("second")
	defer second.Resign(context.Background())
	r2 := &fencing.Runner{Store: st, Term: second, Config: func() *fenceconfig.Config { return cfg }, Drivers: drivers, OpTimeout: 5 * time.Second, Policy: policy, Log: log, Now: clock}
	if err := r2.Run(ctx, rec.Id); err != nil {
		t.Fatalf("resume: %v", err)
	}
	v, err := st.GetFence(ctx, rec.Id)
	if err != nil {
		t.Fatal(err)
	}
	earliest := time.Now().Add(ahead - time.Hour)
	times := map[string]*timestamppb.Timestamp{"updated_at": v.Fence.UpdatedAt, "finished_at": v.Fence.FinishedAt, "confirmed_off_at": v.Fence.ConfirmedOffAt}
	for _, op := range v.Fence.Operations {
		times["operation "+op.OperationId+" started_at"], times["operation "+op.OperationId+" finished_at"] = op.StartedAt, op.FinishedAt
	}
	for name, ts := range times {
		if ts != nil && ts.AsTime().Before(earliest) {
			t.Errorf("%s %s was not read from the runner's clock (100 days ahead)", name, ts.AsTime())
		}
	}
	return v.Fence
}
