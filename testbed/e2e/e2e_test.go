// Package e2e runs the coordinator, the IPMI fence-driver and node agents together over real gRPC on
// 127.0.0.1, against real ipmi_sim BMCs and a real embedded etcd, and checks the results with an
// independent client (ipmitool).
package e2e

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nodefence/nodefence/coordinator/app"
	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/coordinator/fencing"
	"github.com/nodefence/nodefence/fence-drivers/ipmi"
	"github.com/nodefence/nodefence/fence-drivers/kit"
	"github.com/nodefence/nodefence/node-agent/agent"
	"github.com/nodefence/nodefence/services/dial"
	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/server"
	"github.com/nodefence/nodefence/services/tlsfiles"
	"github.com/nodefence/nodefence/services/wire"
	"github.com/nodefence/nodefence/testbed/ipmisim"
	"github.com/nodefence/nodefence/testbed/pki"
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
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
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

// connAs dials addr with files.
func connAs(t *testing.T, addr string, files tlsfiles.Files) *grpc.ClientConn {
	t.Helper()
	cc, err := dial.New(addr, files)
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

// Bad requests get InvalidArgument or NotFound naming the problem; nothing panics.
func TestAPIRejectsBadInput(t *testing.T) {
	n := node{name: "node-1", password: "password", bmc: startBMC(t, "node-1")}
	driver := startDriver(t, t.TempDir())
	c := startCoordinator(t, app.Config{FenceConfig: writeConfig(t, driver, []node{n})})
	cc := conn(t, c.app.Addr())
	leaderReady(t, cc)
	fc := coordv1.NewFenceServiceClient(cc)
	cl := coordv1.NewClusterServiceClient(cc)
	// The agent stream is the node's own agent's.
	ac := agentv1.NewAgentServiceClient(connAs(t, c.app.Addr(), tlsAs(t, identity.Agent, n.name)))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name  string
		call  func() error
		code  codes.Code
		field string
	}{
		{"fence without node", func() error { _, err := fc.Fence(ctx, &coordv1.FenceRequest{}); return err }, codes.InvalidArgument, "node"},
		{"fence unknown node", func() error { _, err := fc.Fence(ctx, &coordv1.FenceRequest{Node: "ghost"}); return err }, codes.NotFound, "ghost"},
		{"ack with an oversized reason", func() error {
			_, err := fc.Acknowledge(ctx, &coordv1.AcknowledgeRequest{Node: n.name, Reason: strings.Repeat("r", 2048)})
			return err
		}, codes.InvalidArgument, "reason"},
		{"get without id", func() error { _, err := fc.GetFence(ctx, &coordv1.GetFenceRequest{}); return err }, codes.InvalidArgument, "id"},
		{"get unknown id", func() error { _, err := fc.GetFence(ctx, &coordv1.GetFenceRequest{Id: "nope"}); return err }, codes.NotFound, "nope"},
		{"list with bad limit", func() error { _, err := fc.ListFences(ctx, &coordv1.ListFencesRequest{Limit: -1}); return err }, codes.InvalidArgument, "limit"},
		{"list with bad status", func() error { _, err := fc.ListFences(ctx, &coordv1.ListFencesRequest{Status: 99}); return err }, codes.InvalidArgument, "status"},
		{"get node without name", func() error { _, err := cl.GetNode(ctx, &coordv1.GetNodeRequest{}); return err }, codes.InvalidArgument, "node"},
		{"watch without id or node", func() error {
			s, err := fc.WatchFence(ctx, &coordv1.WatchFenceRequest{})
			if err != nil {
				return err
			}
			_, err = s.Recv()
			return err
		}, codes.InvalidArgument, "id"},
		{"agent stream without hello", func() error {
			s, err := ac.Connect(ctx)
			if err != nil {
				return err
			}
			s.Send(&agentv1.ConnectRequest{Seq: 1, Msg: &agentv1.ConnectRequest_Heartbeat{Heartbeat: &agentv1.Heartbeat{SentAt: timestamppb.Now()}}})
			_, err = s.Recv()
			return err
		}, codes.InvalidArgument, "hello"},
		{"agent stream with bytes that are no request", func() error {
			s, err := ac.Connect(ctx, grpc.ForceCodecV2(wire.Codec()))
			if err != nil {
				return err
			}
			s.SendMsg(&wire.Encoded{B: []byte{0x0a, 0xff}}) // field 1 of a length beyond the message
			_, err = s.Recv()
			return err
		}, codes.InvalidArgument, "request"},
		{"agent sample with a name that is not UTF-8", func() error {
			s, err := ac.Connect(ctx, grpc.ForceCodecV2(wire.Codec()))
			if err != nil {
				return err
			}
			s.Send(&agentv1.ConnectRequest{Seq: 1, Msg: &agentv1.ConnectRequest_Hello{Hello: &agentv1.Hello{NodeName: n.name, BootId: "b"}}})
			if _, err := s.Recv(); err != nil { // the AgentConfig
				return err
			}
			// ConnectRequest{seq: 2, sample: {signals: [{name: "\xff"}]}}, written by hand: protobuf-go
			// refuses to encode it.
			s.SendMsg(&wire.Encoded{B: []byte{0x08, 0x02, 0x62, 0x05, 0x12, 0x03, 0x0a, 0x01, 0xff}})
			for {
				if _, err := s.Recv(); err != nil {
					return err
				}
			}
		}, codes.InvalidArgument, "request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.field) {
				t.Fatalf("err = %v, want %s naming %q", err, tc.code, tc.field)
			}
		})
	}
	// Acknowledge records a manual confirmation, DONE without any driver call. The node's agent
	// reported a moment ago (the stream above): only a forced acknowledgement with a reason passes.
	if _, err := fc.Acknowledge(ctx, &coordv1.AcknowledgeRequest{Node: n.name, Reason: "pulled the plug"}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Acknowledge of a reporting node = %v, want FailedPrecondition", err)
	}
	ack, err := fc.Acknowledge(ctx, &coordv1.AcknowledgeRequest{Node: n.name, Operator: "alice", Reason: "pulled the plug", Force: true})
	if err != nil || ack.Fence.Status != coordv1.FenceStatus_FENCE_STATUS_DONE || ack.Fence.AcknowledgedBy != "alice" || len(ack.Fence.Operations) != 0 {
		t.Fatalf("Acknowledge = %v, %v", ack, err)
	}
	poweredOffView(t, ctx, cc, n.name, ack.Fence.Id)
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

	// The leader's process "dies" without resigning: its lease must expire. The embedded etcd lives
	// in the first coordinator, so only its election is abandoned here.
	first.app.Term().Abandon()
	wait.Until(t, 20*time.Second, "second becomes leader", func() error {
		if second.app.Term() == nil {
			return fmt.Errorf("second not leading")
		}
		return nil
	})
	newEpoch := second.app.Term().Epoch
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

// grpcurl (an independent client) lists every service through reflection.
func TestGrpcurlListsServices(t *testing.T) {
	grpcurl, err := exec.LookPath("grpcurl")
	if err != nil {
		root, _ := filepath.Abs("../..")
		grpcurl = filepath.Join(root, "bin", "tools", "grpcurl")
		if _, err := os.Stat(grpcurl); err != nil {
			t.Fatalf("grpcurl not found on PATH or in bin/tools (run `make tools`): %v", err)
		}
	}
	n := node{name: "node-1", password: "password", bmc: startBMC(t, "node-1")}
	driver := startDriver(t, t.TempDir())
	c := startCoordinator(t, app.Config{FenceConfig: writeConfig(t, driver, []node{n})})
	for addr, want := range map[string][]string{
		c.app.Addr(): {"grpc.health.v1.Health", "nodefence.agent.v1.AgentService", "nodefence.coordinator.v1.ClusterService", "nodefence.coordinator.v1.FenceService"},
		driver:       {"grpc.health.v1.Health", "nodefence.driver.v1.FenceDriverService"},
	} {
		// Reflection is open to every identity, but the handshake wants a client certificate.
		op := tlsAs(t, identity.Operator, "alice")
		out, err := exec.Command(grpcurl, "-cacert", op.CAFile, "-cert", op.CertFile, "-key", op.KeyFile, addr, "list").CombinedOutput()
		if err != nil {
			t.Fatalf("grpcurl list %s: %v\n%s", addr, err, out)
		}
		for _, svc := range want {
			if !strings.Contains(string(out), svc+"\n") {
				t.Errorf("grpcurl list %s: %s missing in\n%s", addr, svc, out)
			}
		}
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

// A corrupt record forged into etcd (holding node-2's active index) is never fatal: ListFences
// names it and lists the rest, WatchFence of another record works, a new term (the coordinator
// restarted on its data) resumes without it, and node-2 can still be fenced.
func TestCorruptRecordIsNeverFatal(t *testing.T) {
	nodes := []node{{name: "node-1", password: "password", bmc: startBMC(t, "node-1")}, {name: "node-2", password: "password", bmc: startBMC(t, "node-2")}}
	driver := startDriver(t, t.TempDir())
	cfg := app.Config{FenceConfig: writeConfig(t, driver, nodes), DataDir: t.TempDir(),
		EtcdClientListen: "127.0.0.1:0", EtcdPeerListen: "127.0.0.1:0", EtcdUnsafeNoFsync: true}
	first := startCoordinator(t, cfg)
	cc := conn(t, first.app.Addr())
	leaderReady(t, cc)
	fc := coordv1.NewFenceServiceClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	resp, err := fc.Fence(ctx, &coordv1.FenceRequest{Node: "node-1", Reason: "test"})
	if err != nil {
		t.Fatal(err)
	}
	watchUntilFinal(t, ctx, fc, resp.Fence.Id)

	p := first.app.Store().Prefix()
	for k, v := range map[string]string{
		p + "/fences/forged": `{"node": "node-2", "status": "FENCE_STATUS_DONE", "confirmed_off_at": 7`,
		fmt.Sprintf("%s/fences-by-time/%020d/forged", p, time.Now().UnixNano()): "",
		p + "/active/node-2": "forged",
	} {
		if _, err := first.app.Etcd().Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}
	list, err := fc.ListFences(ctx, &coordv1.ListFencesRequest{})
	if err != nil || len(list.Fences) != 1 || list.Fences[0].Id != resp.Fence.Id || len(list.CorruptIds) != 1 || list.CorruptIds[0] != "forged" {
		t.Fatalf("ListFences with a corrupt record = %v, %v", list, err)
	}
	if states := watchUntilFinal(t, ctx, fc, resp.Fence.Id); len(states) != 1 {
		t.Fatalf("WatchFence of a finished record: %d states", len(states))
	}
	// Pages over gRPC: one record a page, then the end.
	page, err := fc.ListFences(ctx, &coordv1.ListFencesRequest{PageSize: 1})
	if err != nil || len(page.Fences) != 1 || page.NextPageToken == "" {
		t.Fatalf("first page: %v, %v", page, err)
	}
	if page, err = fc.ListFences(ctx, &coordv1.ListFencesRequest{PageSize: 1, PageToken: page.NextPageToken}); err != nil || len(page.Fences) != 0 || page.NextPageToken != "" {
		t.Fatalf("second page: %v, %v", page, err)
	}
	for _, bad := range []*coordv1.ListFencesRequest{{PageSize: 1, Limit: 2}, {PageToken: "../../leader"}} {
		if _, err := fc.ListFences(ctx, bad); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("ListFences(%v): %v, want InvalidArgument", bad, err)
		}
	}

	first.stop()
	second := startCoordinator(t, cfg)
	cc = conn(t, second.app.Addr())
	leaderReady(t, cc)
	fc = coordv1.NewFenceServiceClient(cc)
	resp, err = fc.Fence(ctx, &coordv1.FenceRequest{Node: "node-2", Reason: "test"})
	if err != nil {
		t.Fatalf("Fence of node-2 whose active index names the corrupt record: %v", err)
	}
	states := watchUntilFinal(t, ctx, fc, resp.Fence.Id)
	if final := states[len(states)-1]; final.Status != coordv1.FenceStatus_FENCE_STATUS_DONE {
		t.Fatalf("node-2 fence ended %s: %s", final.Status, final.Error)
	}
	if pw, err := ipmisim.IpmitoolPower(ctx, nodes[1].bmc.Port, "admin", "password"); err != nil || pw != "off" {
		t.Fatalf("node-2 after its fence: ipmitool = %q, %v", pw, err)
	}
}

// The running coordinator's embedded etcd is locked: a real etcd client on this machine without the
// client certificate, or without the nodefence password, can neither read nor write a record; the
// coordinator itself, with both, fences as before.
func TestEmbeddedEtcdIsLocked(t *testing.T) {
	n := node{name: "node-1", password: "password", bmc: startBMC(t, "node-1")}
	c := startCoordinator(t, app.Config{FenceConfig: writeConfig(t, startDriver(t, t.TempDir()), []node{n})})
	cc := conn(t, c.app.Addr())
	leaderReady(t, cc)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	access := c.app.EtcdAccess()
	certOnly, err := tlsfiles.Files{CAFile: access.CAFile, CertFile: access.CertFile, KeyFile: access.KeyFile}.Client()
	if err != nil {
		t.Fatal(err)
	}
	noCert, err := tlsfiles.Files{CAFile: access.CAFile}.Client()
	if err != nil {
		t.Fatal(err)
	}
	pw, err := os.ReadFile(access.PasswordFile)
	if err != nil {
		t.Fatal(err)
	}
	ep := c.app.EtcdEndpoint()
	key := c.app.Store().Prefix() + "/fences/forged"
	for name, cfg := range map[string]clientv3.Config{
		"plaintext":                     {Endpoints: []string{strings.Replace(ep, "https://", "http://", 1)}},
		"TLS without a certificate":     {Endpoints: []string{ep}, TLS: noCert, Username: access.Username, Password: strings.TrimSpace(string(pw))},
		"certificate without password":  {Endpoints: []string{ep}, TLS: certOnly},
		"certificate and a wrong guess": {Endpoints: []string{ep}, TLS: certOnly, Username: "root", Password: "root"},
	} {
		cfg.DialTimeout = 2 * time.Second
		cli, err := clientv3.New(cfg)
		if err != nil {
			t.Logf("%s: refused at connect: %v", name, err)
			continue
		}
		octx, ocancel := context.WithTimeout(ctx, 3*time.Second)
		_, getErr := cli.Get(octx, c.app.Store().Prefix()+"/", clientv3.WithPrefix())
		_, putErr := cli.Put(octx, key, `{"node":"node-1","status":"FENCE_STATUS_DONE"}`)
		ocancel()
		cli.Close()
		if getErr == nil || putErr == nil {
			t.Fatalf("%s: get err %v, put err %v; want both refused", name, getErr, putErr)
		}
		t.Logf("%s: refused: %v / %v", name, getErr, putErr)
	}
	if r, err := c.app.Etcd().Get(ctx, key); err != nil || len(r.Kvs) != 0 {
		t.Fatalf("forged key present: %v, %v", r, err)
	}
	fc := coordv1.NewFenceServiceClient(cc)
	resp, err := fc.Fence(ctx, &coordv1.FenceRequest{Node: n.name, Reason: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if states := watchUntilFinal(t, ctx, fc, resp.Fence.Id); states[len(states)-1].Status != coordv1.FenceStatus_FENCE_STATUS_DONE {
		t.Fatalf("fence through the locked store: %v", states[len(states)-1])
	}
}

// grantLog records the grants an agent receives.
type grantLog struct {
	mu  sync.Mutex
	got []string
}

func (g *grantLog) Grant(e *agentv1.EvictionGrant) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, p := range e.Pods {
		g.got = append(g.got, p.Namespace+"/"+p.Name)
	}
}

func (g *grantLog) list() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.got)
}

// Three nodes of one zone propose soft-threshold evictions at once: the coordinator grants over
// the agents' streams under the zone's budget (one in flight, a token every 2 s), visible in
// ListZones; a report frees the slot.
func TestPodEvictionsPacedPerZone(t *testing.T) {
	names := []string{"p-1", "p-2", "p-3"}
	var configured []node // only configured nodes may say hello
	for _, name := range names {
		configured = append(configured, node{name: name, password: "password", bmc: startBMC(t, name)})
	}
	driver := startDriver(t, t.TempDir())
	eng := engine.DefaultConfig()
	eng.Fence.Enabled = false
	eng.PodEviction = engine.PodEvictionConfig{Rate: 0.5, Burst: 1, MaxInFlight: 1, GrantTTL: time.Minute}
	c := startCoordinator(t, app.Config{FenceConfig: writeConfig(t, driver, configured), Engine: eng,
		AgentHeartbeatInterval: 200 * time.Millisecond, AgentSampleInterval: 200 * time.Millisecond})
	cc := conn(t, c.app.Addr())
	leaderReady(t, cc)
	cl := coordv1.NewClusterServiceClient(cc)

	agents := map[string]*agent.Agent{}
	grants := map[string]*grantLog{}
	for _, name := range names {
		grants[name] = &grantLog{}
		a, err := agent.New(agent.Config{Coordinators: []string{c.app.Addr()}, TLS: tlsAs(t, identity.Agent, name), NodeName: name, BootID: "b-" + name,
			Zone: "a", Grants: grants[name], Log: testLog(t)}, fixedSampler{})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); a.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		agents[name] = a
	}
	zone := func() *coordv1.Zone {
		r, err := cl.ListZones(context.Background(), &coordv1.ListZonesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, z := range r.Zones {
			if z.Size == 3 {
				return z
			}
		}
		return &coordv1.Zone{}
	}
	wait.Until(t, 10*time.Second, "three agents connected", func() error {
		if z := zone(); z.Size != 3 || z.Ready != 3 {
			return fmt.Errorf("%v", z)
		}
		return nil
	})
	for _, name := range names {
		agents[name].Send(&agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Candidates{Candidates: &agentv1.EvictionCandidates{
			Signal: "memory.available", Candidates: []*agentv1.EvictionCandidate{{Namespace: "web", Name: "hog-" + name, Uid: "uid-" + name}}}}})
	}
	total := func() (n int, who string) {
		for _, name := range names {
			if g := grants[name].list(); len(g) > 0 {
				n += len(g)
				who = name
			}
		}
		return n, who
	}
	var first string
	wait.Until(t, 5*time.Second, "one grant", func() error {
		n, who := total()
		if n != 1 {
			return fmt.Errorf("%d grants", n)
		}
		first = who
		return nil
	})
	wait.Until(t, 5*time.Second, "ListZones shows the budget", func() error {
		if z := zone(); z.PodEvictionsInFlight != 1 || z.PodEvictionsMaxInFlight != 1 || z.PodCandidatesHeld != 2 || z.PodEvictionsGranted != 1 || z.PodEvictionRate != 0.5 {
			return fmt.Errorf("%v", z)
		}
		return nil
	})
	// The cap holds the others back even when tokens are there.
	time.Sleep(2500 * time.Millisecond)
	if n, _ := total(); n != 1 {
		t.Fatalf("%d grants with one in flight and a cap of 1", n)
	}
	agents[first].Send(&agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Eviction{Eviction: &agentv1.EvictionReport{
		Namespace: "web", Name: "hog-" + first, Uid: "uid-" + first, Signal: "memory.available", Kind: agentv1.EvictionKind_EVICTION_KIND_GRANTED}}})
	wait.Until(t, 5*time.Second, "a second grant after the report", func() error {
		if n, _ := total(); n != 2 {
			return fmt.Errorf("%d grants", n)
		}
		return nil
	})
	if z := zone(); z.PodCandidatesHeld != 1 || z.PodEvictionsGranted != 2 {
		t.Fatalf("zone after the second grant: %v", z)
	}
}

// TestUnauthenticatedCaller covers --unauthenticated-caller, the one place a coordinator serves
// plaintext: callers without a certificate reach nothing but health unless the flag grants them an
// identity, and then exactly that identity's rights.
func TestUnauthenticatedCaller(t *testing.T) {
	n := node{name: "plain-1", password: "password", bmc: startBMC(t, "plain-1"), addr: "127.0.0.1"}
	fenceConfig := writeConfig(t, startDriver(t, t.TempDir()), []node{n})
	plaintext := func(caller string) (*coordinator, *grpc.ClientConn) {
		c := startCoordinator(t, app.Config{FenceConfig: fenceConfig,
			Server: server.Config{Listen: "127.0.0.1:0", TLS: insecure, UnauthenticatedCaller: caller, DrainTimeout: time.Second}})
		return c, connAs(t, c.app.Addr(), insecure)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// Not set: health only.
	c, cc := plaintext("")
	if _, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("health without identity: %v", err)
	}
	if _, err := coordv1.NewClusterServiceClient(cc).ListNodes(ctx, &coordv1.ListNodesRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("ListNodes without identity: %v, want Unauthenticated", err)
	}
	c.stop()

	// One identity: a viewer reads but may not fence.
	c, cc = plaintext("spiffe://nodefence/viewer/demo")
	leaderReady(t, cc)
	if _, err := coordv1.NewFenceServiceClient(cc).Fence(ctx, &coordv1.FenceRequest{Node: n.name}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("Fence as the granted viewer: %v, want PermissionDenied", err)
	}
	c.stop()

	// "any": every role, so a plaintext agent streams and its node becomes Ready.
	c, cc = plaintext("any")
	leaderReady(t, cc)
	runAgentWith(t, cc, c.app.Addr(), n.name, "a", insecure)
}
