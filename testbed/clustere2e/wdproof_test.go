package clustere2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/nodefence/nodefence/services/wdlease"
	"github.com/nodefence/nodefence/testbed/cluster"
	"github.com/nodefence/nodefence/testbed/ipmisim"
	"github.com/nodefence/nodefence/testbed/nfcluster"
)

// TestBMCDark (issue 24 item 5): node-2 and its BMC both lose power — the node is switched off and
// its fence configuration's BMC answers nothing (a UDP black hole: a BMC without power). Without the
// watchdog the fence stays in error for ever; with watchdog_fallback the IPMI method fails as
// unreachable, the record falls back to the node's watchdog, and it is proven off by time
// (NodeFence status.proof watchdog-timeout) no earlier than the safe time after the node's last
// lease; then the StatefulSet's pod runs elsewhere, and its log shows one writer at a time.
func TestBMCDark(t *testing.T) {
	bmcDark(t, "power loss", func(s *scenario, victim *cluster.Node) {
		ctx, cancel := context.WithTimeout(s.ctx, 20*time.Second)
		defer cancel()
		if err := ipmisim.IpmitoolChassisPower(ctx, victim.BMC.Port, cluster.BMCUser, s.c.BMCPassword(), "off"); err != nil {
			t.Fatal(err)
		}
	})
}

// TestIsolatedWithBMC (issue 24 item 5): node-2's link is cut while it runs and writes, and its BMC
// answers nothing (the management path cut too). Alone, with no lease and no peer to vouch, its
// watchdog resets it within its lease plus the timeout; the leader proves it off by time
// (watchdog-timeout), never before the safe time; the pod runs elsewhere only then, and the log
// shows one writer at a time.
func TestIsolatedWithBMC(t *testing.T) {
	var resets int
	var cut time.Time
	_, victim := bmcDark(t, "cut off", func(s *scenario, victim *cluster.Node) {
		resets, cut = victim.Watchdog().Resets(), time.Now()
		if err := victim.Partition(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = victim.Heal() })
	})
	wd := victim.Watchdog()
	if wd.Resets() <= resets {
		t.Fatalf("%s, cut off alone, was never reset by its watchdog", victim.Name)
	}
	// Booted again but still cut off, its agent holds no lease and never arms the device: the last
	// feed is the one before the reset, which came one timeout later.
	lease := 4 * time.Second // the coordinator's default lease
	if last := wd.LastFeed(); last.After(cut.Add(lease + time.Second)) {
		t.Errorf("%s fed its watchdog %s after the cut, past its %s lease", victim.Name, last.Sub(cut), lease)
	}
	t.Logf("%s: last feed %s after the cut, reset by its watchdog a timeout (%s) later", victim.Name, wd.LastFeed().Sub(cut).Round(10*time.Millisecond), wdTimeout)
}

// bmcDark runs a dark-BMC scenario: the fence configuration names a BMC that answers nothing (a UDP
// black hole) for every node, every node has the watchdog fallback, and fail takes the node running
// the StatefulSet's writer (node-2 unless the scheduler chose another) away while it writes. The
// fence must fall back to the watchdog, be proven off by time
// (NodeFence status.proof watchdog-timeout) no earlier than the safe time after the node's last
// lease, and only then may the writer run elsewhere, one writer at a time.
func bmcDark(t *testing.T, what string, fail func(s *scenario, victim *cluster.Node)) (*scenario, *cluster.Node) {
	dark, closeDark, err := ipmisim.Blackhole()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeDark)
	// Every node's fence configuration names the dark BMC: the victim is whichever node the
	// scheduler gives the writer (it prefers node-2), and only the victim is ever fenced.
	s := start(t, nfcluster.Options{Watchdog: wdTimeout, WatchdogFallback: true, FenceOpTimeout: 5 * time.Second,
		BMCPort: func(*cluster.Node) int { return dark }})
	for _, n := range s.c.Nodes {
		s.waitArmed(t, n, 30*time.Second)
	}
	w, pod := s.writer("dark")
	victim := s.c.Node(pod.Spec.NodeName)
	// The leader proves the other agents' leases only over a whole window of its own.
	time.Sleep(wdlease.Defaults(wdTimeout).Window())
	fail(s, victim)
	lost := time.Now()
	newPod := s.recovered(w, pod.UID, victim.Name, recoveryTimeout)
	running := time.Since(lost)
	var proven *unstructured.Unstructured
	for _, f := range s.fences(victim.Name) {
		if p, _, _ := unstructured.NestedString(f.Object, "status", "proof"); p == "watchdog-timeout" {
			proven = &f
		}
	}
	if proven == nil {
		t.Fatalf("no NodeFence of %s with proof watchdog-timeout: %v", victim.Name, s.fences(victim.Name))
	}
	offAt, _, _ := unstructured.NestedString(proven.Object, "status", "confirmedOffAt")
	off, err := time.Parse(time.RFC3339, offAt)
	if err != nil {
		t.Fatal(err)
	}
	safe := wdlease.Defaults(wdTimeout)
	safe.Lease = 4 * time.Second // the coordinator's default lease
	// The node's last grant answered a heartbeat sent at most one heartbeat before the loss (the
	// NodeFence's times are whole seconds).
	if earliest := lost.Add(safe.SafeAfterGrant() - 2*time.Second); off.Before(earliest) || running < safe.SafeAfterGrant()-2*time.Second {
		t.Fatalf("proven off at %s, %s after the %s, the writer running %s after it: before the safe time %s",
			off, off.Sub(lost), what, running, safe.SafeAfterGrant())
	}
	ops, _, _ := unstructured.NestedSlice(proven.Object, "status", "operations")
	var methods []string
	for _, o := range ops {
		m, _, _ := unstructured.NestedString(o.(map[string]any), "method")
		methods = append(methods, m)
	}
	if strings.Join(methods, ",") != "bmc,watchdog" {
		t.Errorf("operations %v, want bmc then the watchdog fallback", methods)
	}
	t.Logf("%s -> proven off by watchdog %s after (safe time %s) -> writer running on %s %s after",
		what, off.Sub(lost).Round(time.Second), safe.SafeAfterGrant(), newPod.Spec.NodeName, running.Round(time.Millisecond))
	eps := s.checkLog(w, newPod)
	t.Logf("writer log: %s", describe(eps))
	return s, victim
}
