// Command bench-recovery-cluster measures, on the testbed's real multi-node Kubernetes
// (testbed/cluster), the seconds from a node's death to its StatefulSet pod Running and Ready on
// another node, side by side in one run with the same failure and the same lifecycle settings:
//
//   - nodefence: the coordinator, IPMI fence-driver and agents (testbed/nfcluster) fence the node
//     (power-off confirmed by read-back) and release its pods;
//   - k8s alone: kube-controller-manager and the StatefulSet controller only; reported as not
//     recovered after --alone-wait when that is what happens;
//   - manual taint: an operator's best script, which taints the node
//     node.kubernetes.io/out-of-service=nodeshutdown:NoExecute the moment its Ready condition
//     stops being True.
//
// The failure is the same each round: every process of the node running the pod is SIGKILLed
// while its BMC still says on. kube-controller-manager and nodefence share --grace as their
// node-monitor grace period. The LAST line of output is one JSON object.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nodefence/nodefence/coordinator/kube"
	"github.com/nodefence/nodefence/testbed/cluster"
	"github.com/nodefence/nodefence/testbed/ipmisim"
	"github.com/nodefence/nodefence/testbed/nfcluster"
)

type result struct {
	Bench            string    `json:"bench"`
	Rounds           int       `json:"rounds"`
	GraceS           float64   `json:"grace_s"`
	FenceTimeoutS    float64   `json:"fence_timeout_s"`
	NodefenceP50     float64   `json:"nodefence_p50_s"`
	NodefenceMax     float64   `json:"nodefence_max_s"`
	NodefenceEach    []float64 `json:"nodefence_each_s"`
	AloneRecovered   bool      `json:"k8s_alone_recovered"`
	AloneWaitedS     float64   `json:"k8s_alone_waited_s"`
	AloneS           float64   `json:"k8s_alone_s,omitempty"`
	ManualTaintP50   float64   `json:"manual_taint_p50_s"`
	ManualTaintMax   float64   `json:"manual_taint_max_s"`
	ManualTaintEach  []float64 `json:"manual_taint_each_s"`
	NodefenceGoalS   float64   `json:"nodefence_goal_s"`
	NodefenceGoalMet bool      `json:"nodefence_goal_met"`
}

type options struct {
	rounds              int
	grace, fenceTimeout time.Duration
	aloneWait           time.Duration
	binDir, dir         string
}

func main() {
	var o options
	flag.IntVar(&o.rounds, "rounds", 3, "rounds of nodefence and of the manual taint (k8s alone runs once)")
	flag.DurationVar(&o.grace, "grace", 20*time.Second, "node-monitor grace period of kube-controller-manager and nodefence")
	flag.DurationVar(&o.fenceTimeout, "fence-timeout", 2*time.Second, "nodefence's --fence-timeout")
	flag.DurationVar(&o.aloneWait, "alone-wait", 330*time.Second, "how long to wait for Kubernetes alone (past the default 300 s toleration of unreachable nodes)")
	flag.StringVar(&o.binDir, "bin", "bin", "directory with coordinator, node-agent, fence-driver, fencectl (make build)")
	flag.StringVar(&o.dir, "dir", "", "working directory (default: a new temporary directory, removed at the end)")
	flag.Parse()
	if o.rounds < 1 || o.rounds > 10 || o.grace < 5*time.Second || o.fenceTimeout < 0 || o.aloneWait < time.Second {
		fmt.Fprintln(os.Stderr, "bench-recovery-cluster: --rounds 1..10, --grace >= 5s, --fence-timeout >= 0, --alone-wait >= 1s")
		os.Exit(2)
	}
	res, err := run(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-recovery-cluster:", err)
		os.Exit(1)
	}
	b, _ := json.Marshal(res)
	fmt.Println(string(b))
}

func run(o options) (*result, error) {
	budget := time.Duration(2*o.rounds)*(3*o.grace+90*time.Second) + o.aloneWait + 5*time.Minute
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	if o.dir == "" {
		d, err := os.MkdirTemp("", "nodefence-bench-recovery-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(d)
		o.dir = d
	}
	bin, err := filepath.Abs(o.binDir)
	if err != nil {
		return nil, err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	c, err := cluster.Up(ctx, cluster.Config{Dir: filepath.Join(o.dir, "cluster"), NodeMonitorGracePeriod: o.grace, NodeMonitorPeriod: 2 * time.Second}, log)
	if err != nil {
		return nil, err
	}
	defer c.Down()
	b := &bench{o: o, c: c, log: log}
	if b.admin, err = c.Admin(); err != nil {
		return nil, err
	}
	res := &result{Bench: "recovery-cluster", Rounds: o.rounds, GraceS: o.grace.Seconds(), FenceTimeoutS: o.fenceTimeout.Seconds()}

	d, err := nfcluster.Deploy(ctx, c, nfcluster.Options{BinDir: bin, Dir: filepath.Join(o.dir, "nodefence"), Grace: o.grace, FenceTimeout: o.fenceTimeout, Log: log})
	if err != nil {
		return nil, err
	}
	for i := 1; i <= o.rounds; i++ {
		if err := d.WaitAgents(ctx, 90*time.Second); err != nil {
			d.Stop()
			return nil, err
		}
		s, ok, err := b.round(ctx, fmt.Sprintf("nf-%d", i), 3*o.grace+90*time.Second, false)
		if err != nil || !ok {
			d.Stop()
			return nil, fmt.Errorf("nodefence round %d: recovered=%v: %v", i, ok, err)
		}
		fmt.Fprintf(os.Stderr, "nodefence round %d: %.2f s\n", i, s)
		res.NodefenceEach = append(res.NodefenceEach, s)
	}
	d.Stop()
	for i := 1; i <= o.rounds; i++ {
		s, ok, err := b.round(ctx, fmt.Sprintf("manual-%d", i), 3*o.grace+90*time.Second, true)
		if err != nil || !ok {
			return nil, fmt.Errorf("manual-taint round %d: recovered=%v: %v", i, ok, err)
		}
		fmt.Fprintf(os.Stderr, "manual taint round %d: %.2f s\n", i, s)
		res.ManualTaintEach = append(res.ManualTaintEach, s)
	}
	s, ok, err := b.round(ctx, "alone", o.aloneWait, false)
	if err != nil {
		return nil, err
	}
	res.AloneRecovered, res.AloneWaitedS = ok, o.aloneWait.Seconds()
	if ok {
		res.AloneS = s
		fmt.Fprintf(os.Stderr, "k8s alone: recovered in %.2f s\n", s)
	} else {
		fmt.Fprintf(os.Stderr, "k8s alone: not recovered in %.0f s\n", o.aloneWait.Seconds())
	}
	res.NodefenceP50, res.NodefenceMax = p50(res.NodefenceEach), maxOf(res.NodefenceEach)
	res.ManualTaintP50, res.ManualTaintMax = p50(res.ManualTaintEach), maxOf(res.ManualTaintEach)
	res.NodefenceGoalS = o.grace.Seconds() + o.fenceTimeout.Seconds() + 10
	res.NodefenceGoalMet = res.NodefenceP50 <= res.NodefenceGoalS && res.NodefenceP50 < res.ManualTaintP50
	return res, nil
}

type bench struct {
	o     options
	c     *cluster.Cluster
	admin *kubernetes.Clientset
	log   *slog.Logger
}

// round creates a writer, kills the node it runs on and measures until the writer runs on
// another node (ok false: not within timeout). With taint, an operator script taints the node
// out-of-service as soon as its Ready condition is not True. The nodes are restored at the end.
func (b *bench) round(ctx context.Context, name string, timeout time.Duration, taint bool) (float64, bool, error) {
	defer b.restore(ctx)
	w, err := nfcluster.CreateWriter(ctx, b.c, "bench-"+name, "node-2")
	if err != nil {
		return 0, false, err
	}
	defer w.Delete(context.Background())
	pod, err := w.RunningPod(ctx, "", 90*time.Second)
	if err != nil {
		return 0, false, err
	}
	victim := b.c.Node(pod.Spec.NodeName)
	if _, err := victim.Crash(); err != nil {
		return 0, false, err
	}
	t0 := time.Now()
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if taint {
		go b.operator(rctx, victim.Name)
	}
	np, err := w.RunningPod(ctx, pod.UID, timeout)
	if err != nil {
		return 0, false, nil
	}
	if np.Spec.NodeName == victim.Name {
		return 0, false, fmt.Errorf("the new pod runs on the dead node %s", victim.Name)
	}
	return math.Round(time.Since(t0).Seconds()*100) / 100, true, nil
}

// operator is the on-call operator's script: poll the Node every 500 ms and taint it
// out-of-service the moment its Ready condition is not True.
func (b *bench) operator(ctx context.Context, node string) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(500 * time.Millisecond):
		}
		n, err := b.admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil || cluster.NodeReady(n) {
			continue
		}
		n.Spec.Taints = append(n.Spec.Taints, kube.OutOfServiceTaint())
		if _, err := b.admin.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err == nil {
			return
		}
	}
}

// restore powers every node on (through its BMC), removes out-of-service taints and NodeFence
// leftovers are none of its business; it waits until every node is Ready.
func (b *bench) restore(ctx context.Context) {
	for _, n := range b.c.Nodes {
		if !n.Running() {
			if err := ipmisim.IpmitoolChassisPower(ctx, n.BMC.Port, cluster.BMCUser, b.c.BMCPassword(), "on"); err != nil {
				b.log.Error("power on", "node", n.Name, "err", err)
			}
		}
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		up := true
		for _, n := range b.c.Nodes {
			up = up && n.Running()
		}
		if up {
			break
		}
	}
	if err := b.c.WaitReady(ctx, 90*time.Second); err != nil {
		b.log.Error("nodes not ready", "err", err)
	}
	for _, n := range b.c.Nodes {
		node, err := b.admin.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			continue
		}
		var keep []corev1.Taint
		for _, t := range node.Spec.Taints {
			if t.Key != kube.TaintKeyOutOfService {
				keep = append(keep, t)
			}
		}
		if len(keep) != len(node.Spec.Taints) {
			node.Spec.Taints = keep
			_, _ = b.admin.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{})
		}
	}
}

func p50(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return math.Round((s[len(s)/2-1]+s[len(s)/2])/2*100) / 100
}

func maxOf(v []float64) float64 {
	m := 0.0
	for _, x := range v {
		m = math.Max(m, x)
	}
	return m
}
