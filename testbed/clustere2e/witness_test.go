package clustere2e

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/coordinator/kube"
	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
	"github.com/nodefence/nodefence/testbed/cluster"
	"github.com/nodefence/nodefence/testbed/kubescenario"
	"github.com/nodefence/nodefence/testbed/nfcluster"
)

// The witness scenarios: a node whose kubelet or nodefence agent alone falls silent still has a
// witness that it runs, so nodefence must neither fence it nor release its pods. Every check reads
// what an operator would: NodeFence objects, the node's taints, ipmitool, the leader's ListNodes and
// the Node's conditions.

// The witness scenarios run the coordinator on what deploy/ ships (nfcluster.Options.Shipped), as
// the no-fence scenarios do: the defaults are what must not fence a node with a witness alive.
// witnessWindow is how long a scenario watches one silent witness: past the moment a fence would
// have started on the slowest path (the shipped grace + fence timeout) with a margin.
const witnessWindow = engine.DefaultNodeMonitorGracePeriod + engine.DefaultFenceTimeout + 10*time.Second

// agentService is the node service nfcluster runs the node-agent as.
const agentService = "node-agent"

// TestWitnessAgentKilled: the node-agent of a healthy node is SIGKILLed while its kubelet keeps
// reporting. No fence, no taint, the BMC still on; the agent is shown down (ListNodes agent_down
// and the nodefence.io/AgentReady=False condition) and comes back when restarted.
func TestWitnessAgentKilled(t *testing.T) {
	s := start(t, nfcluster.Options{Shipped: true})
	victim := s.c.Node("node-2")
	t.Cleanup(func() { s.ensureAgent(victim) })
	if err := victim.KillService(agentService); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	var shownDown, conditionFalse time.Duration
	s.watchNoFence(witnessWindow, func() {
		if shownDown == 0 && s.agentDown(victim.Name) {
			shownDown = time.Since(t0)
		}
		if conditionFalse == 0 && s.agentCondition(victim.Name) == corev1.ConditionFalse {
			conditionFalse = time.Since(t0)
		}
	})
	t.Logf("agent killed: agent_down after %s, AgentReady=False after %s; no fence in %s", shownDown.Round(time.Millisecond),
		conditionFalse.Round(time.Millisecond), witnessWindow)
	if shownDown == 0 {
		t.Errorf("the leader's ListNodes never showed %s agent_down within %s", victim.Name, witnessWindow)
	}
	if conditionFalse == 0 {
		t.Errorf("%s never had %s=False within %s", victim.Name, kube.ConditionAgentReady, witnessWindow)
	}
	s.checkUntouched(victim)
	node, err := s.admin.CoreV1().Nodes().Get(s.ctx, victim.Name, metaGet)
	if err != nil || !nodeReady(node) {
		t.Errorf("%s not Ready at the apiserver (%v): the scenario needs a kubelet that still reports", victim.Name, err)
	}

	if err := victim.StartService(agentService); err != nil {
		t.Fatal(err)
	}
	t1 := time.Now()
	if err := s.d.WaitAgents(s.ctx, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); s.agentDown(victim.Name) || s.agentCondition(victim.Name) != corev1.ConditionTrue; time.Sleep(250 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: agent_down %v, %s=%s 30 s after the agent reconnected; want false and True", victim.Name,
				s.agentDown(victim.Name), kube.ConditionAgentReady, s.agentCondition(victim.Name))
		}
	}
	t.Logf("agent restarted: connected, agent_down false and AgentReady=True after %s", time.Since(t1).Round(time.Millisecond))
}

// TestWitnessKubeletKilled: the kubelet of a node is SIGKILLed while its agent keeps reporting.
// kube-controller-manager marks the Node Unknown and taints it unreachable (its business); with
// the default --kubelet-down-policy=wait nodefence must not fence it nor taint it out of service.
func TestWitnessKubeletKilled(t *testing.T) {
	s := start(t, nfcluster.Options{Shipped: true})
	victim := s.c.Node("node-2")
	kubeletBack := false
	t.Cleanup(func() {
		if !kubeletBack {
			if err := victim.StartKubelet(); err != nil {
				t.Errorf("restart kubelet: %v", err)
			}
		}
	})
	if err := victim.KillKubelet(); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	var unknown, kubeletDown time.Duration
	s.watchNoFence(witnessWindow, func() {
		if unknown == 0 && s.readyStatus(victim.Name) == corev1.ConditionUnknown {
			unknown = time.Since(t0)
		}
		if kubeletDown == 0 && s.leaderNode(victim.Name).GetKubeletDown() {
			kubeletDown = time.Since(t0)
		}
	})
	if unknown == 0 {
		t.Fatalf("kube-controller-manager never marked %s Unknown within %s: the kubelet was not silenced", victim.Name, witnessWindow)
	}
	// Without this the scenario would pass for a coordinator that never watches kubelets.
	if kubeletDown == 0 {
		t.Errorf("the leader's ListNodes never showed %s kubelet_down within %s", victim.Name, witnessWindow)
	}
	t.Logf("kubelet killed: Node Unknown after %s, kubelet_down after %s; no fence in %s", unknown.Round(time.Millisecond),
		kubeletDown.Round(time.Millisecond), witnessWindow)
	s.checkUntouched(victim)
	if s.agentDown(victim.Name) {
		t.Errorf("%s shown agent_down although its agent runs", victim.Name)
	}

	kubeletBack = true
	if err := victim.StartKubelet(); err != nil {
		t.Fatal(err)
	}
	if err := s.c.WaitReady(s.ctx, 90*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := s.d.WaitAgents(s.ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestWitnessAgentRollout: every node's agent is restarted one after another, as a DaemonSet
// rolling update does (SIGTERM, a new agent, the next node once it reports). Nothing is fenced.
func TestWitnessAgentRollout(t *testing.T) {
	s := start(t, nfcluster.Options{Shipped: true})
	t0 := time.Now()
	for _, n := range s.c.Nodes {
		t.Cleanup(func() { s.ensureAgent(n) })
		if err := n.StopService(agentService); err != nil {
			t.Fatal(err)
		}
		stopped := time.Now()
		if err := n.StartService(agentService); err != nil {
			t.Fatal(err)
		}
		// The old agent is gone: contact after stopped is the new one's.
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			if v := s.leaderNode(n.Name); v.GetConnected() && v.GetLastSeen().AsTime().After(stopped) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the new agent did not report within 30 s", n.Name)
			}
		}
		if err := s.d.WaitAgents(s.ctx, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		s.watchNoFence(0, nil)
	}
	t.Logf("rolled %d agents in %s", len(s.c.Nodes), time.Since(t0).Round(time.Millisecond))
	// A fence needs a node silent for the grace period; watch a little past the rollout for one
	// started late.
	s.watchNoFence(engine.DefaultFenceTimeout+5*time.Second, nil)
	for _, n := range s.c.Nodes {
		s.checkUntouched(n)
	}
}

// TestWitnessOwnership runs after the other scenarios (Go runs a package's tests in source
// order, this file last): every Node's managedFields must show nodefence's field manager owning
// nothing but the taint list and its own condition, never Ready, the pressure conditions or
// anything else kubelet or kube-controller-manager writes. The witness scenarios also check this
// every poll while they run.
func TestWitnessOwnership(t *testing.T) {
	s := &scenario{t: t, ctx: t.Context(), c: testCluster}
	admin, err := testCluster.Admin()
	if err != nil {
		t.Fatal(err)
	}
	s.admin = admin
	// Every scenario's coordinator wrote its condition on every Node: no entry means the check
	// looked at nothing.
	if owned := s.checkOwnership(); owned == 0 {
		t.Errorf("no Node has a managedFields entry of %s", kube.FieldManager)
	}
}

// watchNoFence polls for window (at least once): no node may have a NodeFence or the
// out-of-service taint, the leader may have requested no fence, nodefence may own no foreign Node field, and observe (if set) runs each
// poll.
func (s *scenario) watchNoFence(window time.Duration, observe func()) {
	s.t.Helper()
	for deadline := time.Now().Add(window); ; time.Sleep(time.Second) {
		for _, n := range s.c.Nodes {
			if fs := s.fences(n.Name); len(fs) > 0 {
				s.t.Fatalf("%s was fenced with a witness alive: %v", n.Name, fs[0].Object["status"])
			}
			if s.outOfService(n.Name) {
				s.t.Fatalf("%s tainted out-of-service with a witness alive", n.Name)
			}
		}
		nodes, err := s.d.Nodes(s.ctx)
		if err != nil {
			s.t.Fatalf("ListNodes: %v", err)
		}
		for _, n := range nodes {
			if n.FenceRequested {
				s.t.Fatalf("the leader requested a fence of %s with a witness alive (readiness %s: %s)", n.Name, n.Readiness, n.Reason)
			}
		}
		s.checkOwnership()
		if observe != nil {
			observe()
		}
		if time.Now().After(deadline) {
			return
		}
	}
}

// checkUntouched: the node's BMC still says on and fencectl lists no fence.
func (s *scenario) checkUntouched(n *cluster.Node) {
	s.t.Helper()
	if got := s.power(n); got != "on" {
		s.t.Errorf("%s BMC says %q, want on", n.Name, got)
	}
	out, err := s.d.Fencectl(s.ctx, "list")
	if err != nil || strings.Contains(out, "node-") {
		s.t.Errorf("fencectl list = %q, %v; want no fence", out, err)
	}
}

// checkOwnership fails the test for every Node field nodefence's field manager owns but must not
// (kubescenario.ForeignNodeFields); it returns how many Nodes have an entry of that manager.
func (s *scenario) checkOwnership() int {
	s.t.Helper()
	nodes, err := s.admin.CoreV1().Nodes().List(s.ctx, metav1.ListOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	owned := 0
	for _, n := range nodes.Items {
		for _, mf := range n.ManagedFields {
			if mf.Manager == kube.FieldManager {
				owned++
				break
			}
		}
		foreign, err := kubescenario.ForeignNodeFields(n)
		if err != nil {
			s.t.Fatal(err)
		}
		if len(foreign) > 0 {
			s.t.Fatalf("%s: %s owns fields that are not its own: %v", n.Name, kube.FieldManager, foreign)
		}
	}
	return owned
}

// leaderNode is the leader's view of the named node, or nil.
func (s *scenario) leaderNode(name string) *coordv1.Node {
	nodes, err := s.d.Nodes(s.ctx)
	if err != nil {
		s.t.Logf("ListNodes: %v", err)
		return nil
	}
	for _, n := range nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// agentDown reports whether the leader shows the node's agent down.
func (s *scenario) agentDown(name string) bool { return s.leaderNode(name).GetAgentDown() }

// agentCondition is the Node's nodefence.io/AgentReady status, or "" without one.
func (s *scenario) agentCondition(name string) corev1.ConditionStatus {
	return s.condition(name, kube.ConditionAgentReady)
}

// readyStatus is the Node's Ready status.
func (s *scenario) readyStatus(name string) corev1.ConditionStatus {
	return s.condition(name, corev1.NodeReady)
}

func (s *scenario) condition(name string, typ corev1.NodeConditionType) corev1.ConditionStatus {
	s.t.Helper()
	node, err := s.admin.CoreV1().Nodes().Get(s.ctx, name, metaGet)
	if err != nil {
		s.t.Fatal(err)
	}
	for _, c := range node.Status.Conditions {
		if c.Type == typ {
			return c.Status
		}
	}
	return ""
}

// ensureAgent starts the node's agent again if a scenario left it stopped.
func (s *scenario) ensureAgent(n *cluster.Node) {
	if n.Running() && n.ServicePID(agentService) == 0 {
		if err := n.StartService(agentService); err != nil {
			s.t.Errorf("restart %s agent: %v", n.Name, err)
		}
	}
}
