package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodefence/nodefence/coordinator/app"
	"github.com/nodefence/nodefence/fence-drivers/ipmi"
	"github.com/nodefence/nodefence/fence-drivers/kit"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/server"
	"github.com/nodefence/nodefence/testbed/ipmisim"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
)

// startDriverHost serves the IPMI driver as one driver host: mutual TLS with the identity every
// host of the driver shares (driver/ipmi), its own state directory. It returns the server, which
// the test may stop as a host going down.
func startDriverHost(t *testing.T) *server.Server {
	t.Helper()
	svc, err := kit.NewService(ipmi.New(), kit.Options{StateDir: t.TempDir(), Log: testLog(t), DefaultTimeout: 10 * time.Second, PollInterval: 50 * time.Millisecond})
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
	return srv
}

// Three driver hosts, the first down: an operator's fence through a coordinator over mutual TLS is
// confirmed off through the second host (ipmitool agrees); the device check (fencectl test NODE)
// passes too, and the live configuration lists the three endpoints in order.
func TestFenceWhileFirstDriverHostIsDown(t *testing.T) {
	n := node{name: "node-1", password: "password", bmc: startBMC(t, "node-1")}
	hosts := []*server.Server{startDriverHost(t), startDriverHost(t), startDriverHost(t)}
	var endpoints []string
	for _, h := range hosts {
		endpoints = append(endpoints, fmt.Sprintf("%q", h.Addr()))
	}
	cfg := fmt.Sprintf(`drivers:
  ipmi: {endpoints: [%s]}
templates:
  bmc: {driver: ipmi, parameters: {lanplus: "1", cipher: "3", username: admin, password: %s}}
host_maps:
  - template: bmc
    parameters: {ip: "node-1:127.0.0.1", ipport: "node-1:%d"}
`, strings.Join(endpoints, ", "), n.password, n.bmc.Port)
	path := filepath.Join(t.TempDir(), "fence.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	hosts[0].Stop() // the first driver host is down before anything is sent
	c := startCoordinator(t, app.Config{FenceConfig: path})
	cc := conn(t, c.app.Addr())
	leaderReady(t, cc)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	check, err := coordv1.NewClusterServiceClient(cc).CheckNode(ctx, &coordv1.CheckNodeRequest{Node: n.name})
	if err != nil || !check.Ok {
		t.Fatalf("CheckNode with the first driver host down: %v, %v", check, err)
	}
	fc := coordv1.NewFenceServiceClient(cc)
	resp, err := fc.Fence(ctx, &coordv1.FenceRequest{Node: n.name, Reason: "first driver host down"})
	if err != nil {
		t.Fatal(err)
	}
	states := watchUntilFinal(t, ctx, fc, resp.Fence.Id)
	final := states[len(states)-1]
	if final.Status != coordv1.FenceStatus_FENCE_STATUS_DONE || final.ConfirmedOffAt == nil {
		t.Fatalf("fence ended %s (confirmed off %v): %s", final.Status, final.ConfirmedOffAt, final.Error)
	}
	if len(final.Operations) != 1 || final.Retries != 0 {
		t.Errorf("operations %v, retries %d: want one operation, no retry", final.Operations, final.Retries)
	}
	if p, err := ipmisim.IpmitoolPower(ctx, n.bmc.Port, "admin", "password"); err != nil || p != "off" {
		t.Fatalf("after fence: ipmitool = %q, %v; want off", p, err)
	}
	live, err := coordv1.NewClusterServiceClient(cc).GetConfig(ctx, &coordv1.GetConfigRequest{})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{hosts[0].Addr(), hosts[1].Addr(), hosts[2].Addr()}
	for _, nc := range live.Nodes {
		for _, m := range nc.Methods {
			if !slices.Equal(m.Endpoints, want) || m.Endpoint != want[0] {
				t.Errorf("live configuration of %s/%s: endpoints %q (endpoint %q), want %q", nc.Node, m.Name, m.Endpoints, m.Endpoint, want)
			}
		}
	}
}
