package e2e

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/nodefence/nodefence/coordinator/app"
	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/coordinator/fencing"
	"github.com/nodefence/nodefence/node-agent/agent"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/testbed/ipmisim"
	"github.com/nodefence/nodefence/testbed/wait"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// fence_kdump end to end with the real sender: a node crashes (its agent stops) and its kdump
// kernel reports itself once the node is silent past its grace period; the coordinator takes it as
// dumping, fences it after the fence timeout, confirms it off only by the driver's read-back, and
// powers it off only after the dump has finished.
func TestKdumpWithRealSender(t *testing.T) {
	var nodes []node
	for i, name := range []string{"node-1", "node-2", "node-3", "node-4"} {
		n := node{name: name, password: "password", bmc: startBMC(t, name)}
		if i == 1 {
			n.addr = "127.0.0.1" // fence_kdump_send on this machine sends from 127.0.0.1
		}
		nodes = append(nodes, n)
	}
	driver := startDriver(t, t.TempDir())
	eng := engine.DefaultConfig()
	eng.NodeMonitorGracePeriod, eng.NodeStartupGracePeriod = 4*time.Second, 30*time.Second
	eng.NodeEvictionRate = 10
	eng.Fence.Timeout = 500 * time.Millisecond
	eng.KdumpIdle, eng.KdumpTimeout = 2*time.Second, 20*time.Second
	c := startCoordinator(t, app.Config{FenceConfig: writeConfig(t, driver, nodes), Engine: eng, KdumpListen: "127.0.0.1:0",
		AgentHeartbeatInterval: 200 * time.Millisecond, AgentSampleInterval: 200 * time.Millisecond})
	cc := conn(t, c.app.Addr())
	leaderReady(t, cc)
	for _, n := range []node{nodes[0], nodes[2], nodes[3]} {
		runAgent(t, cc, c.app.Addr(), n.name, "a")
	}
	crash := startAgent(t, cc, c.app.Addr(), "node-2")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	crash() // node-2 crashes into its kdump kernel
	crashed := time.Now()
	cl := coordv1.NewClusterServiceClient(cc)
	wait.Until(t, 20*time.Second, "node-2 not ready after its grace period", func() error {
		r, err := cl.GetNode(ctx, &coordv1.GetNodeRequest{Node: "node-2"})
		if err != nil || r.Node.Readiness == coordv1.Readiness_READINESS_READY {
			return fmt.Errorf("%v %v", r, err)
		}
		return nil
	})
	_, port, _ := net.SplitHostPort(c.app.KdumpAddr())
	// A dump of 8 s: longer than the guard's settle window (5 s), as real dumps are.
	out, err := exec.CommandContext(ctx, "/usr/libexec/fence-agents/fence_kdump_send", "-p", port, "-c", "8", "-i", "1", "127.0.0.1").CombinedOutput()
	if err != nil {
		t.Fatalf("fence_kdump_send: %v\n%s", err, out)
	}
	lastMessage := time.Now()
	fc := coordv1.NewFenceServiceClient(cc)
	var rec *coordv1.NodeFence
	wait.Until(t, 30*time.Second, "node-2 fenced after its dump", func() error {
		r, err := fc.ListFences(ctx, &coordv1.ListFencesRequest{Node: "node-2"})
		if err != nil || len(r.Fences) == 0 || r.Fences[0].FinishedAt == nil {
			return fmt.Errorf("%v %v", r, err)
		}
		rec = r.Fences[0]
		return nil
	})
	if rec.Status != coordv1.FenceStatus_FENCE_STATUS_DONE || rec.ConfirmedOffAt == nil || len(rec.Operations) != 1 {
		t.Fatalf("kdump fence: %v", rec)
	}
	if !strings.Contains(strings.Join(rec.Evidence, "; "), "fence_kdump") {
		t.Fatalf("record does not say the node was dumping: %v", rec.Evidence)
	}
	if rec.CreatedAt.AsTime().Before(crashed.Add(eng.NodeMonitorGracePeriod)) {
		t.Fatalf("fence started %s after the crash, within the grace period %s", rec.CreatedAt.AsTime().Sub(crashed), eng.NodeMonitorGracePeriod)
	}
	op := rec.Operations[0]
	if rec.ConfirmedOffAt.AsTime().Before(op.StartedAt.AsTime()) {
		t.Fatalf("confirmed off at %s, before the power-off started at %s: fence_kdump is evidence, never proof", rec.ConfirmedOffAt.AsTime(), op.StartedAt.AsTime())
	}
	if op.StartedAt.AsTime().Before(lastMessage.Add(eng.KdumpIdle - 200*time.Millisecond)) {
		t.Fatalf("power management started at %s, before the dump ended (last message %s + idle %s)", op.StartedAt.AsTime(), lastMessage, eng.KdumpIdle)
	}
	if p, err := ipmisim.IpmitoolPower(ctx, nodes[1].bmc.Port, "admin", "password"); err != nil || p != "off" {
		t.Fatalf("ipmitool after the dump: %q %v", p, err)
	}
	for _, n := range []node{nodes[0], nodes[2], nodes[3]} {
		r, _ := fc.ListFences(ctx, &coordv1.ListFencesRequest{Node: n.name})
		if len(r.GetFences()) != 0 {
			t.Fatalf("%s fenced", n.name)
		}
	}
}

// Spoofed fence_kdump: the real fence_kdump_send, from the address of a node whose agent is
// streaming, changes nothing: the node stays Ready and is never fenced. The messages are counted
// as dropped for the live witness.
func TestKdumpNeverOverridesALiveAgent(t *testing.T) {
	n := node{name: "node-1", password: "password", bmc: startBMC(t, "node-1"), addr: "127.0.0.1"}
	driver := startDriver(t, t.TempDir())
	eng := engine.DefaultConfig()
	eng.NodeMonitorGracePeriod, eng.NodeStartupGracePeriod = 30*time.Second, 30*time.Second
	eng.Fence.Timeout = 500 * time.Millisecond
	eng.KdumpIdle, eng.KdumpTimeout = 2*time.Second, 20*time.Second
	c := startCoordinator(t, app.Config{FenceConfig: writeConfig(t, driver, []node{n}), Engine: eng, KdumpListen: "127.0.0.1:0",
		AgentHeartbeatInterval: 200 * time.Millisecond, AgentSampleInterval: 200 * time.Millisecond})
	cc := conn(t, c.app.Addr())
	leaderReady(t, cc)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	runAgent(t, cc, c.app.Addr(), n.name, "a")
	cl := coordv1.NewClusterServiceClient(cc)
	ready := func() error {
		r, err := cl.GetNode(ctx, &coordv1.GetNodeRequest{Node: n.name})
		if err != nil {
			return err
		}
		if r.Node.Readiness != coordv1.Readiness_READINESS_READY || !r.Node.Connected {
			return fmt.Errorf("%s: %s (connected %v)", r.Node.Readiness, r.Node.Reason, r.Node.Connected)
		}
		return nil
	}

	_, port, _ := net.SplitHostPort(c.app.KdumpAddr())
	out, err := exec.CommandContext(ctx, "/usr/libexec/fence-agents/fence_kdump_send", "-p", port, "-c", "12", "-i", "1", "127.0.0.1").CombinedOutput()
	if err != nil {
		t.Fatalf("fence_kdump_send: %v\n%s", err, out)
	}
	time.Sleep(eng.Fence.Timeout + time.Second) // a fence would have started by now
	if err := ready(); err != nil {
		t.Fatalf("after spoofed kdump messages: %v", err)
	}
	r, err := coordv1.NewFenceServiceClient(cc).ListFences(ctx, &coordv1.ListFencesRequest{Node: n.name})
	if err != nil || len(r.Fences) != 0 {
		t.Fatalf("fence records after spoofed kdump messages: %v, %v", r, err)
	}
	if p, err := ipmisim.IpmitoolPower(ctx, n.bmc.Port, "admin", "password"); err != nil || p != "on" {
		t.Fatalf("ipmitool after spoofed kdump messages: %q %v", p, err)
	}
	au, err := cl.ListAudit(ctx, &coordv1.ListAuditRequest{Node: n.name})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range au.Entries {
		if e.Kind == "kdump" {
			t.Fatalf("spoofed kdump message reached the engine: %v", e)
		}
	}
}

// startAgent runs a real node agent for name (mutual TLS, its own certificate), waits until the
// node is Ready with its agent connected, and returns a function that stops it (a crash, or an
// outage: startAgent again is the agent back, with the same boot).
func startAgent(t *testing.T, cc *grpc.ClientConn, addr, name string) (stop func()) {
	t.Helper()
	a, err := agent.New(agent.Config{Coordinators: []string{addr}, TLS: tlsAs(t, identity.Agent, name), NodeName: name, BootID: "b-" + name, Zone: "a", Log: testLog(t)}, fixedSampler{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	wait.Until(t, 20*time.Second, name+" ready with its agent connected", func() error {
		r, err := coordv1.NewClusterServiceClient(cc).GetNode(ctx, &coordv1.GetNodeRequest{Node: name})
		if err != nil {
			return err
		}
		if r.Node.Readiness != coordv1.Readiness_READINESS_READY || !r.Node.Connected {
			return fmt.Errorf("%s: %s (connected %v)", r.Node.Readiness, r.Node.Reason, r.Node.Connected)
		}
		return nil
	})
	return stop
}

// kdumpStack is a coordinator with the kdump listener, the IPMI driver on ipmi_sim and three nodes
// whose agents report; node-1 has the address fence_kdump_send sends from on this machine.
func kdumpStack(t *testing.T, eng engine.Config) (*coordinator, *grpc.ClientConn, node) {
	t.Helper()
	var nodes []node
	for i, name := range []string{"node-1", "node-2", "node-3"} {
		n := node{name: name, password: "password", bmc: startBMC(t, name)}
		if i == 0 {
			n.addr = "127.0.0.1"
		}
		nodes = append(nodes, n)
	}
	driver := startDriver(t, t.TempDir())
	c := startCoordinator(t, app.Config{FenceConfig: writeConfig(t, driver, nodes), Engine: eng, KdumpListen: "127.0.0.1:0",
		AgentHeartbeatInterval: 200 * time.Millisecond, AgentSampleInterval: 200 * time.Millisecond})
	cc := conn(t, c.app.Addr())
	leaderReady(t, cc)
	for _, n := range nodes[1:] {
		runAgent(t, cc, c.app.Addr(), n.name, "a")
	}
	return c, cc, nodes[0]
}

// sendKdump sends count fence_kdump messages a second apart with the real fence_kdump_send, from
// 127.0.0.1 (node-1's address): what an attacker on the node network can send for any node.
func sendKdump(t *testing.T, ctx context.Context, c *coordinator, count int) {
	t.Helper()
	_, port, _ := net.SplitHostPort(c.app.KdumpAddr())
	out, err := exec.CommandContext(ctx, "/usr/libexec/fence-agents/fence_kdump_send", "-p", port, "-c", fmt.Sprint(count), "-i", "1", "127.0.0.1").CombinedOutput()
	if err != nil {
		t.Fatalf("fence_kdump_send: %v\n%s", err, out)
	}
}

// Issue 22's sequence, end to end: grace 12 s, node-1's agent stopped for 8 s, three spoofed
// fence_kdump datagrams meanwhile, the agent back. The node reported less than one grace period
// before each datagram: it never becomes not ready, nothing is requested, and its BMC stays on
// well past the moment the old code powered it off (the dump's idle time after the last datagram).
func TestKdumpSpoofedDuringAgentOutage(t *testing.T) {
	eng := engine.DefaultConfig()
	eng.NodeMonitorGracePeriod, eng.NodeStartupGracePeriod = 12*time.Second, 30*time.Second
	eng.NodeEvictionRate = 10
	eng.Fence.Timeout = 500 * time.Millisecond
	eng.KdumpIdle, eng.KdumpTimeout = 10*time.Second, 30*time.Second
	c, cc, n := kdumpStack(t, eng)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	stop := startAgent(t, cc, c.app.Addr(), n.name)
	stop()
	outage := time.Now()
	time.Sleep(2 * time.Second)
	sendKdump(t, ctx, c, 3)
	lastMessage := time.Now()
	time.Sleep(time.Until(outage.Add(8 * time.Second)))
	startAgent(t, cc, c.app.Addr(), n.name)
	back := time.Now()
	// The old code powered the node off when the dump's idle time ended; watch well past that.
	time.Sleep(time.Until(lastMessage.Add(eng.KdumpIdle + 5*time.Second)))
	t.Logf("agent back %s after the outage began; watched until %s after it", back.Sub(outage).Round(time.Millisecond), time.Since(back).Round(time.Millisecond))

	if p, err := ipmisim.IpmitoolPower(ctx, n.bmc.Port, "admin", "password"); err != nil || p != "on" {
		t.Fatalf("ipmitool after spoofed kdump messages during an outage shorter than the grace period: %q %v", p, err)
	}
	r, err := coordv1.NewFenceServiceClient(cc).ListFences(ctx, &coordv1.ListFencesRequest{Node: n.name})
	if err != nil || len(r.Fences) != 0 {
		t.Fatalf("fence records: %v, %v", r, err)
	}
	au, err := coordv1.NewClusterServiceClient(cc).ListAudit(ctx, &coordv1.ListAuditRequest{Node: n.name})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range au.Entries {
		if e.Kind == "readiness" || e.Kind == "kdump" || e.Kind == "eviction" {
			t.Errorf("audit: %s %s: the datagrams changed the judgement of a node that reported %s before them", e.Kind, e.Text, lastMessage.Sub(outage).Round(time.Second))
		}
	}
}

// Reconnect with spoofed kdump, end to end: node-1's agent is silent past its grace period, spoofed
// fence_kdump datagrams arrive, the automatic fence is requested and waits for the "dump"; then the
// agent reconnects. Its contact ends the dump, and the witness re-check before the driver call
// aborts the fence: no power-off (ipmitool), the record finished in error saying why, an audit
// entry of kind fence-aborted.
func TestKdumpReconnectAbortsAutomaticFence(t *testing.T) {
	eng := engine.DefaultConfig()
	eng.NodeMonitorGracePeriod, eng.NodeStartupGracePeriod = 5*time.Second, 30*time.Second
	eng.NodeEvictionRate = 10
	eng.Fence.Timeout = 500 * time.Millisecond
	eng.KdumpIdle, eng.KdumpTimeout = 15*time.Second, time.Minute
	c, cc, n := kdumpStack(t, eng)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	startAgent(t, cc, c.app.Addr(), n.name)()
	cl, fc := coordv1.NewClusterServiceClient(cc), coordv1.NewFenceServiceClient(cc)
	wait.Until(t, 30*time.Second, n.name+" not ready after its grace period", func() error {
		r, err := cl.GetNode(ctx, &coordv1.GetNodeRequest{Node: n.name})
		if err != nil || r.Node.Readiness == coordv1.Readiness_READINESS_READY {
			return fmt.Errorf("%v %v", r, err)
		}
		return nil
	})
	sendKdump(t, ctx, c, 3)
	var rec *coordv1.NodeFence
	wait.Until(t, 30*time.Second, "automatic fence requested", func() error {
		r, err := fc.ListFences(ctx, &coordv1.ListFencesRequest{Node: n.name})
		if err != nil || len(r.Fences) == 0 {
			return fmt.Errorf("%v %v", r, err)
		}
		rec = r.Fences[0]
		return nil
	})
	if rec.FinishedAt != nil || len(rec.Operations) != 0 || !strings.Contains(strings.Join(rec.Evidence, "; "), "fence_kdump") {
		t.Fatalf("the fence should wait for the dump: %v", rec)
	}
	startAgent(t, cc, c.app.Addr(), n.name)
	wait.Until(t, 40*time.Second, "fence record finished", func() error {
		r, err := fc.GetFence(ctx, &coordv1.GetFenceRequest{Id: rec.Id})
		if err != nil || r.Fence.FinishedAt == nil {
			return fmt.Errorf("%v %v", r, err)
		}
		rec = r.Fence
		return nil
	})
	if rec.Status != coordv1.FenceStatus_FENCE_STATUS_ERROR || !fencing.AbortedReaching(rec) || rec.ConfirmedOffAt != nil {
		t.Fatalf("a node whose agent reconnected was fenced: %v", rec)
	}
	for _, op := range rec.Operations {
		if op.Result == coordv1.OperationResult_OPERATION_RESULT_CONFIRMED {
			t.Fatalf("driver call made: %v", op)
		}
	}
	if p, err := ipmisim.IpmitoolPower(ctx, n.bmc.Port, "admin", "password"); err != nil || p != "on" {
		t.Fatalf("ipmitool after the agent reconnected: %q %v", p, err)
	}
	// The audit writer appends after the record is stored: the entry may follow it by a moment.
	wait.Until(t, 10*time.Second, "a fence-aborted audit entry for "+rec.Id, func() error {
		au, err := cl.ListAudit(ctx, &coordv1.ListAuditRequest{Node: n.name})
		if err != nil {
			return err
		}
		for _, e := range au.Entries {
			if e.Kind == "fence-aborted" && strings.Contains(e.Text, rec.Id) {
				return nil
			}
		}
		return fmt.Errorf("audit: %v", au.Entries)
	})
}
