package install

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nodefence/nodefence/testbed/cluster"
	"github.com/nodefence/nodefence/testbed/kube/kubetest"
	"github.com/nodefence/nodefence/testbed/nfcluster"
)

// checkWebhookWithoutNode1 proves that the node agents' admission webhook does not hang on one
// coordinator replica: with node-1 cordoned and its coordinator pod deleted (its replacement cannot
// be scheduled anywhere), an agent's evictions are still judged by the webhook — the apiserver
// reaches it through the Service deploy/webhook-node-agent.yaml names, at a ready coordinator (the
// testbed has no kube-proxy: its apiserver routes to the Service's endpoints). A webhook that names
// node-1's coordinator alone fails (failurePolicy Fail): the agent's own eviction is refused.
// survivor is a running node other than node-1.
func checkWebhookWithoutNode1(t *testing.T, ctx context.Context, c *cluster.Cluster, admin *kubernetes.Clientset, survivor string) {
	t.Helper()
	assets, err := kubetest.AssetsDir()
	if err != nil {
		t.Fatal(err)
	}
	kubectl := func(args ...string) {
		t.Helper()
		out, err := exec.CommandContext(ctx, filepath.Join(assets, kubetest.KubectlBinary), append([]string{"--kubeconfig", c.AdminKubeconfig()}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	kubectl("cordon", driverNode)
	t.Cleanup(func() {
		if out, err := exec.Command(filepath.Join(assets, kubetest.KubectlBinary), "--kubeconfig", c.AdminKubeconfig(), "uncordon", driverNode).CombinedOutput(); err != nil {
			t.Logf("uncordon %s: %v\n%s", driverNode, err, out)
		}
	})
	coordinators := metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=nodefence-coordinator", FieldSelector: "spec.nodeName=" + driverNode}
	pods, err := admin.CoreV1().Pods(nfcluster.Namespace).List(ctx, coordinators)
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("the coordinator pod on %s: %v (%d pods)", driverNode, err, len(pods.Items))
	}
	zero := int64(0)
	if err := admin.CoreV1().Pods(nfcluster.Namespace).Delete(ctx, pods.Items[0].Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	node1IP := c.Node(driverNode).IP.String()
	if err := waitFor(ctx, time.Minute, func() error {
		slices, err := admin.DiscoveryV1().EndpointSlices(nfcluster.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=nodefence-coordinator"})
		if err != nil {
			return err
		}
		for _, s := range slices.Items {
			for _, ep := range s.Endpoints {
				if len(ep.Addresses) > 0 && ep.Addresses[0] == node1IP && (ep.Conditions.Ready == nil || *ep.Conditions.Ready) {
					return fmt.Errorf("%s is still a ready endpoint of the coordinators' Service", node1IP)
				}
			}
		}
		// The pod object goes at once; its process (host network) when the kubelet has killed it.
		addr := net.JoinHostPort(node1IP, "7443")
		if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			conn.Close()
			return fmt.Errorf("the coordinator on %s still answers at %s", driverNode, addr)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	agent := agentClient(t, ctx, admin, survivor)
	agentPod := func(node string) *corev1.Pod {
		t.Helper()
		ps, err := admin.CoreV1().Pods(nfcluster.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=nodefence-node-agent", FieldSelector: "spec.nodeName=" + node})
		if err != nil || len(ps.Items) == 0 {
			t.Fatalf("the node agent pod on %s: %v", node, err)
		}
		return &ps.Items[0]
	}
	evict := func(p *corev1.Pod) error { // dry run: admission runs, nothing is evicted
		return agent.PolicyV1().Evictions(p.Namespace).Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name},
			DeleteOptions: &metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}})
	}
	own, other := agentPod(survivor), agentPod(driverNode)
	for range 5 { // the apiserver picks a ready endpoint per call
		if err := evict(own); err != nil {
			t.Fatalf("%s's agent evicting its own node's pod %s with %s's coordinator down: %v", survivor, own.Name, driverNode, err)
		}
	}
	if err := evict(other); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "may not act on a pod bound to node") {
		t.Fatalf("%s's agent evicting %s on %s: got %v, want Forbidden by the node-agent webhook", survivor, other.Name, driverNode, err)
	}
	t.Logf("with %s's coordinator down, the webhook judged %s's evictions", driverNode, survivor)
}

// agentClient is a client with a token of the agents' ServiceAccount bound to node.
func agentClient(t *testing.T, ctx context.Context, admin *kubernetes.Clientset, node string) *kubernetes.Clientset {
	t.Helper()
	n, err := admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	life := int64(600)
	tr, err := admin.CoreV1().ServiceAccounts(nfcluster.Namespace).CreateToken(ctx, nfcluster.AgentServiceAccount, &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{ExpirationSeconds: &life, BoundObjectRef: &authnv1.BoundObjectReference{APIVersion: "v1", Kind: "Node", Name: n.Name, UID: n.UID}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := cluster.RESTConfig(filepath.Join(clusterDir, "admin.kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	return kubernetes.NewForConfigOrDie(&rest.Config{Host: rc.Host, BearerToken: tr.Status.Token, TLSClientConfig: rest.TLSClientConfig{CAFile: rc.CAFile}})
}

// waitFor calls f every 500 ms until it returns nil or timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(500 * time.Millisecond)
	}
}
