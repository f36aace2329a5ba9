package clustere2e

import (
	"context"
	"flag"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
	"github.com/nodefence/nodefence/testbed/cluster"
	"github.com/nodefence/nodefence/testbed/nfcluster"
	"github.com/nodefence/nodefence/testbed/tcpproxy"
)

// The no-fence scenarios (issue 25, item 2): the conditions that made Kubernetes choose a 40-50 s
// grace period — a stalled apiserver, a slow one, a flapping link, a CPU-starved node, a grace
// shorter than the kubelet's Lease renewal — on the real cluster, with the coordinator on nothing
// but what deploy/ ships (nfcluster.Options.Shipped). None may fence or release anything: no fence
// record (the leader's ListFences and fencectl), no fence requested, no NodeFence, no out-of-service
// taint, no pod of the node deleted, and the node as it was afterwards. Every scenario logs what its
// witnesses did (gaps): the kubelet's largest Lease renewal gap, the agent's largest contact gap, and
// how long the leader judged the node not ready.
//
// TestNoFence runs the short variants in make test; TestNoFenceLong (make chaos-cluster,
// -nofence.long) the long ones. Two coordinators run, and the leader is SIGKILLed halfway through
// every fault (started again after it).

var (
	nofenceLong = flag.Bool("nofence.long", false, "run TestNoFenceLong (make chaos-cluster)")
	// nofenceArgs adds coordinator flags to the shipped ones: for proving that the scenarios can
	// fail (e.g. -nofence.args='--node-monitor-grace-period=2s --fence-timeout=0s').
	nofenceArgs = flag.String("nofence.args", "", "extra coordinator flags of the no-fence scenarios, space-separated")
	// nofenceDeep adds an exploration beyond the list: the agent and kubelet at 0.1% of a
	// CPU for a minute (docs/no-fence.md says what it measured).
	nofenceDeep = flag.Bool("nofence.deep", false, "also starve the agent and kubelet at 0.1% of a CPU for 1 min")
)

// chaosPlan is how long each fault lasts.
type chaosPlan struct {
	stall, slow, flap, starve time.Duration
	// shortGrace is how long the grace-below-renewal scenario watches (several renewals).
	shortGrace time.Duration
	// failover kills the leading coordinator in the middle of every fault (two coordinators; the
	// killed one starts again once the fault is over).
	failover bool
}

var (
	shortPlan = chaosPlan{stall: 20 * time.Second, slow: 30 * time.Second, flap: 30 * time.Second, starve: 30 * time.Second,
		shortGrace: 35 * time.Second, failover: true}
	longPlan = chaosPlan{stall: 20 * time.Second, slow: 2 * time.Minute, flap: time.Minute, starve: 30 * time.Second,
		shortGrace: 90 * time.Second, failover: true}
)

// The faults' shapes.
const (
	slowMin, slowMax = 2 * time.Second, 5 * time.Second // every request to the apiserver delayed
	flapDown, flapUp = 3 * time.Second, 3 * time.Second // the node's link
	starvePermille   = 10                               // 1% of one CPU
	// afterFault is how long a scenario keeps watching once both live witnesses reported again.
	afterFault = 10 * time.Second
	// agentDownWithin bounds the wait for the leader to judge a killed agent silent (the shipped
	// grace period is 50 s).
	agentDownWithin = 90 * time.Second
)

func TestNoFence(t *testing.T) { noFence(t, shortPlan) }

func TestNoFenceLong(t *testing.T) {
	if !*nofenceLong {
		t.Skip("make chaos-cluster runs it (-nofence.long)")
	}
	noFence(t, longPlan)
}

func noFence(t *testing.T, plan chaosPlan) {
	// The coordinators reach the apiserver through a proxy that the slow-apiserver scenario slows
	// down (and the nodes through it while it runs); it passes everything on at once otherwise.
	proxy, err := tcpproxy.StartDelayed(net.JoinHostPort(testCluster.HostIP().String(), "0"), testCluster.APIServerAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	coordinators := 1
	if plan.failover {
		coordinators = 2
	}
	s := start(t, nfcluster.Options{Shipped: true, APIServer: proxy.Addr(), Coordinators: coordinators, CoordinatorArgs: strings.Fields(*nofenceArgs)})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	t.Cleanup(cancel)
	s.ctx = ctx
	_, pod := s.writer("nofence")
	victim := s.c.Node(pod.Spec.NodeName)
	t.Logf("writer %s on %s: the victim (the shipped --fence-policy=stateful fences only nodes with such pods)", pod.UID, victim.Name)
	proxyAddr := netip.MustParseAddrPort(proxy.Addr())

	// The apiserver scenarios run with the victim's agent dead (from the first to the end of the
	// second): its kubelet is its only witness.
	t.Run("apiserver-stalled", func(t *testing.T) {
		t.Cleanup(func() {
			if t.Failed() {
				s.ensureAgent(victim)
			}
		})
		x := s.chaos(t, victim)
		x.failover = plan.failover
		x.killAgent()
		x.run("apiserver stalled", plan.stall, func() {
			x.stallAPIServer(plan.stall)
		})
	})
	t.Run("apiserver-slow", func(t *testing.T) {
		t.Cleanup(func() { s.ensureAgent(victim) })
		x := s.chaos(t, victim)
		x.failover = plan.failover
		x.killAgent()
		x.run("apiserver slow", plan.slow, func() {
			x.slowAPIServer(proxy, proxyAddr, plan.slow)
		})
		x.restartAgent()
	})
	t.Run("link-flapping", func(t *testing.T) {
		x := s.chaos(t, victim)
		x.failover = plan.failover
		x.run("link flapping", plan.flap, func() { x.flap(plan.flap) })
	})
	t.Run("cpu-starved", func(t *testing.T) {
		x := s.chaos(t, victim)
		x.failover = plan.failover
		x.run("agent and kubelet CPU-starved", plan.starve, func() { x.starve(starvePermille, plan.starve) })
	})
	if *nofenceDeep {
		t.Run("cpu-starved-deep", func(t *testing.T) {
			x := s.chaos(t, victim)
			x.failover = plan.failover
			x.run("agent and kubelet at 0.1% of a CPU", time.Minute, func() { x.starve(1, time.Minute) })
		})
	}
	t.Run("grace-below-lease-renewal", func(t *testing.T) {
		s.d.Stop()
		x := start(t, nfcluster.Options{Shipped: true,
			CoordinatorArgs: append([]string{"--node-monitor-grace-period=5s", "--fence-timeout=0s"}, strings.Fields(*nofenceArgs)...)}).chaos(t, victim)
		x.killAgent()
		g := x.run("grace 5 s, kubelet renewing every 10 s", plan.shortGrace, func() {
			x.watchNoFence(plan.shortGrace, nil)
		})
		// The kubelet witness must never have been judged silent: the node stays ready (its agent
		// down alone) through every gap between two renewals.
		if g.maxNotReady > 0 {
			t.Errorf("the leader judged %s not ready for %s with its kubelet renewing: %s", victim.Name, g.maxNotReady, g)
		}
	})
}

// chaos is one no-fence scenario on the victim node.
type chaos struct {
	*scenario
	victim *cluster.Node
	// pods are the victim's pods when the scenario began; taints its taints.
	pods   map[types.UID]string
	taints []string
	// agentDead: the scenario killed the victim's agent.
	agentDead bool
	// failover: run kills the leading coordinator halfway through the fault.
	failover bool
}

// chaos begins a scenario on victim as subtest t: every node Ready, every agent connected, and
// what the victim runs and carries noted for checkAfter.
func (s *scenario) chaos(t *testing.T, victim *cluster.Node) *chaos {
	sub := *s
	sub.t = t
	x := &chaos{scenario: &sub, victim: victim, pods: map[types.UID]string{}}
	if err := s.c.WaitReady(s.ctx, 90*time.Second); err != nil {
		t.Fatal(err)
	}
	if victim.ServicePID(agentService) != 0 {
		if err := s.d.WaitAgents(s.ctx, 60*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	pods, err := s.admin.CoreV1().Pods("").List(s.ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + victim.Name})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		x.pods[p.UID] = p.Namespace + "/" + p.Name
	}
	x.taints = x.taintKeys()
	return x
}

// run measures the victim's witnesses while fault runs, waits until every witness still alive
// reported after it and watches afterFault more, and checks that nothing was fenced or released.
func (x *chaos) run(what string, length time.Duration, fault func()) *gaps {
	g := x.watchGaps(x.victim.Name)
	// The measurement starts from a renewal read before the fault (a stalled apiserver answers
	// nothing).
	for deadline := time.Now().Add(10 * time.Second); !g.renewedSince(time.Time{}); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			x.t.Fatalf("the victim's Lease could not be read: %s", g)
		}
	}
	t0 := time.Now()
	failedOver := x.failoverAt(length / 2)
	fault()
	end := time.Now()
	x.t.Logf("%s for %s (planned %s)", what, end.Sub(t0).Round(100*time.Millisecond), length)
	failedOver()
	for deadline := end.Add(90 * time.Second); !g.renewedSince(end) || (!x.agentDead && !g.seenSince(end)); time.Sleep(250 * time.Millisecond) {
		if time.Now().After(deadline) {
			x.t.Errorf("the victim's witnesses did not report within 90 s after the fault: %s", g)
			break
		}
	}
	x.watchNoFence(afterFault, nil)
	g.end()
	x.t.Logf("%s: %s", what, g)
	if g.fenceRequested {
		x.t.Errorf("the leader requested a fence of %s", x.victim.Name)
	}
	x.checkAfter()
	return g
}

// hold lets d pass while checking, every second, what the leader alone can tell (no fence
// requested, no fence record): the apiserver may be stalled.
func (x *chaos) hold(d time.Duration) {
	t0 := time.Now()
	for time.Since(t0) < d {
		x.checkLeader()
		time.Sleep(min(time.Second, max(0, d-time.Since(t0))))
	}
}

// checkLeader: the leader requested no fence and holds no fence record.
func (x *chaos) checkLeader() {
	x.t.Helper()
	co := x.d.Leader(x.ctx)
	if co == nil {
		return // during a failover
	}
	cl, fc, closeConn, err := x.d.Conn(co.Addr)
	if err != nil {
		return
	}
	defer closeConn()
	ctx, cancel := context.WithTimeout(x.ctx, 2*time.Second)
	defer cancel()
	if nodes, err := cl.ListNodes(ctx, &coordv1.ListNodesRequest{}); err == nil {
		for _, n := range nodes.GetNodes() {
			if n.GetFenceRequested() {
				x.t.Fatalf("the leader requested a fence of %s (readiness %s: %s)", n.GetName(), n.GetReadiness(), n.GetReason())
			}
		}
	}
	if r, err := fc.ListFences(ctx, &coordv1.ListFencesRequest{}); err == nil && len(r.GetFences()) > 0 {
		f := r.GetFences()[0]
		x.t.Fatalf("fence record %s of %s: %s", f.GetId(), f.GetNode(), f.GetStatus())
	}
}

// checkAfter: no fence record (fencectl), the BMC on, no out-of-service taint, every pod the victim
// ran still there and not deleted, and within a minute the victim Ready with the taints it had.
func (x *chaos) checkAfter() {
	x.t.Helper()
	x.checkUntouched(x.victim)
	if x.outOfService(x.victim.Name) {
		x.t.Errorf("%s tainted out-of-service", x.victim.Name)
	}
	for uid, name := range x.pods {
		ns, n, _ := strings.Cut(name, "/")
		p, err := x.admin.CoreV1().Pods(ns).Get(x.ctx, n, metav1.GetOptions{})
		switch {
		case err != nil:
			x.t.Errorf("pod %s of %s: %v", name, x.victim.Name, err)
		case p.UID != uid || p.DeletionTimestamp != nil:
			x.t.Errorf("pod %s of %s was deleted (uid %s, now %s, deletion %v)", name, x.victim.Name, uid, p.UID, p.DeletionTimestamp)
		}
	}
	var now []string
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
		node, err := x.admin.CoreV1().Nodes().Get(x.ctx, x.victim.Name, metaGet)
		now = x.taintKeys()
		if err == nil && nodeReady(node) && slices.Equal(now, x.taints) {
			return
		}
		if time.Now().After(deadline) {
			x.t.Errorf("%s a minute after the fault: Ready %v, taints %q, before %q", x.victim.Name, err == nil && nodeReady(node), now, x.taints)
			return
		}
	}
}

// taintKeys are the victim's taints as key:effect, sorted.
func (x *chaos) taintKeys() []string {
	node, err := x.admin.CoreV1().Nodes().Get(x.ctx, x.victim.Name, metaGet)
	if err != nil {
		x.t.Fatal(err)
	}
	var out []string
	for _, tn := range node.Spec.Taints {
		out = append(out, tn.Key+":"+string(tn.Effect))
	}
	slices.Sort(out)
	return out
}

// killAgent SIGKILLs the victim's agent (unless dead) and waits until the leader shows it down.
func (x *chaos) killAgent() {
	x.t.Helper()
	x.agentDead = true
	if x.victim.ServicePID(agentService) == 0 {
		return
	}
	if err := x.victim.KillService(agentService); err != nil {
		x.t.Fatal(err)
	}
	t0 := time.Now()
	for !x.agentDown(x.victim.Name) {
		x.checkLeader()
		if time.Since(t0) > agentDownWithin {
			x.t.Fatalf("the leader did not show %s agent_down within %s", x.victim.Name, agentDownWithin)
		}
		time.Sleep(500 * time.Millisecond)
	}
	x.t.Logf("agent of %s killed: shown agent_down after %s", x.victim.Name, time.Since(t0).Round(100*time.Millisecond))
}

// restartAgent starts the victim's agent again and waits until it reports.
func (x *chaos) restartAgent() {
	x.t.Helper()
	x.ensureAgent(x.victim)
	x.agentDead = false
	if err := x.d.WaitAgents(x.ctx, 60*time.Second); err != nil {
		x.t.Fatal(err)
	}
}

// failoverAt SIGKILLs the leading coordinator after d when x.failover; the function it returns,
// called once the fault is over, cancels the kill if it did not happen yet and starts the killed
// replica again.
func (x *chaos) failoverAt(d time.Duration) func() {
	if !x.failover {
		return func() {}
	}
	var killed *nfcluster.Coordinator
	fired := make(chan struct{})
	t0 := time.Now()
	timer := time.AfterFunc(d, func() {
		defer close(fired)
		if co := x.d.Leader(x.ctx); co != nil {
			co.Kill()
			killed = co
			x.t.Logf("leader %s SIGKILLed %s into the fault", co.ID, time.Since(t0).Round(100*time.Millisecond))
		} else {
			x.t.Errorf("no leader to kill %s into the fault", time.Since(t0).Round(100*time.Millisecond))
		}
	})
	return func() {
		if timer.Stop() {
			x.t.Errorf("the fault ended before the failover planned %s into it", d)
			return
		}
		<-fired
		if killed != nil {
			if err := killed.Restart(); err != nil {
				x.t.Errorf("restart %s: %v", killed.ID, err)
			}
		}
	}
}

// stallAPIServer SIGSTOPs kube-apiserver for d, then SIGCONTs it.
func (x *chaos) stallAPIServer(d time.Duration) {
	var once sync.Once
	resume := func() {
		once.Do(func() {
			if err := x.c.SignalAPIServer(syscall.SIGCONT); err != nil {
				x.t.Errorf("SIGCONT kube-apiserver: %v", err)
			}
		})
	}
	x.t.Cleanup(resume)
	if err := x.c.SignalAPIServer(syscall.SIGSTOP); err != nil {
		x.t.Fatal(err)
	}
	x.hold(d)
	resume()
}

// slowAPIServer routes every node's apiserver traffic through the proxy (the coordinators' goes
// through it always) and delays every chunk a client sends by 2 to 5 s for d.
func (x *chaos) slowAPIServer(proxy *tcpproxy.Proxy, addr netip.AddrPort, d time.Duration) {
	restore := func() {
		proxy.SetDelay(0, 0)
		for _, n := range x.c.Nodes {
			if err := n.UnredirectAPIServer(addr); err != nil {
				x.t.Errorf("%s: %v", n.Name, err)
			}
		}
	}
	var once sync.Once
	x.t.Cleanup(func() { once.Do(restore) })
	for _, n := range x.c.Nodes {
		if err := n.RedirectAPIServer(addr); err != nil {
			x.t.Fatal(err)
		}
	}
	proxy.SetDelay(slowMin, slowMax)
	x.hold(d)
	once.Do(restore)
}

// flap takes the victim's link down for flapDown and up for flapUp, for d.
func (x *chaos) flap(d time.Duration) {
	x.t.Cleanup(func() { _ = x.victim.Heal() })
	cycles := int(d / (flapDown + flapUp))
	for i := range cycles {
		if err := x.victim.Partition(); err != nil {
			x.t.Fatal(err)
		}
		x.hold(flapDown)
		if err := x.victim.Heal(); err != nil {
			x.t.Fatal(err)
		}
		if i < cycles-1 {
			x.hold(flapUp)
		}
	}
}

// starve confines the victim's agent and kubelet to permille thousandths of one CPU for d.
func (x *chaos) starve(permille int, d time.Duration) {
	agent, kubelet := x.victim.ServicePID(agentService), x.victim.KubeletPID()
	if agent == 0 || kubelet == 0 {
		x.t.Fatalf("%s: agent pid %d, kubelet pid %d", x.victim.Name, agent, kubelet)
	}
	restore, err := x.victim.StarveCPU(permille, agent, kubelet)
	if err != nil {
		x.t.Fatal(err)
	}
	var once sync.Once
	undo := func() {
		once.Do(func() {
			stat, err := restore()
			if err != nil {
				x.t.Errorf("restore the CPU of %s: %v", x.victim.Name, err)
			}
			x.t.Logf("%s's agent and kubelet at %d‰ of a CPU: %s (throttled_time in ns)", x.victim.Name, permille, stat)
			if !strings.Contains(stat, "nr_throttled") || strings.Contains(stat, "nr_throttled 0") {
				x.t.Errorf("the CPU quota never throttled %s's agent and kubelet: %q", x.victim.Name, stat)
			}
		})
	}
	x.t.Cleanup(undo)
	x.hold(d)
	undo()
}
