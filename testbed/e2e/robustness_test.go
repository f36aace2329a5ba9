package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nodefence/nodefence/coordinator/app"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/server"
	"github.com/nodefence/nodefence/services/tlsfiles"
	"github.com/nodefence/nodefence/services/wire"
	"github.com/nodefence/nodefence/testbed/ipmisim"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

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
