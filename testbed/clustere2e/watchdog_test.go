package clustere2e

import (
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodefence/nodefence/testbed/cluster"
	"github.com/nodefence/nodefence/testbed/ipmisim"
	"github.com/nodefence/nodefence/testbed/nfcluster"
	"github.com/nodefence/nodefence/testbed/watchdogsim"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// wdTimeout is the watchdog timeout of the scenarios: the agents feed every third of it.
const wdTimeout = 6 * time.Second

// TestWatchdogResetsOnlyAnAbandonedNode gives every node a watchdog device that really resets it
// (cluster.Node.StartWatchdog: unfed for its timeout, the node's processes die as at its BMC's
// power-off and it boots again as at a power-on) and runs the agents with --watchdog-device on it
// (issue 24, items 4 and 5): agents that run reset nothing for 3 × the timeout; an agent stopped
// cleanly (SIGTERM: its magic close) resets nothing; an agent SIGKILLed and restarted within the
// timeout re-opens the device and resets nothing; an agent SIGKILLed and not restarted resets its
// node after the timeout — the node's processes die, it boots with a new boot id, and its agent
// arms the device again; a node its BMC powers off stays off (the power-off disarms the device).
// With the control plane away (every coordinator killed; etcd stopped) for 3 × the timeout, no node
// resets: the agents vouch for each other over their peer checks; a node cut off alone resets and
// the others do not (watchdog_quorum_test.go).
// One deployment serves the subtests, in this order.
func TestWatchdogResetsOnlyAnAbandonedNode(t *testing.T) {
	s := start(t, nfcluster.Options{Watchdog: wdTimeout})
	agentsStarted := time.Now()
	victim := s.c.Node("node-2")
	// A program of the node, like its containerd and kubelet: it dies with the node and starts
	// again when the node boots.
	if err := victim.AddService(cluster.Service{Name: "wd-sentinel", Bin: "sleep", Args: []string{"3600"}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { victim.RemoveService("wd-sentinel") })
	for _, n := range s.c.Nodes {
		s.waitArmed(t, n, 30*time.Second)
	}

	t.Run("fed for 3 timeouts", func(t *testing.T) {
		before := s.snapshot(t)
		time.Sleep(3 * wdTimeout)
		for _, n := range s.c.Nodes {
			s.noReset(t, n, before[n.Name])
			if wd := n.Watchdog(); wd.State() != watchdogsim.Armed || wd.Feeds() <= before[n.Name].feeds {
				t.Errorf("%s: watchdog %d, %d feeds (%d before): not armed and fed", n.Name, wd.State(), wd.Feeds(), before[n.Name].feeds)
			}
		}
		s.coordinatorShows(t, true)
	})

	t.Run("control plane away", func(t *testing.T) { s.controlPlaneAway(t, agentsStarted) })

	t.Run("clean stop", func(t *testing.T) {
		defer s.agentBack(t, victim)
		before := s.snapshot(t)
		if err := victim.StopService("node-agent"); err != nil {
			t.Fatal(err)
		}
		stopped := time.Now()
		if err := waitUntil(5*time.Second, func() bool { return victim.Watchdog().State() == watchdogsim.Disarmed }); err != nil {
			t.Fatalf("the agent's clean stop did not disarm the device: %v", err)
		}
		time.Sleep(2*wdTimeout - time.Since(stopped))
		s.noReset(t, victim, before[victim.Name])
	})

	t.Run("killed and restarted within the timeout", func(t *testing.T) {
		defer s.agentBack(t, victim)
		before := s.snapshot(t)
		if err := victim.KillService("node-agent"); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		if err := victim.StartService("node-agent"); err != nil {
			t.Fatal(err)
		}
		fedAgain := s.waitFedAfter(t, victim, killed, wdTimeout)
		t.Logf("%s: the restarted agent fed the device %.2fs after its predecessor was killed", victim.Name, fedAgain.Sub(killed).Seconds())
		time.Sleep(2*wdTimeout - time.Since(killed))
		s.noReset(t, victim, before[victim.Name])
		if wd := victim.Watchdog(); wd.State() != watchdogsim.Armed || time.Since(wd.LastFeed()) > wdTimeout {
			t.Errorf("%s: the restarted agent does not feed the device (state %d, last feed %s ago)", victim.Name, wd.State(), time.Since(wd.LastFeed()))
		}
	})

	t.Run("killed and not restarted", func(t *testing.T) {
		defer s.agentBack(t, victim)
		before := s.snapshot(t)[victim.Name]
		wd := victim.Watchdog()
		if err := victim.KillService("node-agent"); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		lastFeed := wd.LastFeed()
		var reset, died time.Time
		for deadline := killed.Add(wdTimeout + 10*time.Second); died.IsZero() && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if reset.IsZero() && wd.Resets() > before.resets {
				reset = time.Now()
			}
			if !alive(before.sentinel) {
				died = time.Now()
			}
		}
		if reset.IsZero() || died.IsZero() {
			t.Fatalf("%s: no reset %.1fs after its agent was killed (resets %d, sentinel alive %v)", victim.Name, time.Since(killed).Seconds(), wd.Resets(), alive(before.sentinel))
		}
		t.Logf("%s: watchdog reset %.2fs after the agent was SIGKILLed, %.2fs after its last feed (timeout %s); the node's processes dead %.2fs after the kill",
			victim.Name, reset.Sub(killed).Seconds(), reset.Sub(lastFeed).Seconds(), wdTimeout, died.Sub(killed).Seconds())
		if got := reset.Sub(lastFeed); got < wdTimeout || got > wdTimeout+time.Second {
			t.Errorf("reset %s after the last feed, want the %s timeout (+1s)", got, wdTimeout)
		}
		if got := reset.Sub(killed); got > wdTimeout+time.Second {
			t.Errorf("reset %s after the kill, later than the %s timeout (+1s)", got, wdTimeout)
		}
		s.waitArmedAgain(t, victim, before, killed)
	})

	t.Run("powered off by its BMC", func(t *testing.T) {
		defer s.agentBack(t, victim)
		pass := s.c.BMCPassword()
		if err := ipmisim.IpmitoolChassisPower(s.ctx, victim.BMC.Port, cluster.BMCUser, pass, "off"); err != nil {
			t.Fatal(err)
		}
		off := time.Now()
		// The agent died with the node, its device unfed: the power-off disarmed it, so nothing
		// boots the node its BMC keeps off.
		time.Sleep(2 * wdTimeout)
		if on, err := victim.BMC.Power(); err != nil || on || victim.Running() || victim.Watchdog().State() != watchdogsim.Disarmed {
			t.Errorf("%s %.1fs after its BMC's power-off: BMC on %v (%v), running %v, watchdog %d; want off, disarmed",
				victim.Name, time.Since(off).Seconds(), on, err, victim.Running(), victim.Watchdog().State())
		}
		if err := ipmisim.IpmitoolChassisPower(s.ctx, victim.BMC.Port, cluster.BMCUser, pass, "on"); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("minority partition", func(t *testing.T) {
		s.agentBack(t, victim)
		s.minorityPartition(t, victim)
	})
}

// state is what a node shows of its boots.
type state struct {
	boot     string
	resets   int
	feeds    int
	sentinel int // wd-sentinel's process id on node-2, else 0
}

func (s *scenario) snapshot(t *testing.T) map[string]state {
	t.Helper()
	out := map[string]state{}
	for _, n := range s.c.Nodes {
		wd := n.Watchdog()
		out[n.Name] = state{boot: bootID(t, n), resets: wd.Resets(), feeds: wd.Feeds(), sentinel: n.ServicePID("wd-sentinel")}
	}
	return out
}

// noReset fails t if the node reset since before: the device fired, the boot id changed, or a
// program of the node died.
func (s *scenario) noReset(t *testing.T, n *cluster.Node, before state) {
	t.Helper()
	if r := n.Watchdog().Resets(); r != before.resets {
		t.Errorf("%s: %d watchdog resets, want none", n.Name, r-before.resets)
	}
	if b := bootID(t, n); b != before.boot {
		t.Errorf("%s: booted again (boot id %s, was %s)", n.Name, b, before.boot)
	}
	if before.sentinel != 0 && !alive(before.sentinel) {
		t.Errorf("%s: its processes died", n.Name)
	}
}

// coordinatorShows fails t unless the leader shows every node connected with its watchdog armed
// (or not) and the scenario's timeout.
func (s *scenario) coordinatorShows(t *testing.T, armed bool) {
	t.Helper()
	nodes, err := s.d.Nodes(s.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if !n.Connected || n.GetWatchdogArmed() != armed || n.GetWatchdogTimeout().AsDuration() != wdTimeout {
			t.Errorf("%s: connected %v, watchdog armed %v timeout %s; want armed %v, %s", n.Name, n.Connected,
				n.GetWatchdogArmed(), n.GetWatchdogTimeout().AsDuration(), armed, wdTimeout)
		}
	}
}

// waitArmed waits until the node's agent armed its device and the leader shows it connected and
// armed.
func (s *scenario) waitArmed(t *testing.T, n *cluster.Node, timeout time.Duration) {
	t.Helper()
	err := waitUntil(timeout, func() bool {
		if n.Watchdog().State() != watchdogsim.Armed {
			return false
		}
		nodes, err := s.d.Nodes(s.ctx)
		return err == nil && findNode(nodes, n.Name).GetConnected() && findNode(nodes, n.Name).GetWatchdogArmed()
	})
	if err != nil {
		t.Fatalf("%s: agent not connected with its watchdog armed: %v (device state %d)", n.Name, err, n.Watchdog().State())
	}
}

// waitFedAfter waits until a byte fed the node's device after t0, and returns when.
func (s *scenario) waitFedAfter(t *testing.T, n *cluster.Node, t0 time.Time, timeout time.Duration) time.Time {
	t.Helper()
	if err := waitUntil(timeout, func() bool { return n.Watchdog().LastFeed().After(t0) }); err != nil {
		t.Fatalf("%s: nothing fed the device after %s: %v", n.Name, t0.Format(time.StampMilli), err)
	}
	return n.Watchdog().LastFeed()
}

// waitArmedAgain waits until the reset node booted (new boot id, its programs started again) and
// its new agent armed the device and connected; it logs the seconds since the kill.
func (s *scenario) waitArmedAgain(t *testing.T, n *cluster.Node, before state, killed time.Time) {
	t.Helper()
	if err := waitUntil(60*time.Second, n.Running); err != nil {
		t.Fatalf("%s did not boot after its watchdog reset: %v (boot error %v)", n.Name, err, n.BootError())
	}
	booted := time.Now()
	if b := bootID(t, n); b == before.boot {
		t.Errorf("%s: same boot id %s after the reset", n.Name, b)
	}
	if pid := n.ServicePID("wd-sentinel"); pid == 0 || pid == before.sentinel {
		t.Errorf("%s: its programs did not start again at boot (sentinel pid %d, was %d)", n.Name, pid, before.sentinel)
	}
	s.waitArmed(t, n, 60*time.Second)
	if on, err := n.BMC.Power(); err != nil || !on {
		t.Errorf("%s: BMC reads power on %v (%v) after a watchdog reset, want on", n.Name, on, err)
	}
	t.Logf("%s: booted %.2fs and its agent connected with the watchdog armed again %.2fs after the kill",
		n.Name, booted.Sub(killed).Seconds(), time.Since(killed).Seconds())
}

// agentBack starts the node's agent again if a subtest left it stopped, and waits until it armed
// the device.
func (s *scenario) agentBack(t *testing.T, n *cluster.Node) {
	t.Helper()
	if n.ServicePID("node-agent") == 0 {
		if err := n.StartService("node-agent"); err != nil && !strings.Contains(err.Error(), "runs") {
			t.Fatal(err)
		}
	}
	s.waitArmed(t, n, 60*time.Second)
}

func findNode(nodes []*coordv1.Node, name string) *coordv1.Node {
	for _, n := range nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

func bootID(t *testing.T, n *cluster.Node) string {
	t.Helper()
	b, err := os.ReadFile(n.BootIDFile())
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// alive reports whether the process exists (it was reaped when it died: the cluster waits for its
// own children).
func alive(pid int) bool {
	return pid > 0 && !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

// waitUntil polls cond every 50 ms for up to timeout.
func waitUntil(timeout time.Duration, cond func() bool) error {
	for deadline := time.Now().Add(timeout); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			return errors.New("timed out after " + timeout.String())
		}
	}
	return nil
}
