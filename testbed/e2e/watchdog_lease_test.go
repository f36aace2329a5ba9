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

// TestWatchdogFedOnlyUnderLease runs the node-agent program on the testbed's watchdog stand-in
// against a real coordinator over mutual TLS (issue 24, item 2): the agent arms the device only once
// the leader granted it a lease, and feeds it past many of the device's timeouts while the leader
// renews the lease with each heartbeat. When the coordinator goes away — and no peer confirms that
// nobody holds a lease (this agent has none to ask) — the lease runs out, the agent stops feeding,
// and the device resets the node: after the lease, not before, and within lease + timeout.
func TestWatchdogFedOnlyUnderLease(t *testing.T) {
	n := node{name: "wdl-1", password: "password", bmc: startBMC(t, "wdl-1"), addr: "127.0.0.1"}
	driver := startDriver(t, t.TempDir())
	coord := startCoordinator(t, app.Config{FenceConfig: writeConfig(t, driver, []node{n})}) // heartbeat 1 s, lease 4 s
	cc := conn(t, coord.app.Addr())
	leaderReady(t, cc)

	var resets atomic.Int32
	var resetAt atomic.Int64
	sim, err := watchdogsim.Start(filepath.Join(t.TempDir(), "watchdog"), 2*time.Second, func() {
		resetAt.CompareAndSwap(0, time.Now().UnixNano())
		resets.Add(1)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Stop()
	boot := filepath.Join(t.TempDir(), "boot_id")
	if err := os.WriteFile(boot, []byte("boot-wdl-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := append(pki.Args("", tlsAs(t, identity.Agent, n.name)),
		"--coordinator="+coord.app.Addr(), "--node-name="+n.name, "--zone=a", "--boot-id-file="+boot,
		"--proc-root=../../node-agent/signals/testdata/proc", "--cgroup-root=../../node-agent/signals/testdata/v1", "--cgroup-version=1",
		"--nodefs-path=", "--container-runtime-endpoint=", "--shutdown-grace-period=0s",
		"--watchdog-device="+sim.Path, "--watchdog-timeout=3s")
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

	wait.Until(t, 20*time.Second, "the coordinator shows wdl-1's watchdog armed", func() error {
		r, err := coordv1.NewClusterServiceClient(cc).GetNode(context.Background(), &coordv1.GetNodeRequest{Node: n.name})
		if err != nil {
			return err
		}
		if !r.GetNode().GetWatchdogArmed() {
			return fmt.Errorf("not armed yet")
		}
		return nil
	})
	feeds := sim.Feeds()
	time.Sleep(5 * time.Second) // two and a half device timeouts, longer than one lease: renewals keep it fed
	if sim.Feeds() <= feeds || resets.Load() != 0 {
		t.Fatalf("under the leader's lease: feeds %d -> %d, resets %d\n%s", feeds, sim.Feeds(), resets.Load(), stderr.String())
	}
	if !strings.Contains(stderr.String(), "feeding under the leader's lease") {
		t.Fatalf("the agent does not say it feeds under a lease:\n%s", stderr.String())
	}

	stopped := time.Now()
	coord.stop() // the control plane goes away
	wait.Until(t, 20*time.Second, "the device resets the node once the lease ran out", func() error {
		if resets.Load() == 0 {
			return fmt.Errorf("no reset %s after the coordinator stopped; feeds %d", time.Since(stopped).Round(time.Millisecond), sim.Feeds())
		}
		return nil
	})
	after := time.Unix(0, resetAt.Load()).Sub(stopped)
	// The last heartbeat left at most 1 s before the stop: its 4 s lease ends 3 s after it at the
	// earliest; the last feed is at most a third of 3 s before that, the reset 2 s after it. At
	// the latest: lease 4 s, a feed period 1 s, the device's 2 s, and the test machine's slack.
	if after < 3*time.Second || after > 12*time.Second {
		t.Fatalf("reset %s after the coordinator stopped: want between 3 s and 12 s\n%s", after, stderr.String())
	}
	if !strings.Contains(stderr.String(), "no lease from the leader; not feeding") {
		t.Errorf("the agent does not say it stopped feeding:\n%s", stderr.String())
	}
	t.Logf("reset %s after the coordinator stopped", after.Round(time.Millisecond))
}
