package clustere2e

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/nodefence/nodefence/coordinator/kube"
	"github.com/nodefence/nodefence/testbed/cluster"
	"github.com/nodefence/nodefence/testbed/ipmisim"
	"github.com/nodefence/nodefence/testbed/nfcluster"
	"github.com/nodefence/nodefence/testbed/procs"
	"github.com/nodefence/nodefence/testbed/testlog"
)

// scenario is one test's nodefence deployment on the shared cluster.
type scenario struct {
	t     *testing.T
	ctx   context.Context
	c     *cluster.Cluster
	d     *nfcluster.Deployment
	admin *kubernetes.Clientset
	dyn   dynamic.Interface
}

// start deploys nodefence for the test (fresh etcd, fresh coordinators) on healthy nodes; at the
// end it stops nodefence and restores every node.
func start(t *testing.T, opts nfcluster.Options) *scenario {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	t.Cleanup(cancel)
	c := testCluster
	admin, err := c.Admin()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := cluster.RESTConfig(c.AdminKubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	s := &scenario{t: t, ctx: ctx, c: c, admin: admin, dyn: dynamic.NewForConfigOrDie(rc)}
	s.restore()
	opts.BinDir, opts.Dir = binDir, t.TempDir()
	if opts.Grace == 0 {
		opts.Grace = grace
	}
	if opts.FenceTimeout == 0 {
		opts.FenceTimeout = fenceTimeout
	}
	opts.Log = testlog.New(t, slog.LevelWarn)
	d, err := nfcluster.Deploy(ctx, c, opts)
	if err != nil {
		t.Fatal(err)
	}
	s.d = d
	t.Cleanup(func() {
		if t.Failed() {
			for _, co := range d.Coordinators {
				t.Logf("%s log tail:\n%s", co.ID, procs.TailWithout(co.Log(), 40, nfcluster.AccessLog))
			}
			t.Logf("fence-driver log tail:\n%s", procs.Tail(filepath.Join(opts.Dir, "log", "fence-driver.log"), 20))
			for _, n := range c.Nodes {
				t.Logf("%s node-agent log tail:\n%s", n.Name, procs.Tail(n.ServiceLog(agentService), 25))
			}
			for _, n := range c.Nodes {
				calls, _ := n.BMC.Calls()
				t.Logf("%s BMC calls: %v", n.Name, calls)
			}
		}
		d.Stop()
		s.restore()
	})
	return s
}

// restore powers every node on, heals links, clears BMC faults, and removes what earlier
// scenarios left in the cluster (NodeFence objects, out-of-service taints); it waits until every
// node is Ready.
func (s *scenario) restore() {
	t := s.t
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, n := range s.c.Nodes {
		_ = n.BMC.SetFault(ipmisim.FaultNone)
		_ = n.BMC.SetDelay(0)
		_ = n.Heal()
		_ = n.Unblackhole(s.c.HostIP())
		if !n.Running() {
			if err := ipmisim.IpmitoolChassisPower(ctx, n.BMC.Port, cluster.BMCUser, s.c.BMCPassword(), "on"); err != nil {
				t.Errorf("power on %s: %v", n.Name, err)
			}
		}
	}
	_ = s.dyn.Resource(kube.FenceResource).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	for _, n := range s.c.Nodes {
		node, err := s.admin.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			t.Errorf("restore %s: %v", n.Name, err)
			continue
		}
		var keep []corev1.Taint
		for _, tn := range node.Spec.Taints {
			if tn.Key != kube.TaintKeyOutOfService {
				keep = append(keep, tn)
			}
		}
		_, maint := node.Annotations[kube.AnnotationMaintenance]
		_, maintState := node.Annotations[kube.AnnotationMaintenanceState]
		if len(keep) != len(node.Spec.Taints) || node.Spec.Unschedulable || maint || maintState {
			node.Spec.Taints, node.Spec.Unschedulable = keep, false
			delete(node.Annotations, kube.AnnotationMaintenance)
			delete(node.Annotations, kube.AnnotationMaintenanceState)
			if _, err := s.admin.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
				t.Errorf("restore %s taints: %v", n.Name, err)
			}
		}
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		booting := false
		for _, n := range s.c.Nodes {
			booting = booting || !n.Running()
		}
		if !booting || time.Now().After(deadline) {
			break
		}
	}
	for _, n := range s.c.Nodes {
		if err := n.BootError(); err != nil {
			t.Errorf("%s boot: %v", n.Name, err)
		}
	}
	if err := s.c.WaitReady(ctx, 90*time.Second); err != nil {
		t.Fatalf("restore: %v", err)
	}
}

// writer creates the scenario's StatefulSet writer preferring node-2, waits until it runs and
// writes, and deletes it when the test ends.
func (s *scenario) writer(name string) (*nfcluster.Writer, *corev1.Pod) {
	s.t.Helper()
	w, err := nfcluster.CreateWriter(s.ctx, s.c, name, "node-2")
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() {
		if err := w.Delete(context.Background()); err != nil {
			s.t.Errorf("delete writer: %v", err)
		}
	})
	pod, err := w.RunningPod(s.ctx, "", 90*time.Second)
	if err != nil {
		s.t.Fatal(err)
	}
	s.waitLines(w, 3)
	return w, pod
}

// waitLines waits until the writer log holds at least n lines.
func (s *scenario) waitLines(w *nfcluster.Writer, n int) {
	s.t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		lines, _ := w.Lines()
		if len(lines) >= n {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("writer log has %d lines, want %d", len(lines), n)
		}
	}
}

// power reads the node's power state with ipmitool, independently of nodefence.
func (s *scenario) power(n *cluster.Node) string {
	s.t.Helper()
	got, err := ipmisim.IpmitoolPower(s.ctx, n.BMC.Port, cluster.BMCUser, s.c.BMCPassword())
	if err != nil {
		s.t.Fatal(err)
	}
	return got
}

// outOfService reports whether the node carries the out-of-service taint.
func (s *scenario) outOfService(name string) bool {
	s.t.Helper()
	node, err := s.admin.CoreV1().Nodes().Get(s.ctx, name, metav1.GetOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	for _, tn := range node.Spec.Taints {
		if tn.Key == kube.TaintKeyOutOfService {
			return true
		}
	}
	return false
}

// fences returns the NodeFence objects of the node.
func (s *scenario) fences(node string) []unstructured.Unstructured {
	s.t.Helper()
	list, err := s.dyn.Resource(kube.FenceResource).List(s.ctx, metav1.ListOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	var out []unstructured.Unstructured
	for _, f := range list.Items {
		if n, _, _ := unstructured.NestedString(f.Object, "spec", "node"); n == node {
			out = append(out, f)
		}
	}
	return out
}

// fenceStatus is a NodeFence's status.status and whether status.confirmedOffAt is set.
func fenceStatus(f unstructured.Unstructured) (status string, confirmedOff bool) {
	status, _, _ = unstructured.NestedString(f.Object, "status", "status")
	off, _, _ := unstructured.NestedString(f.Object, "status", "confirmedOffAt")
	return status, off != ""
}

// recovered waits until the writer's pod runs again, as a new pod on another node than victim.
func (s *scenario) recovered(w *nfcluster.Writer, old types.UID, victim string, timeout time.Duration) *corev1.Pod {
	s.t.Helper()
	pod, err := w.RunningPod(s.ctx, old, timeout)
	if err != nil {
		s.t.Fatal(err)
	}
	if pod.Spec.NodeName == victim {
		s.t.Fatalf("the new pod runs on the victim %s", victim)
	}
	return pod
}

// checkLog verifies the writer log: never two writers, and the new pod found the old one's data.
func (s *scenario) checkLog(w *nfcluster.Writer, newPod *corev1.Pod) []nfcluster.Episode {
	s.t.Helper()
	s.waitLines(w, 1)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		lines, err := w.Lines()
		if err != nil {
			s.t.Fatal(err)
		}
		eps, err := nfcluster.CheckOneWriter(lines)
		if err != nil {
			s.t.Fatalf("writer log: %v", err)
		}
		if last := eps[len(eps)-1]; last.UID == string(newPod.UID) && last.Lines >= 3 {
			if last.Found <= eps[0].Lines {
				s.t.Errorf("the new pod found %d lines, want more than the first pod's %d", last.Found, eps[0].Lines)
			}
			return eps
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("the new pod %s is not writing: episodes %+v", newPod.UID, eps)
		}
	}
}

func describe(eps []nfcluster.Episode) string {
	var b strings.Builder
	for _, e := range eps {
		fmt.Fprintf(&b, "[pod %s on %s: lines %d..%d, %d writes, found %d] ", e.UID, e.Node, e.First+1, e.Last+1, e.Lines, e.Found)
	}
	return b.String()
}

var metaGet = metav1.GetOptions{}

func nodeReady(n *corev1.Node) bool { return cluster.NodeReady(n) }
