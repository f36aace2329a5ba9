package ipmisim

import (
	"context"
	"errors"
	"net"
	"os/exec"
	"slices"
	"strconv"
	"testing"
	"time"
)

func startBMC(t *testing.T) *BMC {
	t.Helper()
	b, err := Start(t.TempDir(), 0, "admin", "password")
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := b.Stop(); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	return b
}

func TestStartPowerStop(t *testing.T) {
	b := startBMC(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	if got, err := IpmitoolPower(ctx, b.Port, b.User, b.Password); err != nil || got != "on" {
		t.Fatalf("ipmitool at start = %q, %v; want on", got, err)
	}
	if err := b.SetPower(false); err != nil {
		t.Fatal(err)
	}
	if got, err := IpmitoolPower(ctx, b.Port, b.User, b.Password); err != nil || got != "off" {
		t.Fatalf("ipmitool after SetPower(false) = %q, %v; want off", got, err)
	}
	if on, err := b.Power(); err != nil || on {
		t.Fatalf("Power() = %v, %v; want false", on, err)
	}
	calls, err := b.Calls()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(calls, "get power") {
		t.Errorf("Calls() = %q; want a %q", calls, "get power")
	}

	if err := b.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if bound, err := udpBound("/proc/net/udp", b.Port); err != nil || bound {
		t.Errorf("port %d still bound after Stop (err %v)", b.Port, err)
	}
	if err := b.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

func TestWrongPasswordRejected(t *testing.T) {
	b := startBMC(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if got, err := IpmitoolPower(ctx, b.Port, b.User, "wrong"); err == nil {
		t.Fatalf("ipmitool with a wrong password = %q, want an error", got)
	}
}

func TestFaults(t *testing.T) {
	b := startBMC(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	if err := b.SetFault(FaultFail); err != nil {
		t.Fatal(err)
	}
	if got, err := IpmitoolPower(ctx, b.Port, b.User, b.Password); err == nil {
		t.Errorf("ipmitool with FaultFail = %q, want an error", got)
	}
	if err := b.SetFault(FaultStuck); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, "ipmitool", "-I", "lanplus", "-H", "127.0.0.1", "-p", strconv.Itoa(b.Port),
		"-U", b.User, "-P", b.Password, "-C", "3", "chassis", "power", "off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("ipmitool power off with FaultStuck: %v: %s", err, out)
	}
	if got, err := IpmitoolPower(ctx, b.Port, b.User, b.Password); err != nil || got != "on" {
		t.Errorf("ipmitool after a stuck power off = %q, %v; want on", got, err)
	}
	if err := b.SetFault(FaultNone); err != nil {
		t.Fatal(err)
	}
	if err := b.SetDelay(300 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if got, err := IpmitoolPower(ctx, b.Port, b.User, b.Password); err != nil || got != "on" {
		t.Errorf("ipmitool with a delay = %q, %v; want on", got, err)
	}
	if el := time.Since(start); el < 300*time.Millisecond {
		t.Errorf("status with a 300ms delay took %s", el)
	}
	if err := b.SetDelay(0); err != nil {
		t.Fatal(err)
	}
}

func TestBlackholeNeverAnswers(t *testing.T) {
	port, closer, err := Blackhole()
	if err != nil {
		t.Fatal(err)
	}
	defer closer()
	conn, err := net.Dial("udp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	var nerr net.Error
	if _, err := conn.Read(make([]byte, 16)); !errors.As(err, &nerr) || !nerr.Timeout() {
		t.Errorf("read from the blackhole = %v, want a timeout", err)
	}
}

// TestExternalPower checks that with an external supply a power command waits for the supply:
// the state changes only when the supply completes the request, and the command answers then.
func TestExternalPower(t *testing.T) {
	b := startBMC(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.SetExternalPower(true); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- IpmitoolChassisPower(ctx, b.Port, b.User, b.Password, "off") }()
	var req PowerRequest
	for deadline := time.Now().Add(10 * time.Second); req == RequestNone; time.Sleep(10 * time.Millisecond) {
		var err error
		if req, err = b.PendingPower(); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("no power request within 10 s")
		}
	}
	if req != RequestOff {
		t.Fatalf("request %q, want %q", req, RequestOff)
	}
	if on, err := b.Power(); err != nil || !on {
		t.Fatalf("power before the supply answered = %v, %v; want still on", on, err)
	}
	select {
	case err := <-done:
		t.Fatalf("ipmitool answered before the supply: %v", err)
	default:
	}
	if err := b.CompletePower(false); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got, err := IpmitoolPower(ctx, b.Port, b.User, b.Password); err != nil || got != "off" {
		t.Fatalf("ipmitool after the supply switched off = %q, %v; want off", got, err)
	}
	if req, err := b.PendingPower(); err != nil || req != RequestNone {
		t.Fatalf("pending after completion = %q, %v", req, err)
	}
	if err := b.SetExternalPower(false); err != nil {
		t.Fatal(err)
	}
	if err := IpmitoolChassisPower(ctx, b.Port, b.User, b.Password, "on"); err != nil {
		t.Fatal(err)
	}
	if got, err := IpmitoolPower(ctx, b.Port, b.User, b.Password); err != nil || got != "on" {
		t.Fatalf("ipmitool with the built-in supply again = %q, %v; want on", got, err)
	}
}

func TestPowerOffsCountsTransitions(t *testing.T) {
	for _, tc := range []struct {
		calls []string
		want  int
	}{
		{nil, 0},
		{[]string{"get power", "set power 0", "set power 0", "get power"}, 1},
		{[]string{"set power 0", "set power 1", "set power 0"}, 2},
	} {
		if got := PowerOffs(tc.calls); got != tc.want {
			t.Errorf("PowerOffs(%q) = %d, want %d", tc.calls, got, tc.want)
		}
	}
}
