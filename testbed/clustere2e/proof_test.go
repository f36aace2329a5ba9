package clustere2e

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodefence/nodefence/testbed/cluster"
	"github.com/nodefence/nodefence/testbed/ipmisim"
	"github.com/nodefence/nodefence/testbed/nfcluster"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// The wrong-machine scenarios: the victim's fence configuration names the BMC of a spare machine
// (a BMC that powers nothing of the cluster), as a wrong mapping would. The victim's agent is
// killed while its kubelet keeps renewing its Lease every 10 s; nodefence's grace period (5 s) is
// shorter than that, but the kubelet is judged against its own cadence, so nothing fences the node
// automatically (that is checked first). An operator then fences it: the driver switches the spare
// off and reads it back off. The kubelet's next renewal is a witness heard after the confirmed
// power-off: the alarm (wrong_machine_at, a Warning Event), no out-of-service taint, the pod stays,
// and no second fence however long the agent stays dead. With a failover, the leader that confirmed
// the fence is killed at once and its successor must reach the same verdict from what it hears
// itself.

// wrongMachineGrace is below the kubelet's 10 s Lease renewal interval.
const wrongMachineGrace = 5 * time.Second

// wrongMachineWatch is how long the outcome is watched after the alarm: four kubelet renewals,
// each of which made the node look silent and fenced again before the fix.
const wrongMachineWatch = 45 * time.Second

func TestWrongMachine(t *testing.T) { wrongMachine(t, false) }

func TestWrongMachineFailover(t *testing.T) { wrongMachine(t, true) }

func wrongMachine(t *testing.T, failover bool) {
	spare, err := ipmisim.Start(t.TempDir(), 0, cluster.BMCUser, testCluster.BMCPassword())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = spare.Stop() })
	const victimName = "node-2" // where the writer runs (s.writer prefers it)
	opts := nfcluster.Options{Grace: wrongMachineGrace, CoordinatorArgs: []string{"--fence-guard-settle=1s"},
		BMCPort: func(n *cluster.Node) int {
			if n.Name == victimName {
				return spare.Port
			}
			return 0
		}}
	if failover {
		opts.Coordinators = 2
	}
	s := start(t, opts)
	w, pod := s.writer("wrongmachine")
	victim := s.c.Node(pod.Spec.NodeName)
	if victim.Name != victimName {
		t.Skipf("the writer runs on %s, not on %s whose BMC is mapped to the spare", victim.Name, victimName)
	}
	leader := s.d.Leader(s.ctx)
	if leader == nil {
		t.Fatal("no leader")
	}
	t.Cleanup(func() { s.ensureAgent(victim) })
	if err := victim.KillService(agentService); err != nil {
		t.Fatal(err)
	}
	// Four kubelet renewals with the agent dead: a node whose kubelet keeps its cadence is never
	// fenced automatically, although the grace period is shorter than the renewal interval. The
	// failover variant leaves this watch to TestWrongMachine: its failover comes after the fence.
	for deadline := time.Now().Add(wrongMachineWatch); !failover && time.Now().Before(deadline); time.Sleep(time.Second) {
		if fs := s.records(victim.Name); len(fs) != 0 {
			t.Fatalf("%s fenced automatically while its kubelet renewed its Lease: %v", victim.Name, ids(fs))
		}
	}
	if out, err := s.d.Fencectl(s.ctx, "fence", victim.Name, "--reason", "wrong machine test", "--no-watch"); err != nil {
		t.Fatalf("fencectl fence: %v: %s", err, out)
	}
	t0 := time.Now()

	// The fence: confirmed off by the driver's read-back of the spare's BMC.
	var rec *coordv1.NodeFence
	for deadline := time.Now().Add(90 * time.Second); rec == nil; time.Sleep(200 * time.Millisecond) {
		if fs := s.records(victim.Name); len(fs) > 0 && fs[0].ConfirmedOffAt != nil {
			rec = fs[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no fence of %s confirmed off within 90 s of the operator's fence", victim.Name)
		}
	}
	t.Logf("fence %s confirmed off %s after the operator's fence", rec.Id, time.Since(t0).Round(time.Millisecond))
	if failover {
		leader.Kill()
		t.Logf("killed the leader %s right after the confirmation", leader.ID)
	}
	if got := s.powerOf(spare.Port); got != "off" {
		t.Fatalf("the spare's BMC says %q, want off (the fence switched it off)", got)
	}

	// The alarm, on the record and as an Event on the Node.
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		var alarmed *coordv1.NodeFence
		for _, f := range s.records(victim.Name) {
			if f.Id == rec.Id && f.WrongMachineAt != nil {
				alarmed = f
			}
		}
		if alarmed != nil {
			t.Logf("alarm on %s %s after the confirmation: %v", rec.Id, alarmed.WrongMachineAt.AsTime().Sub(rec.ConfirmedOffAt.AsTime()).Round(time.Millisecond), alarmed.Evidence)
			break
		}
		s.checkNotReleased(w.Pod(), pod.UID, victim.Name)
		if time.Now().After(deadline) {
			t.Fatalf("no wrong-machine alarm on %s within 60 s of its confirmation", rec.Id)
		}
	}
	if !s.wrongMachineEvent(victim.Name) {
		t.Errorf("no FenceHitWrongMachine Warning Event on %s", victim.Name)
	}
	// Watch: the kubelet keeps renewing, the agent stays dead: no second fence, nothing released.
	for deadline := time.Now().Add(wrongMachineWatch); time.Now().Before(deadline); time.Sleep(time.Second) {
		s.checkNotReleased(w.Pod(), pod.UID, victim.Name)
		if fs := s.records(victim.Name); len(fs) != 1 {
			t.Fatalf("%d fence records of %s, want exactly 1: %v", len(fs), victim.Name, ids(fs))
		}
	}
	if fs := s.fences(victim.Name); len(fs) != 1 {
		t.Errorf("%d NodeFence objects of %s, want 1", len(fs), victim.Name)
	}
	if got := s.power(victim); got != "on" {
		t.Errorf("%s's own BMC says %q, want on (nothing switched it off)", victim.Name, got)
	}
}

// records is the leader's fence records of the node, newest first.
func (s *scenario) records(node string) []*coordv1.NodeFence {
	s.t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		if l := s.d.Leader(s.ctx); l != nil {
			_, fc, closeConn, err := s.d.Conn(l.Addr)
			if err == nil {
				ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
				r, err := fc.ListFences(ctx, &coordv1.ListFencesRequest{Node: node})
				cancel()
				closeConn()
				if err == nil {
					return r.Fences
				}
			}
		}
		if time.Now().After(deadline) {
			s.t.Fatal("no leader answers ListFences within 20 s")
		}
	}
}

// checkNotReleased fails the test if the node is tainted out of service or the writer's pod was
// deleted or replaced.
func (s *scenario) checkNotReleased(podName string, uid types.UID, node string) {
	s.t.Helper()
	if s.outOfService(node) {
		s.t.Fatalf("%s tainted out-of-service although its kubelet kept reporting", node)
	}
	p, err := s.admin.CoreV1().Pods(nfcluster.WriterNamespace).Get(s.ctx, podName, metaGet)
	if err != nil || p.UID != uid || p.DeletionTimestamp != nil {
		s.t.Fatalf("the writer pod was released: %v (uid %v, deleting %v)", err, p.GetUID(), p.GetDeletionTimestamp())
	}
}

// wrongMachineEvent reports whether the node has a FenceHitWrongMachine Warning Event.
func (s *scenario) wrongMachineEvent(node string) bool {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		evs, err := s.admin.CoreV1().Events(metav1.NamespaceDefault).List(s.ctx, metav1.ListOptions{})
		if err != nil {
			s.t.Fatal(err)
		}
		for _, ev := range evs.Items {
			if ev.Reason == "FenceHitWrongMachine" && ev.InvolvedObject.Name == node && ev.Type == "Warning" {
				return true
			}
		}
	}
	return false
}

// powerOf reads the power state of the BMC on port with ipmitool.
func (s *scenario) powerOf(port int) string {
	s.t.Helper()
	got, err := ipmisim.IpmitoolPower(s.ctx, port, cluster.BMCUser, s.c.BMCPassword())
	if err != nil {
		s.t.Fatal(err)
	}
	return got
}

func ids(fs []*coordv1.NodeFence) string {
	var out []string
	for _, f := range fs {
		out = append(out, f.Id)
	}
	return strings.Join(out, ", ")
}
