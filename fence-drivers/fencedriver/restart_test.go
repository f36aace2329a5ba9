package fencedriver

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodefence/nodefence/services/dial"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/testbed/ipmisim"
	"github.com/nodefence/nodefence/testbed/pki"

	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
)

// childArgs, when set in the environment, makes the test binary run the fence-driver's main with
// these arguments (separated by \x1f): a real driver process for restart tests.
const childArgs = "NODEFENCE_FENCE_DRIVER_CHILD_ARGS"

func TestMain(m *testing.M) {
	if a := os.Getenv(childArgs); a != "" {
		os.Exit(run(strings.Split(a, "\x1f"), os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// startProcess runs the fence-driver in its own process and returns it and its address.
func startProcess(t *testing.T, args ...string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childArgs+"="+strings.Join(args, "\x1f"))
	cmd.Stderr = t.Output()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if _, a, ok := strings.Cut(sc.Text(), " serving on "); ok {
				addr <- strings.TrimSpace(a)
			}
		}
	}()
	select {
	case a := <-addr:
		return cmd, a
	case <-time.After(20 * time.Second):
		t.Fatal("driver process not serving after 20s")
		return nil, ""
	}
}

// A PowerOff is answered, the driver process is killed (kill -9) and restarted on the same state
// directory, and the same operation id is sent again, as a new leader resends an operation it
// found unanswered: the restarted driver answers from its persisted record and the BMC is switched
// off exactly once. (The BMC is switched back on by hand before the resend, so an operation that
// ran again would be seen.)
func TestOperationIDSurvivesRestart(t *testing.T) {
	bmc, err := ipmisim.Start(filepath.Join(t.TempDir(), "bmc"), 0, "admin", "password")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bmc.Stop() })
	state := t.TempDir()
	ca, err := pki.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	server, err := ca.Files(identity.Driver, "ipmi")
	if err != nil {
		t.Fatal(err)
	}
	coordinator, err := ca.Files(identity.Coordinator, "c1")
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"--driver", "ipmi", "--state-dir", state, "--listen", "127.0.0.1:0"}, pki.Args("", server)...)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tg := &driverv1.Target{Name: "n1", Parameters: map[string]string{"ip": "127.0.0.1", "ipport": strconv.Itoa(bmc.Port),
		"lanplus": "1", "cipher": "3", "username": "admin", "password": "password"}}
	req := &driverv1.PowerOffRequest{OperationId: "fence-n1/0/power_management/bmc/off", Epoch: 7, Target: tg}
	call := func(addr string) *driverv1.PowerOffResponse {
		t.Helper()
		conn, err := dial.New(addr, coordinator)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		r, err := driverv1.NewFenceDriverServiceClient(conn).PowerOff(ctx, req)
		if err != nil || r.GetState() != driverv1.PowerState_POWER_STATE_OFF {
			t.Fatalf("PowerOff = %v, %v", r, err)
		}
		return r
	}
	offs := func() int {
		calls, err := bmc.Calls()
		if err != nil {
			t.Fatal(err)
		}
		return len(slices.DeleteFunc(calls, func(c string) bool { return c != "set power 0" }))
	}

	first, addr := startProcess(t, args...)
	r1 := call(addr)
	if n := offs(); n != 1 {
		t.Fatalf("%d power-offs after the first call", n)
	}
	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	first.Wait()
	if err := bmc.SetPower(true); err != nil {
		t.Fatal(err)
	}

	_, addr = startProcess(t, args...)
	r2 := call(addr)
	if n := offs(); n != 1 {
		t.Fatalf("%d power-offs after a resend to the restarted driver; want exactly 1", n)
	}
	if r2.GetConfirmedAt().AsTime() != r1.GetConfirmedAt().AsTime() {
		t.Fatalf("resend answered %v, first answer %v: want the first answer", r2, r1)
	}
	// A new operation id acts.
	req.OperationId = "fence-n1/1/power_management/bmc/off"
	call(addr)
	if n := offs(); n != 2 {
		t.Fatalf("%d power-offs after a new operation; want 2", n)
	}
}
