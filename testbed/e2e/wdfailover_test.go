package e2e

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/nodefence/nodefence/coordinator/app"
	"github.com/nodefence/nodefence/services/wdlease"
	"github.com/nodefence/nodefence/testbed/wait"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// TestWatchdogProofSurvivesFailover: two coordinator replicas on one etcd; a node cut off together
// with its BMC (as in TestWatchdogProofDarkBMC) falls back to its watchdog, and the leader is
// killed (its term abandoned, its lease left to expire) while the watchdog operation waits for the
// timing rule. The new leader never hears the node's agent: it continues the fence from what the
// old one persisted — the node's last watchdog report ("armed", its timeout) and the pill's safe
// time — and proves the node off by time no earlier than its own conservative bound (its term
// start, after the old leader stepped down, + the safe time), with the proof watchdog-timeout.
// Before the report was persisted, the new leader took the node's watchdog as never armed and the
// fence ended in error.
func TestWatchdogProofSurvivesFailover(t *testing.T) {
	nodes, cfgPath := wdNodes(t, []string{"wdf-a", "wdf-b", "wdf-c"}, map[string]bool{"wdf-c": true})
	// The election's lease is the product's default (5 s), not the other tests' 3 s: a replica
	// waiting in line keeps its place on a machine loaded enough to stall its keepalives.
	replica := func(id string, etcd *coordinator) *coordinator {
		cfg := wdCoordinator(t, id, cfgPath, etcd)
		cfg.ElectionTTL = app.DefaultElectionTTL
		return startCoordinator(t, cfg)
	}
	first := replica("first", nil)
	cc := conn(t, first.app.Addr())
	leaderReady(t, cc)
	second := replica("second", first)
	// The node to be cut off reaches the first replica, the leader, through its proxy alone (a
	// follower's redirect would name a replica's own address, past the proxy); the others reach
	// either replica. Their watchdog (wdFailoverTimeout) outlasts the failover: without peers, an
	// agent stops feeding once its lease expired with no leader to renew it.
	for _, n := range nodes[:2] {
		startWDAgent(t, n, wdFailoverTimeout, first.app.Addr(), second.app.Addr())
	}
	startWDAgent(t, nodes[2], wdFailoverTimeout, first.app.Addr())
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range nodes {
				t.Logf("agent %s:\n%s", n.name, n.log.String())
			}
		}
	})
	waitArmed(t, cc, len(nodes))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	wait.Until(t, 10*time.Second, "second campaigning", func() error {
		r, err := first.app.Etcd().Get(ctx, first.app.Store().LeaderPrefix()+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return err
		}
		if r.Count != 2 {
			return fmt.Errorf("%d election keys", r.Count)
		}
		return nil
	})

	c := nodes[2]
	c.proxy.Cut()
	c.bmc.Stop()
	fc := coordv1.NewFenceServiceClient(cc)
	r, err := fc.Fence(ctx, &coordv1.FenceRequest{Node: c.name, Reason: "dark BMC, then a failover"})
	if err != nil {
		t.Fatal(err)
	}
	wait.Until(t, 30*time.Second, "the watchdog fallback waits for the timing rule, its pill sent", func() error {
		g, err := fc.GetFence(ctx, &coordv1.GetFenceRequest{Id: r.Fence.Id})
		if err != nil {
			return err
		}
		ops := g.GetFence().GetOperations()
		if len(ops) != 2 || ops[1].GetDriver() != "watchdog" || ops[1].GetResult() != coordv1.OperationResult_OPERATION_RESULT_UNSPECIFIED {
			return fmt.Errorf("record %s, %d operations", g.GetFence().GetStatus(), len(ops))
		}
		audit, err := coordv1.NewClusterServiceClient(cc).ListAudit(ctx, &coordv1.ListAuditRequest{Node: c.name})
		if err != nil {
			return err
		}
		for _, e := range audit.GetEntries() {
			if e.GetKind() == "watchdog-pill" {
				return nil
			}
		}
		return errors.New("no pill audited")
	})
	oldEpoch := first.app.Term().Epoch
	before := time.Now() // the new term starts after this
	newEpoch := abandonTo(t, first, second, 60*time.Second)
	if newEpoch <= oldEpoch {
		t.Fatalf("new epoch %d <= old %d", newEpoch, oldEpoch)
	}

	f := final(t, coordv1.NewFenceServiceClient(conn(t, second.app.Addr())), r.Fence.Id, 2*time.Minute)
	if f.Status != coordv1.FenceStatus_FENCE_STATUS_DONE || f.Proof != coordv1.FenceProof_FENCE_PROOF_WATCHDOG_TIMEOUT || f.ConfirmedOffAt == nil {
		t.Fatalf("record %s: %s, proof %s, error %q, evidence %v", f.Id, f.Status, f.Proof, f.Error, f.Evidence)
	}
	off := f.ConfirmedOffAt.AsTime()
	safe := wdlease.Defaults(wdFailoverTimeout).SafeAfterGrant()
	if bound := before.Add(safe); off.Before(bound) {
		t.Fatalf("proven off %s after the failover began: before the new leader's bound (its term start + the safe time %s)", off.Sub(before), safe)
	}
	if op := f.Operations[len(f.Operations)-1]; op.GetDriver() != "watchdog" || op.GetEpoch() != newEpoch {
		t.Fatalf("the proof came from operation %s of epoch %d, want the watchdog operation of the new epoch %d", op.GetMethod(), op.GetEpoch(), newEpoch)
	}
	if rs := c.reset(); rs.IsZero() || !rs.Before(off) {
		t.Fatalf("proven off at %s but the watchdog reset the node at %v", off, rs)
	}
	for _, n := range nodes[:2] {
		if !n.reset().IsZero() {
			t.Errorf("%s reset though it held its lease", n.name)
		}
	}
	t.Logf("failover began %s; the new leader (epoch %d) proved %s off %s after it (safe time %s)",
		before.Format(time.StampMilli), newEpoch, c.name, off.Sub(before).Round(time.Millisecond), safe)
}

// wdFailoverTimeout is the agents' --watchdog-timeout in TestWatchdogProofSurvivesFailover: the lease
// (4 s) plus it outlasts a failover on a loaded machine (the election's 5 s lease, a campaign the
// abandoned replica may win again). The safe time is then max(⌈(4 s + 20 s)·1.01/0.99⌉ + 2 s·1.01,
// 2 × 20 s) = 40 s.
const wdFailoverTimeout = 20 * time.Second
