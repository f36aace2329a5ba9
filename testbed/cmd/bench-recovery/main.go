// Command bench-recovery measures how long a StatefulSet member on a dead node waits before it is
// released: the Kubernetes scenario (a real kube-apiserver, ipmi_sim BMCs, the IPMI fence-driver, a
// coordinator in Kubernetes mode, node agents) with short timeouts, one victim per round. Each round
// stops a node's agent while its BMC still says on, and measures the seconds until the pod is
// deleted; the power-off must have been confirmed before. The LAST line of output is one JSON object.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"time"

	"github.com/nodefence/nodefence/coordinator/store"
	"github.com/nodefence/nodefence/testbed/ipmisim"
	"github.com/nodefence/nodefence/testbed/kubescenario"
)

type result struct {
	Bench        string    `json:"bench"`
	Rounds       int       `json:"rounds"`
	GraceS       float64   `json:"grace_s"`
	FenceTimeout float64   `json:"fence_timeout_s"`
	P50          float64   `json:"p50_s"`
	Max          float64   `json:"max_s"`
	Each         []float64 `json:"each_s"`
}

func main() {
	rounds := flag.Int("rounds", 5, "rounds (one victim node each)")
	grace := flag.Duration("grace", 2*time.Second, "node-monitor grace period")
	fenceTimeout := flag.Duration("fence-timeout", 2*time.Second, "not-ready time before fencing")
	flag.Parse()
	if *rounds < 1 || *rounds > 20 || *grace <= 0 || *fenceTimeout < 0 {
		fmt.Fprintln(os.Stderr, "bench-recovery: --rounds 1..20, --grace > 0, --fence-timeout >= 0")
		os.Exit(2)
	}
	res, err := run(*rounds, *grace, *fenceTimeout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-recovery:", err)
		os.Exit(1)
	}
	b, _ := json.Marshal(res)
	fmt.Println(string(b))
}

func run(rounds int, grace, fenceTimeout time.Duration) (*result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	dir, cleanup, err := kubescenario.TempDir()
	if err != nil {
		return nil, err
	}
	defer cleanup()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	// Enough healthy nodes that the fenced victims never trip the storm guard.
	env, err := kubescenario.Start(ctx, dir, kubescenario.Options{Healthy: 2*rounds + 2, Victims: rounds, Grace: grace, FenceTimeout: fenceTimeout, Log: log})
	if err != nil {
		return nil, err
	}
	defer env.Close()
	fmt.Printf("kube-apiserver, coordinator (Kubernetes mode), IPMI driver and %d nodes up; %d rounds\n", len(env.Nodes), rounds)
	res := &result{Bench: "recovery", Rounds: rounds, GraceS: grace.Seconds(), FenceTimeout: fenceTimeout.Seconds()}
	for _, n := range env.Nodes {
		if !n.Victim {
			continue
		}
		failed := env.Fail(n)
		released, err := env.WaitReleased(ctx, n)
		if err != nil {
			return nil, err
		}
		page, err := env.Coord.Store().ListFences(ctx, store.ListOptions{Node: n.Name, Limit: 1})
		recs := page.Fences
		if err != nil || len(recs) == 0 || recs[0].ConfirmedOffAt == nil || recs[0].ConfirmedOffAt.AsTime().After(released) {
			return nil, fmt.Errorf("%s: pod released without a confirmed power-off before it (%v, %v)", n.Name, recs, err)
		}
		if p, err := ipmisim.IpmitoolPower(ctx, n.BMC.Port, "admin", "password"); err != nil || p != "off" {
			return nil, fmt.Errorf("%s: ipmitool says %q (%v) after the release", n.Name, p, err)
		}
		s := released.Sub(failed).Seconds()
		fmt.Printf("round %d: %s released %.2fs after its agent stopped (power-off confirmed at +%.2fs, ipmitool: off)\n",
			len(res.Each)+1, n.Name, s, recs[0].ConfirmedOffAt.AsTime().Sub(failed).Seconds())
		res.Each = append(res.Each, round2(s))
	}
	sorted := append([]float64(nil), res.Each...)
	sort.Float64s(sorted)
	res.P50, res.Max = sorted[(len(sorted)-1)/2], sorted[len(sorted)-1]
	return res, nil
}

func round2(v float64) float64 { return float64(int64(v*100+0.5)) / 100 }
