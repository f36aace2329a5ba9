package kubescenario

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/testbed/testlog"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// A node alive but broken: its agent and kubelet report, but Node Problem Detector sets
// KernelDeadlock=True on its Node. With --unhealthy-condition KernelDeadlock=True:2s nodefence
// power-cycles it (an automatic reboot record: its BMC switched off, read back, switched on again)
// and releases nothing (no out-of-service taint, its pod stays). A healthy node with the same
// condition False is left alone.
func TestNodeConditionPowerCycles(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	env, err := Start(ctx, t.TempDir(), Options{Healthy: 2, Victims: 1, Grace: time.Second, FenceTimeout: time.Second,
		UnhealthyConditions: []engine.ConditionTrigger{{Type: "KernelDeadlock", Status: "True", For: 2 * time.Second}},
		Log:                 testlog.New(t, slog.LevelWarn)})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	broken, fine := env.Nodes[2], env.Nodes[0]
	setCondition(t, ctx, env, fine.Name, corev1.ConditionFalse)
	setCondition(t, ctx, env, broken.Name, corev1.ConditionTrue)
	var rec *coordv1.NodeFence
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if fs := env.Fences(ctx, broken.Name); len(fs) == 1 && fs[0].Status == coordv1.FenceStatus_FENCE_STATUS_DONE {
			rec = fs[0]
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not power-cycled within 60 s: %v", broken.Name, env.Fences(ctx, broken.Name))
		}
	}
	if rec.Action != coordv1.FenceAction_FENCE_ACTION_REBOOT || !rec.Automatic {
		t.Fatalf("record %s: action %s, automatic %v: want an automatic power cycle", rec.Id, rec.Action, rec.Automatic)
	}
	var states []string // each operation's action and the state its driver read back
	for _, op := range rec.Operations {
		states = append(states, op.Action+"="+op.State.String())
	}
	if got := strings.Join(states, " "); got != "off=POWER_STATE_OFF on=POWER_STATE_ON" {
		t.Fatalf("record %s operations: %s; want the power-off read back off, then the power-on read back on", rec.Id, got)
	}
	calls, err := broken.BMC.Calls()
	if err != nil {
		t.Fatal(err)
	}
	joined := strings.Join(calls, "\n")
	off, on := strings.Index(joined, "set power 0"), strings.LastIndex(joined, "set power 1")
	if off < 0 || on < off {
		t.Fatalf("BMC calls %q: want a power-off, then a power-on", calls)
	}
	if p, err := broken.BMC.Power(); err != nil || !p {
		t.Fatalf("%s's BMC after the power cycle: on=%v %v", broken.Name, p, err)
	}
	time.Sleep(2 * time.Second) // a release would have happened by now
	if ok, err := env.HasOutOfServiceTaint(ctx, broken); err != nil || ok {
		t.Fatalf("%s tainted out of service after a power cycle: %v %v", broken.Name, ok, err)
	}
	if _, err := env.Admin.CoreV1().Pods("apps").Get(ctx, broken.Pod, metav1.GetOptions{}); err != nil {
		t.Fatalf("%s's pod released by a power cycle: %v", broken.Name, err)
	}
	if fs := env.Fences(ctx, fine.Name); len(fs) != 0 {
		t.Fatalf("%s (KernelDeadlock=False) fenced: %v", fine.Name, fs)
	}
}

// setCondition sets the KernelDeadlock condition on a Node as Node Problem Detector does.
func setCondition(t *testing.T, ctx context.Context, env *Env, node string, status corev1.ConditionStatus) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		n, err := env.Admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.Now()
		c := corev1.NodeCondition{Type: "KernelDeadlock", Status: status, Reason: "DockerHung", Message: "task blocked for more than 120 seconds",
			LastHeartbeatTime: now, LastTransitionTime: now}
		conds := []corev1.NodeCondition{c}
		for _, o := range n.Status.Conditions {
			if o.Type != c.Type {
				conds = append(conds, o)
			}
		}
		n.Status.Conditions = conds
		_, err = env.Admin.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{FieldManager: "node-problem-detector"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}
