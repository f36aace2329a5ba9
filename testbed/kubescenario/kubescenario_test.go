package kubescenario

import (
	"context"
	"github.com/nodefence/nodefence/coordinator/store"
	"log/slog"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodefence/nodefence/coordinator/kube"
	"github.com/nodefence/nodefence/testbed/ipmisim"
	"github.com/nodefence/nodefence/testbed/testlog"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// The payoff, against a real kube-apiserver: a StatefulSet member on a node whose agent goes silent
// (BMC still on) is released only after the coordinator powered the node off and read it back —
// out-of-service taint, pod force-deleted, VolumeAttachment deleted, NodeFence object done. With a
// BMC that never turns off: no taint, no deletion, NodeFence in error.
func TestKubernetesEndToEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	env, err := Start(ctx, t.TempDir(), Options{Healthy: 4, Victims: 3, Grace: time.Second, FenceTimeout: time.Second,
		Log: testlog.New(t, slog.LevelInfo)})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	victim, stuck, leaving := env.Nodes[4], env.Nodes[5], env.Nodes[6]

	// An agent's pressure condition reaches the coordinator but never the Node object: kubelet
	// owns MemoryPressure.
	env.ReportMemoryPressure(env.Nodes[0])
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		v, err := env.NodeView(ctx, env.Nodes[0].Name)
		found := false
		for _, c := range v.GetConditions() {
			found = found || (c.Type == "MemoryPressure" && c.Status == "True")
		}
		if err == nil && found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: MemoryPressure=True never reached the coordinator (%v)", env.Nodes[0].Name, err)
		}
	}

	// A node that announced a graceful shutdown and then went silent is never fenced or released.
	env.AnnounceShutdown(leaving)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if v, err := env.NodeView(ctx, leaving.Name); err == nil && v.ShuttingDown {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the coordinator never saw the shutdown announcement", leaving.Name)
		}
	}
	env.Fail(leaving)

	failed := env.Fail(victim)
	released, err := env.WaitReleased(ctx, victim)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: pod released %.2fs after its agent stopped (grace 1s + fence timeout 1s)", victim.Name, released.Sub(failed).Seconds())
	page, err := env.Coord.Store().ListFences(ctx, store.ListOptions{Node: victim.Name, Limit: 10})
	recs := page.Fences
	if err != nil || len(recs) != 1 {
		t.Fatalf("fence records of %s: %v %v", victim.Name, recs, err)
	}
	rec := recs[0]
	if rec.ConfirmedOffAt == nil || rec.ConfirmedOffAt.AsTime().After(released) {
		t.Fatalf("pod released at %s but power-off confirmed at %v: release must follow the read-back", released, rec.ConfirmedOffAt)
	}
	if p, err := ipmisim.IpmitoolPower(ctx, victim.BMC.Port, "admin", "password"); err != nil || p != "off" {
		t.Fatalf("ipmitool: %q %v", p, err)
	}
	if ok, err := env.HasOutOfServiceTaint(ctx, victim); err != nil || !ok {
		t.Fatalf("out-of-service taint on %s: %v %v", victim.Name, ok, err)
	}
	w, err := kube.New(env.Cluster.Config(), kube.Options{})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, st, err := w.GetFence(ctx, rec.Id)
		if err == nil && st.Status == "done" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("NodeFence %s: %+v %v", rec.Id, st, err)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// The stuck BMC: accepted commands, state never changes.
	if err := stuck.BMC.SetFault(ipmisim.FaultStuck); err != nil {
		t.Fatal(err)
	}
	env.Fail(stuck)
	var srec *coordv1.NodeFence
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		recs := env.Fences(ctx, stuck.Name)
		if len(recs) == 1 && recs[0].FinishedAt != nil {
			srec = recs[0]
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stuck BMC: fence of %s never finished: %v", stuck.Name, recs)
		}
	}
	if srec.Status != coordv1.FenceStatus_FENCE_STATUS_ERROR || srec.ConfirmedOffAt != nil {
		t.Fatalf("stuck BMC: %v", srec)
	}
	time.Sleep(time.Second) // give a wrong release every chance to happen
	if _, err := env.Admin.CoreV1().Pods("apps").Get(ctx, stuck.Pod, metav1.GetOptions{}); err != nil {
		t.Fatalf("stuck BMC: the pod was released: %v", err)
	}
	if _, err := env.Admin.StorageV1().VolumeAttachments().Get(ctx, stuck.VA, metav1.GetOptions{}); err != nil {
		t.Fatalf("stuck BMC: the VolumeAttachment was deleted: %v", err)
	}
	if ok, _ := env.HasOutOfServiceTaint(ctx, stuck); ok {
		t.Fatal("stuck BMC: out-of-service taint applied")
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		_, st, err := w.GetFence(ctx, srec.Id)
		if err == nil && st.Status == "error" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("NodeFence %s: %+v %v", srec.Id, st, err)
		}
	}
	// A node added while everything runs (Node, ConfigMaps, pod) is fenceable within seconds: the
	// coordinator's informers saw the new fence configuration (its periodic reload is 30 s).
	late, err := env.AddVictim(ctx, "node-late")
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if func() bool {
			n, err := env.nodeView(ctx, late.Name)
			return err == nil && n.Fenceable && n.Connected
		}() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never became fenceable and connected", late.Name)
		}
	}
	lateFailed := env.Fail(late)
	lateCtx, lateCancel := context.WithTimeout(ctx, 20*time.Second)
	defer lateCancel()
	if at, err := env.WaitReleased(lateCtx, late); err != nil {
		t.Fatalf("%s: %v", late.Name, err)
	} else {
		t.Logf("%s (added at run time) released %.2fs after its agent stopped", late.Name, at.Sub(lateFailed).Seconds())
	}

	// The shutting-down node and the healthy nodes were never fenced, and the shutting-down node's
	// pod is still there.
	if _, err := env.Admin.CoreV1().Pods("apps").Get(ctx, leaving.Pod, metav1.GetOptions{}); err != nil {
		t.Fatalf("%s (shutting down): its pod was released: %v", leaving.Name, err)
	}
	for _, n := range append(env.Nodes[:4:4], leaving) {
		if recs := env.Fences(ctx, n.Name); len(recs) != 0 {
			t.Fatalf("%s fenced: %v", n.Name, recs)
		}
	}
	checkOwnership(t, ctx, env)
}

// A storm: three of a zone's five nodes go silent at once (60%: PartialDisruption). The storm guard
// and the zone's pacing hold everything back: no out-of-service taint, no deletion, no fence.
func TestStormReleasesNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	env, err := Start(ctx, t.TempDir(), Options{Healthy: 2, Victims: 3, Grace: time.Second, FenceTimeout: time.Second,
		Log: testlog.New(t, slog.LevelInfo)})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	for _, n := range env.Nodes[2:] {
		env.Fail(n)
	}
	// Long enough for grace + fence timeout several times over.
	time.Sleep(6 * time.Second)
	for _, n := range env.Nodes[2:] {
		if _, err := env.Admin.CoreV1().Pods("apps").Get(ctx, n.Pod, metav1.GetOptions{}); err != nil {
			t.Fatalf("%s: pod released during a storm: %v", n.Name, err)
		}
		if ok, _ := env.HasOutOfServiceTaint(ctx, n); ok {
			t.Fatalf("%s: out-of-service taint during a storm", n.Name)
		}
		if recs := env.Fences(ctx, n.Name); len(recs) != 0 {
			t.Fatalf("%s fenced during a storm: %v", n.Name, recs)
		}
		v, err := env.NodeView(ctx, n.Name)
		if err != nil || v.Readiness != coordv1.Readiness_READINESS_UNKNOWN {
			t.Fatalf("%s: readiness %v (%v), want Unknown: the judgement is made, only the action is held back", n.Name, v.GetReadiness(), err)
		}
	}
	checkOwnership(t, ctx, env)
}
