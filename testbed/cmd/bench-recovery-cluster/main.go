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
// Three rows. On the first cluster bring-up, the DARK-BMC row (issue 24.6): the node and its BMC
// lose power together, nodefence as shipped plus a watchdog on every node and the watchdog
// fallback, so the power-off is proven by time (dark.go); each of its rounds prints its phases
// (darkphases.go: the IPMI call and its error, the fallback, the safe time, the proof, the
// release). Then, on the same cluster, the DEFAULTS
// row — kube-controller-manager on its own defaults and nodefence with nothing but what deploy/
// ships (nfcluster.Options.Shipped) — with the manual taint beside it; then, on a cluster of its
// own, the short-settings row, where kube-controller-manager and nodefence share --grace as their
// node-monitor grace period, with the manual taint and Kubernetes alone beside it. Each nodefence
// round of the last two rows prints its phases (seconds from the kill): the agent's last contact,
// the kubelet's last Lease renewal, both witnesses judged silent, the decision, the driver call, the
// confirmed power-off, the out-of-service taint, the old pod deleted, the new pod scheduled and
// Running. Their failure is the same each round: every process of the node running the pod is
// SIGKILLed while its BMC still says on. The LAST line of output is one JSON object.
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
	Bench  string `json:"bench"`
	Rounds int    `json:"rounds"`
	// The defaults row.
	DefaultsP50        float64            `json:"defaults_p50_s"`
	DefaultsMax        float64            `json:"defaults_max_s"`
	DefaultsEach       []float64          `json:"defaults_each_s"`
	DefaultsPhasesP50  map[string]float64 `json:"defaults_phase_p50_s"`
	DefaultsManualP50  float64            `json:"defaults_manual_taint_p50_s"`
	DefaultsManualMax  float64            `json:"defaults_manual_taint_max_s"`
	DefaultsManualEach []float64          `json:"defaults_manual_taint_each_s"`
	DefaultsGoalP50S   float64            `json:"defaults_goal_p50_s"`
	DefaultsGoalMaxS   float64            `json:"defaults_goal_max_s"`
	DefaultsGoalMet    bool               `json:"defaults_goal_met"`
	ShortPhasesP50     map[string]float64 `json:"short_phase_p50_s"`
	// The short-settings row.
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
	// The dark-BMC row (issue 24.6).
	DarkP50              float64   `json:"dark_bmc_p50_s,omitempty"`
	DarkMax              float64   `json:"dark_bmc_max_s,omitempty"`
	DarkEach             []float64 `json:"dark_bmc_each_s,omitempty"`
	WatchdogSafeTimeS    float64   `json:"watchdog_safe_time_s,omitempty"`
	DarkWatchdogTimeoutS float64   `json:"dark_bmc_watchdog_timeout_s,omitempty"`
	DarkGoalS            float64   `json:"dark_bmc_goal_p50_s,omitempty"`
	DarkGoalMet          bool      `json:"dark_bmc_goal_met"`
	// DarkPhasesP50 are the dark rounds' phase medians (darkPhaseNames), seconds from the power loss.
	DarkPhasesP50 map[string]float64 `json:"dark_phase_p50_s,omitempty"`
}

type options struct {
	rounds              int
	grace, fenceTimeout time.Duration
	aloneWait           time.Duration
	binDir, dir         string
	defaults, short     bool
	dark                bool
	watchdog            time.Duration
}

func main() {
	var o options
	flag.IntVar(&o.rounds, "rounds", 3, "rounds of nodefence and of the manual taint (k8s alone runs once)")
	flag.DurationVar(&o.grace, "grace", 20*time.Second, "node-monitor grace period of kube-controller-manager and nodefence")
	flag.DurationVar(&o.fenceTimeout, "fence-timeout", 2*time.Second, "nodefence's --fence-timeout")
	flag.DurationVar(&o.aloneWait, "alone-wait", 330*time.Second, "how long to wait for Kubernetes alone (past the default 300 s toleration of unreachable nodes)")
	flag.StringVar(&o.binDir, "bin", "bin", "directory with coordinator, node-agent, fence-driver, fencectl (make build)")
	flag.StringVar(&o.dir, "dir", "", "working directory (default: a new temporary directory, removed at the end)")
	flag.BoolVar(&o.defaults, "defaults", true, "run the defaults row (kube-controller-manager's and nodefence's shipped settings)")
	flag.BoolVar(&o.short, "short", true, "run the short-settings row (--grace, --fence-timeout) with Kubernetes alone")
	flag.BoolVar(&o.dark, "dark", true, "run the dark-BMC row (with the defaults row's cluster): the node and its BMC lose power; the watchdog proves it off")
	flag.DurationVar(&o.watchdog, "watchdog-timeout", 15*time.Second, "the dark-BMC row's --watchdog-timeout (the agent's default)")
	flag.Parse()
	if o.rounds < 1 || o.rounds > 10 || o.grace < 5*time.Second || o.fenceTimeout < 0 || o.aloneWait < time.Second ||
		o.watchdog < time.Second || o.watchdog%time.Second != 0 {
		fmt.Fprintln(os.Stderr, "bench-recovery-cluster: --rounds 1..10, --grace >= 5s, --fence-timeout >= 0, --alone-wait >= 1s, --watchdog-timeout whole seconds >= 1s")
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
	budget := time.Duration(6*o.rounds)*(3*o.grace+3*time.Minute) + o.aloneWait + 10*time.Minute
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
	o.binDir = bin
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	res := &result{Bench: "recovery-cluster", Rounds: o.rounds, GraceS: o.grace.Seconds(), FenceTimeoutS: o.fenceTimeout.Seconds()}
	if o.defaults || o.dark {
		if err := defaultsRow(ctx, o, log, res); err != nil {
			return nil, fmt.Errorf("defaults row: %w", err)
		}
	}
	if o.short {
		if err := shortRow(ctx, o, log, res); err != nil {
			return nil, fmt.Errorf("short-settings row: %w", err)
		}
	}
	return res, nil
}

// Goals of the defaults row (issue 25): from the death to the pod Running elsewhere.
const (
	defaultsGoalP50 = 30.0
	defaultsGoalMax = 40.0
)

// defaultsRow runs, on a cluster whose kube-controller-manager keeps its own defaults, the dark-BMC
// row (with --dark), then nodefence on the shipped settings and the manual taint (with --defaults).
func defaultsRow(ctx context.Context, o options, log *slog.Logger, res *result) error {
	c, err := cluster.Up(ctx, cluster.Config{Dir: filepath.Join(o.dir, "cluster-defaults")}, log)
	if err != nil {
		return err
	}
	defer c.Down()
	b, err := newBench(o, c, log)
	if err != nil {
		return err
	}
	if o.dark {
		if err := darkRow(ctx, o, c, b, log, res); err != nil {
			return fmt.Errorf("dark-BMC row: %w", err)
		}
	}
	if !o.defaults {
		return nil
	}
	d, err := nfcluster.Deploy(ctx, c, nfcluster.Options{BinDir: o.binDir, Dir: filepath.Join(o.dir, "nodefence-defaults"), Shipped: true, Log: log})
	if err != nil {
		return err
	}
	each, phases, err := b.nodefenceRounds(ctx, d, "defaults", 3*time.Minute)
	d.Stop()
	if err != nil {
		return err
	}
	res.DefaultsEach, res.DefaultsP50, res.DefaultsMax, res.DefaultsPhasesP50 = each, p50(each), maxOf(each), phaseMedians(phases, phaseNames)
	if res.DefaultsManualEach, err = b.manualRounds(ctx, "defaults-manual", 4*time.Minute); err != nil {
		return err
	}
	res.DefaultsManualP50, res.DefaultsManualMax = p50(res.DefaultsManualEach), maxOf(res.DefaultsManualEach)
	res.DefaultsGoalP50S, res.DefaultsGoalMaxS = defaultsGoalP50, defaultsGoalMax
	res.DefaultsGoalMet = res.DefaultsP50 <= defaultsGoalP50 && res.DefaultsMax <= defaultsGoalMax
	return nil
}

// shortRow is the short-settings row: kube-controller-manager and nodefence on --grace, nodefence
// on --fence-timeout, then the manual taint and Kubernetes alone.
func shortRow(ctx context.Context, o options, log *slog.Logger, res *result) error {
	c, err := cluster.Up(ctx, cluster.Config{Dir: filepath.Join(o.dir, "cluster"), NodeMonitorGracePeriod: o.grace, NodeMonitorPeriod: 2 * time.Second}, log)
	if err != nil {
		return err
	}
	defer c.Down()
	b, err := newBench(o, c, log)
	if err != nil {
		return err
	}
	d, err := nfcluster.Deploy(ctx, c, nfcluster.Options{BinDir: o.binDir, Dir: filepath.Join(o.dir, "nodefence"), Grace: o.grace, FenceTimeout: o.fenceTimeout, Log: log})
	if err != nil {
		return err
	}
	each, phases, err := b.nodefenceRounds(ctx, d, "nf", 3*o.grace+90*time.Second)
	d.Stop()
	if err != nil {
		return err
	}
	res.NodefenceEach, res.ShortPhasesP50 = each, phaseMedians(phases, phaseNames)
	if res.ManualTaintEach, err = b.manualRounds(ctx, "manual", 3*o.grace+90*time.Second); err != nil {
		return err
	}
	s, ok, err := b.round(ctx, "alone", o.aloneWait, false)
	if err != nil {
		return err
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
	return nil
}

func newBench(o options, c *cluster.Cluster, log *slog.Logger) (*bench, error) {
	b := &bench{o: o, c: c, log: log}
	var err error
	b.admin, err = c.Admin()
	return b, err
}

// nodefenceRounds runs o.rounds rounds with nodefence deployed, each with its phases.
func (b *bench) nodefenceRounds(ctx context.Context, d *nfcluster.Deployment, name string, timeout time.Duration) ([]float64, []phases, error) {
	var each []float64
	var all []phases
	for i := 1; i <= b.o.rounds; i++ {
		if err := d.WaitAgents(ctx, 90*time.Second); err != nil {
			return nil, nil, err
		}
		b.d = d
		s, ok, err := b.round(ctx, fmt.Sprintf("%s-%d", name, i), timeout, false)
		b.d = nil
		if err != nil || !ok {
			return nil, nil, fmt.Errorf("nodefence round %d: recovered=%v: %v", i, ok, err)
		}
		fmt.Fprintf(os.Stderr, "%s round %d: %.2f s; phases %s\n", name, i, s, b.last)
		each, all = append(each, s), append(all, b.last)
	}
	return each, all, nil
}

// manualRounds runs o.rounds rounds of the operator's taint script.
func (b *bench) manualRounds(ctx context.Context, name string, timeout time.Duration) ([]float64, error) {
	var each []float64
	for i := 1; i <= b.o.rounds; i++ {
		s, ok, err := b.round(ctx, fmt.Sprintf("%s-%d", name, i), timeout, true)
		if err != nil || !ok {
			return nil, fmt.Errorf("manual-taint round %d: recovered=%v: %v", i, ok, err)
		}
		fmt.Fprintf(os.Stderr, "%s round %d: %.2f s\n", name, i, s)
		each = append(each, s)
	}
	return each, nil
}

type bench struct {
	o     options
	c     *cluster.Cluster
	admin *kubernetes.Clientset
	log   *slog.Logger
	d     *nfcluster.Deployment // set during nodefence rounds: their phases are read from it
	last  phases                // the phases of the latest nodefence round
	// powerLoss: the round powers the node off through its BMC instead of crashing it; settle is
	// how long the round waits with the writer running before it (the dark-BMC row).
	powerLoss bool
	settle    time.Duration
	// darkSafe is the dark row's safe time; lastDark the latest dark round's record detail.
	darkSafe time.Duration
	lastDark darkDetail
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
	time.Sleep(b.settle)
	if err := b.kill(ctx, victim); err != nil {
		return 0, false, err
	}
	t0 := time.Now()
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if taint {
		go b.operator(rctx, victim.Name)
	}
	deleted := make(chan time.Time, 1)
	go b.watchDeleted(rctx, w, pod.UID, deleted)
	np, err := w.RunningPod(ctx, pod.UID, timeout)
	if err != nil {
		return 0, false, nil
	}
	running := time.Now()
	if np.Spec.NodeName == victim.Name {
		return 0, false, fmt.Errorf("the new pod runs on the dead node %s", victim.Name)
	}
	if b.d != nil {
		b.last = b.phasesOf(ctx, victim.Name, t0, deleted, np, running)
		if b.powerLoss {
			b.lastDark = b.darkPhases(ctx, victim.Name, t0, b.last, b.darkSafe)
		}
	}
	return math.Round(running.Sub(t0).Seconds()*100) / 100, true, nil
}

// kill is the round's failure: every process of the node SIGKILLed while its BMC still says on; or,
// in the dark-BMC row, the node powered off through its real BMC (the node and its BMC lose power).
func (b *bench) kill(ctx context.Context, victim *cluster.Node) error {
	if b.powerLoss {
		return ipmisim.IpmitoolChassisPower(ctx, victim.BMC.Port, cluster.BMCUser, b.c.BMCPassword(), "off")
	}
	_, err := victim.Crash()
	return err
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

// restore powers every node on, removes out-of-service taints and waits until every node is
// Ready. With nodefence deployed it powers a node on as an operator does, with `fencectl unfence`:
// a power-on that nodefence records, so the node's confirmed power-off no longer stands (a node
// powered on behind nodefence's back stays counted as fenced, and holds the next round's fence
// back); otherwise (and in the dark-BMC row, whose BMC nodefence cannot reach) through its BMC.
func (b *bench) restore(ctx context.Context) {
	for _, n := range b.c.Nodes {
		if n.Running() {
			continue
		}
		if b.d != nil && !b.powerLoss {
			if out, err := b.d.Fencectl(ctx, "unfence", n.Name); err != nil {
				b.log.Error("unfence", "node", n.Name, "err", err, "out", out)
			}
			continue
		}
		if err := ipmisim.IpmitoolChassisPower(ctx, n.BMC.Port, cluster.BMCUser, b.c.BMCPassword(), "on"); err != nil {
			b.log.Error("power on", "node", n.Name, "err", err)
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
