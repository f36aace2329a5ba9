package kube

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// TestMaintenanceDrain drives a maintenance against the real apiserver as the coordinator's
// ServiceAccount: start cordons and records who asked; the controller evicts through the Eviction
// API every pod but the DaemonSet's and the ended one; a PodDisruptionBudget's refusal is reported
// as blocked and tried again; the drain is done once the evicted pods are gone; stop uncordons
// only what nodefence cordoned.
func TestMaintenanceDrain(t *testing.T) {
	ctx := testContext(t)
	w := newWriter(t)
	const ns, node, other = "maint", "maint-1", "maint-2"
	createNamespace(t, ctx, ns)
	createNode(t, ctx, node)
	createNode(t, ctx, other)
	guarded := func(p *corev1.Pod) { p.Labels = map[string]string{"app": "guarded"} }
	createPods(t, ctx,
		testPod(ns, "web-0", node, nil),
		testPod(ns, "db-0", node, guarded),
		testPod(ns, "agent-x", node, ownedByKind("DaemonSet")),
		testPod(ns, "job-done", node, nil),
		testPod(ns, "web-1", other, nil),
	)
	setPhase(t, ctx, ns, "job-done", corev1.PodSucceeded)
	setPhase(t, ctx, ns, "db-0", corev1.PodRunning) // the Eviction API ignores budgets for pending pods
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "guarded", Namespace: ns},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: new(intstr.FromInt32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "guarded"}}}}
	if _, err := admin.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, pdb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	if err := w.StartMaintenance(ctx, node, "kernel upgrade", "operator/alice", true); err != nil {
		t.Fatal(err)
	}
	n := getNode(t, ctx, node)
	active, reason, st := MaintenanceOf(n)
	if !active || reason != "kernel upgrade" || st.By != "operator/alice" || !st.Drain || !st.Cordoned || !n.Spec.Unschedulable || st.Since.IsZero() {
		t.Fatalf("after start: active %v reason %q state %+v unschedulable %v", active, reason, st, n.Spec.Unschedulable)
	}

	now := time.Now()
	c := NewMaintenanceController(w, nodeLister(ctx), nil, func() time.Time { return now })
	if err := c.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	m, err := c.View(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	if got := podStates(m); got != "maint/db-0=blocked maint/web-0=terminating" || m.Kept != 2 || m.Drained || !m.Cordoned || m.Requester != "operator/alice" {
		t.Fatalf("after a pass: %s, kept %d, drained %v, cordoned %v, by %q (%v)", got, m.Kept, m.Drained, m.Cordoned, m.Requester, m.Pods)
	}
	if d := m.Pods[0].Detail; !strings.Contains(d, "disruption budget") {
		t.Errorf("the blocked pod's detail %q does not name the disruption budget", d)
	}
	// A refused eviction is not tried again before EvictRetry; then it is, and it goes through.
	if err := admin.PolicyV1().PodDisruptionBudgets(ns).Delete(ctx, "guarded", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if m, _ = c.View(ctx, node); podStates(m) != "maint/db-0=blocked maint/web-0=terminating" {
		t.Fatalf("retried before EvictRetry: %s", podStates(m))
	}
	now = now.Add(EvictRetry)
	if err := c.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if m, _ = c.View(ctx, node); podStates(m) != "maint/db-0=terminating maint/web-0=terminating" {
		t.Fatalf("after EvictRetry: %s", podStates(m))
	}
	// No kubelet here: end the terminating pods as it would, then the node is drained.
	for _, name := range []string{"db-0", "web-0"} {
		if err := admin.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))}); err != nil {
			t.Fatal(err)
		}
	}
	if m, _ = c.View(ctx, node); !m.Drained || len(m.Pods) != 0 {
		t.Fatalf("after the pods ended: drained %v, %s", m.Drained, podStates(m))
	}
	if _, err := admin.CoreV1().Pods(ns).Get(ctx, "web-1", metav1.GetOptions{}); err != nil {
		t.Fatalf("the other node's pod: %v", err)
	}

	if err := w.StopMaintenance(ctx, node); err != nil {
		t.Fatal(err)
	}
	n = getNode(t, ctx, node)
	if active, _, _ := MaintenanceOf(n); active || n.Spec.Unschedulable || n.Annotations[AnnotationMaintenanceState] != "" {
		t.Fatalf("after stop: active %v, unschedulable %v, annotations %v", active, n.Spec.Unschedulable, n.Annotations)
	}

	// A node an operator cordoned before stays cordoned after the maintenance.
	cordon(t, ctx, other)
	if err := w.StartMaintenance(ctx, other, "disk swap", "operator/bob", false); err != nil {
		t.Fatal(err)
	}
	if err := c.Pass(ctx); err != nil { // no drain asked: nothing evicted
		t.Fatal(err)
	}
	if p, err := admin.CoreV1().Pods(ns).Get(ctx, "web-1", metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil {
		t.Fatalf("a maintenance without drain evicted %s: %v", "web-1", err)
	}
	if err := w.StopMaintenance(ctx, other); err != nil {
		t.Fatal(err)
	}
	if n := getNode(t, ctx, other); !n.Spec.Unschedulable {
		t.Fatal("stop uncordoned a node nodefence had not cordoned")
	}
}

func nodeLister(ctx context.Context) func() ([]*corev1.Node, error) {
	return func() ([]*corev1.Node, error) {
		list, err := admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: labels.Everything().String()})
		if err != nil {
			return nil, err
		}
		out := make([]*corev1.Node, len(list.Items))
		for i := range list.Items {
			out[i] = &list.Items[i]
		}
		return out, nil
	}
}

// podStates renders a maintenance's pods as ns/name=state, in order.
func podStates(m *coordv1.Maintenance) string {
	var s []string
	for _, p := range m.GetPods() {
		s = append(s, p.Namespace+"/"+p.Name+"="+strings.ToLower(strings.TrimPrefix(p.State.String(), "MAINTENANCE_POD_STATE_")))
	}
	return strings.Join(s, " ")
}

func setPhase(t *testing.T, ctx context.Context, ns, name string, phase corev1.PodPhase) {
	t.Helper()
	p, err := admin.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status.Phase = phase
	if _, err := admin.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func cordon(t *testing.T, ctx context.Context, node string) {
	t.Helper()
	n := getNode(t, ctx, node)
	n.Spec.Unschedulable = true
	if _, err := admin.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}
