package kubescenario

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodefence/nodefence/testbed/ipmisim"
	"github.com/nodefence/nodefence/testbed/testlog"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// A fence that switches off the wrong machine, in Kubernetes mode: the victim's agent keeps
// reporting while the driver confirms "its" BMC off (the BMC is not the machine the agent runs on).
// The coordinator raises the alarm — the record's wrong_machine_at and a Warning Event on the
// Node — and releases nothing: no out-of-service taint, the StatefulSet pod stays. Then an
// Acknowledge of a node whose agent is silent but whose kubelet reports Ready is refused unless
// forced with a reason.
func TestWrongMachineReleasesNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	env, err := Start(ctx, t.TempDir(), Options{Healthy: 3, Victims: 1, Grace: time.Second, FenceTimeout: time.Second,
		Log: testlog.New(t, slog.LevelWarn)})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	victim := env.Nodes[3]
	cc, err := env.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	fc := coordv1.NewFenceServiceClient(cc)
	f, err := fc.Fence(ctx, &coordv1.FenceRequest{Node: victim.Name, Reason: "wrong machine test"})
	if err != nil {
		t.Fatal(err)
	}
	var rec *coordv1.NodeFence
	for deadline := time.Now().Add(30 * time.Second); rec == nil; time.Sleep(100 * time.Millisecond) {
		g, err := fc.GetFence(ctx, &coordv1.GetFenceRequest{Id: f.Fence.Id})
		if err == nil && g.Fence.WrongMachineAt != nil {
			rec = g.Fence
		}
		if time.Now().After(deadline) {
			t.Fatalf("no wrong-machine alarm on %s: %v %v", f.Fence.Id, g, err)
		}
	}
	if p, err := ipmisim.IpmitoolPower(ctx, victim.BMC.Port, "admin", "password"); err != nil || p != "off" {
		t.Fatalf("ipmitool: %q %v; want off (the driver did switch its BMC off)", p, err)
	}
	var found bool
	for deadline := time.Now().Add(10 * time.Second); !found && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		evs, err := env.Admin.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs.Items {
			found = found || (ev.Reason == "FenceHitWrongMachine" && ev.InvolvedObject.Name == victim.Name && ev.Type == "Warning")
		}
	}
	if !found {
		t.Fatal("no FenceHitWrongMachine Warning Event on the Node")
	}
	time.Sleep(3 * time.Second) // past the proof window: nothing may be released
	if ok, err := env.HasOutOfServiceTaint(ctx, victim); err != nil || ok {
		t.Fatalf("out-of-service taint on %s: %v %v; want none", victim.Name, ok, err)
	}
	if _, err := env.Admin.CoreV1().Pods("apps").Get(ctx, victim.Pod, metav1.GetOptions{}); err != nil {
		t.Fatalf("pod %s of %s: %v; want it kept", victim.Pod, victim.Name, err)
	}

	// Proof is proof: a node whose agent is silent but whose kubelet reports Ready is not
	// acknowledged off, unless forced with a reason.
	quiet := env.Nodes[0]
	env.Fail(quiet)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		n, err := env.nodeView(ctx, quiet.Name)
		if err == nil && !n.Connected && n.Readiness != coordv1.Readiness_READINESS_READY {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still ready or connected: %v %v", quiet.Name, n, err)
		}
	}
	time.Sleep(300 * time.Millisecond) // the coordinator's own Node writes for the transition are done
	node, err := env.Admin.CoreV1().Nodes().Get(ctx, quiet.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	if _, err := env.Admin.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err = fc.Acknowledge(ctx, &coordv1.AcknowledgeRequest{Node: quiet.Name, Reason: "I think it is off"})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "kubelet") {
		t.Fatalf("Acknowledge of a node whose kubelet reports: %v, want FailedPrecondition naming the kubelet", err)
	}
	ack, err := fc.Acknowledge(ctx, &coordv1.AcknowledgeRequest{Node: quiet.Name, Reason: "pulled its plugs myself", Force: true})
	if err != nil || ack.Fence.ConfirmedOffAt == nil || !strings.Contains(ack.Fence.Reason, "FORCED") {
		t.Fatalf("forced Acknowledge: %v, %v", ack, err)
	}
}
