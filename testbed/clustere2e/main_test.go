// Package clustere2e proves nodefence end to end on the testbed's real multi-node Kubernetes
// (testbed/cluster): real kubelets, containerd, kube-controller-manager, scheduler and StatefulSet
// controller, a BMC per node that really powers it, and nodefence's own binaries (coordinator in
// Kubernetes mode with deploy/'s RBAC, IPMI fence-driver, a node-agent in every node). The
// scenarios assert outcomes only: where the StatefulSet pod runs, what the BMC says to ipmitool,
// what the shared volume's writer log shows, which taints and NodeFence objects exist.
//
// One cluster serves the whole package (TestMain); the tests run one after another and each
// restores the nodes (power, links, BMC faults) when it ends.
package clustere2e

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodefence/nodefence/testbed/cluster"
	"github.com/nodefence/nodefence/testbed/nfcluster"
)

// The lifecycle settings every scenario shares: kube-controller-manager and nodefence judge a
// silent node after the same grace period.
const (
	grace        = 20 * time.Second
	fenceTimeout = 2 * time.Second
)

var (
	testCluster *cluster.Cluster
	binDir      string
	// nodes is the cluster's size: 3 for the package; make test runs TestTwoNodeMinority again
	// in a cluster of 5.
	nodes = flag.Int("clustere2e.nodes", cluster.DefaultNodes, "the number of nodes of the package's cluster")
)

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "nodefence-clustere2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	binDir = filepath.Join(dir, "bin")
	if err := nfcluster.BuildBinaries(ctx, binDir); err != nil {
		fmt.Fprintln(os.Stderr, "clustere2e:", err)
		return 1
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	start := time.Now()
	c, err := cluster.Up(ctx, cluster.Config{Dir: filepath.Join(dir, "cluster"), Nodes: *nodes, NodeMonitorGracePeriod: grace, NodeMonitorPeriod: 2 * time.Second,
		StartTimeout: 8 * time.Minute, PodsMemory: podsMemory}, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, "clustere2e: cluster:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "clustere2e: cluster of %d nodes up in %s\n", len(c.Nodes), time.Since(start).Round(time.Millisecond))
	testCluster = c
	code := m.Run()
	// Teardown must leave nothing running or mounted and kubelet's sysctls restored.
	err = c.Down()
	if left := c.Leftovers(); err != nil || len(left) > 0 {
		fmt.Fprintf(os.Stderr, "clustere2e: cluster down: %v; left behind: %q\n", err, left)
		if code == 0 {
			code = 1
		}
	}
	return code
}
