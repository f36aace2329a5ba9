package redfish_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/nodefence/nodefence/fence-drivers/conformance"
	"github.com/nodefence/nodefence/fence-drivers/kit"
	"github.com/nodefence/nodefence/fence-drivers/kit/kittest"
	"github.com/nodefence/nodefence/fence-drivers/redfish"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
	"github.com/nodefence/nodefence/testbed/redfishsim"
)

const (
	user     = "root"
	password = "calvin-redfish"
	systems  = 40
)

var opSeq atomic.Int64

func startSim(t *testing.T, n int, transition time.Duration) (*redfishsim.Service, string) {
	t.Helper()
	sim, err := redfishsim.Start(redfishsim.Config{Systems: n, User: user, Password: password, Transition: transition})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, sim.CAPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	return sim, ca
}

// target addresses system id of sim, verified against the CA file; extra are key, value pairs
// ("" deletes). ClusterLabs aliases are used on purpose.
func target(sim *redfishsim.Service, ca string, id int, extra ...string) *driverv1.Target {
	p := map[string]string{"ipaddr": "127.0.0.1", "ipport": strconv.Itoa(sim.Port()), "login": user, "passwd": password,
		"systems-uri": redfishsim.SystemURI(id), "ssl_ca_file": ca}
	for i := 0; i+1 < len(extra); i += 2 {
		if extra[i+1] == "" {
			delete(p, extra[i])
		} else {
			p[extra[i]] = extra[i+1]
		}
	}
	return &driverv1.Target{Name: "node-" + strconv.Itoa(id), Parameters: p}
}

func truth(sim *redfishsim.Service, id int) func(context.Context) (driverv1.PowerState, error) {
	return func(context.Context) (driverv1.PowerState, error) {
		on, err := sim.On(id)
		switch {
		case err != nil:
			return driverv1.PowerState_POWER_STATE_UNKNOWN, err
		case on:
			return driverv1.PowerState_POWER_STATE_ON, nil
		}
		return driverv1.PowerState_POWER_STATE_OFF, nil
	}
}

// TestConformance runs the suite against the simulated BMC over HTTPS verified with its CA, with
// power changes taking 150 ms (PoweringOff / PoweringOn meanwhile).
func TestConformance(t *testing.T) {
	sim, ca := startSim(t, systems, 150*time.Millisecond)
	hung, hungCA := startSim(t, 1, 0)
	hung.SetHang(true)
	var next atomic.Int64
	conformance.Run(t, conformance.Harness{
		Client: serve(t),
		NewDevice: func(t *testing.T, cond conformance.Condition) conformance.Device {
			if cond == conformance.Hanging {
				return conformance.Device{Target: target(hung, hungCA, 1), Power: truth(hung, 1)}
			}
			id := int(next.Add(1))
			if id > systems {
				t.Fatal("out of simulated systems")
			}
			d := conformance.Device{Target: target(sim, ca, id), Power: truth(sim, id)}
			switch cond {
			case conformance.Stuck:
				_ = sim.SetFault(id, redfishsim.FaultStuck)
			case conformance.Flapping:
				_ = sim.SetFault(id, redfishsim.FaultFlapping)
			case conformance.WrongCredentials:
				d.Target = target(sim, ca, id, "passwd", "wrong-"+password)
			case conformance.UnknownPlug:
				d.Target, d.Power = target(sim, ca, id, "systems-uri", "", "plug", "System.Embedded.99"), nil
			}
			return d
		},
		Timeout:   time.Second,
		OKTimeout: 10 * time.Second,
	})
}

func opID() string { return "test-" + strconv.FormatInt(opSeq.Add(1), 10) }

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestDiscoveryTLSAndFaults(t *testing.T) {
	c := serve(t)
	single, singleCA := startSim(t, 1, 0)
	multi, multiCA := startSim(t, 3, 0)
	st := func(tg *driverv1.Target) (driverv1.PowerState, error) {
		r, err := c.Status(ctx(t), &driverv1.StatusRequest{Target: tg, Timeout: durationpb.New(5 * time.Second)})
		return r.GetState(), err
	}
	cases := []struct {
		name string
		tg   *driverv1.Target
		code codes.Code
	}{
		{"discovered single system", target(single, singleCA, 1, "systems-uri", ""), codes.OK},
		{"several systems, none named", target(multi, multiCA, 1, "systems-uri", ""), codes.InvalidArgument},
		{"several systems, plug names one", target(multi, multiCA, 1, "systems-uri", "", "plug", "2"), codes.OK},
		{"unknown systems_uri", target(multi, multiCA, 9), codes.InvalidArgument},
		{"untrusted certificate (no CA)", target(single, singleCA, 1, "ssl_ca_file", ""), codes.Unauthenticated},
		{"wrong CA", target(single, multiCA, 1), codes.Unauthenticated},
		{"explicit insecure", target(single, singleCA, 1, "ssl_ca_file", "", "ssl_insecure", "1"), codes.OK},
		{"insecure and a CA", target(single, singleCA, 1, "ssl_insecure", "1"), codes.InvalidArgument},
		{"ip as host:port", target(single, singleCA, 1, "ipaddr", "127.0.0.1:"+strconv.Itoa(single.Port()), "ipport", "1"), codes.OK},
		{"session auth", target(single, singleCA, 1, "session_auth", "1"), codes.OK},
		{"session auth, wrong password", target(single, singleCA, 1, "session_auth", "1", "passwd", "nope-nope"), codes.Unauthenticated},
	}
	for _, tc := range cases {
		got, err := st(tc.tg)
		if status.Code(err) != tc.code {
			t.Errorf("%s: %v, %v; want %s", tc.name, got, err, tc.code)
		}
		if err == nil && got != driverv1.PowerState_POWER_STATE_ON {
			t.Errorf("%s: %v; want ON", tc.name, got)
		}
	}
	// A failing Reset is reported with the BMC's message, and the system stays on.
	_ = multi.SetFault(3, redfishsim.FaultResetError)
	_, err := c.PowerOff(ctx(t), &driverv1.PowerOffRequest{OperationId: opID(), Epoch: 1, Target: target(multi, multiCA, 3), Timeout: durationpb.New(5 * time.Second)})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "power controller") {
		t.Fatalf("PowerOff with a failing Reset: %v; want Unavailable quoting the BMC", err)
	}
	// Reboot is ForceOff, verified, then On.
	r, err := c.Reboot(ctx(t), &driverv1.RebootRequest{OperationId: opID(), Epoch: 1, Target: target(multi, multiCA, 1), Timeout: durationpb.New(10 * time.Second)})
	if err != nil || r.GetState() != driverv1.PowerState_POWER_STATE_ON {
		t.Fatalf("Reboot: %v, %v", r, err)
	}
	if got := multi.Resets(1); strings.Join(got, ",") != "ForceOff,On" {
		t.Fatalf("reboot sent %v; want ForceOff then On", got)
	}
	l, err := c.List(ctx(t), &driverv1.ListRequest{Target: target(multi, multiCA, 1)})
	if err != nil || len(l.GetPlugs()) != 3 {
		t.Fatalf("List: %v, %v", l, err)
	}
}

// serve runs the Redfish driver service on 127.0.0.1 over real gRPC and returns a client for it.
func serve(t *testing.T) driverv1.FenceDriverServiceClient {
	t.Helper()
	_, c := kittest.Serve(t, redfish.New(), kit.Options{PollInterval: 20 * time.Millisecond, Log: logger(t)})
	return c
}

func logger(t *testing.T) *slog.Logger { return kittest.Logger(t, slog.LevelInfo) }

// TestCloseLogsOutOfIdleSessions: a Redfish session kept for reuse is deleted on the BMC when the
// driver closes, not left until the BMC times it out.
func TestCloseLogsOutOfIdleSessions(t *testing.T) {
	sim, ca := startSim(t, 1, 0)
	d := redfish.New().(*redfish.Driver)
	_, c := kittest.Serve(t, d, kit.Options{PollInterval: 20 * time.Millisecond, Log: logger(t)})
	if _, err := c.Status(ctx(t), &driverv1.StatusRequest{Target: target(sim, ca, 1, "session_auth", "1")}); err != nil {
		t.Fatal(err)
	}
	if n := sim.Sessions(); n != 1 {
		t.Fatalf("after one Status, %d sessions on the BMC; want 1 (kept for reuse)", n)
	}
	if _, err := c.Status(ctx(t), &driverv1.StatusRequest{Target: target(sim, ca, 1, "session_auth", "1")}); err != nil {
		t.Fatal(err)
	}
	if n := sim.Sessions(); n != 1 {
		t.Fatalf("after a second Status, %d sessions on the BMC; want the first reused", n)
	}
	d.Close()
	if n := sim.Sessions(); n != 0 {
		t.Fatalf("after Close, %d sessions on the BMC; want 0", n)
	}
}
