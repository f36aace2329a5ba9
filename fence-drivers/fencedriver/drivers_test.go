package fencedriver

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
	"github.com/nodefence/nodefence/testbed/brocadesim"
)

// TestDriversByName checks that every --driver name serves the driver of that name.
func TestDriversByName(t *testing.T) {
	cfg := Config{StateDir: t.TempDir()}
	for name, mk := range drivers {
		if got := mk(&cfg, slog.Default()).Name(); got != name {
			t.Errorf("--driver %s serves driver %q", name, got)
		}
	}
}

// TestRunBrocadeAcceptNew serves --driver brocade and fences a simulated switch port over SSH
// with no pinned key: the switch's key is recorded in <state-dir>/known_hosts on first use.
func TestRunBrocadeAcceptNew(t *testing.T) {
	sw, err := brocadesim.Start(brocadesim.Config{Ports: 4, User: "admin", Password: "fibranne"})
	if err != nil {
		t.Fatal(err)
	}
	defer sw.Close()
	state := t.TempDir()
	srv := startRun(t, "--driver", "brocade", "--state-dir", state, "--insecure", "--unauthenticated-caller", "spiffe://nodefence/coordinator/test", "--listen", "127.0.0.1:0")
	conn, done, stderr := srv.conn, srv.done, srv.stderr
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tg := &driverv1.Target{Name: "n2", Parameters: map[string]string{"ip": "127.0.0.1", "ipport": strconv.Itoa(sw.SSHPort()),
		"ssh": "1", "username": "admin", "password": "fibranne", "plug": "2"}}
	r, err := driverv1.NewFenceDriverServiceClient(conn).PowerOff(ctx, &driverv1.PowerOffRequest{OperationId: "run-off", Epoch: 1, Target: tg})
	if err != nil || r.GetState() != driverv1.PowerState_POWER_STATE_OFF {
		t.Fatalf("PowerOff = %v, %v", r, err)
	}
	if d, _ := sw.Disabled(2); !d {
		t.Fatal("port 2 still enabled")
	}
	if kh, err := os.ReadFile(filepath.Join(state, "known_hosts")); err != nil || !strings.Contains(string(kh), "ssh-ed25519") {
		t.Fatalf("known_hosts = %q, %v; want the switch's key", kh, err)
	}
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("run after SIGTERM = %d; stderr:\n%s", code, stderr.String())
		}
	case <-ctx.Done():
		t.Fatal("run did not return after SIGTERM")
	}
}
