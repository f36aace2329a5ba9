package clustere2e

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodefence/nodefence/coordinator/kube"
	"github.com/nodefence/nodefence/testbed/nfcluster"
)

// TestMaintenanceDrain: fencectl maintenance start on the writer's node cordons it and drains it
// through the Eviction API on the real cluster, following the drain until nothing is left to move;
// the StatefulSet's writer runs again on another node and finds its data, the node's DaemonSet-style
// node agent stays, and nothing is fenced; maintenance stop uncordons the node.
func TestMaintenanceDrain(t *testing.T) {
	s := start(t, nfcluster.Options{})
	w, pod := s.writer("maint")
	node := pod.Spec.NodeName
	t0 := time.Now()
	out, err := s.d.Fencectl(s.ctx, "maintenance", "start", node, "--reason", "kernel upgrade", "--timeout=150s")
	if err != nil {
		t.Fatalf("fencectl maintenance start: %v\n%s", err, out)
	}
	t.Logf("fencectl maintenance start (%s):\n%s", time.Since(t0).Round(time.Millisecond), out)
	if !strings.Contains(out, node+" drained") || !strings.Contains(out, "cordoned") {
		t.Fatalf("fencectl did not report the drain: %s", out)
	}
	n, err := s.admin.CoreV1().Nodes().Get(s.ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !n.Spec.Unschedulable || n.Annotations[kube.AnnotationMaintenance] != "kernel upgrade" {
		t.Fatalf("%s after start: unschedulable %v, annotations %v", node, n.Spec.Unschedulable, n.Annotations)
	}
	newPod := s.recovered(w, pod.UID, node, 2*time.Minute)
	t.Logf("writer evicted from %s runs on %s %s after the maintenance started", node, newPod.Spec.NodeName, time.Since(t0).Round(time.Millisecond))
	eps := s.checkLog(w, newPod)
	t.Logf("writer log: %s", describe(eps))
	if fs := s.records(node); len(fs) != 0 {
		t.Fatalf("%s fenced during a drain: %v", node, ids(fs))
	}

	out, err = s.d.Fencectl(s.ctx, "maintenance", "status", node)
	if err != nil || !strings.Contains(out, "drained") {
		t.Fatalf("fencectl maintenance status: %v\n%s", err, out)
	}
	out, err = s.d.Fencectl(s.ctx, "maintenance", "stop", node)
	if err != nil || !strings.Contains(out, "not in maintenance") {
		t.Fatalf("fencectl maintenance stop: %v\n%s", err, out)
	}
	if n, err = s.admin.CoreV1().Nodes().Get(s.ctx, node, metav1.GetOptions{}); err != nil || n.Spec.Unschedulable {
		t.Fatalf("%s after stop: unschedulable %v (%v)", node, n.Spec.Unschedulable, err)
	}
}
