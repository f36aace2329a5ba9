package attack

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
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

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
)

func testLog(t *testing.T) *slog.Logger {
	return testlog.New(t, slog.LevelWarn)
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
func start(t *testing.T, wrongBMC string, opts ...func(*app.Config)) *system {
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
	cfg := app.Config{
		Server:      server.Config{Listen: "127.0.0.1:0", TLS: coordTLS, DrainTimeout: time.Second},
		DriverTLS:   coordTLS,
		FenceConfig: cfgPath, DataDir: t.TempDir(), EtcdClientListen: "127.0.0.1:0", EtcdPeerListen: "127.0.0.1:0",
		// The production election TTL: one replica, no failover here, and under a loaded machine a
		// 3 s lease lapsed mid-attack (a new term forgets the agent's contact, which the kdump case
		// reads as a changed judgement).
		EtcdUnsafeNoFsync: true, ElectionTTL: 5 * time.Second, FenceOpTimeout: 10 * time.Second, Engine: eng,
		Fencing:                fencing.Policy{Retries: 1, Backoff: 100 * time.Millisecond, IsolationWait: time.Second, Polls: 3, PollInterval: 100 * time.Millisecond},
		AgentHeartbeatInterval: 200 * time.Millisecond, AgentSampleInterval: 200 * time.Millisecond,
	}
	for _, o := range opts {
		o(&cfg)
	}
	a, err := app.New(cfg, testLog(t))
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

// settled is a snapshot once the system stopped changing on its own: two snapshots a second apart
// agree (an agent that just connected has its registration and audit entries written in batches,
// after the call that connected it returned). It fails t when the system keeps changing for 20 s.
func (s *system) settled(t *testing.T) snapshot {
	t.Helper()
	prev := s.snapshot(t)
	for deadline := time.Now().Add(20 * time.Second); ; {
		time.Sleep(time.Second)
		cur := s.snapshot(t)
		d := prev.diff(cur)
		if d == "" {
			return cur
		}
		if time.Now().After(deadline) {
			t.Fatalf("the system did not settle before the attacks: %s", d)
		}
		prev = cur
	}
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
