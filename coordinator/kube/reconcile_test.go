package kube

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/coordinator/fencing"
	"github.com/nodefence/nodefence/coordinator/release"
	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

func TestAgentCondition(t *testing.T) {
	for _, tc := range []struct {
		name string
		view *coordv1.Node
		want corev1.ConditionStatus
	}{
		{"unknown node", nil, corev1.ConditionUnknown},
		{"reporting", &coordv1.Node{Readiness: coordv1.Readiness_READINESS_READY}, corev1.ConditionTrue},
		{"agent down alone", &coordv1.Node{Readiness: coordv1.Readiness_READINESS_READY, AgentDown: true}, corev1.ConditionFalse},
		{"both silent", &coordv1.Node{Readiness: coordv1.Readiness_READINESS_UNKNOWN}, corev1.ConditionFalse},
		{"kubelet down alone, fence policy", &coordv1.Node{Readiness: coordv1.Readiness_READINESS_UNKNOWN, KubeletDown: true}, corev1.ConditionTrue},
	} {
		if got, _, _ := AgentCondition(tc.view); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}

// facts is the coordinator's side of ReleaseFacts for these tests: what etcd and the engine would
// answer, set by the test.
type facts struct {
	mu      sync.Mutex
	fence   *coordv1.NodeFence
	running bool
	view    *coordv1.Node
	proof   *release.Proven
}

func (f *facts) Fence(context.Context, string) (*coordv1.NodeFence, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fence, f.running, nil
}

func (f *facts) Node(context.Context, string) (*coordv1.Node, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.view, nil
}

// Proof is the leader's proof: proven dark for the record set, unless the test set another.
func (f *facts) Proof(context.Context, string) (release.Proven, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.proof != nil {
		return *f.proof, nil
	}
	return release.Proven{Fence: f.fence.GetId(), Verdict: fencing.ProofDark}, nil
}

// The reconciler against a real apiserver, as the coordinator's ServiceAccount: a Node whose
// conditions and taints kubelet and kube-controller-manager wrote (here, as admin under their field
// managers) is released once its fence is confirmed, and restored only after the healthy delay;
// afterwards the coordinator's field manager owns only its own condition, and the not-ready taint
// and the kubelet's conditions are untouched.
func TestReconcilerReleasesAndRestoresOwningOnlyItsFields(t *testing.T) {
	ctx := testContext(t)
	const node = "rec-1"
	createNode(t, ctx, node, corev1.Taint{Key: TaintKeyNotReady, Effect: corev1.TaintEffectNoExecute})
	n := getNode(t, ctx, node)
	beat := metav1.NewTime(time.Now().Add(-time.Hour))
	n.Status.Conditions = []corev1.NodeCondition{
		{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, Reason: "NodeStatusUnknown", LastHeartbeatTime: beat, LastTransitionTime: beat},
		{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientMemory", LastHeartbeatTime: beat, LastTransitionTime: beat},
	}
	if _, err := admin.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{FieldManager: "kube-controller-manager"}); err != nil {
		t.Fatal(err)
	}
	createNamespace(t, ctx, "rec")
	createPods(t, ctx, testPod("rec", "db-0", node, withPVC("data")))

	now := time.Now()
	clock := func() time.Time { return now }
	w, err := New(coordCfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	core := kubernetes.NewForConfigOrDie(coordCfg)
	wit := NewWitness(core, WitnessOptions{})
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go wit.Run(wctx)
	cache.WaitForCacheSync(ctx.Done(), wit.Informer().HasSynced)
	f := &facts{fence: &coordv1.NodeFence{Id: node + "-20261124T120000.000000000", Node: node, Action: coordv1.FenceAction_FENCE_ACTION_OFF,
		Status: coordv1.FenceStatus_FENCE_STATUS_DONE, Epoch: 1, CreatedAt: timestamppb.New(now), UpdatedAt: timestamppb.New(now),
		ConfirmedOffAt: timestamppb.New(now), FinishedAt: timestamppb.New(now)},
		view: &coordv1.Node{Name: node, Readiness: coordv1.Readiness_READINESS_UNKNOWN, Reason: "agent and kubelet silent"}}
	r := NewReconciler(w, wit.Nodes, f, ReconcilerOptions{HealthyDelay: time.Minute, Now: clock})
	sync := func() time.Duration {
		t.Helper()
		// The lister may lag the apiserver by a moment.
		time.Sleep(200 * time.Millisecond)
		after, err := r.Sync(ctx, node)
		if err != nil {
			t.Fatal(err)
		}
		return after
	}
	sync()
	if _, err := admin.CoreV1().Pods("rec").Get(ctx, "db-0", metav1.GetOptions{}); err == nil {
		t.Fatal("pod not released")
	}
	got := taintSet(getNode(t, ctx, node))
	// (Admission adds not-ready:NoSchedule to a new Node.)
	if strings.Join(got, " ") != "node.kubernetes.io/not-ready:NoExecute node.kubernetes.io/not-ready:NoSchedule node.kubernetes.io/out-of-service=nodeshutdown:NoExecute" {
		t.Fatalf("taints after release: %v", got)
	}
	if c := nodeCondition(getNode(t, ctx, node), ConditionAgentReady); c == nil || c.Status != corev1.ConditionFalse {
		t.Fatalf("AgentReady after release: %+v", c)
	}

	// Back: both witnesses, and the Node's Ready (kubelet's) True. The taint stays for the delay.
	f.mu.Lock()
	f.view = &coordv1.Node{Name: node, Readiness: coordv1.Readiness_READINESS_READY, ReadinessChangedAt: timestamppb.New(now)}
	f.mu.Unlock()
	n = getNode(t, ctx, node)
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			n.Status.Conditions[i] = corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
				LastHeartbeatTime: metav1.NewTime(now), LastTransitionTime: metav1.NewTime(now)}
		}
	}
	if _, err := admin.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{FieldManager: "kubelet"}); err != nil {
		t.Fatal(err)
	}
	if after := sync(); after != time.Minute {
		t.Fatalf("requeue after %s, want the healthy delay", after)
	}
	if !hasOutOfService(getNode(t, ctx, node)) {
		t.Fatal("out-of-service taint removed before the healthy delay")
	}
	now = now.Add(61 * time.Second)
	sync()
	final := getNode(t, ctx, node)
	if hasOutOfService(final) {
		t.Fatal("out-of-service taint not removed after the healthy delay")
	}
	if got := taintSet(final); strings.Join(got, " ") != "node.kubernetes.io/not-ready:NoExecute node.kubernetes.io/not-ready:NoSchedule" {
		t.Fatalf("kube-controller-manager's taint touched: %v", got)
	}
	if c := nodeCondition(final, ConditionAgentReady); c == nil || c.Status != corev1.ConditionTrue {
		t.Fatalf("AgentReady after return: %+v", c)
	}
	if c := nodeCondition(final, corev1.NodeMemoryPressure); c == nil || c.Reason != "KubeletHasSufficientMemory" {
		t.Fatalf("kubelet's MemoryPressure touched: %+v", c)
	}
	for _, mf := range final.ManagedFields {
		if mf.Manager != FieldManager || mf.FieldsV1 == nil {
			continue
		}
		var fields map[string]map[string]map[string]any
		_ = json.Unmarshal(mf.FieldsV1.GetRawBytes(), &fields)
		for k := range fields["f:status"]["f:conditions"] {
			if strings.HasPrefix(k, "k:") && !strings.Contains(k, string(ConditionAgentReady)) {
				t.Errorf("the coordinator's field manager owns %s (%s)", k, mf.Operation)
			}
		}
	}
}

func nodeCondition(n *corev1.Node, typ corev1.NodeConditionType) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == typ {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// The witness, as the coordinator's ServiceAccount: Nodes become Configured (zones, the
// exclude-disruption label, the control-plane selector), Lease renewals become kubelet heartbeats,
// a deleted Node becomes Removed.
func TestWitness(t *testing.T) {
	ctx := testContext(t)
	core := kubernetes.NewForConfigOrDie(coordCfg)
	sel, _ := labels.Parse("node-role.kubernetes.io/control-plane")
	wit := NewWitness(core, WitnessOptions{ControlPlane: sel, Fenceable: func(n string) bool { return n == "wit-cp" }})
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go wit.Run(wctx)
	var mu sync.Mutex
	var got []engine.Input
	wit.SetSink(func(in engine.Input) {
		mu.Lock()
		got = append(got, in)
		mu.Unlock()
	})
	_, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "wit-cp", Labels: map[string]string{
		corev1.LabelTopologyZone: "z1", corev1.LabelTopologyRegion: "r1", "node-role.kubernetes.io/control-plane": "", LabelExcludeDisruption: ""}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	renew := time.Now().Add(-time.Hour).Truncate(time.Microsecond)
	holder := "wit-cp"
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "wit-cp", Namespace: NodeLeaseNamespace},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, RenewTime: &metav1.MicroTime{Time: renew}}}
	if _, err := admin.CoordinationV1().Leases(NodeLeaseNamespace).Create(ctx, lease, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait := func(what string, ok func(engine.Input) bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			mu.Lock()
			for _, in := range got {
				if ok(in) {
					mu.Unlock()
					return
				}
			}
			mu.Unlock()
			if time.Now().After(deadline) {
				t.Fatalf("never saw %s; got %v", what, got)
			}
		}
	}
	wait("the Node configured", func(in engine.Input) bool {
		c, ok := in.(engine.Configured)
		return ok && c.Node == "wit-cp" && c.Region == "r1" && c.Zone == "z1" && c.ControlPlane && c.ExcludeDisruption && c.Fenceable
	})
	wait("the Lease's renewTime", func(in engine.Input) bool {
		k, ok := in.(engine.Kubelet)
		return ok && k.Node == "wit-cp" && k.Heartbeat.Equal(renew)
	})
	wait("the apiserver readable", func(in engine.Input) bool {
		a, ok := in.(engine.APIServer)
		return ok && a.Reachable
	})
	later := time.Now().Truncate(time.Microsecond)
	l, err := admin.CoordinationV1().Leases(NodeLeaseNamespace).Get(ctx, "wit-cp", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l.Spec.RenewTime = &metav1.MicroTime{Time: later}
	if _, err := admin.CoordinationV1().Leases(NodeLeaseNamespace).Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("the renewal", func(in engine.Input) bool {
		k, ok := in.(engine.Kubelet)
		return ok && k.Node == "wit-cp" && k.Heartbeat.Equal(later)
	})
	if err := admin.CoreV1().Nodes().Delete(ctx, "wit-cp", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("the deletion", func(in engine.Input) bool {
		r, ok := in.(engine.Removed)
		return ok && r.Node == "wit-cp"
	})
}

// flakyFacts fails its first reads, as etcd or the engine might while a leader starts.
type flakyFacts struct {
	facts
	failures int
}

func (f *flakyFacts) Fence(ctx context.Context, node string) (*coordv1.NodeFence, bool, error) {
	f.mu.Lock()
	if f.failures > 0 {
		f.failures--
		f.mu.Unlock()
		return nil, false, errors.New("etcd unavailable")
	}
	f.mu.Unlock()
	return f.facts.Fence(ctx, node)
}

// A new term's reconciler knows nothing but the Nodes: one pass over every Node (EnqueueAll)
// finishes a release a previous leader left undone, and a pass that fails is retried by the queue
// until it succeeds.
func TestReconcilerFinishesAfterRestartAndRetries(t *testing.T) {
	ctx := testContext(t)
	const node = "rec-2"
	createNode(t, ctx, node)
	createNamespace(t, ctx, "rec2")
	createPods(t, ctx, testPod("rec2", "db-0", node, withPVC("data")))
	w, err := New(coordCfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	wit := NewWitness(kubernetes.NewForConfigOrDie(coordCfg), WitnessOptions{})
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go wit.Run(wctx)
	cache.WaitForCacheSync(ctx.Done(), wit.Informer().HasSynced)
	now := time.Now()
	f := &flakyFacts{failures: 3, facts: facts{
		fence: &coordv1.NodeFence{Id: node + "-20261124T120000.000000000", Node: node, Action: coordv1.FenceAction_FENCE_ACTION_OFF,
			Status: coordv1.FenceStatus_FENCE_STATUS_DONE, Epoch: 1, CreatedAt: timestamppb.New(now), UpdatedAt: timestamppb.New(now),
			ConfirmedOffAt: timestamppb.New(now), FinishedAt: timestamppb.New(now)},
		view: &coordv1.Node{Name: node, Readiness: coordv1.Readiness_READINESS_UNKNOWN},
	}}
	r := NewReconciler(w, wit.Nodes, f, ReconcilerOptions{HealthyDelay: time.Minute,
		RateLimiter: workqueue.NewTypedItemExponentialFailureRateLimiter[string](10*time.Millisecond, 100*time.Millisecond)})
	go r.Run(wctx, 0)
	r.EnqueueAll()
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		_, err := admin.CoreV1().Pods("rec2").Get(ctx, "db-0", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod never released (%v)", err)
		}
	}
	f.mu.Lock()
	left := f.failures
	f.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d failures left: the release did not go through the retries", left)
	}
	if !hasOutOfService(getNode(t, ctx, node)) {
		t.Fatal("no out-of-service taint")
	}
}
