package attack

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/nodefence/nodefence/coordinator/fenceconfig"
	"github.com/nodefence/nodefence/fence-drivers/fenceagent"
	"github.com/nodefence/nodefence/fence-drivers/ipmi"
	"github.com/nodefence/nodefence/fence-drivers/kit"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/server"
	"github.com/nodefence/nodefence/testbed/ipmisim"
	"github.com/nodefence/nodefence/testbed/pki"

	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
)

// serveDriver runs d as a fence driver on mutual TLS and returns a client holding the coordinator's
// certificate (the only identity a driver answers).
func serveDriver(t *testing.T, d kit.Driver) driverv1.FenceDriverServiceClient {
	t.Helper()
	p, err := pki.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dtls, err := p.Files(identity.Driver, d.Name())
	if err != nil {
		t.Fatal(err)
	}
	ctls, err := p.Files(identity.Coordinator, "c1")
	if err != nil {
		t.Fatal(err)
	}
	svc, err := kit.NewService(d, kit.Options{StateDir: t.TempDir(), Log: testLog(t), PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{Listen: "127.0.0.1:0", TLS: dtls, DrainTimeout: time.Second}, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	driverv1.RegisterFenceDriverServiceServer(srv.GRPC, svc)
	go func() { _ = srv.Serve() }()
	t.Cleanup(srv.Stop)
	return driverv1.NewFenceDriverServiceClient(dialWith(t, srv.Addr(), ctls))
}

// Issue 22 item 5: a fence configuration whose user name is an ssh option naming a program. The
// coordinator refuses the configuration (load, reload and `fencectl config check` share
// fenceconfig.Validate), and the agent driver refuses the target of a read-only Status before it
// runs the real fence_wti: the program never runs.
func TestAttackAgentUserNameIsAnSSHOption(t *testing.T) {
	dir := t.TempDir()
	marker := filepath.Join(dir, "pwned")
	script := filepath.Join(dir, "proxy.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\ntouch "+marker+"\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	evil := "-oProxyCommand=" + script + " x"
	cfg := "drivers: {agent: {endpoint: \"127.0.0.1:1\"}}\nnodes:\n  n1:\n    methods: {pdu: {driver: agent, parameters: {agent: fence_wti, ip: 127.0.0.1, ssh: \"1\", plug: \"1\", password: x, username: \"" + evil + "\"}}}\n    steps: {power_management: [pdu]}\n"
	if _, err := fenceconfig.Parse([]byte(cfg), "fence.yaml"); err == nil {
		t.Error("a fence configuration with an ssh option as user name was accepted")
	}
	c := serveDriver(t, fenceagent.New())
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	tg := &driverv1.Target{Name: "n1", Parameters: map[string]string{"agent": "fence_wti", "ip": "127.0.0.1", "ipport": "1",
		"ssh": "1", "plug": "1", "password": "x", "username": evil, "login_timeout": "2"}}
	if _, err := c.Status(ctx, &driverv1.StatusRequest{Target: tg, Timeout: durationpb.New(20 * time.Second)}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("Status with username %q: %v, want InvalidArgument", evil, err)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("fence_wti ran the ProxyCommand program")
	}
}

// Issue 22 item 8: one failed PowerOn at the largest epoch made a device unfenceable; re-spelling
// a device's address (localhost for 127.0.0.1) bypassed the epoch a newer leader recorded; a
// request's fields were unbounded.
func TestAttackDriverEpochsAndBounds(t *testing.T) {
	bmc, err := ipmisim.Start(filepath.Join(t.TempDir(), "bmc"), 0, "admin", "password")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bmc.Stop() })
	c := serveDriver(t, ipmi.New())
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	target := func(host string) *driverv1.Target {
		return &driverv1.Target{Name: "n1", Parameters: map[string]string{"ip": host, "ipport": strconv.Itoa(bmc.Port),
			"lanplus": "1", "cipher": "3", "username": "admin", "password": "password"}}
	}
	timeout := durationpb.New(30 * time.Second)

	if err := bmc.SetFault(ipmisim.FaultFail); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PowerOn(ctx, &driverv1.PowerOnRequest{OperationId: "max", Epoch: math.MaxInt64, Target: target("127.0.0.1"), Timeout: timeout}); err == nil {
		t.Fatal("PowerOn against a failing BMC succeeded")
	}
	if err := bmc.SetFault(ipmisim.FaultNone); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PowerOff(ctx, &driverv1.PowerOffRequest{OperationId: "leader-10", Epoch: 10, Target: target("localhost"), Timeout: timeout}); err != nil {
		t.Fatalf("PowerOff at epoch 10 after a failed PowerOn at MaxInt64: %v (the failed call kept its epoch)", err)
	}
	_, err = c.PowerOn(ctx, &driverv1.PowerOnRequest{OperationId: "deposed-9", Epoch: 9, Target: target("127.0.0.1"), Timeout: timeout})
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("PowerOn at epoch 9 via 127.0.0.1 after epoch 10 via localhost: %v, want FailedPrecondition", err)
	}
	if on, _ := bmc.Power(); on {
		t.Error("a deposed leader powered the node on by re-spelling its BMC's address")
	}
	bad := target("127.0.0.1")
	bad.Name = "n1\nfenced n2"
	_, err = c.PowerOff(ctx, &driverv1.PowerOffRequest{OperationId: "op\x00", Epoch: 11, Target: bad, Timeout: timeout})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("control characters in target name and operation id: %v, want InvalidArgument", err)
	}
}
