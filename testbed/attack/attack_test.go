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
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/tlsfiles"
	"github.com/nodefence/nodefence/testbed/ipmisim"
	"github.com/nodefence/nodefence/testbed/pki"
	"github.com/nodefence/nodefence/testbed/wait"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
)

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
	// Dark only after a full grace period (50 s here) of this term's own observation with no
	// witness heard (fencing.ProofRule.Window).
	wait.Until(t, 75*time.Second, "proof that node-b went dark in the audit trail", func() error {
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
