package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"github.com/nodefence/nodefence/coordinator/kube"
	"github.com/nodefence/nodefence/services/wdlease"
	"github.com/nodefence/nodefence/testbed/cluster"
	"github.com/nodefence/nodefence/testbed/ipmisim"
	"github.com/nodefence/nodefence/testbed/nfcluster"
)

// darkRow is the dark-BMC row (issue 24 item 6), on the defaults row's cluster: nodefence with what
// deploy/ ships plus a watchdog on every node (--watchdog-timeout o.watchdog) and watchdog_fallback
// on every node, every node's fence configuration naming a BMC that answers nothing (a UDP black
// hole). Each round powers the victim off through its real BMC — the node and its BMC lose power
// together — and measures until the writer runs elsewhere: the IPMI method fails as unreachable,
// the record falls back to the watchdog and is proven off by time. A round's record stays proven
// off by time (no BMC can power the node on through nodefence), so each round has a deployment of
// its own, and the node is powered on again through its real BMC between rounds.
func darkRow(ctx context.Context, o options, c *cluster.Cluster, b *bench, log *slog.Logger, res *result) error {
	dark, closeDark, err := ipmisim.Blackhole()
	if err != nil {
		return err
	}
	defer closeDark()
	rc, err := cluster.RESTConfig(c.AdminKubeconfig())
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return err
	}
	bounds := wdlease.Defaults(o.watchdog)
	bounds.Lease = 4 * time.Second // the coordinator's default lease: 4 heartbeats of 1 s
	res.DarkWatchdogTimeoutS, res.WatchdogSafeTimeS = o.watchdog.Seconds(), bounds.SafeAfterGrant().Seconds()
	var all []phases
	for i := 1; i <= o.rounds; i++ {
		d, err := nfcluster.Deploy(ctx, c, nfcluster.Options{BinDir: o.binDir, Dir: filepath.Join(o.dir, fmt.Sprintf("nodefence-dark-%d", i)),
			Shipped: true, Watchdog: o.watchdog, WatchdogFallback: true, Log: log,
			// Every node's configuration names the dark BMC: the victim is whichever node the
			// writer runs on (node-2 preferred), and only it is fenced.
			BMCPort: func(*cluster.Node) int { return dark }})
		if err != nil {
			return err
		}
		s, ok, err := b.darkRound(ctx, d, fmt.Sprintf("dark-%d", i), bounds)
		d.Stop()
		// Nothing can power the node on through nodefence: its BMC is dark. An operator powers it
		// on at the BMC and clears the round's records.
		_ = dyn.Resource(kube.FenceResource).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		b.restore(ctx)
		if err != nil || !ok {
			return fmt.Errorf("dark-BMC round %d: recovered=%v: %v", i, ok, err)
		}
		fmt.Fprintf(os.Stderr, "dark-%d round: %.2f s (safe time %s); phases %s; %s\n", i, s, bounds.SafeAfterGrant(), darkString(b.last), b.lastDark)
		res.DarkEach, all = append(res.DarkEach, s), append(all, b.last)
	}
	res.DarkPhasesP50 = phaseMedians(all, darkPhaseNames)
	res.DarkP50, res.DarkMax = p50(res.DarkEach), maxOf(res.DarkEach)
	res.DarkGoalS = min(darkGoalP50, res.WatchdogSafeTimeS+10)
	res.DarkGoalMet = res.DarkP50 <= res.DarkGoalS
	return nil
}

// darkGoalP50 is the dark-BMC row's goal (issue 24.6): p50 at most 60 s and at most the safe time
// plus 10 s.
const darkGoalP50 = 60.0

// darkRound waits until every agent is connected with its watchdog armed, then runs a power-loss
// round with d deployed (after the bounds' window, so the leader can prove the other agents' leases
// over a whole window of its own), and reads its phases from d's leader.
func (b *bench) darkRound(ctx context.Context, d *nfcluster.Deployment, name string, bounds wdlease.Bounds) (float64, bool, error) {
	if err := d.WaitAgents(ctx, 90*time.Second); err != nil {
		return 0, false, err
	}
	b.powerLoss, b.settle, b.darkSafe, b.d, b.last, b.lastDark = true, bounds.Window(), bounds.SafeAfterGrant(), d, nil, darkDetail{}
	defer func() { b.powerLoss, b.settle, b.d = false, 0, nil }()
	return b.round(ctx, name, 3*time.Minute, false)
}
