package clustere2e

import (
	"syscall"
	"testing"
	"time"

	"github.com/nodefence/nodefence/services/wdlease"
	"github.com/nodefence/nodefence/testbed/cluster"
)

// peersVouchAfter is when every agent of a deployment started before t0 answers its peers "no
// lease": a fresh agent vouches for nobody until the longest lease its previous incarnation could
// hold has surely expired (wdlease.Bounds.NoLeaseGuard).
func peersVouchAfter(t0 time.Time) time.Time {
	b := wdlease.Defaults(wdTimeout)
	b.Lease = wdlease.MaxGrant
	return t0.Add(b.NoLeaseGuard() + time.Second)
}

// controlPlaneAway: with every coordinator SIGKILLed, and then with etcd stopped (SIGSTOP: the
// store gone as when its quorum is lost; the leader steps down), for 3 × the watchdog timeout, no
// node resets: nobody holds a lease, and each agent feeds on the word of both others. Afterwards
// the coordinators are back and every agent connected with its watchdog armed.
func (s *scenario) controlPlaneAway(t *testing.T, agentsStarted time.Time) {
	time.Sleep(time.Until(peersVouchAfter(agentsStarted)))
	t.Run("every coordinator killed", func(t *testing.T) {
		before := s.snapshot(t)
		for _, co := range s.d.Coordinators {
			co.Kill()
		}
		time.Sleep(3 * wdTimeout)
		for _, n := range s.c.Nodes {
			s.noReset(t, n, before[n.Name])
		}
		for _, co := range s.d.Coordinators {
			if err := co.Restart(); err != nil {
				t.Fatal(err)
			}
		}
		for _, n := range s.c.Nodes {
			s.waitArmed(t, n, 60*time.Second)
		}
	})
	t.Run("etcd stopped", func(t *testing.T) {
		before := s.snapshot(t)
		if err := s.d.SignalEtcd(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		cont := func() {
			if err := s.d.SignalEtcd(syscall.SIGCONT); err != nil {
				t.Errorf("SIGCONT etcd: %v", err)
			}
		}
		t.Cleanup(cont)
		time.Sleep(3 * wdTimeout)
		for _, n := range s.c.Nodes {
			s.noReset(t, n, before[n.Name])
		}
		cont()
		for _, n := range s.c.Nodes {
			s.waitArmed(t, n, 60*time.Second)
		}
	})
}

// minorityPartition cuts victim off from everything (its coordinators, its peers; its BMC stays
// reachable): alone, a minority, it holds no lease and no quorum of peers vouches, so its watchdog
// resets it within its lease plus the timeout; the majority side is untouched. The next scenario's
// start heals the link and powers the node on if a fence turned it off.
func (s *scenario) minorityPartition(t *testing.T, victim *cluster.Node) {
	before := s.snapshot(t)
	if err := victim.Partition(); err != nil {
		t.Fatal(err)
	}
	cut := time.Now()
	t.Cleanup(func() { _ = victim.Heal() })
	bound := wdlease.MaxGrant + wdTimeout
	if err := waitUntil(bound, func() bool { return victim.Watchdog().Resets() > before[victim.Name].resets }); err != nil {
		t.Fatalf("%s cut off alone did not reset within %s: %v", victim.Name, bound, err)
	}
	t.Logf("%s cut off alone: its watchdog reset it %.2fs after the cut", victim.Name, time.Since(cut).Seconds())
	time.Sleep(wdTimeout)
	for _, n := range s.c.Nodes {
		if n != victim {
			s.noReset(t, n, before[n.Name])
		}
	}
}
