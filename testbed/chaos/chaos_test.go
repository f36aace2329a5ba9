package chaos

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodefence/nodefence/testbed/kube/kubetest"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// binDir holds the binaries built once for this package's tests.
var binDir string

func TestMain(m *testing.M) {
	code := func() int {
		dir, err := os.MkdirTemp("", "nfc-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		binDir = dir
		return m.Run()
	}()
	os.Exit(code)
}

// prerequisites skips the test when this machine cannot run the cluster, and builds the binaries.
func prerequisites(t *testing.T) (etcd string) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts 3 etcd members, 3 coordinators, a driver, BMCs and agents in namespaces")
	}
	if os.Geteuid() != 0 || runtime.GOOS != "linux" {
		t.Skip("network namespaces need root on Linux")
	}
	for _, bin := range []string{"ip", "iptables", "nsenter", "ipmi_sim"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not installed", bin)
		}
	}
	dir, err := kubetest.AssetsDir()
	if err != nil {
		t.Fatal(err)
	}
	etcd = filepath.Join(dir, kubetest.EtcdBinary)
	if _, err := os.Stat(etcd); err != nil {
		t.Skipf("etcd binary missing (make kube-assets builds it): %v", err)
	}
	if _, err := os.Stat(filepath.Join(binDir, "coordinator")); err != nil {
		out, err := exec.Command("go", "build", "-o", binDir+"/",
			"github.com/nodefence/nodefence/coordinator/cmd/coordinator",
			"github.com/nodefence/nodefence/fence-drivers/cmd/fence-driver",
			"github.com/nodefence/nodefence/node-agent/cmd/node-agent").CombinedOutput()
		if err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}
	}
	return etcd
}

// prefix is a namespace prefix unique to this process and test.
func prefix(tag string) string { return fmt.Sprintf("nfc%d%s-", os.Getpid()%100000, tag) }

func startCluster(t *testing.T, ctx context.Context, tag string, agents int, args ...string) *Cluster {
	t.Helper()
	etcd := prerequisites(t)
	dir := t.TempDir()
	if keep := os.Getenv("CHAOS_KEEP_LOGS"); keep != "" { // a directory to leave the logs in
		dir = filepath.Join(keep, t.Name())
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	c, err := Start(ctx, Options{Dir: dir, Bin: binDir, Etcd: etcd, Prefix: prefix(tag), Agents: agents,
		CoordinatorArgs: args, Log: t.Logf})
	if err != nil {
		if c != nil {
			c.Close()
		}
		dumpLogs(t, dir)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() && os.Getenv("CHAOS_QUIT") != "" {
			for _, p := range c.Coord {
				_ = p.Signal(syscall.SIGQUIT)
			}
			time.Sleep(time.Second)
		}
		c.Close()
		if t.Failed() {
			dumpLogs(t, dir)
		}
	})
	return c
}

// dumpLogs prints the tail of every process log.
func dumpLogs(t *testing.T, dir string) {
	logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	for _, l := range logs {
		data, _ := os.ReadFile(l)
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		if len(lines) > 40 {
			lines = lines[len(lines)-40:]
		}
		t.Logf("--- %s (last %d lines)\n%s", filepath.Base(l), len(lines), strings.Join(lines, "\n"))
	}
}

// waitAgents waits until every node whose agent runs is connected to the leader; it returns how long
// that took.
func waitAgents(t *testing.T, ctx context.Context, c *Cluster, l Leader, want []string, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	if err := poll(ctx, timeout, "agents at the leader", func() error {
		got, err := c.ConnectedNodes(ctx, l.Index)
		if err != nil {
			return err
		}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			return fmt.Errorf("connected %v, want %v", got, want)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return time.Since(start)
}

// The testbed's defaults (5 s election lease, 40 s grace): the leader is killed with SIGKILL while a
// fence is in flight, then stopped with SIGSTOP, then cut from every etcd member. Each time a new
// leader takes over with a higher epoch, every agent reconnects to it, the fence completes with one
// power-off, and the old leader, once back, does not act.
func TestFailoverOnRealProcesses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := startCluster(t, ctx, "f", 4)
	l, err := c.WaitLeader(ctx, 60*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	all := append([]string(nil), c.Nodes...)
	waitAgents(t, ctx, c, l, all, 60*time.Second)
	t.Logf("leader %s epoch %d; agents %v connected", l.ID, l.Epoch, all)

	// 1. SIGKILL while a fence is in flight. The victim's agent is gone (its node is dead); its BMC
	// answers slowly so the power-off is under way when the leader dies.
	victim := c.Nodes[0]
	if err := c.Agents[0].Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	live := c.Nodes[1:]
	if err := c.BMCs[victim].SetDelay(300 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	fc := coordv1.NewFenceServiceClient(c.Conn(c.CoordAddr[l.Index]))
	fr, err := fc.Fence(ctx, &coordv1.FenceRequest{Node: victim, Reason: "chaos: in flight at the kill"})
	if err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, 20*time.Second, "the power-off under way", func() error {
		calls, err := c.BMCs[victim].Calls()
		if err != nil || len(calls) == 0 {
			return fmt.Errorf("no BMC call yet (%v)", err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	if err := c.Coord[l.Index].Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	l2, err := c.WaitLeader(ctx, 30*time.Second, l.Epoch)
	if err != nil {
		t.Fatal(err)
	}
	elected := time.Since(killed)
	back := waitAgents(t, ctx, c, l2, live, 30*time.Second) + elected
	rec := waitFence(t, ctx, c, l2, fr.Fence.Id)
	t.Logf("SIGKILL: leader %s -> %s (epoch %d -> %d): elected after %s, agents back after %s; fence %s %s",
		l.ID, l2.ID, l.Epoch, l2.Epoch, elected.Round(time.Millisecond), back.Round(time.Millisecond), rec.Id, rec.Status)
	checkOnePowerOff(t, c, victim)
	if err := c.Coord[l.Index].Start(); err != nil { // back as a follower
		t.Fatal(err)
	}

	// 2. SIGSTOP: the process holds its sockets but answers nothing. Its lease runs out; agents leave
	// it on their own; once continued it finds its term over and does not lead.
	stopped := l2
	if err := c.Coord[stopped.Index].Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	l3, err := c.WaitLeader(ctx, 30*time.Second, stopped.Epoch)
	if err != nil {
		t.Fatal(err)
	}
	back = waitAgents(t, ctx, c, l3, live, 30*time.Second)
	t.Logf("SIGSTOP: leader %s -> %s: elected after %s, agents back %s later", stopped.ID, l3.ID, time.Since(at).Round(time.Millisecond), back.Round(time.Millisecond))
	if err := c.Coord[stopped.Index].Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	notLeading(t, ctx, c, stopped.Index)

	// 3. The leader is cut from every etcd member but not from the agents: it must step down and
	// send its agents away, naming the reason, and they must reach the new leader.
	cut := l3
	for _, e := range c.Etcd {
		if err := c.Net.Cut(c.Coord[cut.Index].Member, e.Member); err != nil {
			t.Fatal(err)
		}
	}
	at = time.Now()
	l4, err := c.WaitLeader(ctx, 30*time.Second, cut.Epoch)
	if err != nil {
		t.Fatal(err)
	}
	back = waitAgents(t, ctx, c, l4, live, 30*time.Second)
	t.Logf("cut from etcd: leader %s -> %s: elected after %s, agents back %s later", cut.ID, l4.ID, time.Since(at).Round(time.Millisecond), back.Round(time.Millisecond))
	// It steps down after four fifths of its lease without a read, or when its lease is judged lost,
	// whichever comes first.
	if log, _ := os.ReadFile(c.Coord[cut.Index].Log); !strings.Contains(string(log), "cannot reach etcd") &&
		!strings.Contains(string(log), "leadership lost: election session ended") {
		t.Errorf("the cut leader's log does not say it lost etcd")
	}
	for _, e := range c.Etcd {
		if err := c.Net.Heal(c.Coord[cut.Index].Member, e.Member); err != nil {
			t.Fatal(err)
		}
	}
	notLeading(t, ctx, c, cut.Index)
	// The agents stay with the leader; the node that was fenced stays off.
	waitAgents(t, ctx, c, l4, live, 30*time.Second)
	checkOnePowerOff(t, c, victim)
}

// waitFence waits until the record is finished and returns it; it must be DONE by the given leader.
func waitFence(t *testing.T, ctx context.Context, c *Cluster, l Leader, id string) *coordv1.NodeFence {
	t.Helper()
	var rec *coordv1.NodeFence
	if err := poll(ctx, 60*time.Second, "fence "+id+" done", func() error {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		r, err := coordv1.NewFenceServiceClient(c.Conn(c.CoordAddr[l.Index])).GetFence(cctx, &coordv1.GetFenceRequest{Id: id})
		if err != nil {
			return err
		}
		rec = r.Fence
		if rec.FinishedAt == nil {
			return fmt.Errorf("status %s", rec.Status)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if rec.Status != coordv1.FenceStatus_FENCE_STATUS_DONE || rec.Epoch != l.Epoch {
		t.Fatalf("fence %s: status %s epoch %d; want DONE by the new leader's epoch %d", rec.Id, rec.Status, rec.Epoch, l.Epoch)
	}
	return rec
}

// checkOnePowerOff checks the BMC was switched off exactly once and is off.
func checkOnePowerOff(t *testing.T, c *Cluster, node string) {
	t.Helper()
	calls, err := c.BMCs[node].Calls()
	if err != nil {
		t.Fatal(err)
	}
	offs := 0
	for _, call := range calls {
		if call == "set power 0" {
			offs++
		}
	}
	on, err := c.BMCs[node].Power()
	if err != nil || on || offs != 1 {
		t.Fatalf("BMC of %s: on=%v (%v), %d power-offs in %q; want off, exactly one", node, on, err, offs, calls)
	}
}

// notLeading checks that coordinator i, back from a fault, answers as a follower.
func notLeading(t *testing.T, ctx context.Context, c *Cluster, i int) {
	t.Helper()
	if err := poll(ctx, 20*time.Second, c.Coord[i].Name+" answering as a follower", func() error {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		r, err := coordv1.NewClusterServiceClient(c.Conn(c.CoordAddr[i])).GetLeader(cctx, &coordv1.GetLeaderRequest{})
		if err != nil {
			return err
		}
		if r.IsSelf || r.Id == c.Coord[i].Name {
			return fmt.Errorf("%s still leads (epoch %d)", r.Id, r.Epoch)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

var (
	long      = flag.Bool("chaos.long", false, "run TestChaosLong (make chaos)")
	longSeed  = flag.Uint64("chaos.seed", 0, "TestChaosLong's seed (0: from the clock, printed)")
	longSteps = flag.Int("chaos.steps", 40, "TestChaosLong's number of faults")
)

// A long run on demand (make chaos): more faults, a seed from the clock unless given.
func TestChaosLong(t *testing.T) {
	if !*long {
		t.Skip("make chaos runs it (-chaos.long)")
	}
	seed := *longSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with make chaos CHAOS_SEED=%d)", seed, seed)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	c := startCluster(t, ctx, "l", 6, shortArgs...)
	if err := c.waitLive(ctx, 60*time.Second, nil); err != nil {
		t.Fatal(err)
	}
	r := c.Run(ctx, Schedule(seed, *longSteps, 3), 40*time.Second, 120*time.Second)
	t.Logf("seed %d: power-offs %v, double fences %d, live nodes fenced %d, stale-epoch calls %d, lost records %d; checked %d times while it ran",
		seed, r.PowerOffs, r.DoubleFences, r.LiveNodesFenced, r.StaleEpochCalls, len(r.LostRecords), r.Looks)
	for _, p := range r.Problems {
		t.Error(p)
	}
}

// shortSeed fixes the short run's schedule; make chaos runs longer schedules with other seeds.
const shortSeed = 16

// A fixed-seed schedule of faults while nodes die and are fenced: no node is powered off twice, no
// live node is fenced, no driver call runs with a stale epoch, no record is lost, and after each
// fault a leader has every live agent back.
func TestChaosShort(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	c := startCluster(t, ctx, "s", 5, shortArgs...)
	if err := c.waitLive(ctx, 60*time.Second, nil); err != nil {
		t.Fatal(err)
	}
	steps := Schedule(shortSeed, 8, 2)
	r := c.Run(ctx, steps, 40*time.Second, 90*time.Second)
	t.Logf("power-offs %v, double fences %d, live nodes fenced %d, stale-epoch calls %d, lost records %d; checked %d times while it ran",
		r.PowerOffs, r.DoubleFences, r.LiveNodesFenced, r.StaleEpochCalls, len(r.LostRecords), r.Looks)
	for _, p := range r.Problems {
		t.Error(p)
	}
}

// shortArgs make nodes die and get fenced within seconds (the defaults take minutes).
var shortArgs = []string{"--node-monitor-grace-period", "8s", "--node-startup-grace-period", "16s", "--fence-timeout", "2s",
	"--node-eviction-rate", "1", "--fence-retry-backoff", "1s", "--fence-op-timeout", "10s"}

func TestScheduleIsSeeded(t *testing.T) {
	a, b := Schedule(7, 20, 2), Schedule(7, 20, 2)
	dead := 0
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("step %d: %v != %v", i, a[i], b[i])
		}
		if a[i].Kind == KillNode {
			dead++
		}
	}
	if dead != 2 || len(a) != 20 {
		t.Fatalf("%d steps, %d node kills; want 20, 2", len(a), dead)
	}
}
