// Package attack attacks a running nodefence the way an adversary on the network would: mutual TLS
// set up as the README says, one CA, and the certificates an attacker could hold (a node-agent's,
// a viewer's, one without an identity, one from another CA, none at all). Every attack goes over
// real gRPC on 127.0.0.1 to a real coordinator (embedded etcd) and a real IPMI fence-driver driving
// ipmi_sim BMCs. Each must fail with the right code and change nothing: the BMCs are read back with
// ipmitool and the store is read back from etcd.
package attack

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
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
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/server"
	"github.com/nodefence/nodefence/services/tlsfiles"
	"github.com/nodefence/nodefence/testbed/ipmisim"
	"github.com/nodefence/nodefence/testbed/pki"
	"github.com/nodefence/nodefence/testbed/wait"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
)

func testLog(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// system is one coordinator, one IPMI driver and two nodes with their BMCs, all on mutual TLS.
type system struct {
	pki        *pki.PKI
	coord      *app.App
	driverAddr string
	bmcs       map[string]*ipmisim.BMC
	etcd       *clientv3.Client
}

var nodes = []string{"node-a", "node-b"}

// start runs the system. wrongBMC maps a node's fence method to the BMC of another machine.
func start(t *testing.T, wrongBMC string) *system {
	t.Helper()
	p, err := pki.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s := &system{pki: p, bmcs: map[string]*ipmisim.BMC{}}
	for _, n := range nodes {
		b, err := ipmisim.Start(filepath.Join(t.TempDir(), n), 0, "admin", "password")
		if err != nil {
			t.Fatalf("ipmi_sim: %v", err)
		}
		t.Cleanup(func() { _ = b.Stop() })
		s.bmcs[n] = b
	}
	method := map[string]*ipmisim.BMC{}
	for n, b := range s.bmcs {
		method[n] = b
	}
	if wrongBMC != "" {
		other, err := ipmisim.Start(filepath.Join(t.TempDir(), "other"), 0, "admin", "password")
		if err != nil {
			t.Fatalf("ipmi_sim: %v", err)
		}
		t.Cleanup(func() { _ = other.Stop() })
		s.bmcs["other-machine"], method[wrongBMC] = other, other
	}

	// The fence driver, which only the coordinator may call.
	driverTLS := s.files(t, identity.Driver, "ipmi")
	svc, err := kit.NewService(ipmi.New(), kit.Options{StateDir: t.TempDir(), Log: testLog(t), PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	dsrv, err := server.New(server.Config{Listen: "127.0.0.1:0", TLS: driverTLS, DrainTimeout: time.Second}, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	driverv1.RegisterFenceDriverServiceServer(dsrv.GRPC, svc)
	go func() { _ = dsrv.Serve() }()
	t.Cleanup(dsrv.Stop)
	s.driverAddr = dsrv.Addr()

	var b strings.Builder
	fmt.Fprintf(&b, "drivers:\n  ipmi: {endpoint: %q}\ntemplates:\n  bmc: {driver: ipmi, parameters: {lanplus: \"1\", cipher: \"3\", username: admin, password: password}}\nnodes:\n", s.driverAddr)
	for _, n := range nodes {
		fmt.Fprintf(&b, "  %s:\n    zone: z\n    region: r\n    methods:\n      bmc: {template: bmc, parameters: {ip: 127.0.0.1, ipport: \"%d\"}}\n    steps:\n      power_management: [bmc]\n", n, method[n].Port)
	}
	cfgPath := filepath.Join(t.TempDir(), "fence.yaml")
	if err := os.WriteFile(cfgPath, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	coordTLS := s.files(t, identity.Coordinator, "c1")
	eng := engine.DefaultConfig()
	eng.Fence.Enabled = false // only what the attacks do may happen
	a, err := app.New(app.Config{
		Server:      server.Config{Listen: "127.0.0.1:0", TLS: coordTLS, DrainTimeout: time.Second},
		DriverTLS:   coordTLS,
		FenceConfig: cfgPath, DataDir: t.TempDir(), EtcdClientListen: "127.0.0.1:0", EtcdPeerListen: "127.0.0.1:0",
		EtcdUnsafeNoFsync: true, ElectionTTL: 3 * time.Second, FenceOpTimeout: 10 * time.Second, Engine: eng,
		Fencing:                fencing.Policy{Retries: 1, Backoff: 100 * time.Millisecond, IsolationWait: time.Second, Polls: 3, PollInterval: 100 * time.Millisecond},
		AgentHeartbeatInterval: 200 * time.Millisecond, AgentSampleInterval: 200 * time.Millisecond,
	}, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	s.coord, s.etcd = a, a.Etcd()
	return s
}

func (s *system) files(t *testing.T, role identity.Role, name string) tlsfiles.Files {
	t.Helper()
	f, err := s.pki.Files(role, name)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func dialWith(t *testing.T, addr string, f tlsfiles.Files) *grpc.ClientConn {
	t.Helper()
	cc, err := dial.New(addr, f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// runAgent runs a real node-agent for node with its own certificate.
func (s *system) runAgent(t *testing.T, node string) func() {
	t.Helper()
	a, err := agent.New(agent.Config{Coordinators: []string{s.coord.Addr()}, TLS: s.files(t, identity.Agent, node),
		NodeName: node, BootID: "boot-" + node, Zone: "z", Region: "r", Log: testLog(t)}, sampler{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	stop := func() { cancel(); <-done }
	t.Cleanup(stop)
	return stop
}

type sampler struct{}

func (sampler) Sample(context.Context) (*agentv1.SignalSample, error) {
	return &agentv1.SignalSample{ObservedAt: timestamppb.Now(), Signals: []*agentv1.Signal{{Name: "memory.available", Available: 3 << 30, Capacity: 8 << 30}}}, nil
}

// snapshot is what must not change: every BMC's power read by ipmitool, and every key in etcd
// apart from the election's and the engine's own bookkeeping of node contact.
type snapshot struct {
	power map[string]string
	keys  map[string]string
}

func (s *system) snapshot(t *testing.T) snapshot {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	snap := snapshot{power: map[string]string{}, keys: map[string]string{}}
	for n, b := range s.bmcs {
		p, err := ipmisim.IpmitoolPower(ctx, b.Port, "admin", "password")
		if err != nil {
			t.Fatalf("ipmitool %s: %v", n, err)
		}
		snap.power[n] = p
	}
	resp, err := s.etcd.Get(ctx, "/nodefence/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		k := string(kv.Key)
		if strings.HasPrefix(k, "/nodefence/leader") || strings.HasPrefix(k, "/nodefence/state/") {
			continue
		}
		snap.keys[k] = string(kv.Value)
	}
	return snap
}

func (a snapshot) diff(b snapshot) string {
	var out []string
	for n, p := range a.power {
		if b.power[n] != p {
			out = append(out, fmt.Sprintf("BMC of %s: %s -> %s", n, p, b.power[n]))
		}
	}
	for k, v := range b.keys {
		if a.keys[k] != v {
			out = append(out, "etcd key written: "+k)
		}
	}
	for k := range a.keys {
		if _, ok := b.keys[k]; !ok {
			out = append(out, "etcd key deleted: "+k)
		}
	}
	return strings.Join(out, "; ")
}

// openStream opens an agent stream and sends first; it returns the status the stream ended with,
// or OK when the server accepted the hello and sent its configuration.
func openStream(ctx context.Context, cc *grpc.ClientConn, msgs ...*agentv1.ConnectRequest) error {
	st, err := agentv1.NewAgentServiceClient(cc).Connect(ctx)
	if err != nil {
		return err
	}
	for _, m := range msgs {
		if err := st.Send(m); err != nil {
			break // the server ended the stream: Recv has its status
		}
	}
	for {
		r, err := st.Recv()
		if err != nil {
			return err
		}
		if r.GetConfig() != nil && len(msgs) == 1 {
			_ = st.CloseSend()
			return nil
		}
	}
}

func hello(node string) *agentv1.ConnectRequest {
	return &agentv1.ConnectRequest{Seq: 1, Msg: &agentv1.ConnectRequest_Hello{Hello: &agentv1.Hello{NodeName: node, BootId: "boot-" + node, Zone: "z", Region: "r"}}}
}

func TestAttacks(t *testing.T) {
	s := start(t, "")
	operator := dialWith(t, s.coord.Addr(), s.files(t, identity.Operator, "alice"))
	wait.Until(t, 30*time.Second, "leader elected", func() error {
		_, err := coordv1.NewClusterServiceClient(operator).ListNodes(context.Background(), &coordv1.ListNodesRequest{})
		return err
	})
	stopAgent := map[string]func(){}
	for _, n := range nodes {
		stopAgent[n] = s.runAgent(t, n)
	}
	wait.Until(t, 20*time.Second, "both agents connected", func() error {
		r, err := coordv1.NewClusterServiceClient(operator).ListNodes(context.Background(), &coordv1.ListNodesRequest{})
		if err != nil {
			return err
		}
		connected := 0
		for _, n := range r.Nodes {
			if n.Connected {
				connected++
			}
		}
		if connected != len(nodes) {
			return fmt.Errorf("%d of %d connected", connected, len(nodes))
		}
		return nil
	})
	leader, err := coordv1.NewClusterServiceClient(operator).GetLeader(context.Background(), &coordv1.GetLeaderRequest{})
	if err != nil {
		t.Fatal(err)
	}

	// The attackers' connections.
	agentA := dialWith(t, s.coord.Addr(), s.files(t, identity.Agent, "node-a"))
	viewer := dialWith(t, s.coord.Addr(), s.files(t, identity.Viewer, "bob"))
	ghost := dialWith(t, s.coord.Addr(), s.files(t, identity.Agent, "ghost-1"))
	driverCert := dialWith(t, s.coord.Addr(), s.files(t, identity.Driver, "ipmi"))
	bare, err := s.pki.CA.IssueURIs("bare", nil, []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	bc, bk, _ := bare.Write(t.TempDir(), "bare")
	noIdentity := dialWith(t, s.coord.Addr(), tlsfiles.Files{CertFile: bc, KeyFile: bk, CAFile: s.pki.CAFile})
	noCert := dialWith(t, s.coord.Addr(), tlsfiles.Files{CAFile: s.pki.CAFile})
	plaintext := dialWith(t, s.coord.Addr(), tlsfiles.Files{Insecure: true})
	other, err := pki.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	foreignFiles, _ := other.Files(identity.Operator, "alice")
	foreignFiles.CAFile = s.pki.CAFile // trusts our server, presents a certificate of another CA
	foreign := dialWith(t, s.coord.Addr(), foreignFiles)
	// At the driver, directly.
	driverFrom := func(role identity.Role, name string) driverv1.FenceDriverServiceClient {
		return driverv1.NewFenceDriverServiceClient(dialWith(t, s.driverAddr, s.files(t, role, name)))
	}
	bmcB := s.bmcs["node-b"]
	target := &driverv1.Target{Name: "node-b", Parameters: map[string]string{"ip": "127.0.0.1", "ipport": fmt.Sprint(bmcB.Port),
		"username": "admin", "password": "wrong", "lanplus": "1", "cipher": "3"}}

	fc := coordv1.NewFenceServiceClient
	cl := coordv1.NewClusterServiceClient
	big := strings.Repeat("x", 1500*1024)
	attacks := []struct {
		name string
		code codes.Code
		call func(ctx context.Context) error
	}{
		// An agent's certificate calls what only operators may.
		{"agent fences another node", codes.PermissionDenied, func(ctx context.Context) error {
			_, err := fc(agentA).Fence(ctx, &coordv1.FenceRequest{Node: "node-b", Reason: "x"})
			return err
		}},
		{"agent unfences", codes.PermissionDenied, func(ctx context.Context) error {
			_, err := fc(agentA).Unfence(ctx, &coordv1.UnfenceRequest{Node: "node-b"})
			return err
		}},
		{"agent acknowledges a powered-on node", codes.PermissionDenied, func(ctx context.Context) error {
			_, err := fc(agentA).Acknowledge(ctx, &coordv1.AcknowledgeRequest{Node: "node-b", Operator: "alice", Reason: "trust me"})
			return err
		}},
		{"agent pauses evictions", codes.PermissionDenied, func(ctx context.Context) error {
			_, err := cl(agentA).PauseEvictions(ctx, &coordv1.PauseEvictionsRequest{Reason: "x"})
			return err
		}},
		{"agent reads the audit trail", codes.PermissionDenied, func(ctx context.Context) error {
			_, err := cl(agentA).ListAudit(ctx, &coordv1.ListAuditRequest{})
			return err
		}},
		{"viewer fences", codes.PermissionDenied, func(ctx context.Context) error {
			_, err := fc(viewer).Fence(ctx, &coordv1.FenceRequest{Node: "node-b"})
			return err
		}},
		{"agent reboots another node", codes.PermissionDenied, func(ctx context.Context) error {
			_, err := fc(agentA).Reboot(ctx, &coordv1.RebootRequest{Node: "node-b"})
			return err
		}},
		{"viewer reboots", codes.PermissionDenied, func(ctx context.Context) error {
			_, err := fc(viewer).Reboot(ctx, &coordv1.RebootRequest{Node: "node-b"})
			return err
		}},
		{"viewer logs in to a BMC through a device check", codes.PermissionDenied, func(ctx context.Context) error {
			_, err := cl(viewer).CheckNode(ctx, &coordv1.CheckNodeRequest{Node: "node-b"})
			return err
		}},
		{"agent checks devices", codes.PermissionDenied, func(ctx context.Context) error {
			_, err := cl(agentA).CheckNode(ctx, &coordv1.CheckNodeRequest{Node: "node-a"})
			return err
		}},
		{"agent reads the live configuration", codes.PermissionDenied, func(ctx context.Context) error {
			_, err := cl(agentA).GetConfig(ctx, &coordv1.GetConfigRequest{})
			return err
		}},
		{"operator checks devices with a huge node name", codes.InvalidArgument, func(ctx context.Context) error {
			_, err := cl(operator).CheckNode(ctx, &coordv1.CheckNodeRequest{Node: big})
			return err
		}},
		{"viewer resumes evictions", codes.PermissionDenied, func(ctx context.Context) error {
			_, err := cl(viewer).ResumeEvictions(ctx, &coordv1.ResumeEvictionsRequest{})
			return err
		}},
		{"driver certificate fences", codes.PermissionDenied, func(ctx context.Context) error {
			_, err := fc(driverCert).Fence(ctx, &coordv1.FenceRequest{Node: "node-b"})
			return err
		}},
		{"viewer opens an agent stream", codes.PermissionDenied, func(ctx context.Context) error {
			return openStream(ctx, viewer, hello("node-b"))
		}},
		// Certificates that identify no one.
		{"certificate without identity", codes.Unauthenticated, func(ctx context.Context) error {
			_, err := fc(noIdentity).Fence(ctx, &coordv1.FenceRequest{Node: "node-b"})
			return err
		}},
		{"no client certificate", codes.Unavailable, func(ctx context.Context) error {
			_, err := fc(noCert).Fence(ctx, &coordv1.FenceRequest{Node: "node-b"})
			return err
		}},
		{"plaintext", codes.Unavailable, func(ctx context.Context) error {
			_, err := fc(plaintext).Fence(ctx, &coordv1.FenceRequest{Node: "node-b"})
			return err
		}},
		{"certificate of another CA", codes.Unavailable, func(ctx context.Context) error {
			_, err := fc(foreign).Fence(ctx, &coordv1.FenceRequest{Node: "node-b"})
			return err
		}},
		// An agent speaks only for its own node, and only configured nodes speak.
		{"agent says hello as another node", codes.PermissionDenied, func(ctx context.Context) error {
			return openStream(ctx, agentA, hello("node-b"))
		}},
		{"agent announces another node's shutdown", codes.PermissionDenied, func(ctx context.Context) error {
			return openStream(ctx, agentA, hello("node-b"), &agentv1.ConnectRequest{Seq: 2, Msg: &agentv1.ConnectRequest_Shutdown{
				Shutdown: &agentv1.ShutdownEvent{Phase: agentv1.ShutdownPhase_SHUTDOWN_PHASE_STARTED, At: timestamppb.Now()}}})
		}},
		{"unconfigured node says hello", codes.PermissionDenied, func(ctx context.Context) error {
			return openStream(ctx, ghost, hello("ghost-1"))
		}},
		// Unbounded input.
		{"300 KB node name", codes.InvalidArgument, func(ctx context.Context) error {
			return openStream(ctx, agentA, hello(strings.Repeat("a", 300*1024)))
		}},
		{"zone name with a slash", codes.InvalidArgument, func(ctx context.Context) error {
			m := hello("node-a")
			m.GetHello().Zone = "../../leader"
			return openStream(ctx, agentA, m)
		}},
		{"agent moves its node to another zone", codes.InvalidArgument, func(ctx context.Context) error {
			m := hello("node-a")
			m.GetHello().Zone = "zone-999"
			return openStream(ctx, agentA, m)
		}},
		{"unknown condition type", codes.InvalidArgument, func(ctx context.Context) error {
			return openStream(ctx, agentA, hello("node-a"), &agentv1.ConnectRequest{Seq: 2, Msg: &agentv1.ConnectRequest_Condition{
				Condition: &agentv1.ConditionChange{Type: 42, Status: agentv1.ConditionStatus_CONDITION_STATUS_TRUE}}})
		}},
		{"sequence number that goes back", codes.InvalidArgument, func(ctx context.Context) error {
			m := hello("node-a")
			m.Seq = 100
			return openStream(ctx, agentA, m, &agentv1.ConnectRequest{Seq: 7, Msg: &agentv1.ConnectRequest_Heartbeat{Heartbeat: &agentv1.Heartbeat{SentAt: timestamppb.Now()}}})
		}},
		{"negative shutdown grace period", codes.InvalidArgument, func(ctx context.Context) error {
			return openStream(ctx, agentA, hello("node-a"), &agentv1.ConnectRequest{Seq: 2, Msg: &agentv1.ConnectRequest_Shutdown{
				Shutdown: &agentv1.ShutdownEvent{Phase: agentv1.ShutdownPhase_SHUTDOWN_PHASE_STARTED, GracePeriod: durationpb.New(-time.Hour)}}})
		}},
		{"1.5 MB fence reason", codes.InvalidArgument, func(ctx context.Context) error {
			_, err := fc(operator).Fence(ctx, &coordv1.FenceRequest{Node: "node-b", Reason: big})
			return err
		}},
		{"1.5 MB pause reason", codes.InvalidArgument, func(ctx context.Context) error {
			_, err := cl(operator).PauseEvictions(ctx, &coordv1.PauseEvictionsRequest{Reason: big})
			return err
		}},
		{"unknown status filter", codes.InvalidArgument, func(ctx context.Context) error {
			_, err := fc(viewer).ListFences(ctx, &coordv1.ListFencesRequest{Status: 77})
			return err
		}},
		// Identity never from a request field; proof is proof.
		{"operator names someone else", codes.InvalidArgument, func(ctx context.Context) error {
			_, err := fc(operator).Acknowledge(ctx, &coordv1.AcknowledgeRequest{Node: "node-b", Operator: "mallory", Reason: "x"})
			return err
		}},
		{"operator acknowledges a node whose agent reports", codes.FailedPrecondition, func(ctx context.Context) error {
			_, err := fc(operator).Acknowledge(ctx, &coordv1.AcknowledgeRequest{Node: "node-b", Reason: "I am sure"})
			return err
		}},
		{"forced acknowledgement without a reason", codes.InvalidArgument, func(ctx context.Context) error {
			_, err := fc(operator).Acknowledge(ctx, &coordv1.AcknowledgeRequest{Node: "node-b", Force: true})
			return err
		}},
		// Drivers obey only the coordinator: no call, not even a read, and no epoch from anyone else.
		{"operator powers off at the driver with epoch MaxInt64", codes.PermissionDenied, func(ctx context.Context) error {
			_, err := driverFrom(identity.Operator, "alice").PowerOff(ctx, &driverv1.PowerOffRequest{OperationId: "evil-1", Epoch: math.MaxInt64, Target: target})
			return err
		}},
		{"agent reads status at the driver", codes.PermissionDenied, func(ctx context.Context) error {
			_, err := driverFrom(identity.Agent, "node-a").Status(ctx, &driverv1.StatusRequest{Target: target})
			return err
		}},
		{"driver describes to a viewer", codes.PermissionDenied, func(ctx context.Context) error {
			_, err := driverFrom(identity.Viewer, "bob").Describe(ctx, &driverv1.DescribeRequest{})
			return err
		}},
		{"driver to a caller without certificate", codes.Unavailable, func(ctx context.Context) error {
			_, err := driverv1.NewFenceDriverServiceClient(dialWith(t, s.driverAddr, tlsfiles.Files{CAFile: s.pki.CAFile})).
				PowerOff(ctx, &driverv1.PowerOffRequest{OperationId: "evil-2", Epoch: math.MaxInt64, Target: target})
			return err
		}},
	}
	before := s.snapshot(t)
	if before.power["node-a"] != "on" || before.power["node-b"] != "on" {
		t.Fatalf("before the attacks the BMCs read %v, want on", before.power)
	}
	for _, a := range attacks {
		t.Run(a.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			err := a.call(ctx)
			if status.Code(err) != a.code {
				t.Fatalf("got %v, want %s", err, a.code)
			}
			t.Logf("refused: %v", err)
			if d := before.diff(s.snapshot(t)); d != "" {
				t.Fatalf("the attack changed something: %s", d)
			}
		})
	}
	r, err := cl(operator).GetLeader(context.Background(), &coordv1.GetLeaderRequest{})
	if err != nil || r.Epoch != leader.Epoch {
		t.Fatalf("leader after the attacks: %v, %v; want the same term (epoch %d): no attack may make the leader resign", r, err, leader.Epoch)
	}

	// After all that, the real operator fences node-b through the coordinator: the driver accepts
	// the coordinator's (low) epoch, so no attacker's epoch was recorded; ipmitool sees the BMC off;
	// the record and the audit trail name the certificate's operator. node-b's agent stops as a
	// powered-off node's would: the right machine went dark.
	stopAgent["node-b"]()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	f, err := fc(operator).Fence(ctx, &coordv1.FenceRequest{Node: "node-b", Reason: "attack suite"})
	if err != nil {
		t.Fatal(err)
	}
	var final *coordv1.NodeFence
	wait.Until(t, 30*time.Second, "fence done", func() error {
		g, err := fc(viewer).GetFence(ctx, &coordv1.GetFenceRequest{Id: f.Fence.Id})
		if err != nil {
			return err
		}
		if g.Fence.Status != coordv1.FenceStatus_FENCE_STATUS_DONE {
			return fmt.Errorf("status %s: %s", g.Fence.Status, g.Fence.Error)
		}
		final = g.Fence
		return nil
	})
	if final.RequestedBy != "spiffe://nodefence/operator/alice" || final.Epoch != leader.Epoch {
		t.Errorf("record requested_by %q epoch %d; want the operator's certificate identity and epoch %d", final.RequestedBy, final.Epoch, leader.Epoch)
	}
	if p, err := ipmisim.IpmitoolPower(ctx, bmcB.Port, "admin", "password"); err != nil || p != "off" {
		t.Fatalf("ipmitool after the operator's fence: %q, %v; want off", p, err)
	}
	if p, err := ipmisim.IpmitoolPower(ctx, s.bmcs["node-a"].Port, "admin", "password"); err != nil || p != "on" {
		t.Fatalf("ipmitool node-a: %q, %v; want on", p, err)
	}
	wait.Until(t, 20*time.Second, "proof that node-b went dark in the audit trail", func() error {
		return auditHas(ctx, viewer, "node-b", "proof", "went dark")
	})
	if err := auditHas(ctx, viewer, "node-b", "alarm", ""); err == nil {
		t.Fatal("a wrong-machine alarm for a node that went dark")
	}
}

// auditHas returns nil when node's audit trail has an entry of kind containing text.
func auditHas(ctx context.Context, cc *grpc.ClientConn, node, kind, text string) error {
	r, err := coordv1.NewClusterServiceClient(cc).ListAudit(ctx, &coordv1.ListAuditRequest{Node: node, Limit: 5000})
	if err != nil {
		return err
	}
	for _, e := range r.Entries {
		if e.Kind == kind && strings.Contains(e.Text, text) {
			return nil
		}
	}
	return fmt.Errorf("no %s entry with %q among %d", kind, text, len(r.Entries))
}

// A fence whose BMC is mapped to another machine: the driver confirms "its" BMC off (ipmitool
// agrees: the other machine is off), but node-a's agent keeps reporting. The coordinator raises the
// critical alarm — the record's wrong_machine_at, an audit entry — and never proves the node dark,
// so its pods are never released.
func TestFenceOfTheWrongMachine(t *testing.T) {
	s := start(t, "node-a")
	operator := dialWith(t, s.coord.Addr(), s.files(t, identity.Operator, "alice"))
	wait.Until(t, 30*time.Second, "leader elected", func() error {
		_, err := coordv1.NewClusterServiceClient(operator).ListNodes(context.Background(), &coordv1.ListNodesRequest{})
		return err
	})
	s.runAgent(t, "node-a")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	wait.Until(t, 20*time.Second, "node-a reporting", func() error {
		r, err := coordv1.NewClusterServiceClient(operator).GetNode(ctx, &coordv1.GetNodeRequest{Node: "node-a"})
		if err != nil || !r.Node.Connected {
			return fmt.Errorf("%v %v", r, err)
		}
		return nil
	})
	f, err := coordv1.NewFenceServiceClient(operator).Fence(ctx, &coordv1.FenceRequest{Node: "node-a", Reason: "wrong machine test"})
	if err != nil {
		t.Fatal(err)
	}
	var final *coordv1.NodeFence
	wait.Until(t, 30*time.Second, "the wrong-machine alarm on the record", func() error {
		g, err := coordv1.NewFenceServiceClient(operator).GetFence(ctx, &coordv1.GetFenceRequest{Id: f.Fence.Id})
		if err != nil {
			return err
		}
		if g.Fence.WrongMachineAt == nil {
			return fmt.Errorf("status %s, confirmed off %v, no alarm", g.Fence.Status, g.Fence.ConfirmedOffAt)
		}
		final = g.Fence
		return nil
	})
	if final.ConfirmedOffAt == nil {
		t.Fatalf("record %v: the driver's read-back should have confirmed the (wrong) BMC off", final)
	}
	if p, err := ipmisim.IpmitoolPower(ctx, s.bmcs["other-machine"].Port, "admin", "password"); err != nil || p != "off" {
		t.Fatalf("the other machine's BMC: %q, %v; want off (the fence hit it)", p, err)
	}
	if p, err := ipmisim.IpmitoolPower(ctx, s.bmcs["node-a"].Port, "admin", "password"); err != nil || p != "on" {
		t.Fatalf("node-a's own BMC: %q, %v; want on", p, err)
	}
	if err := auditHas(ctx, operator, "node-a", "alarm", "CRITICAL"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // longer than the proof window: the node is never proven dark
	if err := auditHas(ctx, operator, "node-a", "proof", "went dark"); err == nil {
		t.Fatal("node-a proven dark although its agent kept reporting")
	}
}
