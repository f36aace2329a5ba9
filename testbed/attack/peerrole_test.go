package attack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/nodefence/nodefence/coordinator/app"
	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/coordinator/fencing"
	"github.com/nodefence/nodefence/node-agent/agent"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/server"
	"github.com/nodefence/nodefence/services/tlsfiles"
	"github.com/nodefence/nodefence/testbed/pki"
	"github.com/nodefence/nodefence/testbed/syncbuf"
	"github.com/nodefence/nodefence/testbed/testlog"
	"github.com/nodefence/nodefence/testbed/wait"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
)

// impostor is an attacker's gRPC server: a valid certificate of the nodefence CA, but not the
// identity the caller means to reach. It answers every driver call "confirmed off" and counts
// every call of any method that reaches it.
type impostor struct {
	driverv1.UnimplementedFenceDriverServiceServer
	calls atomic.Int64
	addr  string
}

func (m *impostor) PowerOff(context.Context, *driverv1.PowerOffRequest) (*driverv1.PowerOffResponse, error) {
	m.calls.Add(1)
	return &driverv1.PowerOffResponse{State: driverv1.PowerState_POWER_STATE_OFF}, nil
}

func (m *impostor) Status(context.Context, *driverv1.StatusRequest) (*driverv1.StatusResponse, error) {
	m.calls.Add(1)
	return &driverv1.StatusResponse{State: driverv1.PowerState_POWER_STATE_OFF}, nil
}

// startImpostor serves with files (its own certificate, the real CA) on 127.0.0.1. Every method,
// known or not, is counted.
func startImpostor(t *testing.T, files tlsfiles.Files) *impostor {
	t.Helper()
	cfg, err := files.Server()
	if err != nil {
		t.Fatal(err)
	}
	m := &impostor{}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(cfg)), grpc.UnknownServiceHandler(func(any, grpc.ServerStream) error {
		m.calls.Add(1)
		return nil
	}))
	driverv1.RegisterFenceDriverServiceServer(srv, m)
	lis, err := netListen()
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	m.addr = lis.Addr().String()
	return m
}

// logTo is a logger writing text lines into buf and to the test log.
func logTo(t *testing.T, buf *syncbuf.Buffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(io.MultiWriter(buf, testlog.Writer{T: t}), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// The coordinator checks who answers: an attacker holding an agent certificate (on every node's
// disk) and serving it where the fence configuration names the IPMI driver receives no call; the
// fence fails at the TLS handshake, and the record and the log name the expected and the presented
// identity. Before the check, the coordinator sent it the power-off and accepted its "confirmed off".
func TestImpostorDriverGetsNoCall(t *testing.T) {
	p, err := pki.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	files := func(role identity.Role, name string) tlsfiles.Files {
		f, err := p.Files(role, name)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	fake := startImpostor(t, files(identity.Agent, "node-b"))
	cfg := fmt.Sprintf(`drivers:
  ipmi: {endpoint: %q}
nodes:
  node-a:
    zone: z
    region: r
    methods:
      bmc: {driver: ipmi, parameters: {ip: 127.0.0.1, ipport: "9", username: admin, password: password, lanplus: "1", cipher: "3"}}
    steps:
      power_management: [bmc]
`, fake.addr)
	cfgPath := filepath.Join(t.TempDir(), "fence.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs syncbuf.Buffer
	coordTLS := files(identity.Coordinator, "c1")
	eng := engine.DefaultConfig()
	eng.Fence.Enabled = false
	a, err := app.New(app.Config{
		Server:      server.Config{Listen: "127.0.0.1:0", TLS: coordTLS, DrainTimeout: time.Second},
		DriverTLS:   coordTLS,
		FenceConfig: cfgPath, DataDir: t.TempDir(), EtcdClientListen: "127.0.0.1:0", EtcdPeerListen: "127.0.0.1:0",
		EtcdUnsafeNoFsync: true, ElectionTTL: 3 * time.Second, FenceOpTimeout: 5 * time.Second, Engine: eng,
		Fencing:                fencing.Policy{Retries: 1, Backoff: 100 * time.Millisecond, IsolationWait: time.Second, Polls: 2, PollInterval: 100 * time.Millisecond},
		AgentHeartbeatInterval: 200 * time.Millisecond, AgentSampleInterval: 200 * time.Millisecond,
	}, logTo(t, &logs))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	operator := coordv1.NewFenceServiceClient(dialWith(t, a.Addr(), files(identity.Operator, "alice")))
	var id string
	wait.Until(t, 30*time.Second, "the fence accepted", func() error {
		r, err := operator.Fence(context.Background(), &coordv1.FenceRequest{Node: "node-a", Reason: "peer role attack"})
		if err != nil {
			return err
		}
		id = r.GetFence().GetId()
		return nil
	})
	var rec *coordv1.NodeFence
	wait.Until(t, 60*time.Second, "the driver call failed and was recorded", func() error {
		r, err := operator.GetFence(context.Background(), &coordv1.GetFenceRequest{Id: id})
		if err != nil {
			return err
		}
		rec = r.GetFence()
		for _, op := range rec.GetOperations() {
			if op.GetError() != "" || rec.GetConfirmedOffAt() != nil {
				return nil
			}
		}
		return fmt.Errorf("status %s, no operation answered yet", rec.GetStatus())
	})
	if n := fake.calls.Load(); n != 0 {
		t.Errorf("the impostor driver received %d calls", n)
	}
	if rec.GetConfirmedOffAt() != nil {
		t.Fatalf("the fence %s succeeded against an impostor: %v", id, rec)
	}
	const want, presented = "spiffe://nodefence/driver/ipmi", "spiffe://nodefence/agent/node-b"
	var opErrs []string
	for _, op := range rec.GetOperations() {
		opErrs = append(opErrs, op.GetError())
	}
	if all := strings.Join(opErrs, " | "); !strings.Contains(all, want) || !strings.Contains(all, presented) {
		t.Errorf("the record's operation errors %q do not name the expected %s and the presented %s", all, want, presented)
	}
	wait.Until(t, 10*time.Second, "the refusal logged", func() error {
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, "level=ERROR") && strings.Contains(line, want) && strings.Contains(line, presented) {
				return nil
			}
		}
		return errors.New("no error line naming both identities")
	})
}

// An agent and fencectl talk only to a coordinator: an attacker serving another certificate of
// the CA (a driver's, an agent's) at a coordinator address receives no call — no hello naming the
// node, no operator request — and the refusal is logged naming both identities.
func TestImpostorCoordinatorGetsNoCall(t *testing.T) {
	p, err := pki.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	files := func(role identity.Role, name string) tlsfiles.Files {
		f, err := p.Files(role, name)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	t.Run("agent", func(t *testing.T) {
		fake := startImpostor(t, files(identity.Driver, "ipmi"))
		var logs syncbuf.Buffer
		ag, err := agent.New(agent.Config{Coordinators: []string{fake.addr}, TLS: files(identity.Agent, "node-a"),
			NodeName: "node-a", BootID: "boot-a", Zone: "z", Region: "r", Log: logTo(t, &logs)}, sampler{})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = ag.Run(ctx) }()
		defer func() { cancel(); <-done }()
		wait.Until(t, 20*time.Second, "the agent refused the impostor", func() error {
			if n := fake.calls.Load(); n != 0 {
				t.Fatalf("the impostor coordinator received %d calls from the agent", n)
			}
			if s := logs.String(); !strings.Contains(s, "spiffe://nodefence/driver/ipmi") || !strings.Contains(s, "spiffe://nodefence/coordinator/*") {
				return errors.New("no log line naming both identities")
			}
			return nil
		})
		if n := fake.calls.Load(); n != 0 {
			t.Errorf("the impostor coordinator received %d calls from the agent", n)
		}
	})
	t.Run("fencectl", func(t *testing.T) {
		fake := startImpostor(t, files(identity.Agent, "node-b"))
		bin := filepath.Join(t.TempDir(), "fencectl")
		if out, err := goBuild(bin, "../../coordinator/cmd/fencectl"); err != nil {
			t.Fatalf("build fencectl: %v\n%s", err, out)
		}
		op := files(identity.Operator, "alice")
		out, err := runCmd(bin, "--coordinator", fake.addr, "--tls-cert", op.CertFile, "--tls-key", op.KeyFile, "--tls-ca", op.CAFile,
			"--timeout", "5s", "fence", "node-a", "--reason", "x")
		if err == nil {
			t.Errorf("fencectl fence against an impostor succeeded:\n%s", out)
		}
		if n := fake.calls.Load(); n != 0 {
			t.Errorf("the impostor coordinator received %d calls from fencectl", n)
		}
		t.Logf("fencectl: %s", out)
	})
}

// A node holds at most two agent streams: the third is refused with ResourceExhausted, and once one
// closes a new one is accepted (an agent resuming while its old stream still closes keeps working).
func TestAgentStreamsPerNodeCapped(t *testing.T) {
	s := start(t, "")
	agentA := dialWith(t, s.coord.Addr(), s.files(t, identity.Agent, "node-a"))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	open := func(sctx context.Context) (agentv1.AgentService_ConnectClient, error) {
		st, err := agentv1.NewAgentServiceClient(agentA).Connect(sctx)
		if err != nil {
			return nil, err
		}
		if err := st.Send(hello("node-a")); err != nil {
			return nil, err
		}
		for {
			r, err := st.Recv()
			if err != nil {
				return nil, err
			}
			if r.GetConfig() != nil {
				return st, nil
			}
		}
	}
	var first context.CancelFunc
	wait.Until(t, 30*time.Second, "the first stream accepted", func() error {
		sctx, c := context.WithCancel(ctx)
		if _, err := open(sctx); err != nil {
			c()
			return err
		}
		first = c
		return nil
	})
	if _, err := open(ctx); err != nil {
		t.Fatalf("second stream of node-a (a resume while the first still closes): %v", err)
	}
	if _, err := open(ctx); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("third stream of node-a: %v, want ResourceExhausted", err)
	}
	first()
	wait.Until(t, 10*time.Second, "a new stream accepted once one closed", func() error {
		_, err := open(ctx)
		return err
	})
}

func netListen() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }

func goBuild(out, pkg string) ([]byte, error) {
	return exec.Command("go", "build", "-o", out, pkg).CombinedOutput()
}

func runCmd(bin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	return string(out), err
}
