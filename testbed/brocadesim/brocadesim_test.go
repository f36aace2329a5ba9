package brocadesim_test

import (
	"context"
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodefence/nodefence/testbed/brocadesim"
)

const (
	user     = "admin"
	password = "fibranne"
)

func start(t *testing.T, ports int) *brocadesim.Switch {
	t.Helper()
	sw, err := brocadesim.Start(brocadesim.Config{Ports: ports, User: user, Password: password})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sw.Close() })
	return sw
}

// fenceBrocade runs the real ClusterLabs agent and returns its exit code and output.
func fenceBrocade(t *testing.T, args ...string) (int, string) {
	t.Helper()
	if _, err := exec.LookPath("fence_brocade"); err != nil {
		t.Fatalf("fence_brocade is not installed (Debian fence-agents): %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "fence_brocade", args...)
	cmd.Env = []string{"LANG=C", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + t.TempDir()}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return ee.ExitCode(), string(out)
	case err != nil:
		t.Fatalf("fence_brocade %v: %v", args, err)
	}
	return 0, string(out)
}

// transports are fence_brocade's arguments for each way in.
func transports(sw *brocadesim.Switch) map[string][]string {
	return map[string][]string{
		"telnet": {"--ip=127.0.0.1", "--ipport=" + strconv.Itoa(sw.TelnetPort())},
		"ssh": {"--ip=127.0.0.1", "--ipport=" + strconv.Itoa(sw.SSHPort()), "--ssh",
			"--ssh-options=-o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=no -o LogLevel=ERROR"},
	}
}

// TestFenceBrocade drives the simulator with the real fence_brocade over telnet and SSH: the
// simulator is faithful when the reference agent reads and changes its ports correctly.
func TestFenceBrocade(t *testing.T) {
	if _, err := exec.LookPath("telnet"); err != nil {
		t.Fatalf("fence_brocade needs /usr/bin/telnet (Debian telnet): %v", err)
	}
	sw := start(t, 8)
	for name, base := range transports(sw) {
		t.Run(name, func(t *testing.T) {
			plug := 3
			if name == "ssh" {
				plug = 5
			}
			args := func(action string, extra ...string) []string {
				a := append([]string{}, base...)
				a = append(a, "--username="+user, "--password="+password, "--plug="+strconv.Itoa(plug), "--action="+action)
				return append(a, extra...)
			}
			want := func(action string, code int, out string) {
				t.Helper()
				got, text := fenceBrocade(t, args(action)...)
				if got != code || !strings.Contains(text, out) {
					t.Fatalf("fence_brocade %s: exit %d, output %q; want exit %d with %q", action, got, text, code, out)
				}
			}
			want("status", 0, "Status: ON")
			want("off", 0, "Success: Powered OFF")
			if d, _ := sw.Disabled(plug); !d {
				t.Fatalf("port %d still enabled after fence_brocade off", plug)
			}
			want("status", 2, "Status: OFF")
			want("off", 0, "Success: Already OFF")
			want("on", 0, "Success: Powered ON")
			if d, _ := sw.Disabled(plug); d {
				t.Fatalf("port %d still disabled after fence_brocade on", plug)
			}
			want("status", 0, "Status: ON")

			code, out := fenceBrocade(t, args("list")...)
			if code != 0 {
				t.Fatalf("list: exit %d: %s", code, out)
			}
			for i := range 8 {
				if !strings.Contains(out, strconv.Itoa(i)+",") {
					t.Fatalf("list lacks port %d: %q", i, out)
				}
			}
			code, out = fenceBrocade(t, append(args("status")[:len(base)], "--username="+user, "--password=wrong", "--plug=1", "--action=status")...)
			if code != 1 || !strings.Contains(out, "Unable to connect/login") {
				t.Fatalf("wrong password: exit %d, output %q; want 1 with a login failure", code, out)
			}
		})
	}
	cmds := strings.Join(sw.Commands(), "\n")
	for _, c := range []string{"switchshow", "portCfgPersistentDisable 3", "portCfgPersistentEnable 5"} {
		if !strings.Contains(cmds, c) {
			t.Errorf("the switch never received %q; got:\n%s", c, cmds)
		}
	}
}

// TestFenceBrocadeFaults checks the failure hooks through the reference agent.
func TestFenceBrocadeFaults(t *testing.T) {
	sw := start(t, 4)
	base := transports(sw)["telnet"]
	run := func(plug int, action string, extra ...string) (int, string) {
		a := append(append([]string{}, base...), "--username="+user, "--password="+password,
			"--plug="+strconv.Itoa(plug), "--action="+action, "--power-timeout=2")
		return fenceBrocade(t, append(a, extra...)...)
	}
	t.Run("stuck", func(t *testing.T) {
		if err := sw.SetFault(1, brocadesim.FaultStuck); err != nil {
			t.Fatal(err)
		}
		if code, out := run(1, "off"); code != 1 || !strings.Contains(out, "Timed out waiting to power OFF") {
			t.Fatalf("off of a stuck port: exit %d, %q", code, out)
		}
		if d, _ := sw.Disabled(1); d {
			t.Fatal("stuck port disabled")
		}
	})
	t.Run("command error", func(t *testing.T) {
		if err := sw.SetFault(2, brocadesim.FaultCommandError); err != nil {
			t.Fatal(err)
		}
		if code, out := run(2, "off"); code != 1 {
			t.Fatalf("off with a command error: exit %d, %q", code, out)
		}
	})
	t.Run("hang", func(t *testing.T) {
		sw.SetHang(true)
		defer sw.SetHang(false)
		start := time.Now()
		if code, out := run(0, "status", "--login-timeout=1"); code != 1 {
			t.Fatalf("status of a hanging switch: exit %d, %q", code, out)
		}
		t.Logf("hanging switch: failed after %s", time.Since(start).Round(time.Millisecond))
	})
}

// TestDefaultsFail checks that a switch without credentials refuses logins.
func TestDefaultsFail(t *testing.T) {
	sw, err := brocadesim.Start(brocadesim.Config{Ports: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer sw.Close()
	code, out := fenceBrocade(t, "--ip=127.0.0.1", "--ipport="+strconv.Itoa(sw.TelnetPort()), "--username=admin",
		"--password=password", "--plug=1", "--action=status")
	if code != 1 {
		t.Fatalf("status on a switch without credentials: exit %d, %q", code, out)
	}
}
