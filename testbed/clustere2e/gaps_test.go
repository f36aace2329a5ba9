package clustere2e

import (
	"context"
	"fmt"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nodefence/nodefence/coordinator/kube"
	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
	"github.com/nodefence/nodefence/testbed/nfcluster"
)

// gaps measures, while a no-fence scenario runs, how each witness of one node reported and what
// the leader made of it: the kubelet's Lease renewals (renewTime, the kubelet's clock, read from
// the apiserver directly, not through the scenario's proxy), the agent's contact (the leader's
// last_seen, the coordinator's clock) and the leader's readiness of the node.
type gaps struct {
	node string
	d    *nfcluster.Deployment
	kube *kubernetes.Clientset

	mu sync.Mutex
	// lastRenew and lastSeen are the newest values read; renewAt when lastRenew was first read.
	lastRenew, lastSeen, renewAt time.Time
	// maxRenew is the largest gap between two renewTimes, maxRenewSeen between the moments this
	// poll first read them, maxSeen between two last_seen values of the agent.
	maxRenew, maxRenewSeen, maxSeen time.Duration
	renewals                        int
	// notReadySince is when the leader last turned the node not ready (zero while ready);
	// maxNotReady the longest such stretch, on this poll's clock.
	notReadySince           time.Time
	maxNotReady             time.Duration
	agentDown, kubeletDown  bool
	fenceRequested          bool
	leaderErrs, apiserverTO int

	stop chan struct{}
	done chan struct{}
}

// watchGaps starts measuring node's witnesses (poll every 250 ms) until end.
func (s *scenario) watchGaps(node string) *gaps {
	g := &gaps{node: node, d: s.d, kube: s.admin, stop: make(chan struct{}), done: make(chan struct{})}
	go g.run()
	return g
}

func (g *gaps) run() {
	defer close(g.done)
	var leader coordv1.ClusterServiceClient
	closeConn := func() {}
	defer func() { closeConn() }()
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-g.stop:
			return
		case <-t.C:
		}
		if leader == nil {
			if co := g.d.Leader(context.Background()); co != nil {
				if cl, _, c, err := g.d.Conn(co.Addr); err == nil {
					leader, closeConn = cl, c
				}
			}
		}
		if leader != nil && !g.pollLeader(leader) {
			closeConn()
			leader, closeConn = nil, func() {}
		}
		if i%2 == 0 {
			g.pollLease()
		}
	}
}

// pollLeader reads the leader's view of the node; false when the call failed.
func (g *gaps) pollLeader(cl coordv1.ClusterServiceClient) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	r, err := cl.ListNodes(ctx, &coordv1.ListNodesRequest{})
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	if err != nil {
		g.leaderErrs++
		return false
	}
	for _, n := range r.GetNodes() {
		if n.GetName() != g.node {
			continue
		}
		if seen := n.GetLastSeen().AsTime(); n.GetLastSeen() != nil && seen.After(g.lastSeen) {
			if !g.lastSeen.IsZero() {
				g.maxSeen = max(g.maxSeen, seen.Sub(g.lastSeen))
			}
			g.lastSeen = seen
		}
		g.agentDown = g.agentDown || n.GetAgentDown()
		g.kubeletDown = g.kubeletDown || n.GetKubeletDown()
		g.fenceRequested = g.fenceRequested || n.GetFenceRequested()
		ready := n.GetReadiness() == coordv1.Readiness_READINESS_READY
		switch {
		case !ready && g.notReadySince.IsZero():
			g.notReadySince = now
		case ready && !g.notReadySince.IsZero():
			g.maxNotReady = max(g.maxNotReady, now.Sub(g.notReadySince))
			g.notReadySince = time.Time{}
		}
	}
	return true
}

// pollLease reads the node's Lease in kube-node-lease.
func (g *gaps) pollLease() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	l, err := g.kube.CoordinationV1().Leases(kube.NodeLeaseNamespace).Get(ctx, g.node, metav1.GetOptions{})
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	if err != nil || l.Spec.RenewTime == nil {
		g.apiserverTO++
		return
	}
	renew := l.Spec.RenewTime.Time
	if !renew.After(g.lastRenew) {
		return
	}
	if !g.lastRenew.IsZero() {
		g.maxRenew = max(g.maxRenew, renew.Sub(g.lastRenew))
		g.maxRenewSeen = max(g.maxRenewSeen, now.Sub(g.renewAt))
		g.renewals++
	}
	g.lastRenew, g.renewAt = renew, now
}

// renewedSince tells whether the kubelet renewed its Lease after t (its clock is the machine's).
func (g *gaps) renewedSince(t time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.lastRenew.After(t)
}

// seenSince tells whether the leader heard the node's agent after t.
func (g *gaps) seenSince(t time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.lastSeen.After(t)
}

// end stops the measurement; a stretch not ready at the end counts up to now.
func (g *gaps) end() *gaps {
	close(g.stop)
	<-g.done
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.notReadySince.IsZero() {
		g.maxNotReady = max(g.maxNotReady, time.Since(g.notReadySince))
	}
	return g
}

func (g *gaps) String() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	r := func(d time.Duration) time.Duration { return d.Round(100 * time.Millisecond) }
	return fmt.Sprintf("%s: Lease renewals %d, largest renewTime gap %s (read %s apart); largest agent contact gap %s; "+
		"leader: longest not ready %s, agent_down %v, kubelet_down %v, fence requested %v; failed reads: leader %d, apiserver %d",
		g.node, g.renewals, r(g.maxRenew), r(g.maxRenewSeen), r(g.maxSeen), r(g.maxNotReady), g.agentDown, g.kubeletDown,
		g.fenceRequested, g.leaderErrs, g.apiserverTO)
}
