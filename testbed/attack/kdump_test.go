package attack

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nodefence/nodefence/coordinator/app"
	"github.com/nodefence/nodefence/coordinator/fencing"
	"github.com/nodefence/nodefence/coordinator/kdump"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/testbed/ipmisim"
	"github.com/nodefence/nodefence/testbed/wait"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// Issue 22, item 3: fence_kdump is never enough to power off a node that is reaching us. The
// adversary is anyone on the node network: it sends fence_kdump datagrams (unauthenticated, 8
// bytes) from node-a's address while node-a's agent is between two streams. Each case runs the
// whole system (coordinator with its kdump listener and automatic fencing on, the IPMI driver,
// ipmi_sim BMCs, both nodes' real agents over mutual TLS) and reads node-a's BMC back with ipmitool.

// kdumpAddr is node-a's address in the fence configuration: where the adversary's datagrams come
// from (any 127/8 address can be bound on Linux).
const kdumpAddr = "127.0.0.21"

// kdumpSystem starts the system with automatic fencing, the kdump listener, /metrics, node-a's
// address, and the grace period, kdump idle time and pacing of the case; both agents report.
func kdumpSystem(t *testing.T, grace, kdumpIdle time.Duration) (*system, coordv1.ClusterServiceClient, coordv1.FenceServiceClient, map[string]func()) {
	t.Helper()
	s := start(t, "", func(c *app.Config) {
		c.KdumpListen, c.Server.MetricsListen = "127.0.0.1:0", "127.0.0.1:0"
		c.Engine.Fence.Enabled = true
		c.Engine.Fence.Timeout, c.Engine.Fence.Settle = 500*time.Millisecond, 500*time.Millisecond
		c.Engine.NodeMonitorGracePeriod, c.Engine.NodeStartupGracePeriod = grace, 30*time.Second
		c.Engine.NodeEvictionRate = 10
		c.Engine.KdumpIdle, c.Engine.KdumpTimeout = kdumpIdle, time.Minute
		addNodeAddress(t, c.FenceConfig, "node-a", kdumpAddr)
	})
	operator := dialWith(t, s.coord.Addr(), s.files(t, identity.Operator, "alice"))
	cl, fc := coordv1.NewClusterServiceClient(operator), coordv1.NewFenceServiceClient(operator)
	agents := map[string]func(){}
	for _, n := range nodes {
		agents[n] = s.runAgent(t, n)
		waitReady(t, cl, n)
	}
	return s, cl, fc, agents
}

// addNodeAddress gives node an address in the fence configuration the harness wrote.
func addNodeAddress(t *testing.T, path, node, addr string) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	head := "  " + node + ":\n"
	if !strings.Contains(string(raw), head) {
		t.Fatalf("fence configuration has no node %s:\n%s", node, raw)
	}
	out := strings.Replace(string(raw), head, head+"    addresses: ["+addr+"]\n", 1)
	if err := os.WriteFile(path, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
}

func waitReady(t *testing.T, cl coordv1.ClusterServiceClient, node string) {
	t.Helper()
	wait.Until(t, 30*time.Second, node+" ready with its agent connected", func() error {
		r, err := cl.GetNode(context.Background(), &coordv1.GetNodeRequest{Node: node})
		if err != nil {
			return err
		}
		if r.Node.Readiness != coordv1.Readiness_READINESS_READY || !r.Node.Connected {
			return fmt.Errorf("%s: %s (connected %v)", r.Node.Readiness, r.Node.Reason, r.Node.Connected)
		}
		return nil
	})
}

// spoofKdump sends count fence_kdump messages (magic, version 1, little-endian: what
// fence_kdump_send writes on x86) from node-a's address to the listener, interval apart.
func spoofKdump(t *testing.T, listener string, count int, interval time.Duration) {
	t.Helper()
	to, err := net.ResolveUDPAddr("udp", listener)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.DialUDP("udp", &net.UDPAddr{IP: net.ParseIP(kdumpAddr)}, to)
	if err != nil {
		t.Fatalf("bind %s: %v", kdumpAddr, err)
	}
	defer c.Close()
	msg := make([]byte, 8)
	binary.LittleEndian.PutUint32(msg[0:4], kdump.Magic)
	binary.LittleEndian.PutUint32(msg[4:8], kdump.Version)
	for i := range count {
		if i > 0 {
			time.Sleep(interval) // the sender's pace, as fence_kdump_send -i
		}
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
	}
}

// bmcOn fails the test unless ipmitool reads node's BMC on.
func (s *system) bmcOn(t *testing.T, node, when string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if p, err := ipmisim.IpmitoolPower(ctx, s.bmcs[node].Port, "admin", "password"); err != nil || p != "on" {
		t.Fatalf("ipmitool %s %s: %q, %v; want on", node, when, p, err)
	}
}

// kdumpCounted reads nodefence_kdump_messages_total{result} from the coordinator's /metrics.
func kdumpCounted(t *testing.T, s *system, result string) string {
	t.Helper()
	resp, err := http.Get("http://" + s.coord.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	prefix := `nodefence_kdump_messages_total{result="` + result + `"} `
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			return v
		}
	}
	t.Fatalf("/metrics has no %s", prefix)
	return ""
}

func TestAttackSpoofedKdump(t *testing.T) {
	// The sequence, scaled: grace 10 s, node-a's agent away for 4.5 s, three spoofed
	// datagrams meanwhile, the agent back. Before the fix the node became NotReady at the first
	// datagram, its grace was waived, and it was powered off when the "dump" went idle — after its
	// agent was back. Now every datagram is dropped for the live witness (counted), the node stays
	// Ready and is never fenced, and ipmitool reads its BMC on well past that moment.
	t.Run("agent between two streams", func(t *testing.T) {
		const grace, idle = 10 * time.Second, 5 * time.Second // a grace well above the outage, even on a loaded machine
		s, cl, fc, agents := kdumpSystem(t, grace, idle)
		agents["node-a"]()
		outage := time.Now()
		time.Sleep(1500 * time.Millisecond)
		spoofKdump(t, s.coord.KdumpAddr(), 3, time.Second)
		lastMessage := time.Now()
		time.Sleep(time.Until(outage.Add(4500 * time.Millisecond)))
		s.runAgent(t, "node-a")
		waitReady(t, cl, "node-a")
		t.Logf("agent back %s after the outage began", time.Since(outage).Round(time.Millisecond))
		// Watch past the moment the old code powered the node off: the dump's idle time after
		// the last datagram, and a fence's settle and timeout.
		for time.Now().Before(lastMessage.Add(idle + 3*time.Second)) {
			r, err := cl.GetNode(context.Background(), &coordv1.GetNodeRequest{Node: "node-a"})
			if err != nil {
				t.Fatal(err)
			}
			if r.Node.Readiness != coordv1.Readiness_READINESS_READY {
				t.Fatalf("node-a %s (%s) after spoofed fence_kdump datagrams during an outage shorter than its grace", r.Node.Readiness, r.Node.Reason)
			}
			time.Sleep(250 * time.Millisecond)
		}
		s.bmcOn(t, "node-a", "after spoofed fence_kdump datagrams")
		r, err := fc.ListFences(context.Background(), &coordv1.ListFencesRequest{Node: "node-a"})
		if err != nil || len(r.Fences) != 0 {
			t.Fatalf("fence records of node-a: %v, %v", r, err)
		}
		au, err := cl.ListAudit(context.Background(), &coordv1.ListAuditRequest{Node: "node-a"})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range au.Entries {
			if e.Kind == "readiness" || e.Kind == "kdump" || e.Kind == "eviction" || strings.HasPrefix(e.Kind, "fence") {
				t.Errorf("audit %s: %s: the datagrams changed the judgement of a node whose agent reported within its grace", e.Kind, e.Text)
			}
		}
		if got := kdumpCounted(t, s, kdump.LiveWitness); got != "3" {
			t.Errorf("datagrams dropped for the live witness: %s, want 3", got)
		}
	})

	// Reconnect: node-a's agent silent past its grace, the adversary's datagrams make the engine
	// request the automatic fence, which waits for the "dump"; then the agent reconnects. Its
	// contact ends the dump and the re-check before the driver call aborts the fence: no driver
	// call, the record finished in error saying why, an audit entry fence-aborted, the BMC on.
	t.Run("agent reconnects while the fence waits for the dump", func(t *testing.T) {
		const grace, idle = 3 * time.Second, 15 * time.Second
		s, cl, fc, agents := kdumpSystem(t, grace, idle)
		agents["node-a"]()
		wait.Until(t, 20*time.Second, "node-a not ready after its grace", func() error {
			r, err := cl.GetNode(context.Background(), &coordv1.GetNodeRequest{Node: "node-a"})
			if err != nil || r.Node.Readiness == coordv1.Readiness_READINESS_READY {
				return fmt.Errorf("%v %v", r, err)
			}
			return nil
		})
		spoofKdump(t, s.coord.KdumpAddr(), 3, time.Second)
		var rec *coordv1.NodeFence
		wait.Until(t, 20*time.Second, "automatic fence of node-a requested", func() error {
			r, err := fc.ListFences(context.Background(), &coordv1.ListFencesRequest{Node: "node-a"})
			if err != nil || len(r.Fences) == 0 {
				return fmt.Errorf("%v %v", r, err)
			}
			rec = r.Fences[0]
			return nil
		})
		if rec.FinishedAt != nil || len(rec.Operations) != 0 || !strings.Contains(strings.Join(rec.Evidence, "; "), "fence_kdump") {
			t.Fatalf("the fence should wait for the dump: %v", rec)
		}
		s.runAgent(t, "node-a")
		wait.Until(t, 40*time.Second, "fence record finished", func() error {
			r, err := fc.GetFence(context.Background(), &coordv1.GetFenceRequest{Id: rec.Id})
			if err != nil || r.Fence.FinishedAt == nil {
				return fmt.Errorf("%v %v", r, err)
			}
			rec = r.Fence
			return nil
		})
		s.bmcOn(t, "node-a", "after its agent reconnected during the spoofed dump")
		if rec.Status != coordv1.FenceStatus_FENCE_STATUS_ERROR || !fencing.AbortedReaching(rec) || rec.ConfirmedOffAt != nil {
			t.Fatalf("a node whose agent reconnected was fenced: %v", rec)
		}
		for _, op := range rec.Operations {
			if op.Result == coordv1.OperationResult_OPERATION_RESULT_CONFIRMED {
				t.Fatalf("driver call made: %v", op)
			}
		}
		au, err := cl.ListAudit(context.Background(), &coordv1.ListAuditRequest{Node: "node-a"})
		if err != nil {
			t.Fatal(err)
		}
		var aborted bool
		for _, e := range au.Entries {
			aborted = aborted || (e.Kind == "fence-aborted" && strings.Contains(e.Text, rec.Id))
		}
		if !aborted {
			t.Fatalf("no fence-aborted audit entry for %s: %v", rec.Id, au.Entries)
		}
	})
}
