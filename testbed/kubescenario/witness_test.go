package kubescenario

import (
	"context"
	"log/slog"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodefence/nodefence/coordinator/kube"
	"github.com/nodefence/nodefence/testbed/testlog"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// Two witnesses: a node whose agent dies while its kubelet keeps renewing its Lease is shown
// agent-down (the coordinator's view, nodefence.io/AgentReady=False, an Event) and is never
// tainted or fenced; a node whose kubelet stops while its agent reports is shown kubelet-down and,
// under the default policy (wait), never fenced either. Both run stateful pods and are fenceable:
// one witness alone would have been enough for the coordinator before.
func TestOneWitnessNeverFences(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	env, err := Start(ctx, t.TempDir(), Options{Healthy: 3, Victims: 2, Grace: time.Second, FenceTimeout: time.Second,
		Log: testlog.New(t, slog.LevelInfo)})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	agentDead, kubeletDead := env.Nodes[3], env.Nodes[4]
	env.StopAgent(agentDead)
	env.StopKubelet(kubeletDead)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		a, errA := env.NodeView(ctx, agentDead.Name)
		k, errK := env.NodeView(ctx, kubeletDead.Name)
		if errA == nil && errK == nil && a.AgentDown && k.KubeletDown {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent-down %v (%v), kubelet-down %v (%v)", a.GetAgentDown(), errA, k.GetKubeletDown(), errK)
		}
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		n, err := env.Admin.CoreV1().Nodes().Get(ctx, agentDead.Name, metav1.GetOptions{})
		if err == nil && conditionStatus(n, kube.ConditionAgentReady) == corev1.ConditionFalse {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s never False (%v)", agentDead.Name, kube.ConditionAgentReady, err)
		}
	}
	// Grace (1 s) + pacing + fence timeout (1 s) + settle (0.5 s), several times over.
	time.Sleep(8 * time.Second)
	for _, n := range []*Node{agentDead, kubeletDead} {
		if recs := env.Fences(ctx, n.Name); len(recs) != 0 {
			t.Fatalf("%s fenced with one witness alive: %v", n.Name, recs)
		}
		if ok, _ := env.HasOutOfServiceTaint(ctx, n); ok {
			t.Fatalf("%s: out-of-service taint with one witness alive", n.Name)
		}
		if _, err := env.Admin.CoreV1().Pods("apps").Get(ctx, n.Pod, metav1.GetOptions{}); err != nil {
			t.Fatalf("%s: pod released with one witness alive: %v", n.Name, err)
		}
		v, _ := env.NodeView(ctx, n.Name)
		if v.GetReadiness() != coordv1.Readiness_READINESS_READY {
			t.Fatalf("%s: readiness %v with one witness alive", n.Name, v.GetReadiness())
		}
	}
	if !hasEvent(ctx, env, agentDead.Name, "AgentDown") {
		t.Errorf("%s: no AgentDown Event", agentDead.Name)
	}
	if !hasEvent(ctx, env, kubeletDead.Name, "KubeletDown") {
		t.Errorf("%s: no KubeletDown Event", kubeletDead.Name)
	}
	// The agent comes back: AgentReady is True again.
	if err := env.startAgent(agentDead); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		n, err := env.Admin.CoreV1().Nodes().Get(ctx, agentDead.Name, metav1.GetOptions{})
		if err == nil && conditionStatus(n, kube.ConditionAgentReady) == corev1.ConditionTrue {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s never True again (%v)", agentDead.Name, kube.ConditionAgentReady, err)
		}
	}
	checkOwnership(t, ctx, env)
}

// The apiserver is unreachable for the coordinator for 30 s from the moment the fence record of a
// dead node exists: the power-off is confirmed meanwhile, the release cannot happen, and once the
// apiserver is back the reconciler releases the pod without anything else changing. The node then
// comes back: its out-of-service taint stays for the healthy delay, then comes off.
func TestReleaseSurvivesAPIServerOutage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	// The BMC password is in the template: a fence whose credentials are a Secret cannot run while
	// the apiserver is away (see the report), and this test is about the release.
	env, err := Start(ctx, t.TempDir(), Options{Healthy: 3, Victims: 1, Grace: time.Second, FenceTimeout: time.Second, HealthyDelay: 4 * time.Second, PlainPassword: true,
		Log: testlog.New(t, slog.LevelInfo)})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	victim := env.Nodes[3]
	env.Fail(victim)
	var rec *coordv1.NodeFence
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		recs := env.Fences(ctx, victim.Name)
		if len(recs) == 1 {
			rec = recs[0]
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the dead node was never fenced")
		}
	}
	env.Proxy.Cut()
	cutAt := time.Now()
	t.Logf("apiserver cut off for the coordinator at fence %s", rec.Id)
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		v, err := env.Coord.Store().GetFence(ctx, rec.Id)
		if err == nil && v.Fence.ConfirmedOffAt != nil {
			t.Logf("power-off confirmed %.2fs into the outage", time.Since(cutAt).Seconds())
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("power-off never confirmed during the outage: %v %v", v.Fence, err)
		}
	}
	// 30 s of outage, and at least a few retries of the release after the confirmation.
	time.Sleep(max(time.Until(cutAt.Add(30*time.Second)), 5*time.Second))
	if _, err := env.Admin.CoreV1().Pods("apps").Get(ctx, victim.Pod, metav1.GetOptions{}); err != nil {
		t.Fatalf("pod gone while the coordinator could not reach the apiserver: %v", err)
	}
	env.Proxy.Restore()
	restored := time.Now()
	rctx, rcancel := context.WithTimeout(ctx, 60*time.Second)
	defer rcancel()
	at, err := env.WaitReleased(rctx, victim)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("released %.2fs after the apiserver came back", at.Sub(restored).Seconds())
	if ok, err := env.HasOutOfServiceTaint(ctx, victim); err != nil || !ok {
		t.Fatalf("no out-of-service taint after the release: %v %v", ok, err)
	}

	// The node comes back (powered on, agent and kubelet again): the taint stays for the healthy
	// delay (4 s), then comes off.
	if err := victim.BMC.SetPower(true); err != nil {
		t.Fatal(err)
	}
	victim.Boot++      // a machine powered on boots anew
	back := time.Now() // the first witness may report from here on
	if err := env.startKubelet(ctx, victim, 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := env.startAgent(victim); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if v, err := env.NodeView(ctx, victim.Name); err == nil && v.Readiness == coordv1.Readiness_READINESS_READY {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the node never came back in the coordinator's view")
		}
	}
	time.Sleep(time.Second)
	if ok, _ := env.HasOutOfServiceTaint(ctx, victim); !ok && time.Since(back) < 4*time.Second {
		t.Fatal("out-of-service taint removed before the healthy delay")
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if ok, err := env.HasOutOfServiceTaint(ctx, victim); err == nil && !ok {
			t.Logf("out-of-service taint removed %.2fs after the node came back (healthy delay 4s)", time.Since(back).Seconds())
			if time.Since(back) < 4*time.Second {
				t.Fatal("removed before the healthy delay")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("out-of-service taint never removed")
		}
	}
	if !hasEvent(ctx, env, victim.Name, "PodsReleased") || !hasEvent(ctx, env, victim.Name, "Recovered") {
		t.Error("no PodsReleased or Recovered Event on the Node")
	}
	checkOwnership(t, ctx, env)
}

func conditionStatus(n *corev1.Node, typ corev1.NodeConditionType) corev1.ConditionStatus {
	for _, c := range n.Status.Conditions {
		if c.Type == typ {
			return c.Status
		}
	}
	return ""
}

func hasEvent(ctx context.Context, env *Env, node, reason string) bool {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		evs, err := env.Admin.CoreV1().Events("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			continue
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Kind == "Node" && e.InvolvedObject.Name == node && e.Reason == reason {
				return true
			}
		}
	}
	return false
}

// checkOwnership is one owner per field, from the apiserver's own records: on every Node, the
// coordinator's field manager owns no field but the taint list and its condition
// nodefence.io/AgentReady (ForeignNodeFields), and no Node carries
// the not-ready or unreachable NoExecute taints (kube-controller-manager's; none runs here, so any
// would be the coordinator's).
func checkOwnership(t *testing.T, ctx context.Context, env *Env) {
	t.Helper()
	nodes, err := env.Admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		for _, tn := range n.Spec.Taints {
			if (tn.Key == kube.TaintKeyNotReady || tn.Key == kube.TaintKeyUnreachable) && tn.Effect == corev1.TaintEffectNoExecute {
				t.Errorf("%s carries %s:%s", n.Name, tn.Key, tn.Effect)
			}
		}
		foreign, err := ForeignNodeFields(n)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range foreign {
			t.Errorf("%s: the coordinator's field manager owns %s", n.Name, f)
		}
	}
}
