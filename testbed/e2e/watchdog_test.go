package e2e

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodefence/nodefence/coordinator/app"
	"github.com/nodefence/nodefence/node-agent/nodeagent"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/testbed/pki"
	"github.com/nodefence/nodefence/testbed/syncbuf"
	"github.com/nodefence/nodefence/testbed/wait"
	"github.com/nodefence/nodefence/testbed/watchdogsim"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// TestAgentWatchdogArmedAndCleanStop runs the node-agent program with --watchdog-device on the
// testbed's watchdog stand-in against a real coordinator over mutual TLS (issue 24, item 1): the
// agent arms and feeds the device and reports it in its hello, the coordinator shows the node's
// watchdog armed with its timeout; a clean stop reports "disarmed", which the coordinator shows, then
// writes the magic close: the device is disarmed and never resets the node. A device that cannot be
// armed keeps the agent from starting.
func TestAgentWatchdogArmedAndCleanStop(t *testing.T) {
	n := node{name: "wd-1", password: "password", bmc: startBMC(t, "wd-1"), addr: "127.0.0.1"}
	driver := startDriver(t, t.TempDir())
	coord := startCoordinator(t, app.Config{FenceConfig: writeConfig(t, driver, []node{n})})
	cc := conn(t, coord.app.Addr())
	leaderReady(t, cc)

	var resets atomic.Int32
	sim, err := watchdogsim.Start(filepath.Join(t.TempDir(), "watchdog"), 2*time.Second, func() { resets.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Stop()
	boot := filepath.Join(t.TempDir(), "boot_id")
	if err := os.WriteFile(boot, []byte("boot-wd-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := append(pki.Args("", tlsAs(t, identity.Agent, n.name)),
		"--coordinator="+coord.app.Addr(), "--node-name="+n.name, "--zone=a", "--boot-id-file="+boot,
		"--proc-root=../../node-agent/signals/testdata/proc", "--cgroup-root=../../node-agent/signals/testdata/v1", "--cgroup-version=1",
		"--nodefs-path=", "--container-runtime-endpoint=", "--shutdown-grace-period=0s",
		"--watchdog-device="+sim.Path, "--watchdog-timeout=3s")

	// A device that cannot be armed: the agent does not start.
	var refused syncbuf.Buffer
	if code := nodeagent.Main(context.Background(), append(append([]string(nil), args...), "--watchdog-device="+filepath.Join(t.TempDir(), "none")), io.Discard, &refused); code != 1 {
		t.Fatalf("agent with an unarmable watchdog: exit %d, want 1:\n%s", code, refused.String())
	}

	ctx, cancel := context.WithCancel(context.Background())
	var stderr syncbuf.Buffer
	done := make(chan int, 1)
	go func() { done <- nodeagent.Main(ctx, args, io.Discard, &stderr) }()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
		}
	}()
	view := func() (*coordv1.Node, error) {
		r, err := coordv1.NewClusterServiceClient(cc).GetNode(context.Background(), &coordv1.GetNodeRequest{Node: n.name})
		return r.GetNode(), err
	}
	wait.Until(t, 20*time.Second, "the coordinator shows wd-1's watchdog armed", func() error {
		v, err := view()
		if err != nil {
			return err
		}
		if !v.WatchdogArmed || v.WatchdogTimeout.AsDuration() != 3*time.Second {
			return fmt.Errorf("watchdog armed %v, timeout %v", v.WatchdogArmed, v.WatchdogTimeout.AsDuration())
		}
		return nil
	})
	feeds := sim.Feeds()
	time.Sleep(3 * time.Second) // past the stand-in's 2 s timeout: only feeding keeps the node up
	if sim.Feeds() <= feeds || sim.State() != watchdogsim.Armed || resets.Load() != 0 {
		t.Fatalf("while the agent runs: feeds %d -> %d, state %v, resets %d\n%s", feeds, sim.Feeds(), sim.State(), resets.Load(), stderr.String())
	}

	cancel() // a clean stop
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("clean stop: exit %d\n%s", code, stderr.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the agent did not stop")
	}
	if v, err := view(); err != nil || v.WatchdogArmed {
		t.Fatalf("after the clean stop the coordinator shows the watchdog armed %v (%v): the disarm report did not arrive first", v.GetWatchdogArmed(), err)
	}
	wait.Until(t, 5*time.Second, "the magic close disarmed the device", func() error {
		if sim.State() != watchdogsim.Disarmed {
			return fmt.Errorf("state %v", sim.State())
		}
		return nil
	})
	time.Sleep(3 * time.Second)
	if n := resets.Load(); n != 0 {
		t.Fatalf("a clean stop reset the node %d times", n)
	}
	audit, err := coordv1.NewClusterServiceClient(cc).ListAudit(context.Background(), &coordv1.ListAuditRequest{Node: n.name})
	if err != nil {
		t.Fatal(err)
	}
	var armed, disarmed bool
	for _, e := range audit.Entries {
		armed = armed || e.Kind == "watchdog" && e.Text == "node wd-1: watchdog armed (timeout 3s)"
		disarmed = disarmed || e.Kind == "watchdog" && strings.Contains(e.Text, "watchdog disarmed by its agent")
	}
	if !armed || !disarmed {
		t.Errorf("audit lacks the watchdog's arming (%v) or disarming (%v): %v", armed, disarmed, audit.Entries)
	}
}
