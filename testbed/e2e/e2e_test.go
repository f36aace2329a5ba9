// Package e2e runs the coordinator, the IPMI fence-driver and node agents together over real gRPC on
// 127.0.0.1, against real ipmi_sim BMCs and a real embedded etcd, and checks the results with an
// independent client (ipmitool).
package e2e

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nodefence/nodefence/coordinator/app"
	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/coordinator/fencing"
	"github.com/nodefence/nodefence/fence-drivers/ipmi"
	"github.com/nodefence/nodefence/fence-drivers/kit"
	"github.com/nodefence/nodefence/node-agent/agent"
	"github.com/nodefence/nodefence/services/dial"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/server"
	"github.com/nodefence/nodefence/services/tlsfiles"
	"github.com/nodefence/nodefence/testbed/ipmisim"
	"github.com/nodefence/nodefence/testbed/pki"
	"github.com/nodefence/nodefence/testbed/testlog"
	"github.com/nodefence/nodefence/testbed/wait"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
)

var insecure = tlsfiles.Files{Insecure: true}

// testPKI is the tests' CA: every coordinator, driver, agent and operator runs with mutual TLS and
// a certificate of its own identity, as in production. TestUnauthenticatedCaller alone runs a
// plaintext coordinator.
var testPKI *pki.PKI

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "nodefence-e2e-pki-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if testPKI, err = pki.New(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// tlsAs returns the TLS files of role/name.
func tlsAs(t *testing.T, role identity.Role, name string) tlsfiles.Files {
	t.Helper()
	f, err := testPKI.Files(role, name)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func testLog(t *testing.T) *slog.Logger {
	return testlog.New(t, slog.LevelInfo)
}

// startDriver serves the IPMI driver on 127.0.0.1 over mutual TLS (identity driver/ipmi; only
// coordinators may call it) with its epoch state in stateDir.
func startDriver(t *testing.T, stateDir string) string {
	t.Helper()
	svc, err := kit.NewService(ipmi.New(), kit.Options{StateDir: stateDir, Log: testLog(t), DefaultTimeout: 10 * time.Second, PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{Listen: "127.0.0.1:0", TLS: tlsAs(t, identity.Driver, "ipmi"), DrainTimeout: time.Second}, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	driverv1.RegisterFenceDriverServiceServer(srv.GRPC, svc)
	go func() { _ = srv.Serve() }()
	t.Cleanup(srv.Stop)
	return srv.Addr()
}

type node struct {
	name, password string
	bmc            *ipmisim.BMC
	addr           string // the node's IP, for fence_kdump (each test node gets its own loopback address)
}

func startBMC(t *testing.T, name string) *ipmisim.BMC {
	t.Helper()
	bmc, err := ipmisim.Start(filepath.Join(t.TempDir(), name), 0, "admin", "password")
	if err != nil {
		t.Fatalf("ipmi_sim for %s: %v", name, err)
	}
	t.Cleanup(func() { bmc.Stop() })
	return bmc
}

// writeConfig writes a fence configuration with one IPMI method per node.
func writeConfig(t *testing.T, driverAddr string, nodes []node) string {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "drivers:\n  ipmi: {endpoint: %q}\ntemplates:\n  bmc: {driver: ipmi, parameters: {lanplus: \"1\", cipher: \"3\", username: admin}}\nnodes:\n", driverAddr)
	for _, n := range nodes {
		fmt.Fprintf(&b, "  %s:\n    zone: a\n    addresses: [%s]\n    methods:\n      bmc: {template: bmc, parameters: {ip: 127.0.0.1, ipport: \"%d\", password: %q}}\n    steps:\n      power_management: [bmc]\n",
			n.name, n.addr, n.bmc.Port, n.password)
	}
	p := filepath.Join(t.TempDir(), "fence.yaml")
	t.Logf("fence configuration:\n%s", b.String())
	if err := os.WriteFile(p, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

type coordinator struct {
	app    *app.App
	cancel context.CancelFunc
	done   chan struct{}
}

func (c *coordinator) stop() { c.cancel(); <-c.done }

func startCoordinator(t *testing.T, cfg app.Config) *coordinator {
	t.Helper()
	// Mutual TLS with the coordinator's own certificate, towards callers and drivers, unless the
	// test set up the server itself.
	name := cfg.ID
	if name == "" {
		name = "e2e"
	}
	if cfg.Server.Listen == "" {
		cfg.Server = server.Config{Listen: "127.0.0.1:0", TLS: tlsAs(t, identity.Coordinator, name), DrainTimeout: time.Second}
	}
	if cfg.DriverTLS == (tlsfiles.Files{}) {
		cfg.DriverTLS = tlsAs(t, identity.Coordinator, name)
	}
	if cfg.DataDir == "" && len(cfg.EtcdEndpoints) == 0 {
		cfg.DataDir = t.TempDir()
		cfg.EtcdClientListen, cfg.EtcdPeerListen = "127.0.0.1:0", "127.0.0.1:0"
		cfg.EtcdUnsafeNoFsync = true
	}
	if cfg.ElectionTTL == 0 {
		// Short for quick failovers, yet long enough that a stall of this process under the race
		// detector on a loaded machine does not expire every lease at once.
		cfg.ElectionTTL = 3 * time.Second
	}
	if cfg.FenceOpTimeout == 0 {
		cfg.FenceOpTimeout = 5 * time.Second
	}
	if cfg.Fencing == (fencing.Policy{}) {
		cfg.Fencing = fencing.Policy{Retries: 1, Backoff: 100 * time.Millisecond, IsolationWait: time.Second, Polls: 3, PollInterval: 100 * time.Millisecond}
	}
	a, err := app.New(cfg, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &coordinator{app: a, cancel: cancel, done: make(chan struct{})}
	go func() { defer close(c.done); a.Run(ctx) }()
	t.Cleanup(c.stop)
	return c
}

// conn dials addr as the operator alice.
func conn(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	return connAs(t, addr, tlsAs(t, identity.Operator, "alice"))
}

// connAs dials addr with files. A call refused while an election runs is asked again, as fencectl
// does: a loaded machine's etcd can cost a leader its term between two steps of a test.
func connAs(t *testing.T, addr string, files tlsfiles.Files) *grpc.ClientConn {
	t.Helper()
	cc, err := dial.New(addr, files, dial.WaitOutElections(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// watchUntilFinal follows a record and returns every state seen.
func watchUntilFinal(t *testing.T, ctx context.Context, fc coordv1.FenceServiceClient, id string) []*coordv1.NodeFence {
	t.Helper()
	stream, err := fc.WatchFence(ctx, &coordv1.WatchFenceRequest{Id: id})
	if err != nil {
		t.Fatal(err)
	}
	var seen []*coordv1.NodeFence
	for {
		r, err := stream.Recv()
		if err == io.EOF {
			return seen
		}
		if err != nil {
			t.Fatalf("watch %s: %v (seen %d states)", id, err, len(seen))
		}
		seen = append(seen, r.Fence)
	}
}

func leaderReady(t *testing.T, cc *grpc.ClientConn) {
	t.Helper()
	wait.Until(t, 20*time.Second, "leader elected", func() error {
		_, err := coordv1.NewClusterServiceClient(cc).ListNodes(context.Background(), &coordv1.ListNodesRequest{})
		return err
	})
}

// Fence -> confirmed off (ipmitool agrees) -> Unfence -> confirmed on; a wrong BMC password ends in
// ERROR with a clear message and nothing reported fenced.
// runAgent runs a node agent for name against the coordinator until the test ends, and waits until
// the node is Ready with its agent connected.
func runAgent(t *testing.T, cc *grpc.ClientConn, addr, name, zone string) {
	t.Helper()
	runAgentWith(t, cc, addr, name, zone, tlsAs(t, identity.Agent, name))
}

// runAgentWith is runAgent with the agent's TLS files.
func runAgentWith(t *testing.T, cc *grpc.ClientConn, addr, name, zone string, files tlsfiles.Files) {
	t.Helper()
	a, err := agent.New(agent.Config{Coordinators: []string{addr}, TLS: files, NodeName: name, BootID: "b-" + name, Zone: zone, Log: testLog(t)}, fixedSampler{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	wait.Until(t, 10*time.Second, name+" ready with its agent connected", func() error {
		r, err := coordv1.NewClusterServiceClient(cc).GetNode(ctx, &coordv1.GetNodeRequest{Node: name})
		if err != nil {
			return err
		}
		if r.Node.Readiness != coordv1.Readiness_READINESS_READY || !r.Node.Connected {
			return fmt.Errorf("%s: %s (connected %v)", r.Node.Readiness, r.Node.Reason, r.Node.Connected)
		}
		return nil
	})
}

func TestFenceAndUnfenceAgainstIPMISim(t *testing.T) {
	good := node{name: "node-1", password: "password", bmc: startBMC(t, "node-1")}
	badpw := node{name: "node-2", password: "wrong-password", bmc: startBMC(t, "node-2")}
	driver := startDriver(t, t.TempDir())
	c := startCoordinator(t, app.Config{FenceConfig: writeConfig(t, driver, []node{good, badpw})})
	cc := conn(t, c.app.Addr())
	leaderReady(t, cc)
	fc := coordv1.NewFenceServiceClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	if p, err := ipmisim.IpmitoolPower(ctx, good.bmc.Port, "admin", "password"); err != nil || p != "on" {
		t.Fatalf("before: ipmitool = %q, %v; want on", p, err)
	}
	resp, err := fc.Fence(ctx, &coordv1.FenceRequest{Node: good.name, Reason: "test"})
	if err != nil {
		t.Fatal(err)
	}
	states := watchUntilFinal(t, ctx, fc, resp.Fence.Id)
	final := states[len(states)-1]
	if final.Status != coordv1.FenceStatus_FENCE_STATUS_DONE {
		t.Fatalf("fence ended %s: %s", final.Status, final.Error)
	}
	if final.ConfirmedOffAt == nil {
		t.Fatal("fence done without confirmed_off_at")
	}
	if len(final.Operations) != 1 || final.Operations[0].Result != coordv1.OperationResult_OPERATION_RESULT_CONFIRMED ||
		final.Operations[0].State != driverv1.PowerState_POWER_STATE_OFF || final.Operations[0].Epoch <= 0 {
		t.Fatalf("operations = %v, want one confirmed off with an epoch", final.Operations)
	}
	var statuses []coordv1.FenceStatus
	for _, s := range states {
		if len(statuses) == 0 || statuses[len(statuses)-1] != s.Status {
			statuses = append(statuses, s.Status)
		}
	}
	if statuses[len(statuses)-2] != coordv1.FenceStatus_FENCE_STATUS_RUNNING {
		t.Fatalf("status sequence %v: want RUNNING before DONE", statuses)
	}
	if p, err := ipmisim.IpmitoolPower(ctx, good.bmc.Port, "admin", "password"); err != nil || p != "off" {
		t.Fatalf("after fence: ipmitool = %q, %v; want off", p, err)
	}
	poweredOffView(t, ctx, cc, good.name, final.Id)

	un, err := fc.Unfence(ctx, &coordv1.UnfenceRequest{Node: good.name})
	if err != nil {
		t.Fatal(err)
	}
	states = watchUntilFinal(t, ctx, fc, un.Fence.Id)
	if final := states[len(states)-1]; final.Status != coordv1.FenceStatus_FENCE_STATUS_DONE || final.Action != coordv1.FenceAction_FENCE_ACTION_ON {
		t.Fatalf("unfence ended %s %s: %s", final.Action, final.Status, final.Error)
	}
	if p, err := ipmisim.IpmitoolPower(ctx, good.bmc.Port, "admin", "password"); err != nil || p != "on" {
		t.Fatalf("after unfence: ipmitool = %q, %v; want on", p, err)
	}

	resp, err = fc.Fence(ctx, &coordv1.FenceRequest{Node: badpw.name})
	if err != nil {
		t.Fatal(err)
	}
	states = watchUntilFinal(t, ctx, fc, resp.Fence.Id)
	final = states[len(states)-1]
	if final.Status != coordv1.FenceStatus_FENCE_STATUS_ERROR {
		t.Fatalf("wrong password: fence ended %s, want ERROR", final.Status)
	}
	if len(final.Operations) != 2 || final.Retries != 1 || final.ConfirmedOffAt != nil {
		t.Fatalf("wrong password: want one retry (2 operations) and never confirmed off, got retries=%d ops=%d confirmed_off_at=%v",
			final.Retries, len(final.Operations), final.ConfirmedOffAt)
	}
	for _, op := range final.Operations {
		if op.Result == coordv1.OperationResult_OPERATION_RESULT_CONFIRMED || op.State == driverv1.PowerState_POWER_STATE_OFF {
			t.Fatalf("wrong password: operation %v reported confirmed/off", op)
		}
	}
	if n := len(final.Evidence); n == 0 || !strings.Contains(final.Evidence[n-1], "escalated after 2 attempts") {
		t.Fatalf("wrong password: evidence %q does not record the escalation", final.Evidence)
	}
	if !strings.Contains(strings.ToLower(final.Error), "credential") && !strings.Contains(strings.ToLower(final.Error), "unauthenticated") {
		t.Fatalf("wrong password: error %q does not say the credentials were rejected", final.Error)
	}
	if p, err := ipmisim.IpmitoolPower(ctx, badpw.bmc.Port, "admin", "password"); err != nil || p != "on" {
		t.Fatalf("wrong password: ipmitool = %q, %v; the node must still be on", p, err)
	}

	// The record list shows all three, newest first.
	list, err := fc.ListFences(ctx, &coordv1.ListFencesRequest{})
	if err != nil || len(list.Fences) != 3 || list.Fences[0].Node != badpw.name {
		t.Fatalf("ListFences = %v, %v", list, err)
	}
}

// poweredOffView waits until the node's view says fence id confirmed it off.
func poweredOffView(t *testing.T, ctx context.Context, cc *grpc.ClientConn, name, id string) {
	t.Helper()
	want := "powered off: fence " + id + " confirmed it"
	reason := "(absent)"
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		r, err := coordv1.NewClusterServiceClient(cc).ListNodes(ctx, &coordv1.ListNodesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range r.Nodes {
			if n.Name == name {
				reason = n.Reason
			}
		}
		if strings.HasPrefix(reason, want) {
			return
		}
	}
	t.Fatalf("node %s reads %q, want it to start with %q", name, reason, want)
}

type fixedSampler struct{}

func (fixedSampler) Sample(context.Context) (*agentv1.SignalSample, error) {
	return &agentv1.SignalSample{ObservedAt: timestamppb.Now(), Signals: []*agentv1.Signal{{Name: "memory.available", Available: 3 << 30, Capacity: 8 << 30}}}, nil
}

// Agents over real gRPC: every node Ready while reporting; one goes silent and is Unknown after the
// grace period; a node that announced shutdown is NotReady with kubelet's reason, never Unknown.
func TestAgentsReadinessOverGRPC(t *testing.T) {
	names := []string{"node-1", "w-1", "w-2", "w-3"}
	var configured []node // only configured nodes may say hello
	for _, name := range names {
		configured = append(configured, node{name: name, password: "password", bmc: startBMC(t, name)})
	}
	driver := startDriver(t, t.TempDir())
	grace := 1500 * time.Millisecond
	eng := engine.DefaultConfig()
	eng.NodeMonitorGracePeriod = grace
	eng.Fence.Enabled = false
	c := startCoordinator(t, app.Config{FenceConfig: writeConfig(t, driver, configured), Engine: eng,
		AgentHeartbeatInterval: 200 * time.Millisecond, AgentSampleInterval: 200 * time.Millisecond})
	cc := conn(t, c.app.Addr())
	leaderReady(t, cc)
	cl := coordv1.NewClusterServiceClient(cc)

	cancels := map[string]context.CancelFunc{}
	agents := map[string]*agent.Agent{}
	for _, name := range names {
		a, err := agent.New(agent.Config{Coordinators: []string{c.app.Addr()}, TLS: tlsAs(t, identity.Agent, name), NodeName: name, BootID: "b-" + name, Zone: "a", Region: "r", Log: testLog(t)}, fixedSampler{})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); a.Run(ctx) }()
		cancels[name] = func() { cancel(); <-done }
		agents[name] = a
		t.Cleanup(cancels[name])
	}
	get := func(name string) *coordv1.Node {
		r, err := cl.GetNode(context.Background(), &coordv1.GetNodeRequest{Node: name})
		if err != nil {
			t.Logf("GetNode(%s): %v", name, err)
			return &coordv1.Node{Name: name, Reason: err.Error()}
		}
		return r.Node
	}
	for _, name := range names {
		wait.Until(t, 10*time.Second, name+" ready", func() error {
			nd := get(name)
			if nd.Readiness != coordv1.Readiness_READINESS_READY || !nd.Connected || nd.Signals["memory.available"] != 3<<30 {
				return fmt.Errorf("%v", nd)
			}
			return nil
		})
	}
	cancels["w-1"]()
	var unknownAt time.Time
	var lastSeen time.Time
	wait.Until(t, grace+5*time.Second, "w-1 unknown", func() error {
		nd := get("w-1")
		if nd.Readiness != coordv1.Readiness_READINESS_UNKNOWN {
			return fmt.Errorf("%s: %s", nd.Readiness, nd.Reason)
		}
		unknownAt, lastSeen = time.Now(), nd.LastSeen.AsTime()
		return nil
	})
	if silent := unknownAt.Sub(lastSeen); silent < grace {
		t.Fatalf("w-1 judged Unknown %s after its last contact, before the %s grace period", silent, grace)
	}

	agents["w-2"].Send(&agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Shutdown{Shutdown: &agentv1.ShutdownEvent{
		Phase: agentv1.ShutdownPhase_SHUTDOWN_PHASE_STARTED, At: timestamppb.Now(), GracePeriod: durationpb.New(30 * time.Second)}}})
	wait.Until(t, 5*time.Second, "w-2 shutting down", func() error {
		if nd := get("w-2"); nd.Readiness != coordv1.Readiness_READINESS_NOT_READY || nd.Reason != "node is shutting down" {
			return fmt.Errorf("%s: %s", nd.Readiness, nd.Reason)
		}
		return nil
	})
	cancels["w-2"]()
	// Silent past its grace, a node that announced its shutdown is Unknown, as kube-controller-manager
	// marks it (it stays exempt from fencing: the engine's shutdown rule, scenario scripts).
	wait.Until(t, grace+5*time.Second, "w-2 unknown after shutdown and silence", func() error {
		if nd := get("w-2"); nd.Readiness != coordv1.Readiness_READINESS_UNKNOWN {
			return fmt.Errorf("%s: %s", nd.Readiness, nd.Reason)
		}
		return nil
	})
	if nd := get("w-3"); nd.Readiness != coordv1.Readiness_READINESS_READY {
		t.Fatalf("w-3 still reporting: %s", nd.Readiness)
	}
	zones, err := cl.ListZones(context.Background(), &coordv1.ListZonesRequest{})
	if err != nil || len(zones.Zones) != 1 || zones.Zones[0].Size != 4 || zones.Zones[0].NotReady != 2 {
		t.Fatalf("ListZones = %v, %v", zones, err)
	}
}

// abandonTo ends from's leadership term without resigning (its lease must expire, as when its
// process dies; the embedded etcd may live in from, so only the election is abandoned) and waits up
// to timeout until to leads, then returns to's term's epoch. from is still alive and campaigns
// again: if to lost its place in the election meanwhile (its lease not renewed in time on a loaded
// machine), from rightly wins again, and its new term is abandoned too, until to leads.
func abandonTo(t *testing.T, from, to *coordinator, timeout time.Duration) int64 {
	t.Helper()
	old := from.app.Term()
	if old == nil {
		t.Fatalf("%s is not leading", from.app.Addr())
	}
	old.Abandon()
	abandoned := old.Epoch
	var epoch int64
	wait.Until(t, timeout, "the other replica becomes leader", func() error {
		if term := to.app.Term(); term != nil {
			epoch = term.Epoch
			return nil
		}
		if term := from.app.Term(); term != nil && term.Epoch > abandoned {
			t.Logf("the abandoned replica won term %d again: abandoning it too", term.Epoch)
			abandoned = term.Epoch
			term.Abandon()
		}
		return fmt.Errorf("%s not leading", to.app.Addr())
	})
	return epoch
}
