package fenceagent_test

import (
	"context"
	"fmt"
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
	"github.com/nodefence/nodefence/fence-drivers/fenceagent"
	"github.com/nodefence/nodefence/fence-drivers/kit"
	"github.com/nodefence/nodefence/fence-drivers/kit/kittest"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
	"github.com/nodefence/nodefence/testbed/ipmisim"
)

var opSeq atomic.Int64

func opID() string { return fmt.Sprintf("op-%d-%d", time.Now().UnixNano(), opSeq.Add(1)) }

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestFenceDummy drives fence_dummy (type=file): the status file is the true state.
func TestFenceDummy(t *testing.T) {
	// fence_dummy keeps its state in a file: only an administrator may allow that parameter.
	c := serve(t, fenceagent.NewWith(fenceagent.Config{ExtraParameters: []string{"type", "status_file"}}))
	ctx := testCtx(t, 60*time.Second)
	file := filepath.Join(t.TempDir(), "status")
	if err := os.WriteFile(file, []byte("on"), 0o644); err != nil {
		t.Fatal(err)
	}
	tg := &driverv1.Target{Name: "dummy", Parameters: map[string]string{"agent": "fence_dummy", "type": "file", "status-file": file}}
	truth := func(want string) {
		t.Helper()
		got, err := os.ReadFile(file)
		if err != nil || strings.TrimSpace(string(got)) != want {
			t.Fatalf("status file = %q, %v; want %q", got, err, want)
		}
	}
	for range 2 {
		if _, err := c.PowerOff(ctx, &driverv1.PowerOffRequest{OperationId: opID(), Epoch: 1, Target: tg}); err != nil {
			t.Fatalf("PowerOff: %v", err)
		}
		truth("off")
	}
	st, err := c.Status(ctx, &driverv1.StatusRequest{Target: tg})
	if err != nil || st.GetState() != driverv1.PowerState_POWER_STATE_OFF {
		t.Fatalf("Status = %v, %v; want OFF (exit 2)", st, err)
	}
	if _, err := c.PowerOn(ctx, &driverv1.PowerOnRequest{OperationId: opID(), Epoch: 2, Target: tg}); err != nil {
		t.Fatalf("PowerOn: %v", err)
	}
	truth("on")
	_, err = c.PowerOff(ctx, &driverv1.PowerOffRequest{OperationId: opID(), Epoch: 1, Target: tg})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("stale epoch: %v", err)
	}
	truth("on")

	// A status file that says neither on nor off: the agent fails, never "off".
	if err := os.WriteFile(file, []byte("bogus"), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err = c.Status(ctx, &driverv1.StatusRequest{Target: tg})
	if err == nil || st.GetState() == driverv1.PowerState_POWER_STATE_OFF {
		t.Fatalf("Status of a bogus file = %v, %v; want an error", st, err)
	}
	t.Logf("bogus status: %v", err)

	// The runner's own deadline kills the agent's process group.
	slow := &driverv1.Target{Parameters: map[string]string{"agent": "fence_dummy", "type": "file", "status_file": file, "delay": "30"}}
	if err := os.WriteFile(file, []byte("on"), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = c.PowerOff(ctx, &driverv1.PowerOffRequest{OperationId: opID(), Epoch: 3, Target: slow, Timeout: durationpb.New(time.Second)})
	if status.Code(err) != codes.DeadlineExceeded || time.Since(start) > 1500*time.Millisecond {
		t.Fatalf("PowerOff with delay=30 and a 1s timeout: %v after %s", err, time.Since(start))
	}
	truth("on")

	for name, params := range map[string]map[string]string{
		"unknown parameter": {"agent": "fence_dummy", "colour": "blue"},
		"unknown agent":     {"agent": "fence_nonexistent"},
		"bad agent name":    {"agent": "../bin/sh"},
		"no agent":          {"type": "file"},
		"bad select":        {"agent": "fence_ipmilan", "ip": "127.0.0.1", "auth": "rot13"},
		"shell in a value":  {"agent": "fence_ipmilan", "ip": "127.0.0.1; reboot"},
	} {
		_, err := c.Status(ctx, &driverv1.StatusRequest{Target: &driverv1.Target{Parameters: params}})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v; want InvalidArgument", name, err)
		}
	}

	d, err := serve(t, fenceagent.NewWith(fenceagent.Config{Agent: "fence_ipmilan"})).Describe(ctx, &driverv1.DescribeRequest{})
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*driverv1.Parameter{}
	for _, p := range d.GetParameters() {
		byName[p.GetName()] = p
	}
	if p := byName["ip"]; p == nil || !strings.Contains(strings.Join(p.GetAliases(), ","), "ipaddr") {
		t.Errorf("Describe of fence_ipmilan: ip = %v; want alias ipaddr", p)
	}
	if p := byName["password"]; p == nil || !p.GetSecret() {
		t.Errorf("Describe of fence_ipmilan: password = %v; want secret", p)
	}
}

// TestConformanceFenceIPMILAN runs the conformance suite with fence_ipmilan against ipmi_sim.
func TestConformanceFenceIPMILAN(t *testing.T) {
	c := serve(t, fenceagent.New())
	target := func(port int, extra ...string) *driverv1.Target {
		p := map[string]string{"agent": "fence_ipmilan", "ip": "127.0.0.1", "ipport": strconv.Itoa(port), "username": "admin",
			"password": "password", "lanplus": "1", "cipher": "3", "power_wait": "0"}
		for i := 0; i+1 < len(extra); i += 2 {
			p[extra[i]] = extra[i+1]
		}
		return &driverv1.Target{Name: "node-" + strconv.Itoa(port), Parameters: p}
	}
	conformance.Run(t, conformance.Harness{
		Client: c,
		NewDevice: func(t *testing.T, cond conformance.Condition) conformance.Device {
			switch cond {
			case conformance.Hanging:
				port, closeHole, err := ipmisim.Blackhole()
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(closeHole)
				return conformance.Device{Target: target(port)}
			case conformance.UnknownPlug:
				t.Skip("fence_ipmilan has no plugs to list")
			}
			b, err := ipmisim.Start(t.TempDir(), 0, "admin", "password")
			if err != nil {
				t.Fatalf("ipmisim.Start: %v", err)
			}
			t.Cleanup(func() { _ = b.Stop() })
			d := conformance.Device{Target: target(b.Port), Power: func(ctx context.Context) (driverv1.PowerState, error) {
				got, err := ipmisim.IpmitoolPower(ctx, b.Port, b.User, b.Password)
				if err != nil {
					return driverv1.PowerState_POWER_STATE_UNKNOWN, err
				}
				if got == "off" {
					return driverv1.PowerState_POWER_STATE_OFF, nil
				}
				return driverv1.PowerState_POWER_STATE_ON, nil
			}}
			switch cond {
			case conformance.Stuck:
				if err := b.SetFault(ipmisim.FaultStuck); err != nil {
					t.Fatal(err)
				}
			case conformance.Flapping:
				if err := b.SetFault(ipmisim.FaultFlap); err != nil {
					t.Fatal(err)
				}
				d.Power = nil
			case conformance.WrongCredentials:
				d.Target = target(b.Port, "password", "Wr0ng-passw0rd")
			}
			return d
		},
		Timeout:   2 * time.Second,
		OKTimeout: 20 * time.Second,
		Slack:     700 * time.Millisecond,
		// fence_ipmilan says "Unable to obtain correct plug status or plug is not available"
		// for a wrong password too: the runner cannot know it was the credentials.
		CredentialCodes: []codes.Code{codes.Unauthenticated, codes.Unavailable},
	})
}

func serve(t *testing.T, d kit.Driver) driverv1.FenceDriverServiceClient {
	t.Helper()
	_, c := kittest.Serve(t, d, kit.Options{DefaultTimeout: 20 * time.Second})
	return c
}

// Describe for a target describes the agent the target names, from its metadata XML; an unknown
// agent is refused, never described as something else.
func TestDescribeTheNamedAgent(t *testing.T) {
	c := serve(t, fenceagent.New())
	ctx := testCtx(t, 20*time.Second)
	resp, err := c.Describe(ctx, &driverv1.DescribeRequest{Target: &driverv1.Target{Parameters: map[string]string{"agent": "fence_dummy"}}})
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, p := range resp.Parameters {
		names[p.Name] = true
	}
	if !names["agent"] || !names["type"] || !strings.HasPrefix(resp.Description, "fence_dummy") {
		t.Fatalf("Describe(fence_dummy) = %q %v", resp.Description, names)
	}
	if _, err := c.Describe(ctx, &driverv1.DescribeRequest{Target: &driverv1.Target{Parameters: map[string]string{"agent": "fence_nosuch"}}}); err == nil {
		t.Fatal("Describe of a missing agent succeeded")
	}
	if _, err := c.Describe(ctx, &driverv1.DescribeRequest{Target: &driverv1.Target{}}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Describe without an agent: %v, want InvalidArgument", err)
	}
}

// A target cannot make the runner execute a program of its choosing: with fence_ipmilan's own
// ipmitool_path (or any *_path, *_script, sudo, debug_file, ssh_options), even on a read-only
// Status, the call is refused and the program never runs. Before the allowlist this ran the
// script as the driver's user (root in production).
func TestNoParameterRunsAProgram(t *testing.T) {
	c := serve(t, fenceagent.New())
	ctx := testCtx(t, 30*time.Second)
	dir := t.TempDir()
	marker := filepath.Join(dir, "pwned")
	script := filepath.Join(dir, "evil.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\ntouch "+marker+"\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	base := map[string]string{"agent": "fence_ipmilan", "ip": "127.0.0.1", "ipport": "1", "username": "admin", "password": "x", "lanplus": "1"}
	for _, attack := range [][2]string{
		{"ipmitool_path", script}, {"ipmitool-path", script}, {"sudo_path", script}, {"use_sudo", "1"},
		{"password_script", script}, {"passwd_script", script}, {"debug_file", marker}, {"verbose", "1"},
		{"ip", "127.0.0.1;" + script}, {"ip", "$(" + script + ")"}, {"username", "`" + script + "`"},
	} {
		params := map[string]string{}
		for k, v := range base {
			params[k] = v
		}
		params[attack[0]] = attack[1]
		tg := &driverv1.Target{Name: "n1", Parameters: params}
		_, err := c.Status(ctx, &driverv1.StatusRequest{Target: tg, Timeout: durationpb.New(10 * time.Second)})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("Status with %s=%q: %v, want InvalidArgument", attack[0], attack[1], err)
		}
		_, err = c.PowerOff(ctx, &driverv1.PowerOffRequest{OperationId: opID(), Epoch: 1, Target: tg, Timeout: durationpb.New(10 * time.Second)})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("PowerOff with %s=%q: %v, want InvalidArgument", attack[0], attack[1], err)
		}
		if _, err := os.Stat(marker); err == nil {
			t.Fatalf("%s=%q: the script ran", attack[0], attack[1])
		}
	}
	// An administrator cannot allow a program-naming parameter either.
	c = serve(t, fenceagent.NewWith(fenceagent.Config{ExtraParameters: []string{"ipmitool_path"}}))
	params := map[string]string{"ipmitool_path": script}
	for k, v := range base {
		params[k] = v
	}
	if _, err := c.Status(ctx, &driverv1.StatusRequest{Target: &driverv1.Target{Parameters: params}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("Status with an administrator-allowed ipmitool_path: %v, want InvalidArgument", err)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the script ran")
	}
}
