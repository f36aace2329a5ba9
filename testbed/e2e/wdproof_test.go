package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nodefence/nodefence/coordinator/app"
	"github.com/nodefence/nodefence/node-agent/nodeagent"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/server"
	"github.com/nodefence/nodefence/services/wdlease"
	"github.com/nodefence/nodefence/testbed/pki"
	"github.com/nodefence/nodefence/testbed/syncbuf"
	"github.com/nodefence/nodefence/testbed/tcpproxy"
	"github.com/nodefence/nodefence/testbed/wait"
	"github.com/nodefence/nodefence/testbed/watchdogsim"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// wdTimeout is the agents' --watchdog-timeout in these tests; the stand-in device fires after 2 s.
const wdTimeout = 3 * time.Second

// wdSafe is the leader's SafeAfterGrant for that watchdog with the coordinator's default lease (4 s
// with the 1 s heartbeat): ⌈(4 s + 3 s)·1.01/0.99⌉ + 2 s·1.01 ≈ 9.16 s.
func wdSafe() time.Duration {
	b := wdlease.Defaults(wdTimeout)
	return b.SafeAfterGrant()
}

// wdNode is one node of a watchdog cluster: its BMC, its agent (through a proxy that can cut it
// off from the coordinator) and its watchdog stand-in, whose reset ends the agent as a power cut
// would (the agent gets no chance to speak again).
type wdNode struct {
	node
	proxy   *tcpproxy.Proxy   // the first of proxies
	proxies []*tcpproxy.Proxy // one per coordinator replica
	sim     *watchdogsim.Device
	log     syncbuf.Buffer
	cancel  context.CancelFunc
	done    chan int
	resetAt atomic.Int64 // unix nanoseconds of the device's first reset (0: none)
}

func (n *wdNode) reset() time.Time {
	if v := n.resetAt.Load(); v != 0 {
		return time.Unix(0, v)
	}
	return time.Time{}
}

// stopAgent stops the agent (cleanly: it reports "disarmed" unless it took a stop-feeding pill).
func (n *wdNode) stopAgent() {
	n.cancel()
	select {
	case <-n.done:
	case <-time.After(15 * time.Second):
	}
}

// startWDCluster starts a coordinator with one IPMI method per node (ipmi_sim), watchdog_fallback
// for the nodes named in fallback, and a watchdog-mode agent per node; it returns once the
// coordinator shows every watchdog armed.
func startWDCluster(t *testing.T, names []string, fallback map[string]bool) ([]*wdNode, *coordinator, *grpc.ClientConn) {
	t.Helper()
	nodes, cfgPath := wdNodes(t, names, fallback)
	coord := startCoordinator(t, wdCoordinator(t, "e2e", cfgPath, nil))
	cc := conn(t, coord.app.Addr())
	leaderReady(t, cc)
	for _, n := range nodes {
		startWDAgent(t, n, wdTimeout, coord.app.Addr())
	}
	waitArmed(t, cc, len(names))
	// The leader proves a majority's leases only over a whole window of its own.
	time.Sleep(wdlease.Defaults(wdTimeout).Window())
	return nodes, coord, cc
}

// wdNodes starts a BMC and a driver for names and writes their fence configuration.
func wdNodes(t *testing.T, names []string, fallback map[string]bool) ([]*wdNode, string) {
	t.Helper()
	var nodes []*wdNode
	for _, n := range names {
		nodes = append(nodes, &wdNode{node: node{name: n, password: "password", bmc: startBMC(t, n), addr: "127.0.0.1"}})
	}
	driver := startDriver(t, t.TempDir())
	var b strings.Builder
	fmt.Fprintf(&b, "drivers:\n  ipmi: {endpoint: %q}\ntemplates:\n  bmc: {driver: ipmi, parameters: {lanplus: \"1\", cipher: \"3\", username: admin}}\nnodes:\n", driver)
	for _, n := range nodes {
		fmt.Fprintf(&b, "  %s:\n    zone: a\n    watchdog_fallback: %v\n    methods:\n      bmc: {template: bmc, parameters: {ip: 127.0.0.1, ipport: \"%d\", password: %q}}\n    steps:\n      power_management: [bmc]\n",
			n.name, fallback[n.name], n.bmc.Port, n.password)
	}
	cfgPath := filepath.Join(t.TempDir(), "fence.yaml")
	if err := os.WriteFile(cfgPath, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return nodes, cfgPath
}

// wdCoordinator is a watchdog cluster's coordinator replica id; with etcd (another replica's), it
// joins that replica's etcd.
func wdCoordinator(t *testing.T, id, cfgPath string, etcd *coordinator) app.Config {
	cfg := app.Config{ID: id, FenceConfig: cfgPath, FenceOpTimeout: 3 * time.Second,
		Server: server.Config{Listen: "127.0.0.1:0", MetricsListen: "127.0.0.1:0", TLS: tlsAs(t, identity.Coordinator, id), DrainTimeout: time.Second}}
	if etcd != nil {
		cfg.EtcdEndpoints, cfg.EtcdAccess = []string{etcd.app.EtcdEndpoint()}, etcd.app.EtcdAccess()
	}
	return cfg
}

// startWDAgent starts n's watchdog stand-in and its agent with --watchdog-timeout timeout (the
// stand-in fires a second earlier), which reaches the coordinator replicas at addrs through a
// proxy each (n.proxies; n.proxy is the first).
func startWDAgent(t *testing.T, n *wdNode, timeout time.Duration, addrs ...string) {
	t.Helper()
	var via []string
	for _, addr := range addrs {
		p, err := tcpproxy.Start(addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		n.proxies, via = append(n.proxies, p), append(via, p.Addr())
	}
	n.proxy = n.proxies[0]
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel, n.done = cancel, make(chan int, 1)
	sim, err := watchdogsim.Start(filepath.Join(t.TempDir(), "watchdog"), timeout-time.Second, func() {
		if n.resetAt.CompareAndSwap(0, time.Now().UnixNano()) {
			go cancel() // the node lost power: its agent never speaks again (the stream just ends)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sim.Stop)
	n.sim = sim
	boot := filepath.Join(t.TempDir(), "boot_id")
	if err := os.WriteFile(boot, []byte("boot-"+n.name+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := append(pki.Args("", tlsAs(t, identity.Agent, n.name)),
		"--coordinator="+strings.Join(via, ","), "--node-name="+n.name, "--zone=a", "--boot-id-file="+boot,
		"--proc-root=../../node-agent/signals/testdata/proc", "--cgroup-root=../../node-agent/signals/testdata/v1", "--cgroup-version=1",
		"--nodefs-path=", "--container-runtime-endpoint=", "--shutdown-grace-period=0s",
		"--watchdog-device="+sim.Path, "--watchdog-timeout="+timeout.String())
	go func() { n.done <- nodeagent.Main(ctx, args, io.Discard, &n.log) }()
	t.Cleanup(n.stopAgent)
}

// waitArmed waits until the leader at cc shows n watchdogs armed.
func waitArmed(t *testing.T, cc *grpc.ClientConn, n int) {
	t.Helper()
	wait.Until(t, 30*time.Second, "the coordinator shows every watchdog armed", func() error {
		r, err := coordv1.NewClusterServiceClient(cc).ListNodes(context.Background(), &coordv1.ListNodesRequest{})
		if err != nil {
			return err
		}
		armed := 0
		for _, v := range r.GetNodes() {
			if v.GetWatchdogArmed() {
				armed++
			}
		}
		if armed != n {
			return fmt.Errorf("%d of %d armed", armed, n)
		}
		return nil
	})
}

// final follows record id to its end and returns its last state.
func final(t *testing.T, fc coordv1.FenceServiceClient, id string, within time.Duration) *coordv1.NodeFence {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	seen := watchUntilFinal(t, ctx, fc, id)
	if len(seen) == 0 {
		t.Fatalf("record %s: no state seen", id)
	}
	return seen[len(seen)-1]
}

// TestWatchdogProofDarkBMC: a node cut off from the coordinator together with its BMC (ipmi_sim
// stopped) — today stuck in error until a person acts — opted in to the watchdog fallback: its
// fence's IPMI method fails as unreachable, the record falls back to the watchdog method, and it
// is confirmed off with the proof watchdog-timeout: never before the node's safe time after its
// last lease, and only after its watchdog really reset it. The audit, fencectl's view (GetFence)
// and the proof metric say so.
func TestWatchdogProofDarkBMC(t *testing.T) {
	nodes, coord, cc := startWDCluster(t, []string{"wdd-a", "wdd-b", "wdd-c"}, map[string]bool{"wdd-c": true})
	c := nodes[2]
	cut := time.Now()
	c.proxy.Cut() // the node's link to the control plane...
	c.bmc.Stop()  // ...and its BMC: dark
	fc := coordv1.NewFenceServiceClient(cc)
	r, err := fc.Fence(context.Background(), &coordv1.FenceRequest{Node: c.name, Reason: "dark BMC"})
	if err != nil {
		t.Fatal(err)
	}
	f := final(t, fc, r.Fence.Id, 90*time.Second)
	if f.Status != coordv1.FenceStatus_FENCE_STATUS_DONE || f.Proof != coordv1.FenceProof_FENCE_PROOF_WATCHDOG_TIMEOUT || f.ConfirmedOffAt == nil {
		t.Fatalf("record %s: %s, proof %s, error %q, evidence %v\n%s", f.Id, f.Status, f.Proof, f.Error, f.Evidence, c.log.String())
	}
	off := f.ConfirmedOffAt.AsTime()
	// The node's last grant answered a heartbeat sent at most one heartbeat before the cut.
	if earliest := cut.Add(wdSafe() - time.Second); off.Before(earliest) {
		t.Fatalf("proven off at %s, %s after the cut: before the safe time %s", off, off.Sub(cut), wdSafe())
	}
	if rs := c.reset(); rs.IsZero() || !rs.Before(off) {
		t.Fatalf("proven off at %s but the watchdog reset the node at %v", off, rs)
	}
	var ops []string
	for _, op := range f.Operations {
		ops = append(ops, fmt.Sprintf("%s/%s:%s", op.Method, op.Driver, op.Result))
	}
	if len(f.Operations) != 2 || f.Operations[0].Driver != "ipmi" || f.Operations[1].Driver != "watchdog" {
		t.Fatalf("operations %v, want the IPMI method then the watchdog fallback", ops)
	}
	t.Logf("cut at %s; the watchdog reset the node %s after; proven off %s after (safe time %s); operations %v",
		cut.Format(time.StampMilli), c.reset().Sub(cut).Round(time.Millisecond), off.Sub(cut).Round(time.Millisecond), wdSafe(), ops)

	wait.Until(t, 10*time.Second, "the audit names the pill and the proof", func() error {
		audit, err := coordv1.NewClusterServiceClient(cc).ListAudit(context.Background(), &coordv1.ListAuditRequest{Node: c.name})
		if err != nil {
			return err
		}
		var proofAudited, pillAudited bool
		for _, e := range audit.Entries {
			proofAudited = proofAudited || strings.Contains(e.Text, "proof: watchdog-timeout")
			pillAudited = pillAudited || e.Kind == "watchdog-pill"
		}
		if !proofAudited || !pillAudited {
			return fmt.Errorf("audit lacks the proof (%v) or the pill (%v)", proofAudited, pillAudited)
		}
		return nil
	})
	if v := scrapeCounter(t, coord, `nodefence_fence_proofs_total{proof="watchdog-timeout"}`); v != 1 {
		t.Errorf("nodefence_fence_proofs_total{proof=\"watchdog-timeout\"} = %v, want 1", v)
	}
	for _, n := range nodes[:2] {
		if !n.reset().IsZero() {
			t.Errorf("%s reset though it held its lease", n.name)
		}
	}
}

// TestWatchdogPoisonPill: an operator's `fencectl fence NODE --method watchdog` on a node whose agent
// is connected and armed: the agent takes the leader's stop-feeding pill, stops feeding, the device
// fires, and the record is proven off by time after the safe time counted from the pill — never
// before. A node whose agent's last report was "disarmed" (a clean stop) is refused the method and,
// with its BMC dark and the fallback on, is never proven by time: its fence stays in error.
func TestWatchdogPoisonPill(t *testing.T) {
	// Five nodes: with wdx-d stopped and wdx-c silenced, wdx-a, wdx-b and wdx-e are a majority (3 of 5)
	// of wdx-c's others holding leases.
	nodes, _, cc := startWDCluster(t, []string{"wdx-a", "wdx-b", "wdx-c", "wdx-d", "wdx-e"}, map[string]bool{"wdx-d": true})
	fc := coordv1.NewFenceServiceClient(cc)
	c, d := nodes[2], nodes[3]

	// wdx-d: a clean stop reports "disarmed"; its BMC goes dark.
	d.stopAgent()
	wait.Until(t, 10*time.Second, "wdx-d shown disarmed", func() error {
		r, err := coordv1.NewClusterServiceClient(cc).GetNode(context.Background(), &coordv1.GetNodeRequest{Node: d.name})
		if err != nil {
			return err
		}
		if r.GetNode().GetWatchdogArmed() {
			return errors.New("still armed")
		}
		return nil
	})
	d.bmc.Stop()
	if _, err := fc.Fence(context.Background(), &coordv1.FenceRequest{Node: d.name, Method: "watchdog"}); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "armed") {
		t.Fatalf("the watchdog method on a disarmed node: %v, want FailedPrecondition naming \"armed\"", err)
	}
	rd, err := fc.Fence(context.Background(), &coordv1.FenceRequest{Node: d.name, Reason: "dark BMC, disarmed watchdog"})
	if err != nil {
		t.Fatal(err)
	}

	// wdx-c: connected and armed; the pill.
	pill := time.Now()
	rc, err := fc.Fence(context.Background(), &coordv1.FenceRequest{Node: c.name, Reason: "poison pill", Method: "watchdog"})
	if err != nil {
		t.Fatal(err)
	}
	if rc.Fence.Method != "watchdog" {
		t.Fatalf("record method %q", rc.Fence.Method)
	}
	var fcRec, fdRec *coordv1.NodeFence
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); fcRec = final(t, fc, rc.Fence.Id, 90*time.Second) }()
	go func() { defer wg.Done(); fdRec = final(t, fc, rd.Fence.Id, 90*time.Second) }()
	wg.Wait()

	if fcRec.Status != coordv1.FenceStatus_FENCE_STATUS_DONE || fcRec.Proof != coordv1.FenceProof_FENCE_PROOF_WATCHDOG_TIMEOUT {
		t.Fatalf("pill record: %s, proof %s, error %q\n%s", fcRec.Status, fcRec.Proof, fcRec.Error, c.log.String())
	}
	if len(fcRec.Operations) != 1 || fcRec.Operations[0].Driver != "watchdog" {
		t.Fatalf("pill record ran %v, want the watchdog method alone", fcRec.Operations)
	}
	if !strings.Contains(c.log.String(), "told this agent to stop feeding") {
		t.Fatalf("the agent did not take the pill:\n%s", c.log.String())
	}
	off := fcRec.ConfirmedOffAt.AsTime()
	rs := c.reset()
	if rs.IsZero() || !rs.Before(off) {
		t.Fatalf("proven off at %s but the device reset the node at %v", off, rs)
	}
	// Its agent kept heartbeating until the pill: the last grant came at most a heartbeat before it.
	if off.Before(pill.Add(wdSafe() - time.Second)) {
		t.Fatalf("proven off %s after the pill: before the safe time %s", off.Sub(pill), wdSafe())
	}
	if rs.Sub(pill) > 8*time.Second {
		t.Errorf("the device fired %s after the pill: the agent went on feeding", rs.Sub(pill))
	}
	t.Logf("pill at %s; device reset %s after; proven off %s after (safe time %s)", pill.Format(time.StampMilli),
		rs.Sub(pill).Round(time.Millisecond), off.Sub(pill).Round(time.Millisecond), wdSafe())

	if fdRec.Status != coordv1.FenceStatus_FENCE_STATUS_ERROR || fdRec.Proof != coordv1.FenceProof_FENCE_PROOF_UNSPECIFIED || fdRec.ConfirmedOffAt != nil {
		t.Fatalf("disarmed node's fence: %s, proof %s", fdRec.Status, fdRec.Proof)
	}
	for _, op := range fdRec.Operations {
		if op.Driver == "watchdog" {
			t.Fatalf("the disarmed node fell back to its watchdog: %v", fdRec.Operations)
		}
	}
	for _, n := range []*wdNode{nodes[0], nodes[1], nodes[4]} {
		if !n.reset().IsZero() {
			t.Errorf("%s reset though it held its lease", n.name)
		}
	}
}

// scrapeCounter reads one series (name{labels}, exactly as exposed) from the coordinator's plaintext
// metrics endpoint; -1 when it is absent.
func scrapeCounter(t *testing.T, c *coordinator, series string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + c.app.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metrics line %q: %v", sc.Text(), err)
			}
			return f
		}
	}
	return -1
}
