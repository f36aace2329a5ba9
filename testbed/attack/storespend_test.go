package attack

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodefence/nodefence/coordinator/app"
	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/testbed/ipmisim"
	"github.com/nodefence/nodefence/testbed/wait"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// TestOneAgentCannotSpendTheStore: node-a's agent certificate flips a condition as fast as it can
// over a real mTLS stream against a coordinator whose embedded etcd has a 16 MiB quota (before the
// per-node limit this wrote ~1.4 MB/s of audit and etcd raised NOSPACE within seconds, after which
// nothing could be fenced). After 30 s of flooding, an operator fences node-b through
// FenceService/Fence: the record must finish DONE and ipmitool must read node-b's BMC off. And the
// flood's share of the store is node-a's own limit: its condition changes reached the audit trail
// at most at the per-node rate (after the burst), and what was not written is summarised in
// rate-limit entries of node-a (the store-wide audit rate alone would let one node take all of it).
func TestOneAgentCannotSpendTheStore(t *testing.T) {
	const summary = 10 * time.Second
	s := start(t, "", func(c *app.Config) {
		c.EtcdQuotaBackendBytes = 16 << 20
		c.Engine.AgentEvents.Summary = summary
	})
	operator := dialWith(t, s.coord.Addr(), s.files(t, identity.Operator, "alice"))
	fc := coordv1.NewFenceServiceClient(operator)
	wait.Until(t, 30*time.Second, "leader elected", func() error {
		_, err := coordv1.NewClusterServiceClient(operator).ListNodes(context.Background(), &coordv1.ListNodesRequest{})
		return err
	})

	agentA := dialWith(t, s.coord.Addr(), s.files(t, identity.Agent, "node-a"))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	st, err := agentv1.NewAgentServiceClient(agentA).Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(hello("node-a")); err != nil {
		t.Fatal(err)
	}
	go func() { // the acks: read and forget
		for {
			if _, err := st.Recv(); err != nil {
				return
			}
		}
	}()
	var sent atomic.Int64
	floodStart := time.Now()
	floodCtx, stopFlood := context.WithCancel(ctx)
	floodDone := make(chan struct{})
	go func() {
		defer close(floodDone)
		for seq := uint64(2); floodCtx.Err() == nil; seq++ {
			status := agentv1.ConditionStatus_CONDITION_STATUS_TRUE
			if seq%2 == 0 {
				status = agentv1.ConditionStatus_CONDITION_STATUS_FALSE
			}
			err := st.Send(&agentv1.ConnectRequest{Seq: seq, Msg: &agentv1.ConnectRequest_Condition{Condition: &agentv1.ConditionChange{
				Type: agentv1.ConditionType_CONDITION_TYPE_MEMORY_PRESSURE, Status: status, Reason: fmt.Sprintf("flood-%d", seq)}}})
			if err != nil {
				return
			}
			sent.Add(1)
		}
	}()
	time.Sleep(30 * time.Second) // the flood runs; a bound on the attack, not a reading of the clock
	t.Logf("node-a's agent sent %d condition changes in 30 s", sent.Load())

	// The operator's fence completes while the flood goes on.
	f, err := fc.Fence(ctx, &coordv1.FenceRequest{Node: "node-b", Reason: "store flood"})
	if err != nil {
		t.Fatalf("operator fence during the flood: %v", err)
	}
	wait.Until(t, 60*time.Second, "fence done", func() error {
		g, err := fc.GetFence(ctx, &coordv1.GetFenceRequest{Id: f.Fence.Id})
		if err != nil {
			return err
		}
		if g.Fence.Status != coordv1.FenceStatus_FENCE_STATUS_DONE || g.Fence.ConfirmedOffAt == nil {
			return fmt.Errorf("status %s, confirmed off %v: %s", g.Fence.Status, g.Fence.ConfirmedOffAt, g.Fence.Error)
		}
		return nil
	})
	stopFlood()
	<-floodDone
	if p, err := ipmisim.IpmitoolPower(ctx, s.bmcs["node-b"].Port, "admin", "password"); err != nil || p != "off" {
		t.Fatalf("ipmitool node-b after the operator's fence: %q, %v; want off", p, err)
	}
	if sent.Load() < 1000 {
		t.Fatalf("the flood sent only %d messages: not a flood", sent.Load())
	}
	flood := time.Since(floodStart)                                // node-a's bucket was full when the flood began
	entries, err := s.coord.Store().ListAudit(ctx, "node-a", 0, 0) // the whole trail of node-a
	if err != nil {
		t.Fatal(err)
	}
	written := map[string]int{}
	for _, e := range entries {
		written[e.Kind]++
	}
	lim := engine.DefaultConfig().AgentEvents
	bound := lim.Burst + int(flood.Seconds()*lim.Rate) + 2
	t.Logf("node-a's audit entries in %s of flooding: %v (condition bound %d)", flood.Round(time.Second), written, bound)
	if written["condition"] > bound {
		t.Fatalf("%d condition changes of node-a reached the audit trail in %s: more than its limit (burst %d, %g a second) allows", written["condition"], flood.Round(time.Second), lim.Burst, lim.Rate)
	}
	if written["rate-limit"] == 0 {
		t.Fatalf("no rate-limit summary of node-a's dropped changes in %s (summary every %s)", flood.Round(time.Second), summary)
	}
}
