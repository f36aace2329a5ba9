package clustere2e

import (
	"strings"
	"testing"
	"time"

	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/testbed/ipmisim"
	"github.com/nodefence/nodefence/testbed/nfcluster"
)

// recoveryTimeout bounds how long a scenario waits for the StatefulSet pod to run elsewhere:
// grace + fence timeout + the fence + pod start, with room for a slow machine.
const recoveryTimeout = 150 * time.Second

// TestCrash: node-2's processes die while its BMC still says on. nodefence must power it off
// (confirmed by read-back), release it, and the StatefulSet pod must run on another node and find
// its data.
func TestCrash(t *testing.T) {
	s := start(t, nfcluster.Options{})
	w, pod := s.writer("crash")
	victim := s.c.Node(pod.Spec.NodeName)
	t.Logf("writer %s on %s", pod.UID, victim.Name)
	killed, err := victim.Crash()
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if got := s.power(victim); got != "on" {
		t.Fatalf("BMC after the crash says %q, want on (the crash must not touch power)", got)
	}
	newPod := s.recovered(w, pod.UID, victim.Name, recoveryTimeout)
	t.Logf("crash (%d processes killed) -> writer running on %s after %s", killed, newPod.Spec.NodeName, time.Since(t0).Round(time.Millisecond))
	if got := s.power(victim); got != "off" {
		t.Errorf("ipmitool says %s is %q after its pod was released, want off", victim.Name, got)
	}
	confirmed := false
	for _, f := range s.fences(victim.Name) {
		_, off := fenceStatus(f)
		confirmed = confirmed || off
	}
	if !confirmed {
		t.Errorf("no NodeFence of %s with confirmedOffAt", victim.Name)
	}
	eps := s.checkLog(w, newPod)
	t.Logf("writer log: %s", describe(eps))
}

// TestPartition: node-2's link is cut while it keeps running and writing to the shared volume.
// nodefence must power it off before anything is released: the writer log must show the old
// writer's last write before the new writer's first.
func TestPartition(t *testing.T) {
	s := start(t, nfcluster.Options{})
	w, pod := s.writer("partition")
	victim := s.c.Node(pod.Spec.NodeName)
	if err := victim.Partition(); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	atCut, _ := w.Lines()
	newPod := s.recovered(w, pod.UID, victim.Name, recoveryTimeout)
	t.Logf("partition -> writer running on %s after %s", newPod.Spec.NodeName, time.Since(t0).Round(time.Millisecond))
	if got := s.power(victim); got != "off" {
		t.Errorf("ipmitool says %s is %q after its pod was released, want off", victim.Name, got)
	}
	eps := s.checkLog(w, newPod)
	t.Logf("writer log: %s", describe(eps))
	// The check means something only if the cut-off writer really kept writing.
	if old := eps[0]; old.UID != string(pod.UID) || old.Last < len(atCut)+20 {
		t.Errorf("the partitioned writer wrote up to line %d, only %d lines after the cut at line %d; want it to keep writing until power-off",
			old.Last+1, old.Last+1-len(atCut), len(atCut))
	}
}

// TestCutOffCoordinator: the coordinator loses every agent while the apiserver still sees every
// node Ready. With what deploy/ ships, nothing may be fenced and nothing released.
func TestCutOffCoordinator(t *testing.T) {
	s := start(t, nfcluster.Options{Shipped: true})
	w, pod := s.writer("cutoff")
	for _, n := range s.c.Nodes {
		if err := n.Blackhole(s.c.HostIP()); err != nil {
			t.Fatal(err)
		}
	}
	// Twice the grace period plus the fence timeout and a margin: long past the moment a fence
	// would have started.
	wait := 2*engine.DefaultNodeMonitorGracePeriod + engine.DefaultFenceTimeout + 5*time.Second
	for deadline := time.Now().Add(wait); time.Now().Before(deadline); time.Sleep(2 * time.Second) {
		for _, n := range s.c.Nodes {
			if fs := s.fences(n.Name); len(fs) > 0 {
				t.Fatalf("%s was fenced while only the coordinator was cut off: %v", n.Name, fs[0].Object["status"])
			}
			if s.outOfService(n.Name) {
				t.Fatalf("%s tainted out-of-service", n.Name)
			}
		}
	}
	cur, err := w.RunningPod(s.ctx, "", time.Second)
	if err != nil || cur.UID != pod.UID {
		t.Errorf("the writer pod changed or stopped: %v", err)
	}
	for _, n := range s.c.Nodes {
		if got := s.power(n); got != "on" {
			t.Errorf("%s BMC says %q, want on", n.Name, got)
		}
		node, err := s.admin.CoreV1().Nodes().Get(s.ctx, n.Name, metaGet)
		if err != nil || !nodeReady(node) {
			t.Errorf("%s not Ready at the apiserver (%v): the scenario needs kubelets that still report", n.Name, err)
		}
	}
	out, err := s.d.Fencectl(s.ctx, "list")
	if err != nil || strings.Contains(out, "node-") {
		t.Errorf("fencectl list = %q, %v; want no fence", out, err)
	}
}

// TestStuckBMC: the BMC accepts power-off but the power never reads back off. No taint, no
// deletion; the NodeFence is in error, visible in fencectl and on the NodeFence object.
func TestStuckBMC(t *testing.T) {
	s := start(t, nfcluster.Options{FenceOpTimeout: 5 * time.Second})
	w, pod := s.writer("stuck")
	victim := s.c.Node(pod.Spec.NodeName)
	if err := victim.BMC.SetFault(ipmisim.FaultStuck); err != nil {
		t.Fatal(err)
	}
	if _, err := victim.Crash(); err != nil {
		t.Fatal(err)
	}
	var listed string
	for deadline := time.Now().Add(recoveryTimeout); ; time.Sleep(time.Second) {
		objError := false
		for _, f := range s.fences(victim.Name) {
			st, off := fenceStatus(f)
			if off {
				t.Fatalf("NodeFence of %s confirmed off although the BMC never switched off", victim.Name)
			}
			objError = objError || strings.EqualFold(st, "error")
		}
		out, err := s.d.Fencectl(s.ctx, "list", "--status", "error")
		if err == nil && strings.Contains(out, victim.Name) && objError {
			listed = out
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no NodeFence of %s in error within %s; fencectl: %s %v", victim.Name, recoveryTimeout, out, err)
		}
	}
	t.Logf("fencectl list --status error:\n%s", listed)
	if s.outOfService(victim.Name) {
		t.Errorf("%s tainted out-of-service although never confirmed off", victim.Name)
	}
	cur, err := s.admin.CoreV1().Pods(nfcluster.WriterNamespace).Get(s.ctx, w.Pod(), metaGet)
	if err != nil || cur.UID != pod.UID || cur.DeletionTimestamp != nil {
		t.Errorf("the writer pod was released (%v): uid %s -> %s", err, pod.UID, cur.GetUID())
	}
	if got := s.power(victim); got != "on" {
		t.Errorf("BMC says %q, want on (stuck)", got)
	}
}

// TestLeaderKilledMidFence: two coordinators; the leader is SIGKILLed while its power-off is at
// the BMC. The other takes over and the fence completes exactly once: one power-off at the BMC,
// one NodeFence, the pod running elsewhere.
func TestLeaderKilledMidFence(t *testing.T) {
	s := start(t, nfcluster.Options{Coordinators: 2, FenceOpTimeout: 30 * time.Second})
	w, pod := s.writer("leaderkill")
	victim := s.c.Node(pod.Spec.NodeName)
	leader := s.d.Leader(s.ctx)
	if leader == nil {
		t.Fatal("no leader")
	}
	before := len(calls(t, victim.BMC)) // the BMC's call log spans earlier scenarios
	// A slow BMC keeps the power-off in flight long enough to kill the leader during it (below the
	// driver's 1 s retransmission interval: a slower BMC would see the command again).
	if err := victim.BMC.SetDelay(300 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if _, err := victim.Crash(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(recoveryTimeout); ; time.Sleep(50 * time.Millisecond) {
		if powerOffs(calls(t, victim.BMC)[before:]) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no power-off reached the BMC")
		}
	}
	leader.Kill()
	t.Logf("killed the leader %s while the power-off was at the BMC", leader.ID)
	newPod := s.recovered(w, pod.UID, victim.Name, recoveryTimeout)
	if err := victim.BMC.SetDelay(0); err != nil {
		t.Fatal(err)
	}
	if got := s.power(victim); got != "off" {
		t.Errorf("ipmitool says %q, want off", got)
	}
	if c := calls(t, victim.BMC)[before:]; powerOffs(c) != 1 {
		t.Errorf("%d power-offs reached the BMC, want exactly 1: %q", powerOffs(c), c)
	}
	if fs := s.fences(victim.Name); len(fs) != 1 {
		t.Errorf("%d NodeFence objects of %s, want 1", len(fs), victim.Name)
	} else if st, off := fenceStatus(fs[0]); !strings.EqualFold(st, "done") || !off {
		t.Errorf("NodeFence of %s: status %q, confirmed off %v; want done and confirmed", victim.Name, st, off)
	}
	if nl := s.d.Leader(s.ctx); nl == nil || nl == leader {
		t.Errorf("leader after the kill: %v", nl)
	}
	s.checkLog(w, newPod)
}

// calls is the BMC's chassis-control call log.
func calls(t *testing.T, b *ipmisim.BMC) []string {
	t.Helper()
	c, err := b.Calls()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// powerOffs counts the power-off commands among calls.
func powerOffs(calls []string) int {
	n := 0
	for _, c := range calls {
		if c == "set power 0" {
			n++
		}
	}
	return n
}
