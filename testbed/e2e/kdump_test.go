package e2e

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"testing"
	"time"

	"github.com/nodefence/nodefence/coordinator/app"
	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/testbed/ipmisim"
	"github.com/nodefence/nodefence/testbed/wait"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// fence_kdump end to end with the real sender: a crashed node's kdump kernel reports itself; the
// coordinator takes it as down at once (long before the 30 s grace period), confirms it off for pod
// release from the dump alone, and powers it off only after the dump has finished.
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
	eng.NodeMonitorGracePeriod, eng.NodeStartupGracePeriod = 30*time.Second, 30*time.Second
	eng.NodeEvictionRate = 10
	eng.Fence.Timeout = 500 * time.Millisecond
	eng.KdumpIdle, eng.KdumpTimeout = 2*time.Second, 20*time.Second
	c := startCoordinator(t, app.Config{FenceConfig: writeConfig(t, driver, nodes), Engine: eng, KdumpListen: "127.0.0.1:0",
		AgentHeartbeatInterval: 200 * time.Millisecond, AgentSampleInterval: 200 * time.Millisecond})
	cc := conn(t, c.app.Addr())
	leaderReady(t, cc)
	// The other nodes report (a node that never reported counts as not ready in its zone, as in
	// kube-controller-manager); node-2 has crashed: no agent, only its kdump kernel's messages.
	for _, n := range []node{nodes[0], nodes[2], nodes[3]} {
		runAgent(t, cc, c.app.Addr(), n.name, "a")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, port, _ := net.SplitHostPort(c.app.KdumpAddr())
	sent := time.Now()
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
	if rec.CreatedAt.AsTime().Sub(sent) > 10*time.Second {
		t.Fatalf("fence started %s after the dump began: the node should be down at once, not after the 30s grace", rec.CreatedAt.AsTime().Sub(sent))
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
