package clustere2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodefence/nodefence/node-agent/kubepods"
	"github.com/nodefence/nodefence/testbed/cluster"
	"github.com/nodefence/nodefence/testbed/logind"
	"github.com/nodefence/nodefence/testbed/nfcluster"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// Node pressure on the real cluster. Every node's pods share a memory limit of their own
// (podsMemory, kubelet's enforced node allocatable), and the agents measure
// allocatableMemory.available on that cgroup, so pressure is per node and bounded, whatever the
// machine's free memory: a hog pod fills hogMiB of a memory-backed emptyDir (tmpfs pages are
// charged to its cgroup and are not inactive file cache, so they count in the working set) and
// holds it until it is evicted. The kubelets have no eviction threshold: whatever is evicted,
// nodefence's agent evicted.
const (
	podsMemory = 400 << 20
	hogMiB     = 300
	// threshold is crossed once the node's pods use more than podsMemory - 150Mi = 250Mi.
	threshold = "allocatableMemory.available<150Mi"
	// housekeeping is the agents' --housekeeping-interval: allocatableMemory.available is read
	// there (the fast path reads memory.available alone).
	housekeeping = "--housekeeping-interval=1s"
)

// hogTaint keeps new pods off a node: it stands in for the memory-pressure taint kubelet's own
// eviction manager would bring, which the testbed's kubelets (no thresholds) never do.
const hogTaint = "nodefence.io/test-no-new-pods"

// TestHardEvictionHog: a hog on node-1 crosses a hard threshold. node-1's agent evicts exactly
// that pod as kubelet does (phase Failed, reason Evicted, a DisruptionTarget condition, an Evicted
// Event), reports it to the coordinator (a local eviction in the zone), and the Deployment's
// replacement runs on another node. A bystander pod on node-1 stays.
func TestHardEvictionHog(t *testing.T) {
	s := start(t, nfcluster.Options{AgentArgs: func(n *cluster.Node) []string {
		if n.Name != "node-1" {
			return nil
		}
		return []string{"--eviction-hard=" + threshold, housekeeping}
	}})
	s.checkPodsLimit()
	bystander := s.pod("hard-bystander", "node-1", nil)
	s.waitRunning(bystander, 60*time.Second)

	// The first hog can only go to node-1; once it runs there, node-1 takes no new pods and the
	// other nodes do.
	s.taint("node-2", "node-3")
	w := s.watchPods("app=hard-hog")
	s.hogDeployment("hard-hog")
	first := w.waitPod(t, 60*time.Second, func(p *corev1.Pod) bool { return p.Spec.NodeName != "" })
	if first.Spec.NodeName != "node-1" {
		t.Fatalf("the hog was scheduled on %s, want node-1", first.Spec.NodeName)
	}
	s.taint("node-1")
	s.untaint("node-2", "node-3")

	evictedAt := w.waitEvicted(t, first.UID, 60*time.Second)
	t.Logf("hog %s evicted %s after its container started", first.UID, w.sinceStart(first.UID, evictedAt))
	w.waitGone(t, first.UID, 30*time.Second)
	got := w.merged(first.UID)
	if got.Status.Phase != corev1.PodFailed || got.Status.Reason != kubepods.EvictedReason ||
		!strings.Contains(got.Status.Message, "The node was low on resource: memory.") {
		t.Errorf("evicted hog status: phase %q reason %q message %q; want Failed, Evicted, kubelet's message", got.Status.Phase, got.Status.Reason, got.Status.Message)
	}
	if c := condition(got, corev1.DisruptionTarget); c == nil || c.Status != corev1.ConditionTrue || c.Reason != kubepods.TerminationByKubeletReason {
		t.Errorf("evicted hog DisruptionTarget condition = %+v; want True, %s", c, kubepods.TerminationByKubeletReason)
	}
	s.waitEvent(first.UID, kubepods.EvictedReason, kubepods.EventSource)

	replacement := w.waitPod(t, 90*time.Second, func(p *corev1.Pod) bool {
		return p.UID != first.UID && p.Status.Phase == corev1.PodRunning
	})
	if replacement.Spec.NodeName == "node-1" {
		t.Errorf("the replacement runs on node-1")
	}
	t.Logf("replacement %s running on %s", replacement.UID, replacement.Spec.NodeName)

	// The coordinator heard of it: one local eviction in the zone, nothing granted.
	z := s.waitZone(func(z *coordv1.Zone) bool { return z.GetPodEvictionsLocal() >= 1 }, 20*time.Second)
	if z.GetPodEvictionsLocal() != 1 || z.GetPodEvictionsGranted() != 0 {
		t.Errorf("zone %s: %d local, %d granted pod evictions; want 1 and 0", z.GetKey(), z.GetPodEvictionsLocal(), z.GetPodEvictionsGranted())
	}
	// Exactly one pod: a few housekeeping intervals later the bystander still runs and no other
	// pod of node-1 is terminating.
	time.Sleep(5 * time.Second)
	s.onlyEvicted("node-1", first.UID)
	if p, err := s.admin.CoreV1().Pods(bystander.Namespace).Get(s.ctx, bystander.Name, metaGet); err != nil || p.UID != bystander.UID || p.DeletionTimestamp != nil {
		t.Errorf("the bystander on node-1 was touched: %v", err)
	}
}

// TestSoftEvictionZoneBudget: a soft threshold is crossed on all three nodes of zone-a at once.
// The agents propose, the coordinator grants one eviction at a time under the zone's budget (one
// grant per 5 s, one in flight), the others wait (held back in ListZones), and every hog is evicted
// through the Eviction API.
func TestSoftEvictionZoneBudget(t *testing.T) {
	const perGrant = 5 * time.Second
	s := start(t, nfcluster.Options{
		CoordinatorArgs: []string{"--pod-eviction-rate=0.2", "--pod-eviction-burst=1", "--pod-eviction-max-in-flight=1"},
		AgentArgs: func(*cluster.Node) []string {
			return []string{"--eviction-soft=" + threshold, "--eviction-soft-grace-period=allocatableMemory.available=1s",
				"--eviction-grant-timeout=2m", housekeeping}
		},
	})
	s.checkPodsLimit()
	w := s.watchPods("nodefence.io/hog=soft")
	var hogs []*corev1.Pod
	for _, n := range s.c.Nodes {
		hogs = append(hogs, s.pod("soft-hog-"+n.Name, n.Name, hogSpec("soft")))
	}
	var maxHeld int32
	var evicted []time.Time
	deadline := time.Now().Add(90 * time.Second)
	for len(evicted) < len(hogs) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d hogs evicted in 90 s; most candidates held back at once: %d", len(evicted), len(hogs), maxHeld)
		}
		z := s.zone()
		maxHeld = max(maxHeld, z.GetPodCandidatesHeld())
		evicted = evicted[:0]
		for _, h := range hogs {
			if at, ok := w.evictedAt(h.UID); ok {
				evicted = append(evicted, at)
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	slices.SortFunc(evicted, time.Time.Compare)
	for i := 1; i < len(evicted); i++ {
		// A grant every perGrant; the timestamps are the watch's, so allow for its delivery.
		if gap := evicted[i].Sub(evicted[i-1]); gap < perGrant-time.Second {
			t.Errorf("eviction %d came %s after eviction %d; the zone's budget allows one per %s", i+1, gap.Round(time.Millisecond), i, perGrant)
		}
	}
	t.Logf("evictions at +0, %s; most candidates held back at once: %d", gapsOf(evicted), maxHeld)
	if maxHeld < 2 {
		t.Errorf("at most %d candidates were held back in ListZones; want 2 (three nodes, one grant at a time)", maxHeld)
	}
	for _, h := range hogs {
		w.waitGone(t, h.UID, 30*time.Second)
		got := w.merged(h.UID)
		if c := condition(got, corev1.DisruptionTarget); c == nil || c.Reason != "EvictionByEvictionAPI" {
			t.Errorf("%s: DisruptionTarget %+v; want reason EvictionByEvictionAPI (granted evictions go through the Eviction API)", h.Name, c)
		}
	}
	z := s.waitZone(func(z *coordv1.Zone) bool { return z.GetPodEvictionsGranted() >= 3 && z.GetPodEvictionsInFlight() == 0 }, 20*time.Second)
	if z.GetPodEvictionsGranted() != 3 || z.GetPodEvictionsLocal() != 0 || z.GetPodEvictionFallbacks() != 0 {
		t.Errorf("zone %s: granted %d, local %d, fallbacks %d; want 3, 0, 0", z.GetKey(), z.GetPodEvictionsGranted(), z.GetPodEvictionsLocal(), z.GetPodEvictionFallbacks())
	}
}

// TestSoftEvictionFallback: node-1 cannot reach the coordinator; a soft threshold is crossed
// there. No grant can come, so after --eviction-grant-timeout the agent evicts on its own, and
// reports the fallback once the coordinator is reachable again.
func TestSoftEvictionFallback(t *testing.T) {
	const grantTimeout = 4 * time.Second
	s := start(t, nfcluster.Options{AgentArgs: func(n *cluster.Node) []string {
		if n.Name != "node-1" {
			return nil
		}
		return []string{"--eviction-soft=" + threshold, "--eviction-soft-grace-period=allocatableMemory.available=1s",
			"--eviction-grant-timeout=" + grantTimeout.String(), housekeeping}
	}})
	s.checkPodsLimit()
	node1 := s.c.Node("node-1")
	if err := node1.Blackhole(s.c.HostIP()); err != nil {
		t.Fatal(err)
	}
	w := s.watchPods("nodefence.io/hog=fallback")
	hog := s.pod("fallback-hog", "node-1", hogSpec("fallback"))
	at := w.waitEvicted(t, hog.UID, 60*time.Second)
	took := w.sinceStart(hog.UID, at)
	t.Logf("hog evicted %s after its container started", took)
	w.waitGone(t, hog.UID, 30*time.Second)
	if took < grantTimeout {
		t.Errorf("the hog was evicted %s after it started, before the grant timeout %s", took, grantTimeout)
	}
	got := w.merged(hog.UID)
	if got.Status.Reason != kubepods.EvictedReason || condition(got, corev1.DisruptionTarget) == nil {
		t.Errorf("fallback eviction status: reason %q, DisruptionTarget %v; want a local eviction (Evicted, DisruptionTarget)", got.Status.Reason, condition(got, corev1.DisruptionTarget))
	}
	if err := node1.Unblackhole(s.c.HostIP()); err != nil {
		t.Fatal(err)
	}
	z := s.waitZone(func(z *coordv1.Zone) bool { return z.GetPodEvictionFallbacks() >= 1 }, 60*time.Second)
	if z.GetPodEvictionFallbacks() != 1 || z.GetPodEvictionsGranted() != 0 {
		t.Errorf("zone %s: %d fallbacks, %d granted; want 1 and 0", z.GetKey(), z.GetPodEvictionFallbacks(), z.GetPodEvictionsGranted())
	}
}

// TestShutdownGraceZeroPhase: node-1's agent runs kubelet's graceful node shutdown with
// --shutdown-grace-period equal to the critical pods' part, so the regular pods' phase has a grace
// of 0. On PrepareForShutdown a regular pod whose own grace is 30 s and which ignores SIGTERM must
// be gone at once, as kubelet kills such pods, not after 30 s, and not left running.
func TestShutdownGraceZeroPhase(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "nf-logind-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	bus, err := logind.StartBus(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(bus.Close)
	srv, err := logind.Serve(bus.Address, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	s := start(t, nfcluster.Options{AgentArgs: func(n *cluster.Node) []string {
		if n.Name != "node-1" {
			return nil
		}
		return []string{"--shutdown-grace-period=5s", "--shutdown-grace-period-critical-pods=5s",
			"--logind-bus=" + bus.Address, "--manage-inhibit-delay=false"}
	}})
	thirty := int64(30)
	stubborn := s.pod("shutdown-stubborn", "node-1", func(p *corev1.Pod) {
		p.Spec.TerminationGracePeriodSeconds = &thirty
		p.Spec.Containers[0].Command = []string{"sh", "-c", "trap '' TERM; sleep 600"}
	})
	s.waitRunning(stubborn, 60*time.Second)
	if _, err := srv.WaitLocks(ctx, 1); err != nil {
		t.Fatalf("node-1's agent took no inhibitor lock: %v", err)
	}
	t0 := time.Now()
	if err := srv.PrepareForShutdown(true); err != nil {
		t.Fatal(err)
	}
	for {
		p, err := s.admin.CoreV1().Pods(stubborn.Namespace).Get(s.ctx, stubborn.Name, metaGet)
		if apierrors.IsNotFound(err) || (err == nil && p.UID != stubborn.UID) {
			break
		}
		if time.Since(t0) > 10*time.Second {
			t.Fatalf("the regular pod (grace 30 s, phase grace 0) is still there %s after PrepareForShutdown: deleting=%v",
				time.Since(t0).Round(time.Millisecond), err == nil && p.DeletionTimestamp != nil)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("regular pod gone %s after PrepareForShutdown", time.Since(t0).Round(time.Millisecond))
}

// hogSpec makes the pod a hog: it fills hogMiB of a memory-backed emptyDir at start and holds it
// (at most ten minutes), labelled nodefence.io/hog=<kind>.
func hogSpec(kind string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Labels["nodefence.io/hog"] = kind
		p.Spec = hogPodSpec(p.Spec.NodeName, "")
	}
}

// hogPodSpec is a hog's pod: it fills only when it runs on fillOn ("" : anywhere).
func hogPodSpec(node, fillOn string) corev1.PodSpec {
	zero := int64(0)
	limit := resource.MustParse(strconv.Itoa(hogMiB+16) + "Mi")
	cond := "true"
	if fillOn != "" {
		cond = `[ "$NODE_NAME" = ` + fillOn + ` ]`
	}
	script := fmt.Sprintf(`if %s; then dd if=/dev/zero of=/hog/fill bs=1M count=%d 2>/dev/null; echo filled; fi
trap 'exit 0' TERM
sleep 600 & wait`, cond, hogMiB)
	return corev1.PodSpec{
		NodeName:                      node,
		TerminationGracePeriodSeconds: &zero,
		Containers: []corev1.Container{{Name: "hog", Image: cluster.BusyboxImage, ImagePullPolicy: corev1.PullNever,
			Command:      []string{"sh", "-c", script},
			Env:          []corev1.EnvVar{{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}}},
			VolumeMounts: []corev1.VolumeMount{{Name: "hog", MountPath: "/hog"}}}},
		Volumes: []corev1.Volume{{Name: "hog", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{
			Medium: corev1.StorageMediumMemory, SizeLimit: &limit}}}},
	}
}

// hogDeployment creates a one-replica Deployment of hogs labelled app=name that fill only on
// node-1, and deletes it when the test ends.
func (s *scenario) hogDeployment(name string) {
	s.t.Helper()
	one := int32(1)
	labels := map[string]string{"app": name}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: appsv1.DeploymentSpec{Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: hogPodSpec("", "node-1")}},
	}
	if _, err := s.admin.AppsV1().Deployments(d.Namespace).Create(s.ctx, d, metav1.CreateOptions{}); err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		fg := metav1.DeletePropagationForeground
		zero := int64(0)
		if err := s.admin.AppsV1().Deployments(d.Namespace).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &fg}); err != nil {
			s.t.Errorf("delete deployment %s: %v", name, err)
		}
		_ = s.admin.CoreV1().Pods(d.Namespace).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero},
			metav1.ListOptions{LabelSelector: "app=" + name})
	})
}

// checkPodsLimit fails unless every node's pods cgroup is limited to podsMemory: without it
// allocatableMemory.available has no value and nothing here could happen.
func (s *scenario) checkPodsLimit() {
	s.t.Helper()
	for _, n := range s.c.Nodes {
		path := filepath.Join("/sys/fs/cgroup/memory", n.CgroupRoot, "kubepods", "memory.limit_in_bytes")
		data, err := os.ReadFile(path)
		if err != nil || strings.TrimSpace(string(data)) != strconv.Itoa(podsMemory) {
			s.t.Fatalf("%s: %q, %v; want the node allocatable %d enforced by kubelet", path, strings.TrimSpace(string(data)), err, podsMemory)
		}
	}
}

// taint puts hogTaint (NoSchedule) on the nodes; the test's end removes it from every node.
func (s *scenario) taint(nodes ...string) {
	s.t.Helper()
	s.t.Cleanup(func() { s.untaint("node-1", "node-2", "node-3") })
	for _, name := range nodes {
		s.setTaint(name, true)
	}
}

func (s *scenario) untaint(nodes ...string) {
	for _, name := range nodes {
		s.setTaint(name, false)
	}
}

func (s *scenario) setTaint(name string, on bool) {
	s.t.Helper()
	for attempt := 0; ; attempt++ {
		node, err := s.admin.CoreV1().Nodes().Get(context.Background(), name, metaGet)
		if err != nil {
			s.t.Errorf("taint %s: %v", name, err)
			return
		}
		var keep []corev1.Taint
		for _, tn := range node.Spec.Taints {
			if tn.Key != hogTaint {
				keep = append(keep, tn)
			}
		}
		if on {
			keep = append(keep, corev1.Taint{Key: hogTaint, Effect: corev1.TaintEffectNoSchedule})
		} else if len(keep) == len(node.Spec.Taints) {
			return
		}
		node.Spec.Taints = keep
		_, err = s.admin.CoreV1().Nodes().Update(context.Background(), node, metav1.UpdateOptions{})
		if err == nil {
			return
		}
		if !apierrors.IsConflict(err) || attempt == 5 {
			s.t.Errorf("taint %s: %v", name, err)
			return
		}
	}
}

// waitRunning waits until the pod runs.
func (s *scenario) waitRunning(p *corev1.Pod, timeout time.Duration) {
	s.t.Helper()
	for deadline := time.Now().Add(timeout); ; time.Sleep(200 * time.Millisecond) {
		got, err := s.admin.CoreV1().Pods(p.Namespace).Get(s.ctx, p.Name, metaGet)
		if err == nil && got.Status.Phase == corev1.PodRunning {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("pod %s not running after %s: %v", p.Name, timeout, err)
		}
	}
}

// waitEvent waits for an Event of the pod with the reason, from the component.
func (s *scenario) waitEvent(uid types.UID, reason, component string) {
	s.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		evs, err := s.admin.CoreV1().Events("default").List(s.ctx, metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(uid)})
		if err == nil {
			for _, e := range evs.Items {
				if e.Reason == reason && e.Source.Component == component {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			s.t.Errorf("no %s Event from %s on pod %s: %v", reason, component, uid, err)
			return
		}
	}
}

// onlyEvicted fails if a pod of the node other than uid is terminating or failed.
func (s *scenario) onlyEvicted(node string, uid types.UID) {
	s.t.Helper()
	pods, err := s.admin.CoreV1().Pods("").List(s.ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		s.t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.UID != uid && (p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodFailed) {
			s.t.Errorf("pod %s/%s on %s was evicted too (phase %s, deleting %v)", p.Namespace, p.Name, node, p.Status.Phase, p.DeletionTimestamp != nil)
		}
	}
}

// zone is the leader's view of zone-a (every node's zone).
func (s *scenario) zone() *coordv1.Zone {
	s.t.Helper()
	co := s.d.Leader(s.ctx)
	if co == nil {
		s.t.Fatal("no coordinator leads")
	}
	cl, _, closeConn, err := s.d.Conn(co.Addr)
	if err != nil {
		s.t.Fatal(err)
	}
	defer closeConn()
	r, err := cl.ListZones(s.ctx, &coordv1.ListZonesRequest{})
	if err != nil {
		s.t.Fatal(err)
	}
	for _, z := range r.GetZones() {
		if strings.HasSuffix(z.GetKey(), "zone-a") {
			return z
		}
	}
	s.t.Fatalf("no zone-a in %v", r.GetZones())
	return nil
}

func (s *scenario) waitZone(ok func(*coordv1.Zone) bool, timeout time.Duration) *coordv1.Zone {
	s.t.Helper()
	for deadline := time.Now().Add(timeout); ; time.Sleep(250 * time.Millisecond) {
		z := s.zone()
		if ok(z) || time.Now().After(deadline) {
			return z
		}
	}
}
