package kube

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
)

// createNode creates a Node as admin (no kubelet here) and returns it.
func createNode(t *testing.T, ctx context.Context, name string, taints ...corev1.Taint) *corev1.Node {
	t.Helper()
	n, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"topology.kubernetes.io/zone": "a"}},
		Spec:       corev1.NodeSpec{Taints: taints},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func getNode(t *testing.T, ctx context.Context, name string) *corev1.Node {
	t.Helper()
	n, err := admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// taintSet renders a node's taints as key=value:effect strings, in order.
func taintSet(n *corev1.Node) []string {
	var out []string
	for _, t := range n.Spec.Taints {
		s := t.Key
		if t.Value != "" {
			s += "=" + t.Value
		}
		out = append(out, s+":"+string(t.Effect))
	}
	return out
}

// TestTaintConflicts writes taints concurrently to one node: every write must survive the
// apiserver's 409 Conflicts.
func TestTaintConflicts(t *testing.T) {
	ctx := testContext(t)
	w := newWriter(t)
	createNode(t, ctx, "taint-conflict")
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := w.updateTaints(ctx, "taint-conflict", []corev1.Taint{{Key: fmt.Sprintf("example.com/t%d", i), Effect: corev1.TaintEffectNoExecute}}, nil)
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if got := len(getNode(t, ctx, "taint-conflict").Spec.Taints); got != 9 {
		t.Errorf("%d taints, want 8 + admission's not-ready:NoSchedule", got)
	}
}

// podSpec makes a pod bound to node (no scheduler, no kubelet here).
func testPod(ns, name, node string, mutate func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "registry.example/app:1"}}},
	}
	if mutate != nil {
		mutate(p)
	}
	return p
}

func ownedByKind(kind string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: kind, Name: "owner", UID: types.UID("uid-" + kind), Controller: new(true)}}
	}
}

func withPVC(claim string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "data", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}})
	}
}

func createNamespace(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func createPods(t *testing.T, ctx context.Context, pods ...*corev1.Pod) {
	t.Helper()
	for _, p := range pods {
		if _, err := admin.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

func createVolumeAttachment(t *testing.T, ctx context.Context, name, node, pv string) {
	t.Helper()
	_, err := admin.StorageV1().VolumeAttachments().Create(ctx, &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: "csi.example.com", NodeName: node,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

func TestReleaseNode(t *testing.T) {
	ctx := testContext(t)
	w := newWriter(t)
	const ns, node, other = "release", "release-1", "release-2"
	createNamespace(t, ctx, ns)
	createNode(t, ctx, node)
	createNode(t, ctx, other)
	tolerate := func(p *corev1.Pod) {
		p.Spec.Tolerations = []corev1.Toleration{{Key: TaintKeyOutOfService, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}}
	}
	createPods(t, ctx,
		testPod(ns, "db-0", node, func(p *corev1.Pod) { ownedByKind("StatefulSet")(p); withPVC("data-db-0")(p) }),
		testPod(ns, "agent-abcde", node, ownedByKind("DaemonSet")),
		testPod(ns, "tolerant", node, tolerate),
		testPod(ns, "db-1", other, func(p *corev1.Pod) { ownedByKind("StatefulSet")(p); withPVC("data-db-1")(p) }),
	)
	createVolumeAttachment(t, ctx, "csi-release-1", node, "pv-db-0")
	createVolumeAttachment(t, ctx, "csi-release-2", other, "pv-db-1")

	need, why, err := w.NeedsFencing(ctx, node, PolicyStateful)
	if err != nil || !need || !cmp.Equal(why, []string{ns + "/db-0"}) {
		t.Fatalf("NeedsFencing = %v %v %v, want true [release/db-0]", need, why, err)
	}

	got, err := w.ReleaseNode(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	want := Released{Tainted: true, DeletedPods: []string{ns + "/db-0"}, KeptPods: []string{ns + "/agent-abcde", ns + "/tolerant"},
		DeletedVolumeAttachments: []string{"csi-release-1"}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("ReleaseNode (-want +got):\n%s", d)
	}
	pods, err := admin.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, p := range pods.Items {
		left = append(left, p.Spec.NodeName+"/"+p.Name)
	}
	if d := cmp.Diff([]string{node + "/agent-abcde", other + "/db-1", node + "/tolerant"}, left); d != "" {
		t.Errorf("pods left (-want +got):\n%s", d)
	}
	vas, err := admin.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(vas.Items) != 1 || vas.Items[0].Name != "csi-release-2" {
		t.Errorf("volumeattachments left: %v, want only csi-release-2", vas.Items)
	}
	if d := cmp.Diff([]string{"node.kubernetes.io/not-ready:NoSchedule", "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"}, taintSet(getNode(t, ctx, node))); d != "" {
		t.Errorf("taints (-want +got):\n%s", d)
	}
	if need, _, _ := w.NeedsFencing(ctx, node, PolicyStateful); need {
		t.Error("NeedsFencing after the release: true")
	}

	// Again: nothing left to do.
	again, err := w.ReleaseNode(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(Released{KeptPods: want.KeptPods}, again); d != "" {
		t.Errorf("second ReleaseNode (-want +got):\n%s", d)
	}

	removed, err := w.Unrelease(ctx, node)
	if err != nil || !removed {
		t.Fatalf("Unrelease = %v, %v", removed, err)
	}
	if d := cmp.Diff([]string{"node.kubernetes.io/not-ready:NoSchedule"}, taintSet(getNode(t, ctx, node))); d != "" {
		t.Errorf("taints after Unrelease (-want +got):\n%s", d)
	}
	if removed, err := w.Unrelease(ctx, node); err != nil || removed {
		t.Errorf("second Unrelease = %v, %v; want false, nil", removed, err)
	}
	// The other node was never touched.
	if ts := taintSet(getNode(t, ctx, other)); len(ts) != 1 {
		t.Errorf("other node taints: %v", ts)
	}
}

func TestNeedsFencing(t *testing.T) {
	ctx := testContext(t)
	w := newWriter(t)
	const ns = "needs"
	createNamespace(t, ctx, ns)
	finished := func(p *corev1.Pod) { withPVC("old")(p) }
	createPods(t, ctx,
		testPod(ns, "web", "nf-stateless", ownedByKind("ReplicaSet")),
		testPod(ns, "ds-pvc", "nf-stateless", func(p *corev1.Pod) { ownedByKind("DaemonSet")(p); withPVC("x")(p) }),
		testPod(ns, "job-pvc", "nf-stateless", finished),
		testPod(ns, "pvc-only", "nf-pvc", withPVC("data")),
		testPod(ns, "sts-0", "nf-sts", ownedByKind("StatefulSet")),
	)
	// A finished pod's PVC does not count.
	p, err := admin.CoreV1().Pods(ns).Get(ctx, "job-pvc", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status.Phase = corev1.PodSucceeded
	if _, err := admin.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		node   string
		policy Policy
		want   bool
	}{
		{"nf-stateless", PolicyStateful, false},
		{"nf-stateless", PolicyAll, true},
		{"nf-empty", PolicyStateful, false},
		{"nf-empty", PolicyAll, true},
		{"nf-pvc", PolicyStateful, true},
		{"nf-sts", PolicyStateful, true},
	} {
		t.Run(tc.node+"/"+tc.policy.String(), func(t *testing.T) {
			got, why, err := w.NeedsFencing(ctx, tc.node, tc.policy)
			if err != nil || got != tc.want {
				t.Errorf("NeedsFencing = %v %v %v, want %v", got, why, err, tc.want)
			}
		})
	}
}

func TestMirrorFence(t *testing.T) {
	ctx := testContext(t)
	w := newWriter(t)
	t0 := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	rec := &coordv1.NodeFence{
		Id: "host1-20261122T100000.000000000", Node: "host1", Action: coordv1.FenceAction_FENCE_ACTION_OFF,
		Step: coordv1.FenceStep_FENCE_STEP_ISOLATION, Status: coordv1.FenceStatus_FENCE_STATUS_RUNNING,
		Reason: "node silent", RequestedBy: "coordinator", Automatic: true, Epoch: 7,
		CreatedAt: timestamppb.New(t0), UpdatedAt: timestamppb.New(t0.Add(time.Second)),
		Operations: []*coordv1.Operation{{
			OperationId: "host1-20261122T100000.000000000/fc-off/off", Method: "fc-off", Driver: "brocade", Action: "off",
			Epoch: 7, Step: coordv1.FenceStep_FENCE_STEP_ISOLATION, Required: true, StartedAt: timestamppb.New(t0.Add(time.Second)),
		}},
	}
	if err := w.MirrorFence(ctx, rec); err != nil {
		t.Fatal(err)
	}
	spec, st, err := w.GetFence(ctx, rec.Id)
	if err != nil {
		t.Fatal(err)
	}
	wantSpec := FenceSpec{ID: rec.Id, Node: "host1", Action: "off", Reason: "node silent", RequestedBy: "coordinator", Automatic: true}
	if d := cmp.Diff(wantSpec, spec); d != "" {
		t.Errorf("spec (-want +got):\n%s", d)
	}
	if st.Step != "isolation" || st.Status != "running" || st.Epoch != 7 || len(st.Operations) != 1 || st.Operations[0].Driver != "brocade" {
		t.Errorf("status = %+v", st)
	}

	// Progress: power management done, confirmed off.
	rec.Step, rec.Status, rec.Retries = coordv1.FenceStep_FENCE_STEP_POWER_MANAGEMENT, coordv1.FenceStatus_FENCE_STATUS_DONE, 1
	rec.UpdatedAt, rec.ConfirmedOffAt, rec.FinishedAt = timestamppb.New(t0.Add(5*time.Second)), timestamppb.New(t0.Add(4*time.Second)), timestamppb.New(t0.Add(5*time.Second))
	rec.Operations[0].Result, rec.Operations[0].State = coordv1.OperationResult_OPERATION_RESULT_CONFIRMED, driverv1.PowerState_POWER_STATE_OFF
	rec.Operations[0].FinishedAt = timestamppb.New(t0.Add(2 * time.Second))
	rec.Operations = append(rec.Operations, &coordv1.Operation{OperationId: rec.Id + "/eaton-off/off", Method: "eaton-off", Driver: "pdu", Action: "off",
		Epoch: 7, Step: coordv1.FenceStep_FENCE_STEP_POWER_MANAGEMENT, Result: coordv1.OperationResult_OPERATION_RESULT_CONFIRMED,
		State: driverv1.PowerState_POWER_STATE_OFF, StartedAt: timestamppb.New(t0.Add(3 * time.Second)), FinishedAt: timestamppb.New(t0.Add(4 * time.Second))})
	if err := w.MirrorFence(ctx, rec); err != nil {
		t.Fatal(err)
	}
	_, st, err = w.GetFence(ctx, rec.Id)
	if err != nil {
		t.Fatal(err)
	}
	mt := func(d time.Duration) *metav1.Time { m := metav1.NewTime(t0.Add(d)); return &m }
	wantSt := FenceStatus{
		Step: "power_management", Status: "done", Retries: 1, Epoch: 7,
		CreatedAt: mt(0), UpdatedAt: mt(5 * time.Second), FinishedAt: mt(5 * time.Second), ConfirmedOffAt: mt(4 * time.Second),
		Operations: []FenceOperation{
			{OperationID: rec.Id + "/fc-off/off", Method: "fc-off", Driver: "brocade", Action: "off", Step: "isolation", Required: true, Epoch: 7,
				Result: "confirmed", State: "off", StartedAt: mt(time.Second), FinishedAt: mt(2 * time.Second)},
			{OperationID: rec.Id + "/eaton-off/off", Method: "eaton-off", Driver: "pdu", Action: "off", Step: "power_management", Epoch: 7,
				Result: "confirmed", State: "off", StartedAt: mt(3 * time.Second), FinishedAt: mt(4 * time.Second)},
		},
		Conditions: []metav1.Condition{
			{Type: "Fenced", Status: "True", LastTransitionTime: *mt(4 * time.Second), Reason: "ReadBack", Message: "power-off or isolation confirmed; pods may be released"},
			{Type: "Finished", Status: "True", LastTransitionTime: *mt(5 * time.Second), Reason: "Finished", Message: "the record finished"},
			{Type: "Failed", Status: "False", LastTransitionTime: *mt(0), Reason: "NoError", Message: "no error"},
		},
	}
	if d := cmp.Diff(wantSt, st, cmp.Comparer(func(a, b metav1.Time) bool { return a.Equal(&b) })); d != "" {
		t.Errorf("status (-want +got):\n%s", d)
	}

	// A stale record (a deposed leader's late write) does not roll the object back.
	stale := &coordv1.NodeFence{Id: rec.Id, Node: "host1", Step: coordv1.FenceStep_FENCE_STEP_ISOLATION,
		Status: coordv1.FenceStatus_FENCE_STATUS_RUNNING, Epoch: 7, UpdatedAt: timestamppb.New(t0.Add(time.Second))}
	if err := w.MirrorFence(ctx, stale); err != nil {
		t.Fatal(err)
	}
	if _, st, _ := w.GetFence(ctx, rec.Id); st.Status != "done" {
		t.Errorf("stale mirror rolled the status back to %q", st.Status)
	}
	obj, err := w.dyn.Resource(FenceResource).Get(ctx, "host1-20261122t100000.000000000", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("object name: %v", err)
	}
	if obj.GetLabels()[LabelNode] != "host1" {
		t.Errorf("labels = %v", obj.GetLabels())
	}
}
