package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/nodefence/nodefence/coordinator/app"
	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/node-agent/agent"
	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/testbed/ipmisim"
	"github.com/nodefence/nodefence/testbed/wait"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
)

// Two coordinators on one etcd: the follower refuses mutations naming the leader; the leader dies;
// the follower takes over with a higher epoch; the driver then refuses the deposed leader's epoch.
func TestFailoverAndStaleEpochAtTheDriver(t *testing.T) {
	n := node{name: "node-1", password: "password", bmc: startBMC(t, "node-1")}
	driver := startDriver(t, t.TempDir())
	cfgPath := writeConfig(t, driver, []node{n})
	first := startCoordinator(t, app.Config{ID: "first", FenceConfig: cfgPath})
	leaderReady(t, conn(t, first.app.Addr()))
	second := startCoordinator(t, app.Config{ID: "second", FenceConfig: cfgPath, EtcdEndpoints: []string{first.app.EtcdEndpoint()}, EtcdAccess: first.app.EtcdAccess()})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	secondConn := conn(t, second.app.Addr())
	var trailer metadata.MD
	_, err := coordv1.NewFenceServiceClient(secondConn).Fence(ctx, &coordv1.FenceRequest{Node: n.name}, grpc.Trailer(&trailer))
	if status.Code(err) != codes.Unavailable || fault.LeaderFromTrailer(trailer) != first.app.Addr() || !strings.Contains(err.Error(), "first") {
		t.Fatalf("follower Fence: err = %v trailer = %v; want Unavailable naming leader first at %s", err, trailer, first.app.Addr())
	}
	gl, err := coordv1.NewClusterServiceClient(secondConn).GetLeader(ctx, &coordv1.GetLeaderRequest{})
	if err != nil || gl.Id != "first" || gl.IsSelf {
		t.Fatalf("GetLeader from follower = %v, %v", gl, err)
	}
	oldEpoch := first.app.Term().Epoch
	// Wait until the second replica is queued in the election; otherwise the stalled first replica,
	// still alive, could campaign again ahead of it and rightly win.
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

	// The leader's process "dies" without resigning: its lease must expire (abandonTo).
	newEpoch := abandonTo(t, first, second, 60*time.Second)
	if newEpoch <= oldEpoch {
		t.Fatalf("new epoch %d <= old %d", newEpoch, oldEpoch)
	}
	resp, err := coordv1.NewFenceServiceClient(secondConn).Fence(ctx, &coordv1.FenceRequest{Node: n.name})
	if err != nil {
		t.Fatal(err)
	}
	states := watchUntilFinal(t, ctx, coordv1.NewFenceServiceClient(secondConn), resp.Fence.Id)
	if f := states[len(states)-1]; f.Status != coordv1.FenceStatus_FENCE_STATUS_DONE || f.Operations[0].Epoch != newEpoch {
		t.Fatalf("fence by new leader: %v", f)
	}
	// The deposed leader's epoch reaches the driver: refused, the BMC untouched.
	dc := driverv1.NewFenceDriverServiceClient(connAs(t, driver, tlsAs(t, identity.Coordinator, "first")))
	_, err = dc.PowerOn(ctx, &driverv1.PowerOnRequest{OperationId: "stale-1", Epoch: oldEpoch, Timeout: durationpb.New(5 * time.Second),
		Target: &driverv1.Target{Name: n.name, Parameters: map[string]string{"ip": "127.0.0.1", "ipport": fmt.Sprint(n.bmc.Port), "username": "admin", "password": "password", "lanplus": "1", "cipher": "3"}}})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("stale epoch PowerOn: %v, want FailedPrecondition", err)
	}
	if p, err := ipmisim.IpmitoolPower(ctx, n.bmc.Port, "admin", "password"); err != nil || p != "off" {
		t.Fatalf("after stale PowerOn: ipmitool = %q, %v; want still off", p, err)
	}
}

// Automatic fencing end to end: a node's agent stops while its BMC says on; after the grace period
// and the fence timeout the coordinator fences it on its own, confirms the power-off by read-back
// (ipmitool agrees), and the record is done. A node whose BMC accepts commands but never changes
// state ends in ERROR after its retries, escalated, never confirmed off.
func TestAutomaticFencing(t *testing.T) {
	var nodes []node
	for _, name := range []string{"node-1", "node-2", "node-3", "node-4"} {
		nodes = append(nodes, node{name: name, password: "password", bmc: startBMC(t, name)})
	}
	driver := startDriver(t, t.TempDir())
	eng := engine.DefaultConfig()
	eng.NodeMonitorGracePeriod, eng.NodeStartupGracePeriod = time.Second, 2*time.Second
	eng.NodeEvictionRate = 10
	eng.Fence.Timeout = time.Second
	c := startCoordinator(t, app.Config{FenceConfig: writeConfig(t, driver, nodes), Engine: eng,
		AgentHeartbeatInterval: 200 * time.Millisecond, AgentSampleInterval: 200 * time.Millisecond})
	cc := conn(t, c.app.Addr())
	leaderReady(t, cc)
	fc := coordv1.NewFenceServiceClient(cc)
	stop := map[string]func(){}
	for _, n := range nodes {
		a, err := agent.New(agent.Config{Coordinators: []string{c.app.Addr()}, TLS: tlsAs(t, identity.Agent, n.name), NodeName: n.name, BootID: "b", Zone: "a", Log: testLog(t)}, fixedSampler{})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); a.Run(ctx) }()
		stop[n.name] = func() { cancel(); <-done }
		t.Cleanup(stop[n.name])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	fenceOf := func(name string) *coordv1.NodeFence {
		r, err := fc.ListFences(ctx, &coordv1.ListFencesRequest{Node: name})
		if err != nil || len(r.Fences) == 0 {
			return nil
		}
		return r.Fences[0]
	}
	time.Sleep(2 * time.Second) // every agent has reported for a while: no fence may exist yet
	for _, n := range nodes {
		if f := fenceOf(n.name); f != nil {
			t.Fatalf("%s fenced while reporting: %v", n.name, f)
		}
	}

	victim := nodes[1]
	silenced := time.Now()
	stop[victim.name]()
	var rec *coordv1.NodeFence
	wait.Until(t, 30*time.Second, victim.name+" fenced automatically", func() error {
		if rec = fenceOf(victim.name); rec == nil || rec.FinishedAt == nil {
			return fmt.Errorf("record %v", rec)
		}
		return nil
	})
	if rec.Status != coordv1.FenceStatus_FENCE_STATUS_DONE || !rec.Automatic || rec.ConfirmedOffAt == nil || rec.RequestedBy != "coordinator" {
		t.Fatalf("automatic fence: %v", rec)
	}
	// The last contact was at most one heartbeat (200ms) before the agent stopped.
	if took := rec.ConfirmedOffAt.AsTime().Sub(silenced); took < 1800*time.Millisecond {
		t.Fatalf("fenced %s after the agent stopped, before grace (1s) + fence timeout (1s) since its last contact", took)
	}
	if !strings.Contains(strings.Join(rec.Evidence, "\n"), "Unknown since") {
		t.Fatalf("evidence does not say why: %q", rec.Evidence)
	}
	if p, err := ipmisim.IpmitoolPower(ctx, victim.bmc.Port, "admin", "password"); err != nil || p != "off" {
		t.Fatalf("ipmitool after automatic fence: %q, %v", p, err)
	}
	// The audit trail tells the story: judged Unknown, released by pacing, fence requested, fenced.
	audit, err := coordv1.NewClusterServiceClient(cc).ListAudit(ctx, &coordv1.ListAuditRequest{Node: victim.name})
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, e := range audit.Entries {
		if len(kinds) == 0 || kinds[len(kinds)-1] != e.Kind {
			kinds = append(kinds, e.Kind)
		}
	}
	if got := strings.Join(kinds, ","); !strings.HasPrefix(got, "readiness,eviction,fence-requested,fence") {
		t.Fatalf("audit kinds for %s: %s\n%v", victim.name, got, audit.Entries)
	}
	t.Logf("automatic fence confirmed %.2fs after the agent stopped", rec.ConfirmedOffAt.AsTime().Sub(silenced).Seconds())

	stuck := nodes[2]
	if err := stuck.bmc.SetFault(ipmisim.FaultStuck); err != nil {
		t.Fatal(err)
	}
	stop[stuck.name]()
	wait.Until(t, 60*time.Second, stuck.name+" fence finished", func() error {
		if rec = fenceOf(stuck.name); rec == nil || rec.FinishedAt == nil {
			return fmt.Errorf("record %v", rec)
		}
		return nil
	})
	if rec.Status != coordv1.FenceStatus_FENCE_STATUS_ERROR || rec.ConfirmedOffAt != nil || rec.Retries != 1 {
		t.Fatalf("stuck BMC: want ERROR after 1 retry, never confirmed off; got %v", rec)
	}
	for _, op := range rec.Operations {
		if op.Result == coordv1.OperationResult_OPERATION_RESULT_CONFIRMED {
			t.Fatalf("stuck BMC: operation reported confirmed: %v", op)
		}
	}
	if on, err := stuck.bmc.Power(); err != nil || !on {
		t.Fatalf("stuck BMC power state %v, %v: want still on", on, err)
	}
	// The nodes that kept reporting were never fenced.
	for _, n := range []node{nodes[0], nodes[3]} {
		if f := fenceOf(n.name); f != nil {
			t.Fatalf("%s fenced: %v", n.name, f)
		}
	}
}
