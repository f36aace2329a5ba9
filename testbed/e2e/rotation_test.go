package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodefence/nodefence/coordinator/app"
	"github.com/nodefence/nodefence/coordinator/fencing"
	"github.com/nodefence/nodefence/fence-drivers/ipmi"
	"github.com/nodefence/nodefence/fence-drivers/kit"
	"github.com/nodefence/nodefence/services/dial"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/identity/certs"
	"github.com/nodefence/nodefence/services/server"
	"github.com/nodefence/nodefence/services/tlsfiles"
	"github.com/nodefence/nodefence/testbed/ipmisim"
	"github.com/nodefence/nodefence/testbed/wait"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
)

// rotatingPKI is a CA directory whose files are rewritten in place, as cert-manager and an
// operator's renewal do: one certificate per identity at a fixed path, and ca.crt the bundle
// every component verifies its peers with.
type rotatingPKI struct {
	t   *testing.T
	dir string
	ids []identity.Identity
}

func (p *rotatingPKI) files(id identity.Identity) tlsfiles.Files {
	base := filepath.Join(p.dir, string(id.Role)+"-"+id.Name)
	return tlsfiles.Files{CertFile: base + ".crt", KeyFile: base + ".key", CAFile: filepath.Join(p.dir, "ca.crt")}
}

// issue re-issues every identity's certificate from ca, valid for validity.
func (p *rotatingPKI) issue(ca *certs.CA, validity time.Duration) {
	p.t.Helper()
	for _, id := range p.ids {
		pair, err := ca.Issue(id, []string{"127.0.0.1", "localhost"}, validity)
		if err != nil {
			p.t.Fatal(err)
		}
		if _, _, err := pair.Write(p.dir, string(id.Role)+"-"+id.Name); err != nil {
			p.t.Fatal(err)
		}
	}
}

// trust writes the CA bundle.
func (p *rotatingPKI) trust(cas ...*certs.CA) {
	p.t.Helper()
	var b []byte
	for _, ca := range cas {
		b = append(append(b, ca.CertPEM...), '\n')
	}
	if err := os.WriteFile(filepath.Join(p.dir, "ca.crt"), b, 0o644); err != nil {
		p.t.Fatal(err)
	}
}

// Every certificate of a running system is renewed and then the CA rolled over (a bundle of the
// old and the new CA, every certificate re-issued by the new CA, then the new CA alone) while a
// fence is in flight: the coordinator, the driver, two agents and an operator's fencectl calls,
// all on real gRPC over TCP with mutual TLS, the fence through ipmi_sim. The certificates the
// processes started with expire during the test, and every server cuts its connections every
// 2 s, so every handshake after that uses what the processes reloaded: nothing fails, the agents
// stay connected, and the fence completes with a read-back once the BMC answers.
func TestCertificatesAndCARotateUnderARunningSystem(t *testing.T) {
	const firstLifetime = 60 * time.Second // past the start on a loaded machine; expires mid-test
	victim := node{name: "node-1", password: "password", bmc: startBMC(t, "node-1")}
	coordID, driverID, opID := identity.Identity{Role: identity.Coordinator, Name: "rot"}, identity.Identity{Role: identity.Driver, Name: "ipmi"}, identity.Identity{Role: identity.Operator, Name: "alice"}
	agents := []identity.Identity{{Role: identity.Agent, Name: "node-2"}, {Role: identity.Agent, Name: "node-3"}}
	p := &rotatingPKI{t: t, dir: t.TempDir(), ids: append([]identity.Identity{coordID, driverID, opID}, agents...)}
	oldCA, err := certs.NewCA("nodefence CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	p.trust(oldCA)
	p.issue(oldCA, firstLifetime)
	expired := time.Now().Add(firstLifetime)

	driver := startRotatingDriver(t, p.files(driverID))
	coordTLS := p.files(coordID)
	c := startCoordinator(t, app.Config{ID: "rot", FenceConfig: writeConfig(t, driver, []node{victim,
		{name: "node-2", password: "password", bmc: startBMC(t, "node-2")}, {name: "node-3", password: "password", bmc: startBMC(t, "node-3")}}),
		Server:    server.Config{Listen: "127.0.0.1:0", MetricsListen: "127.0.0.1:0", TLS: coordTLS, DrainTimeout: time.Second, MaxConnectionAge: 2 * time.Second},
		DriverTLS: coordTLS, FenceOpTimeout: 5 * time.Second,
		Fencing: fencing.Policy{Retries: 30, Backoff: 200 * time.Millisecond, IsolationWait: time.Second, Polls: 3, PollInterval: 100 * time.Millisecond}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// fencectl: every call a new process, with the files as they are then.
	fencectl := func(step string, call func(coordv1.FenceServiceClient, coordv1.ClusterServiceClient) error) {
		t.Helper()
		cc, err := dial.New(c.app.Addr(), p.files(opID), dial.Peer(identity.Coordinator, ""))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		if err := call(coordv1.NewFenceServiceClient(cc), coordv1.NewClusterServiceClient(cc)); err != nil {
			t.Fatalf("%s: fencectl: %v", step, err)
		}
	}
	opConn, err := dial.New(c.app.Addr(), p.files(opID))
	if err != nil {
		t.Fatal(err)
	}
	defer opConn.Close()
	leaderReady(t, opConn)
	for _, a := range agents {
		runAgentWith(t, opConn, c.app.Addr(), a.Name, "a", p.files(a))
	}

	// The fence goes in flight: the BMC fails every chassis call until the rotation is over.
	if err := victim.bmc.SetFault(ipmisim.FaultFail); err != nil {
		t.Fatal(err)
	}
	var fenceID string
	fencectl("fence", func(fc coordv1.FenceServiceClient, _ coordv1.ClusterServiceClient) error {
		r, err := fc.Fence(ctx, &coordv1.FenceRequest{Node: victim.name, Reason: "certificate rotation test"})
		if err == nil {
			fenceID = r.Fence.Id
		}
		return err
	})
	// connected waits (briefly: the servers cut every stream each 2 s and the agents reconnect)
	// for both agents connected and their nodes Ready; every fencectl call must succeed.
	connected := func(step string) {
		t.Helper()
		wait.Until(t, 10*time.Second, step+": agents connected", func() error {
			var err error
			fencectl(step, func(_ coordv1.FenceServiceClient, cs coordv1.ClusterServiceClient) error {
				nodes, e := cs.ListNodes(ctx, &coordv1.ListNodesRequest{})
				if e == nil {
					err = agentsConnected(nodes.Nodes, agents)
				}
				return e
			})
			return err
		})
	}
	check := func(step string) {
		t.Helper()
		// Past the reload check (1 s) and a connection age (2 s): the next handshakes use the files.
		time.Sleep(3500 * time.Millisecond)
		fencectl(step, func(fc coordv1.FenceServiceClient, _ coordv1.ClusterServiceClient) error {
			f, err := fc.GetFence(ctx, &coordv1.GetFenceRequest{Id: fenceID})
			if err != nil {
				return err
			}
			if f.Fence.Status == coordv1.FenceStatus_FENCE_STATUS_DONE || f.Fence.FinishedAt != nil {
				return fmt.Errorf("the fence ended while the BMC fails: %v", f.Fence)
			}
			return nil
		})
		connected(step)
	}
	check("started")

	p.issue(oldCA, time.Hour)
	check("every certificate renewed by the same CA")
	newCA, err := certs.NewCA("nodefence CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	p.trust(oldCA, newCA)
	check("bundle of the old and the new CA")
	p.issue(newCA, time.Hour)
	check("every certificate re-issued by the new CA")
	p.trust(newCA)
	check("the new CA alone")
	// A certificate of the dropped CA (a decommissioned node's agent) is refused from now on,
	// though the coordinator has not restarted.
	stale := &rotatingPKI{t: t, dir: t.TempDir(), ids: []identity.Identity{{Role: identity.Agent, Name: "node-2"}}}
	stale.trust(newCA)
	stale.issue(oldCA, time.Hour)
	sc, err := dial.New(c.app.Addr(), stale.files(stale.ids[0]), dial.Peer(identity.Coordinator, ""))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := coordv1.NewClusterServiceClient(sc).ListNodes(ctx, &coordv1.ListNodesRequest{}); err == nil {
		t.Fatal("a certificate of the dropped CA was accepted")
	}
	sc.Close()
	if d := time.Until(expired); d > 0 {
		time.Sleep(d + time.Second)
	}
	check("the first certificates expired")
	if e := scrapeExpiry(t, c.app.MetricsAddr()); e["serving"] < 50*60 || e["client"] < 50*60 || e["serving-ca"] < 50*60 {
		t.Fatalf("nodefence_certificate_expiry_seconds after the rotation: %v; want about an hour for serving, client and serving-ca", e)
	}

	// The BMC answers again: the fence's next attempt, over a connection to the driver made with
	// the new certificates, powers the node off and reads it back.
	if err := victim.bmc.SetFault(ipmisim.FaultNone); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, 90*time.Second, "the fence done", func() error {
		var err error
		fencectl("wait", func(fc coordv1.FenceServiceClient, _ coordv1.ClusterServiceClient) error {
			f, e := fc.GetFence(ctx, &coordv1.GetFenceRequest{Id: fenceID})
			if e != nil {
				return e
			}
			if f.Fence.Status != coordv1.FenceStatus_FENCE_STATUS_DONE {
				err = fmt.Errorf("%s %s", f.Fence.Step, f.Fence.Status)
			}
			return nil
		})
		return err
	})
	if pw, err := ipmisim.IpmitoolPower(ctx, victim.bmc.Port, "admin", "password"); err != nil || pw != "off" {
		t.Fatalf("after the fence: ipmitool = %q, %v; want off", pw, err)
	}
	connected("after the fence")
}

// agentsConnected reports a node of agents that is not Ready with its agent connected.
func agentsConnected(nodes []*coordv1.Node, agents []identity.Identity) error {
	byName := map[string]*coordv1.Node{}
	for _, n := range nodes {
		byName[n.Name] = n
	}
	for _, a := range agents {
		n := byName[a.Name]
		if n == nil || !n.Connected || n.Readiness != coordv1.Readiness_READINESS_READY {
			return fmt.Errorf("agent of %s not connected and ready: %v", a.Name, n)
		}
	}
	return nil
}

// startRotatingDriver serves the IPMI driver with files, cutting every connection after 2 s.
func startRotatingDriver(t *testing.T, files tlsfiles.Files) string {
	t.Helper()
	svc, err := kit.NewService(ipmi.New(), kit.Options{StateDir: t.TempDir(), Log: testLog(t), DefaultTimeout: 10 * time.Second, PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{Listen: "127.0.0.1:0", TLS: files, DrainTimeout: time.Second, MaxConnectionAge: 2 * time.Second}, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	driverv1.RegisterFenceDriverServiceServer(srv.GRPC, svc)
	go func() { _ = srv.Serve() }()
	t.Cleanup(srv.Stop)
	return srv.Addr()
}

// scrapeExpiry reads nodefence_certificate_expiry_seconds by role from a plaintext metrics endpoint.
func scrapeExpiry(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), `nodefence_certificate_expiry_seconds{role="`)
		if !ok {
			continue
		}
		role, value, _ := strings.Cut(line, `"} `)
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", sc.Text(), err)
		}
		out[role] = v
	}
	return out
}
