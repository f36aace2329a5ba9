package aws_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/nodefence/nodefence/fence-drivers/aws"
	"github.com/nodefence/nodefence/fence-drivers/conformance"
	"github.com/nodefence/nodefence/fence-drivers/kit"
	"github.com/nodefence/nodefence/fence-drivers/kit/kittest"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
	"github.com/nodefence/nodefence/testbed/ec2sim"
)

const (
	accessKey = "AKIAIOSFODNN7EXAMPLE"
	secretKey = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
)

func startSim(t *testing.T, transition time.Duration) *ec2sim.Sim {
	t.Helper()
	sim, err := ec2sim.Start(ec2sim.Config{Region: "eu-central-1", AccessKey: accessKey, SecretKey: secretKey, Transition: transition})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	return sim
}

func target(sim *ec2sim.Sim, id string, extra ...string) *driverv1.Target {
	p := map[string]string{"port": id, "region": sim.Region(), "access_key": accessKey, "secret_key": secretKey, "endpoint_url": sim.Endpoint()}
	for i := 0; i+1 < len(extra); i += 2 {
		if extra[i+1] == "" {
			delete(p, extra[i])
		} else {
			p[extra[i]] = extra[i+1]
		}
	}
	return &driverv1.Target{Name: id, Parameters: p}
}

func truth(sim *ec2sim.Sim, id string) func(context.Context) (driverv1.PowerState, error) {
	return func(context.Context) (driverv1.PowerState, error) {
		s, err := sim.State(id)
		switch {
		case err != nil:
			return driverv1.PowerState_POWER_STATE_UNKNOWN, err
		case s == "running":
			return driverv1.PowerState_POWER_STATE_ON, nil
		case s == "stopped":
			return driverv1.PowerState_POWER_STATE_OFF, nil
		}
		return driverv1.PowerState_POWER_STATE_UNKNOWN, nil
	}
}

// TestConformance runs the suite against the EC2 endpoint, with stopping and pending lasting
// 200 ms.
func TestConformance(t *testing.T) {
	c := serve(t)
	sim := startSim(t, 200*time.Millisecond)
	hung := startSim(t, 0)
	hungID := hung.AddInstance("hung")
	hung.SetHang(true)
	conformance.Run(t, conformance.Harness{
		Client: c,
		NewDevice: func(t *testing.T, cond conformance.Condition) conformance.Device {
			if cond == conformance.Hanging {
				return conformance.Device{Target: target(hung, hungID)}
			}
			id := sim.AddInstance(t.Name())
			d := conformance.Device{Target: target(sim, id), Power: truth(sim, id)}
			switch cond {
			case conformance.Stuck:
				_ = sim.SetFault(id, ec2sim.FaultStuck)
			case conformance.Flapping:
				_ = sim.SetFault(id, ec2sim.FaultFlapping)
			case conformance.WrongCredentials:
				d.Target = target(sim, id, "secret_key", "not-the-"+secretKey)
			case conformance.UnknownPlug:
				d.Target, d.Power = target(sim, "i-0123456789abcdef0"), nil
			}
			return d
		},
		Timeout:   time.Second,
		OKTimeout: 10 * time.Second,
	})
}

func TestWireAndErrors(t *testing.T) {
	c := serve(t)
	sim := startSim(t, 100*time.Millisecond)
	id := sim.AddInstance("node-a")
	other := sim.AddInstance("node-b")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.PowerOff(ctx, &driverv1.PowerOffRequest{OperationId: "off-1", Epoch: 1, Target: target(sim, id)}); err != nil {
		t.Fatal(err)
	}
	if got := sim.Calls(); !containsPrefix(got, "StopInstances "+id+" Force=true") {
		t.Fatalf("calls %q; want a forced StopInstances", got)
	}
	l, err := c.List(ctx, &driverv1.ListRequest{Target: target(sim, id)})
	if err != nil || len(l.GetPlugs()) != 2 {
		t.Fatalf("List: %v, %v", l, err)
	}
	for _, p := range l.GetPlugs() {
		want := map[string]driverv1.PowerState{id: driverv1.PowerState_POWER_STATE_OFF, other: driverv1.PowerState_POWER_STATE_ON}[p.GetId()]
		if p.GetState() != want {
			t.Fatalf("List: %s is %v, want %v", p.GetId(), p.GetState(), want)
		}
	}
	l, err = c.List(ctx, &driverv1.ListRequest{Target: target(sim, id, "filter", "tag:Name=node-b")})
	if err != nil || len(l.GetPlugs()) != 1 || l.GetPlugs()[0].GetName() != "node-b" {
		t.Fatalf("List with a filter: %v, %v", l, err)
	}
	cases := []struct {
		name string
		tg   *driverv1.Target
		code codes.Code
	}{
		{"wrong region", target(sim, id, "region", "us-east-1"), codes.Unauthenticated},
		{"unknown access key", target(sim, id, "access_key", "AKIAOTHEROTHEROTHER1"), codes.Unauthenticated},
		{"malformed instance id", target(sim, "i-xyz"), codes.InvalidArgument},
		{"secret without key", target(sim, id, "access_key", ""), codes.InvalidArgument},
		{"bad endpoint", target(sim, id, "endpoint_url", "ftp://x"), codes.InvalidArgument},
		{"unreachable endpoint", target(sim, id, "endpoint_url", "http://127.0.0.1:1"), codes.Unavailable},
	}
	for _, tc := range cases {
		_, err := c.Status(ctx, &driverv1.StatusRequest{Target: tc.tg, Timeout: durationpb.New(5 * time.Second)})
		if status.Code(err) != tc.code {
			t.Errorf("%s: %v; want %s", tc.name, err, tc.code)
		}
	}
	_ = sim.SetFault(other, ec2sim.FaultAPIError)
	_, err = c.PowerOff(ctx, &driverv1.PowerOffRequest{OperationId: "off-2", Epoch: 1, Target: target(sim, other)})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "IncorrectInstanceState") {
		t.Fatalf("PowerOff with an API error: %v; want Unavailable with the EC2 code", err)
	}
}

func containsPrefix(l []string, p string) bool {
	for _, s := range l {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// serve runs the EC2 driver service on 127.0.0.1 over real gRPC and returns a client for it.
func serve(t *testing.T) driverv1.FenceDriverServiceClient {
	t.Helper()
	// The SDK must not find other credentials or configuration on this machine.
	t.Setenv("AWS_CONFIG_FILE", "/dev/null")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	_, c := kittest.Serve(t, aws.New(), kit.Options{PollInterval: 20 * time.Millisecond, Log: logger(t)})
	return c
}

func logger(t *testing.T) *slog.Logger { return kittest.Logger(t, slog.LevelInfo) }
