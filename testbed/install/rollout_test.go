package install

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/nodefence/nodefence/coordinator/kube"
	"github.com/nodefence/nodefence/services/tlsfiles"
	"github.com/nodefence/nodefence/testbed/cluster"
)

// rolloutAgents restarts the agents' DaemonSet as an upgrade does (`kubectl rollout restart`: one
// node's agent pod at a time replaced) and, a few seconds in, deletes the leading coordinator's
// pod, so a failover lands in the middle of the rollout. Every second until ten seconds after all
// pods are back, nothing may be fenced: no NodeFence, no out-of-service taint, no fence requested
// by whichever replica leads. It returns the node of the leader afterwards.
func rolloutAgents(t *testing.T, ctx context.Context, c *cluster.Cluster, admin *kubernetes.Clientset, dyn dynamic.Interface,
	k func(...string) string, operator tlsfiles.Files, leader string) string {
	t.Helper()
	t0 := time.Now()
	watch := startNoFenceWatch(ctx, c, admin, dyn, operator)
	k("-n", "nodefence", "rollout", "restart", "daemonset/nodefence-node-agent")
	time.Sleep(5 * time.Second)
	k("-n", "nodefence", "delete", "pod", "-l", "app.kubernetes.io/name=nodefence-coordinator",
		"--field-selector", "spec.nodeName="+leader, "--wait=false")
	t.Logf("agent rollout started; the leader's coordinator pod on %s deleted 5 s in", leader)
	k("-n", "nodefence", "rollout", "status", "daemonset/nodefence-node-agent", "--timeout=4m")
	if err := waitPods(ctx, admin, 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	leader, err := waitAgents(ctx, c, operator, 2*time.Minute)
	if err != nil {
		t.Fatalf("after the agent rollout: %v", err)
	}
	time.Sleep(10 * time.Second)
	checks, problems := watch()
	for _, p := range problems {
		t.Error(p)
	}
	if checks < 10 {
		t.Errorf("the no-fence watch checked only %d times during the rollout", checks)
	}
	t.Logf("agents rolled, the leader moved to %s, nothing fenced (%d checks) in %s", leader, checks, time.Since(t0).Round(time.Millisecond))
	return leader
}

// startNoFenceWatch checks every second that nothing is fenced; the function it returns stops the
// watch and gives how many full checks ran and every problem seen (each once).
func startNoFenceWatch(ctx context.Context, c *cluster.Cluster, admin *kubernetes.Clientset, dyn dynamic.Interface, operator tlsfiles.Files) func() (int, []string) {
	var (
		mu       sync.Mutex
		checks   int
		problems []string
		seen     = map[string]bool{}
	)
	report := func(p string) {
		mu.Lock()
		defer mu.Unlock()
		if !seen[p] {
			seen[p] = true
			problems = append(problems, p)
		}
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for tick := time.NewTicker(time.Second); ; {
			select {
			case <-wctx.Done():
				tick.Stop()
				return
			case <-tick.C:
			}
			if noFenceCheck(wctx, c, admin, dyn, operator, report) {
				mu.Lock()
				checks++
				mu.Unlock()
			}
		}
	}()
	return func() (int, []string) {
		stop()
		<-done
		mu.Lock()
		defer mu.Unlock()
		return checks, problems
	}
}

// noFenceCheck reports every NodeFence, out-of-service taint and fence requested by a leader; it
// says whether the apiserver answered both reads.
func noFenceCheck(ctx context.Context, c *cluster.Cluster, admin *kubernetes.Clientset, dyn dynamic.Interface, operator tlsfiles.Files, report func(string)) bool {
	complete := true
	if list, err := dyn.Resource(kube.FenceResource).List(ctx, metav1.ListOptions{}); err != nil {
		complete = false
	} else {
		for _, f := range list.Items {
			report(fmt.Sprintf("NodeFence %s created during the agent rollout: %v", f.GetName(), f.Object["spec"]))
		}
	}
	if nodes, err := admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err != nil {
		complete = false
	} else {
		taint := kube.OutOfServiceTaint()
		for _, n := range nodes.Items {
			for _, tn := range n.Spec.Taints {
				if tn.Key == taint.Key {
					report(fmt.Sprintf("%s tainted %s during the agent rollout", n.Name, tn.Key))
				}
			}
		}
	}
	for _, n := range c.Nodes {
		// Followers refuse ListNodes: only the leader's answer counts.
		views, err := listNodes(ctx, net.JoinHostPort(n.IP.String(), "7001"), operator)
		if err != nil {
			continue
		}
		for _, v := range views {
			if v.GetFenceRequested() {
				report(fmt.Sprintf("the leader on %s requested a fence of %s during the agent rollout (%s: %s)", n.Name, v.GetName(), v.GetReadiness(), v.GetReason()))
			}
		}
	}
	return complete
}
