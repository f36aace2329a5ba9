package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodefence/nodefence/coordinator/app"
	"github.com/nodefence/nodefence/node-agent/nodeagent"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/wdlease"
	"github.com/nodefence/nodefence/testbed/pki"
	"github.com/nodefence/nodefence/testbed/syncbuf"
	"github.com/nodefence/nodefence/testbed/wait"
	"github.com/nodefence/nodefence/testbed/watchdogsim"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// freePort returns a loopback address nothing listens on now.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestWatchdogPeersKeepNodesUp runs three node-agent programs in watchdog mode with their peer
// checks (issue 24, item 2): with the coordinator killed, nobody holds a lease, each agent feeds on
// the word of both others over mutual TLS, and no node resets for many leases and timeouts. When one
// agent stops (cleanly), the other two lack a quorum of OTHER agents and both reset. The stopped
// one resets too: no coordinator acknowledged its "disarmed" report, so it wrote no magic close (a
// leader may still hold it armed and prove it off by time later).
func TestWatchdogPeersKeepNodesUp(t *testing.T) {
	names := []string{"wdp-a", "wdp-b", "wdp-c"}
	var nodes []node
	for _, n := range names {
		nodes = append(nodes, node{name: n, password: "password", bmc: startBMC(t, n), addr: "127.0.0.1"})
	}
	driver := startDriver(t, t.TempDir())
	coord := startCoordinator(t, app.Config{FenceConfig: writeConfig(t, driver, nodes)})
	cc := conn(t, coord.app.Addr())
	leaderReady(t, cc)

	addrs := map[string]string{}
	for _, n := range names {
		addrs[n] = freePort(t)
	}
	var resets [3]atomic.Int32
	var logs [3]syncbuf.Buffer
	var cancels [3]context.CancelFunc
	var dones [3]chan int
	started := time.Now()
	for i, n := range names {
		// The stand-in has no timeout ioctl: its own timeout is the one the agent is told
		// (--watchdog-timeout), so the agent's feeding cadence (a third of it) keeps its margin
		// across the lease's expiry and the peer check that follows it.
		sim, err := watchdogsim.Start(filepath.Join(t.TempDir(), "watchdog"), 3*time.Second, func() { resets[i].Add(1) })
		if err != nil {
			t.Fatal(err)
		}
		defer sim.Stop()
		boot := filepath.Join(t.TempDir(), "boot_id")
		if err := os.WriteFile(boot, []byte("boot-"+n+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		args := append(pki.Args("", tlsAs(t, identity.Agent, n)),
			"--coordinator="+coord.app.Addr(), "--node-name="+n, "--zone=a", "--boot-id-file="+boot,
			"--proc-root=../../node-agent/signals/testdata/proc", "--cgroup-root=../../node-agent/signals/testdata/v1", "--cgroup-version=1",
			"--nodefs-path=", "--container-runtime-endpoint=", "--shutdown-grace-period=0s",
			"--watchdog-device="+sim.Path, "--watchdog-timeout=3s", "--peer-listen="+addrs[n])
		for _, p := range names {
			if p != n {
				args = append(args, "--peer="+p+"="+addrs[p])
			}
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancels[i], dones[i] = cancel, make(chan int, 1)
		go func() { dones[i] <- nodeagent.Main(ctx, args, io.Discard, &logs[i]) }()
		defer func() {
			cancel()
			select {
			case <-dones[i]:
			case <-time.After(10 * time.Second):
			}
		}()
	}
	wait.Until(t, 30*time.Second, "the coordinator shows every watchdog armed", func() error {
		r, err := coordv1.NewClusterServiceClient(cc).ListNodes(context.Background(), &coordv1.ListNodesRequest{})
		if err != nil {
			return err
		}
		armed := 0
		for _, v := range r.GetNodes() {
			if v.GetWatchdogArmed() {
				armed++
			}
		}
		if armed != len(names) {
			return fmt.Errorf("%d of %d armed", armed, len(names))
		}
		return nil
	})
	// A fresh agent vouches for nobody until its previous incarnation's lease has certainly expired.
	guard := wdlease.Defaults(3 * time.Second)
	guard.Lease = wdlease.MaxGrant
	time.Sleep(time.Until(started.Add(guard.NoLeaseGuard() + time.Second)))

	coord.stop()                 // the control plane goes away for everyone
	time.Sleep(15 * time.Second) // leases of 4 s and the devices' 3 s, many times over
	for i, n := range names {
		if r := resets[i].Load(); r != 0 {
			t.Fatalf("%s reset %d times with the control plane away and both peers answering\n%s", n, r, logs[i].String())
		}
		if !strings.Contains(logs[i].String(), "feeding because these agents say nobody holds one") {
			t.Fatalf("%s does not say it feeds on its peers' word\n%s", n, logs[i].String())
		}
	}

	cancels[2]() // wdp-c stops cleanly: the other two have one peer each, short of a quorum of two
	stopped := time.Now()
	wait.Until(t, 20*time.Second, "wdp-a and wdp-b reset without a quorum", func() error {
		if resets[0].Load() == 0 || resets[1].Load() == 0 {
			return fmt.Errorf("resets %d, %d after %s", resets[0].Load(), resets[1].Load(), time.Since(stopped).Round(time.Millisecond))
		}
		return nil
	})
	wait.Until(t, 10*time.Second, "wdp-c, stopped with its disarm unacknowledged, reset", func() error {
		if resets[2].Load() == 0 {
			return fmt.Errorf("no reset %s after the stop", time.Since(stopped).Round(time.Millisecond))
		}
		return nil
	})
	if !strings.Contains(logs[2].String(), "did not acknowledge") {
		t.Errorf("wdp-c does not say why its watchdog stayed armed\n%s", logs[2].String())
	}
}
