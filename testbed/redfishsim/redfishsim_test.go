package redfishsim_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodefence/nodefence/testbed/redfishsim"
)

const (
	user     = "root"
	password = "calvin-redfish"
)

// fenceRedfish runs the real ClusterLabs agent and returns its exit code and output.
func fenceRedfish(t *testing.T, args ...string) (int, string) {
	t.Helper()
	return fenceRedfishWithin(t, 60*time.Second, args...)
}

// fenceRedfishWithin is fenceRedfish killed after d (exit code -1).
func fenceRedfishWithin(t *testing.T, d time.Duration, args ...string) (int, string) {
	t.Helper()
	if _, err := exec.LookPath("fence_redfish"); err != nil {
		t.Fatalf("fence_redfish is not installed (Debian fence-agents): %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	cmd := exec.CommandContext(ctx, "fence_redfish", args...)
	cmd.Env = []string{"LANG=C", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return ee.ExitCode(), string(out)
	case err != nil:
		t.Fatalf("fence_redfish %v: %v", args, err)
	}
	return 0, string(out)
}

// TestFenceRedfish drives the simulator with the real fence_redfish: discovery (it takes the last
// system), a configured systems_uri, status, off, on and reboot, and the failure hooks.
func TestFenceRedfish(t *testing.T) {
	sim, err := redfishsim.Start(redfishsim.Config{Systems: 3, User: user, Password: password, Transition: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	base := []string{"--ip=127.0.0.1", "--ipport=" + strconv.Itoa(sim.Port()), "--username=" + user, "--password=" + password,
		"--ssl-insecure", "--power-timeout=5"}
	run := func(extra ...string) (int, string) { return fenceRedfish(t, append(slices.Clone(base), extra...)...) }
	want := func(code int, out string, extra ...string) {
		t.Helper()
		got, text := run(extra...)
		if got != code || !strings.Contains(text, out) {
			t.Fatalf("fence_redfish %v: exit %d, %q; want exit %d with %q", extra, got, text, code, out)
		}
	}
	// Discovery: the last member of /redfish/v1/Systems.
	want(0, "Status: ON", "--action=status")
	want(0, "Success: Powered OFF", "--action=off")
	if on, _ := sim.On(3); on {
		t.Fatal("system 3 still on after fence_redfish off")
	}
	want(2, "Status: OFF", "--action=status")
	want(0, "Success: Powered ON", "--action=on")
	// fence_redfish counts PoweringOn as on: it returns before the transition ends.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if on, _ := sim.On(3); on {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("system 3 never came on after fence_redfish on")
		}
	}
	// A configured system.
	one := "--systems-uri=" + redfishsim.SystemURI(1)
	want(0, "Success: Rebooted", "--action=reboot", one)
	if got := sim.Resets(1); !slices.Equal(got, []string{"ForceOff", "On"}) {
		t.Fatalf("reboot sent %v; want ForceOff then On", got)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if on, _ := sim.On(1); on {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("system 1 never came back on after reboot")
		}
	}
	if on, _ := sim.On(2); !on {
		t.Fatal("system 2 touched")
	}
	// Failures.
	if code, out := fenceRedfish(t, "--ip=127.0.0.1", "--ipport="+strconv.Itoa(sim.Port()), "--username="+user,
		"--password=wrong", "--ssl-insecure", "--action=status"); code != 1 {
		t.Fatalf("wrong password: exit %d, %q", code, out)
	}
	if code, out := run("--action=status", "--systems-uri=/redfish/v1/Systems/9"); code != 1 {
		t.Fatalf("unknown system: exit %d, %q", code, out)
	}
	if err := sim.SetFault(2, redfishsim.FaultStuck); err != nil {
		t.Fatal(err)
	}
	if code, out := run("--action=off", "--systems-uri="+redfishsim.SystemURI(2), "--power-timeout=2"); code != 1 || !strings.Contains(out, "Timed out") {
		t.Fatalf("stuck system: exit %d, %q", code, out)
	}
	// fence_redfish does not check the POST status: a failing Reset shows only as a timeout.
	if err := sim.SetFault(2, redfishsim.FaultResetError); err != nil {
		t.Fatal(err)
	}
	if code, out := run("--action=off", "--systems-uri="+redfishsim.SystemURI(2), "--power-timeout=2"); code != 1 {
		t.Fatalf("reset error: exit %d, %q", code, out)
	}
	if on, _ := sim.On(2); !on {
		t.Fatal("faulty system 2 turned off")
	}
	// fence_redfish has no timeout on a service that accepts and never answers: it is killed.
	sim.SetHang(true)
	if code, out := fenceRedfishWithin(t, 3*time.Second, append(slices.Clone(base), "--action=status")...); code == 0 {
		t.Fatalf("hanging service: exit %d, %q", code, out)
	}
}

// TestCAAndDefaults checks that the service's certificate verifies with its CA (fence_redfish
// without --ssl-insecure, through the system trust store, is not possible here) and that a
// service without credentials refuses everyone.
func TestCAAndDefaults(t *testing.T) {
	sim, err := redfishsim.Start(redfishsim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	resp, err := sim.Client().Get(sim.URL() + "/redfish/v1/Systems")
	if err != nil {
		t.Fatalf("GET with the CA: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Fatalf("unauthenticated GET of Systems: %d; want 401", resp.StatusCode)
	}
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, sim.CAPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out := fenceRedfish(t, "--ip=127.0.0.1", "--ipport="+strconv.Itoa(sim.Port()), "--username=root",
		"--password=calvin", "--ssl-insecure", "--action=status"); code != 1 {
		t.Fatalf("status on a service without credentials: exit %d, %q", code, out)
	}
}
