package kube

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nodefence/nodefence/testbed/kube/kubetest"
)

// One real apiserver for the package: the CRD and the coordinator's RBAC from deploy/ are applied
// to it for real, and every writer test runs as the coordinator's ServiceAccount.
var (
	cluster  *kubetest.Cluster
	coordCfg *rest.Config // the nodefence-coordinator ServiceAccount, with deploy/'s RBAC only
	admin    *kubernetes.Clientset
)

const deployDir = "../../deploy"

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	start := time.Now()
	c, err := kubetest.New("")
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: kube test cluster:", err)
		return 1
	}
	defer c.Stop()
	cluster, admin = c, c.Clientset()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, err := kubetest.NewApplier(c.Config())
	if err == nil {
		err = installCoordinatorRBAC(ctx, a)
	}
	if err == nil {
		coordCfg, err = c.ServiceAccountConfig(ctx, "nodefence", "nodefence-coordinator")
	}
	if err == nil {
		err = c.WaitForClusterRole(ctx, "nodefence-coordinator", "nodefence", "nodefence-coordinator")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: setting up the cluster:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "kube test cluster at %s ready in %s\n", c.Host, time.Since(start).Round(time.Millisecond))
	return m.Run()
}

// installCoordinatorRBAC applies deploy/'s namespace, NodeFence CRD and coordinator RBAC for real,
// and waits until NodeFences are served.
func installCoordinatorRBAC(ctx context.Context, a *kubetest.Applier) error {
	if err := a.ApplyFiles(ctx, deployDir, "namespace.yaml", "crd-nodefences.yaml", "crd-nodefenceremediations.yaml", "rbac-coordinator.yaml"); err != nil {
		return err
	}
	if err := a.WaitForResource(ctx, FenceResource); err != nil {
		return err
	}
	return a.WaitForResource(ctx, RemediationResource)
}

// newWriter is a Writer running as the coordinator's ServiceAccount.
func newWriter(t *testing.T) *Writer {
	t.Helper()
	w, err := New(coordCfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
