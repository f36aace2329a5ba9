package kubepods

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/types/known/durationpb"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nodefence/nodefence/node-agent/eviction"
	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

// runSource starts a Source for node as the agent until the end of the test.
func runSource(t *testing.T, node string, usage UsageReader, opts ...SourceOption) *Source {
	t.Helper()
	src, err := NewSource(agentClient(t, nil), node, usage, testLog(t), opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = src.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return src
}

// TestSourceListsThisNodesPods: only the node's unfinished pods, with the QoS class the apiserver
// also computed, the priority its admission resolved, the requests, the markers, and the usage of
// the one pod that has a cgroup.
func TestSourceListsThisNodesPods(t *testing.T) {
	ctx := testContext(t)
	ns := namespace(ctx, t)
	const node, other = "node-src-a", "node-src-b"
	mk := func(s podSpec) *corev1.Pod { return createPod(ctx, t, ns, s) }
	guaranteed := mk(podSpec{name: "guaranteed", node: node, priorityClass: "nf-high",
		requests: rl("cpu", "1", "memory", "1Gi"), limits: rl("cpu", "1", "memory", "1Gi")})
	mk(podSpec{name: "burstable", node: node, priorityClass: "nf-mid", requests: rl("memory", "100Mi", "ephemeral-storage", "2Gi")})
	mk(podSpec{name: "besteffort", node: node, grace: 5})
	mk(podSpec{name: "daemon", node: node, daemonSet: true, requests: rl("memory", "10Mi")})
	mk(podSpec{name: "kube-proxy", node: node, mirror: true, priorityClass: "system-node-critical"})
	done := mk(podSpec{name: "finished", node: node})
	done.Status.Phase = corev1.PodSucceeded
	if _, err := admin.CoreV1().Pods(ns).UpdateStatus(ctx, done, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	mk(podSpec{name: "elsewhere", node: other})
	mk(podSpec{name: "unscheduled"})

	// A cgroup v2 tree, cgroupfs driver, with the guaranteed pod's cgroup: 512Mi - 128Mi.
	root := t.TempDir()
	dir := filepath.Join(root, PodCgroup(CgroupDriverCgroupfs, eviction.Guaranteed, string(guaranteed.UID)))
	for path, content := range map[string]string{
		filepath.Join(root, "cgroup.controllers"): "memory pids\n",
		filepath.Join(dir, "memory.current"):      "536870912\n",
		filepath.Join(dir, "memory.stat"):         "anon 402653184\ninactive_file 134217728\n",
		filepath.Join(dir, "pids.current"):        "12\n",
	} {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	src := runSource(t, node, Cgroups{Root: root})

	var got []eviction.Pod
	eventually(ctx, t, "the node's five pods", func() bool {
		pods, err := src.Pods(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got = nil
		for _, p := range pods {
			if p.Namespace == ns {
				got = append(got, p)
			}
		}
		return len(got) == 5
	})
	for i := range got {
		got[i].UID = "" // checked against the apiserver below
	}
	want := []eviction.Pod{
		{Namespace: ns, Name: "besteffort", QoS: eviction.BestEffort, GracePeriod: 5 * time.Second, MemoryUsageUnknown: true},
		{Namespace: ns, Name: "burstable", Priority: 10000, QoS: eviction.Burstable, GracePeriod: 30 * time.Second,
			MemoryRequest: 100 << 20, StorageRequest: 2 << 30, MemoryUsageUnknown: true},
		{Namespace: ns, Name: "daemon", QoS: eviction.Burstable, GracePeriod: 30 * time.Second, MemoryRequest: 10 << 20,
			MemoryUsageUnknown: true, DaemonSet: true},
		{Namespace: ns, Name: "guaranteed", Priority: 100000, QoS: eviction.Guaranteed, GracePeriod: 30 * time.Second,
			MemoryRequest: 1 << 30, MemoryUsage: 384 << 20, Processes: 12},
		{Namespace: ns, Name: "kube-proxy", Priority: 2000001000, QoS: eviction.BestEffort, GracePeriod: 30 * time.Second,
			MemoryUsageUnknown: true, Static: true, Critical: true},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("pods (-want +got):\n%s", diff)
	}

	// The QoS class computed here is the one the apiserver computed.
	api, err := src.APIPods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range api {
		if p.Namespace != ns {
			continue
		}
		if got := QoS(p).String(); got != string(p.Status.QOSClass) {
			t.Errorf("%s: QoS %s; the apiserver says %s", p.Name, got, p.Status.QOSClass)
		}
		if p.Spec.NodeName != node {
			t.Errorf("%s is on %q", p.Name, p.Spec.NodeName)
		}
	}
}

// TestSourceMeasuresDisk: PodsWithDisk gives each pod of the node the disk use of its emptyDirs and
// logs, found by the uid and names the apiserver gave it; a pod without directories uses none.
// Pods, which memory and pid ranking and the graceful shutdown use, does not walk the directories.
func TestSourceMeasuresDisk(t *testing.T) {
	ctx := testContext(t)
	ns := namespace(ctx, t)
	const node = "node-disk"
	filled := createPod(ctx, t, ns, podSpec{name: "filled", node: node})
	createPod(ctx, t, ns, podSpec{name: "bare", node: node})

	ref := PodRef{Namespace: ns, Name: filled.Name, UID: string(filled.UID)}
	l := newDiskLayout(t, ref)
	l.file(filepath.Join(l.dir(filepath.Join(l.volumes, "cache")), "blob"), 250_000)
	l.countedInLogs = true
	l.file(filepath.Join(l.dir(filepath.Join(l.dir(l.podLogs), "app")), "0.log"), 60_000)
	src := runSource(t, node, nil, WithDisk(l.disk()))

	var got map[string][2]eviction.DiskUsage
	eventually(ctx, t, "the node's two pods", func() bool {
		pods, err := src.PodsWithDisk(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got = map[string][2]eviction.DiskUsage{}
		for _, p := range pods {
			got[p.Name] = [2]eviction.DiskUsage{p.Disk, p.DiskInodes}
		}
		return len(got) == 2
	})
	want := map[string][2]eviction.DiskUsage{"filled": {l.bytes, l.inodes}, "bare": {}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("disk use by pod, bytes and inodes (-want +got):\n%s", diff)
	}
	plain, err := src.Pods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range plain {
		if p.Disk != (eviction.DiskUsage{}) || p.DiskInodes != (eviction.DiskUsage{}) {
			t.Errorf("Pods measured %s's disk: %+v, %+v; only PodsWithDisk should", p.Name, p.Disk, p.DiskInodes)
		}
	}
	// Allocated bytes, not apparent sizes: half the files' sizes is slack for any filesystem, and
	// still tells the files from their directories.
	if l.bytes.LocalVolumes < 250_000/2 || l.bytes.Logs < 60_000/2 {
		t.Errorf("the layout takes %+v bytes; want about the files' sizes", l.bytes)
	}
}

// TestEvictorHonoursPDB: a granted pod without a budget is evicted (Terminating, with the grant's
// grace period: no kubelet finishes it); a pod whose PodDisruptionBudget allows no disruption
// gets 429s, is retried and never deleted, and is evicted once the budget allows it.
func TestEvictorHonoursPDB(t *testing.T) {
	ctx := testContext(t)
	ns := namespace(ctx, t)
	const node = "node-ev"
	free := createPod(ctx, t, ns, podSpec{name: "free", node: node})
	guarded := createPod(ctx, t, ns, podSpec{name: "guarded", node: node, labels: map[string]string{"app": "guarded"}})
	minAvailable := intstr.FromInt32(1)
	pdb, err := admin.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "guarded"},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: &minAvailable,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "guarded"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// What the disruption controller (absent here) would write: the budget is spent.
	pdb.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: pdb.Generation, DisruptionsAllowed: 0,
		CurrentHealthy: 1, DesiredHealthy: 1, ExpectedPods: 1}
	if pdb, err = admin.PolicyV1().PodDisruptionBudgets(ns).UpdateStatus(ctx, pdb, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	reqs := &requestLog{}
	ev := NewEvictor(agentClient(t, reqs.wrap), EvictorConfig{RetryInterval: 100 * time.Millisecond, Log: testLog(t)})
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- ev.Run(rctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	getPod := func(name string) *corev1.Pod {
		p, err := admin.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	grant := func(p *corev1.Pod, grace time.Duration) {
		ev.Grant(&agentv1.EvictionGrant{Signal: "memory.available", Pods: []*agentv1.EvictionCandidate{
			{Namespace: p.Namespace, Name: p.Name, Uid: string(p.UID), GracePeriod: durationpb.New(grace)}}})
	}

	grant(free, 7*time.Second)
	eventually(ctx, t, "free to be Terminating", func() bool { return getPod("free").DeletionTimestamp != nil })
	if g := getPod("free").DeletionGracePeriodSeconds; g == nil || *g != 7 {
		t.Errorf("free: deletion grace period %v; want 7", g)
	}

	grant(guarded, 0)
	eventually(ctx, t, "three refused evictions of guarded", func() bool { return reqs.count("POST", "/pods/guarded/eviction") >= 3 })
	if p := getPod("guarded"); p.DeletionTimestamp != nil {
		t.Fatalf("guarded is being deleted despite its budget")
	}
	if n := ev.Pending(); n != 1 {
		t.Errorf("Pending() = %d; want 1", n)
	}
	out, _, err := ev.Evict(ctx, eviction.Candidate{Namespace: ns, Name: "guarded", UID: string(guarded.UID)})
	if out != Retry {
		t.Errorf("Evict(guarded) = %v, %v; want retry (429)", out, err)
	}

	// Another replica became healthy: the budget allows one disruption, and the next retry evicts.
	pdb.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: pdb.Generation, DisruptionsAllowed: 1,
		CurrentHealthy: 2, DesiredHealthy: 1, ExpectedPods: 2}
	if _, err := admin.PolicyV1().PodDisruptionBudgets(ns).UpdateStatus(ctx, pdb, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(ctx, t, "guarded to be Terminating", func() bool { return getPod("guarded").DeletionTimestamp != nil })
	if g := getPod("guarded").DeletionGracePeriodSeconds; g == nil || *g != 1 {
		t.Errorf("guarded: deletion grace period %v; want 1 (a hard eviction through the API keeps the kubelet's confirmation)", g)
	}
	eventually(ctx, t, "the queue to empty", func() bool { return ev.Pending() == 0 })
	if n := reqs.count("DELETE", ""); n != 0 {
		t.Errorf("%d DELETE requests; the evictor must only use the Eviction API", n)
	}

	// A name now held by another pod (another uid) is not evicted.
	other := createPod(ctx, t, ns, podSpec{name: "recreated", node: node})
	out, _, err = ev.Evict(ctx, eviction.Candidate{Namespace: ns, Name: other.Name, UID: "00000000-0000-0000-0000-000000000000"})
	if out != Gone {
		t.Errorf("Evict with a stale uid = %v, %v; want gone", out, err)
	}
	if getPod("recreated").DeletionTimestamp != nil {
		t.Error("the recreated pod was evicted")
	}
	if out, _, err := ev.Evict(ctx, eviction.Candidate{Namespace: ns, Name: "nonexistent"}); out != Gone {
		t.Errorf("Evict(nonexistent) = %v, %v; want gone", out, err)
	}
}

// TestEvictUnsyncedBudget: a budget the disruption controller has not processed yet is refused
// with a Retry-After, which comes back as the delay at once (client-go does not sleep on it).
func TestEvictUnsyncedBudget(t *testing.T) {
	ctx := testContext(t)
	ns := namespace(ctx, t)
	p := createPod(ctx, t, ns, podSpec{name: "db-0", node: "node-unsynced", labels: map[string]string{"app": "db"}})
	one := intstr.FromInt32(1)
	if _, err := admin.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "db"},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: &one,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ev := NewEvictor(agentClient(t, nil), EvictorConfig{MaxRetryDelay: 4 * time.Second, Log: testLog(t)})
	start := time.Now()
	out, delay, err := ev.Evict(ctx, eviction.Candidate{Namespace: ns, Name: p.Name, UID: string(p.UID)})
	if out != Retry || delay != 4*time.Second {
		t.Errorf("Evict = %v, %v, %v; want retry after 4s (the apiserver's 10s, capped)", out, delay, err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("Evict took %v: it must not wait out the Retry-After itself", took)
	}
}

// TestKillerEvictsLikeKubelet: a local eviction (hard threshold or fallback), as the agent's
// ServiceAccount: the pod's status is Failed/Evicted with kubelet's message and a DisruptionTarget
// condition (reason TerminationByKubelet), an Evicted Warning Event is on the pod, and the pod is
// being deleted with the eviction's grace period (at least 1 s). A stale uid evicts nothing.
func TestKillerEvictsLikeKubelet(t *testing.T) {
	ctx := testContext(t)
	ns := namespace(ctx, t)
	const node = "node-kill"
	pod := createPod(ctx, t, ns, podSpec{name: "hog", node: node})
	other := createPod(ctx, t, ns, podSpec{name: "renamed", node: node})
	k := NewKiller(agentClient(t, nil), node, nil, 0, testLog(t))
	r := eviction.Reclaim{Threshold: eviction.Threshold{Signal: eviction.SignalMemoryAvailable, Value: eviction.Value{Quantity: 100 << 20}},
		Observed: eviction.Observation{Available: 50 << 20, Capacity: 8 << 30}}
	msg, err := k.Kill(ctx, eviction.Candidate{Namespace: ns, Name: "hog", UID: string(pod.UID), GracePeriod: 0}, r)
	if err != nil {
		t.Fatal(err)
	}
	const want = "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. "
	if msg != want {
		t.Errorf("message %q, want %q", msg, want)
	}
	got, err := admin.CoreV1().Pods(ns).Get(ctx, "hog", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase != corev1.PodFailed || got.Status.Reason != "Evicted" || got.Status.Message != want {
		t.Errorf("status %s/%s/%q; want Failed/Evicted/%q", got.Status.Phase, got.Status.Reason, got.Status.Message, want)
	}
	var dt *corev1.PodCondition
	for i, c := range got.Status.Conditions {
		if c.Type == corev1.DisruptionTarget {
			dt = &got.Status.Conditions[i]
		}
	}
	if dt == nil || dt.Status != corev1.ConditionTrue || dt.Reason != "TerminationByKubelet" || dt.Message != want {
		t.Errorf("DisruptionTarget condition %+v", dt)
	}
	if got.DeletionTimestamp == nil || got.DeletionGracePeriodSeconds == nil || *got.DeletionGracePeriodSeconds != 1 {
		t.Errorf("deletion %v grace %v; want terminating with 1 s", got.DeletionTimestamp, got.DeletionGracePeriodSeconds)
	}
	evs, err := admin.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=hog"})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs.Items) != 1 || evs.Items[0].Reason != "Evicted" || evs.Items[0].Type != corev1.EventTypeWarning || evs.Items[0].Message != want {
		t.Errorf("events %+v; want one Warning Evicted", evs.Items)
	}

	if _, err := k.Kill(ctx, eviction.Candidate{Namespace: ns, Name: "renamed", UID: "00000000-0000-0000-0000-000000000000"}, r); err == nil {
		t.Error("Kill with a stale uid succeeded")
	}
	if p, err := admin.CoreV1().Pods(ns).Get(ctx, "renamed", metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodFailed || p.UID != other.UID {
		t.Errorf("the pod holding the name was touched: %v %+v", err, p.Status)
	}
}

// TestSourcePodGone answers the CRI garbage collection as kubelet's pod workers do once synced.
// Containers (PodGone): a pod still on the node and not finished keeps its newest dead containers;
// a finished pod, a pod deleted or never bound here, does not. Logs (PodRemoved): only a pod gone
// from the node or evicted loses them. A static pod is found by the uid its mirror pod names.
func TestSourcePodGone(t *testing.T) {
	ctx := testContext(t)
	ns := namespace(ctx, t)
	const node = "node-gone"
	running := createPod(ctx, t, ns, podSpec{name: "running", node: node})
	createPod(ctx, t, ns, podSpec{name: "static", node: node, mirror: true}) // kubelet's uid "hash"
	finished := createPod(ctx, t, ns, podSpec{name: "finished", node: node})
	finished.Status.Phase = corev1.PodFailed
	if _, err := admin.CoreV1().Pods(ns).UpdateStatus(ctx, finished, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	evicted := createPod(ctx, t, ns, podSpec{name: "evicted", node: node})
	evicted.Status.Phase, evicted.Status.Reason = corev1.PodFailed, "Evicted"
	if _, err := admin.CoreV1().Pods(ns).UpdateStatus(ctx, evicted, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	deleted := createPod(ctx, t, ns, podSpec{name: "deleted", node: node})
	elsewhere := createPod(ctx, t, ns, podSpec{name: "elsewhere", node: "node-gone-other"})
	src := runSource(t, node, nil)
	eventually(ctx, t, "the evicted pod seen as evicted", func() bool { return src.PodRemoved(string(evicted.UID)) })
	for _, tc := range []struct {
		name          string
		uid           string
		gone, removed bool
	}{
		{"running", string(running.UID), false, false},
		{"static (kubelet's uid)", "hash", false, false},
		{"finished", string(finished.UID), true, false},
		{"evicted", string(evicted.UID), true, true},
		{"deleted, not yet", string(deleted.UID), false, false},
		{"on another node", string(elsewhere.UID), true, true},
		{"unknown", "no-such-uid", true, true},
	} {
		if got := src.PodGone(tc.uid); got != tc.gone {
			t.Errorf("%s: PodGone = %v, want %v", tc.name, got, tc.gone)
		}
		if got := src.PodRemoved(tc.uid); got != tc.removed {
			t.Errorf("%s: PodRemoved = %v, want %v", tc.name, got, tc.removed)
		}
	}
	zero := int64(0)
	if err := admin.CoreV1().Pods(ns).Delete(ctx, deleted.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	eventually(ctx, t, "the deleted pod seen as gone", func() bool {
		return src.PodGone(string(deleted.UID)) && src.PodRemoved(string(deleted.UID))
	})
}
