// Command bench-pressure measures, on the testbed's real multi-node Kubernetes (testbed/cluster),
// the milliseconds from a memory threshold being crossed to the pod being marked for eviction,
// side by side in one run, on the same node, with the same memory hog and the same hard
// threshold:
//
//   - nodefence: node-1's node-agent (testbed/nfcluster, with a kubeconfig) evicts; node-1's
//     kubelet has no eviction threshold (evictionHard {});
//   - kubelet: the agents are stopped and node-1's kubelet is given the threshold, with kubelet's
//     defaults otherwise (10 s housekeeping, kernelMemcgNotification false): the reference.
//
// The pressure is bounded and the node's own, never the machine's: the cluster's kubelets reserve
// all of the machine's memory but --pods-limit for the system (testbed/cluster's PodsMemory:
// systemReserved, enforceNodeAllocatable [pods]), so node-1's pods' cgroup (kubepods) is limited
// to --pods-limit; the hard threshold
// memory.available<--threshold is copied, by kubelet and by the agent alike, to
// allocatableMemory.available, measured on that cgroup. The node-level memory.available threshold
// also applies (to the machine) and is never met.
//
// The hog is a static C program (hog.go) run from a hostPath in the busybox image: it allocates
// anonymous memory in 1 MiB steps, and for each step logs the wall-clock times before and after
// it and then allocatableMemory.available as kubelet computes it from the kubepods cgroup (mounted
// read-only). The threshold crossing is the start of the first step after which that value is
// below the threshold: an early bound, so the latency includes that step (well under a
// millisecond). A round whose pod is marked before the hog logged its crossing step (the hog
// preempted on a busy machine, or other usage in the cgroup crossing first) is run again, at most
// --rounds/2+1 times per side, and counted in the JSON's *_rerun. The pod is marked for eviction when a watch on it, opened before the hog starts,
// delivers an event with deletionTimestamp set, status reason Evicted, or its deletion; the time
// is when the bench receives that event. Both clocks are this machine's CLOCK_REALTIME. The LAST
// line of output is one JSON object.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/nodefence/nodefence/node-agent/signals"
	"github.com/nodefence/nodefence/testbed/cluster"
	"github.com/nodefence/nodefence/testbed/nfcluster"
	"github.com/nodefence/nodefence/testbed/procs"
)

const (
	mib       = 1 << 20
	maxHogMiB = 512
	namespace = "default"
	nodeName  = "node-1"
)

type options struct {
	rounds          int
	threshold       string
	podsLimit, hog  int64 // MiB
	step            int64 // MiB
	stepPause       time.Duration
	wait, jitter    time.Duration
	fastInterval    string
	binDir, dir     string
	budget          time.Duration
	thresholdBytes  int64
	kubepodsMemPath string
}

func main() {
	var o options
	flag.IntVar(&o.rounds, "rounds", 10, "rounds per side (1..30)")
	flag.StringVar(&o.threshold, "threshold", "400Mi", "the hard threshold memory.available<THRESHOLD, given to the agent and to kubelet")
	flag.Int64Var(&o.podsLimit, "pods-limit", 768, "MiB node-1's pods may use: its pods' cgroup limit (capacity - systemReserved)")
	flag.Int64Var(&o.hog, "hog", 448, "MiB the hog allocates at most (<= 512)")
	flag.Int64Var(&o.step, "step", 1, "MiB the hog allocates per step")
	flag.DurationVar(&o.stepPause, "step-pause", 5*time.Millisecond, "pause of the hog between steps")
	flag.DurationVar(&o.wait, "wait", 40*time.Second, "how long a round waits for the eviction")
	flag.DurationVar(&o.jitter, "jitter", 10*time.Second, "each round starts its hog after a random delay in [0, jitter), so that the crossing falls anywhere in kubelet's 10 s housekeeping period rather than at the same phase every round")
	flag.StringVar(&o.fastInterval, "agent-memory-fast-interval", "", "the agent's --memory-fast-interval (default: the agent's default)")
	flag.StringVar(&o.binDir, "bin", "bin", "directory with coordinator, node-agent, fence-driver, fencectl (make build)")
	flag.StringVar(&o.dir, "dir", "", "working directory (default: a new temporary directory, removed at the end)")
	flag.DurationVar(&o.budget, "budget", 9*time.Minute, "the whole run's time limit")
	flag.Parse()
	if err := o.validate(); err != nil {
		fmt.Fprintln(os.Stderr, "bench-pressure:", err)
		os.Exit(2)
	}
	res, err := run(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-pressure:", err)
		os.Exit(1)
	}
	fmt.Println(res.line())
}

func (o *options) validate() error {
	var bad []string
	if o.rounds < 1 || o.rounds > 30 {
		bad = append(bad, "--rounds: 1..30")
	}
	q, err := resource.ParseQuantity(o.threshold)
	if err != nil || q.Value() <= 0 {
		bad = append(bad, "--threshold: a positive quantity such as 400Mi")
	}
	o.thresholdBytes = q.Value()
	if o.hog < 1 || o.hog > maxHogMiB {
		bad = append(bad, fmt.Sprintf("--hog: 1..%d MiB", maxHogMiB))
	}
	if o.step < 1 || o.step > o.hog {
		bad = append(bad, "--step: 1..--hog MiB")
	}
	if o.podsLimit*mib <= o.thresholdBytes || (o.podsLimit-o.hog)*mib < 64*mib || o.hog*mib <= o.podsLimit*mib-o.thresholdBytes {
		bad = append(bad, "--pods-limit, --threshold, --hog: the hog must cross the threshold (hog > pods-limit - threshold) and stay 64 MiB below the limit")
	}
	if o.stepPause < 0 || o.jitter < 0 || o.wait < 5*time.Second || o.budget < time.Minute || o.budget > 10*time.Minute {
		bad = append(bad, "--step-pause >= 0, --wait >= 5s, --budget 1m..10m")
	}
	if len(bad) > 0 {
		return fmt.Errorf("%s", strings.Join(bad, "; "))
	}
	return nil
}

func run(o options) (*result, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), o.budget)
	defer cancel()
	if o.dir == "" {
		d, err := os.MkdirTemp("", "nodefence-bench-pressure-")
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
	hogDir := filepath.Join(o.dir, "hog")
	if err := os.MkdirAll(hogDir, 0o755); err != nil {
		return nil, err
	}
	if err := buildHog(hogDir); err != nil {
		return nil, err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	c, err := cluster.Up(ctx, cluster.Config{Dir: filepath.Join(o.dir, "cluster"), PodsMemory: o.podsLimit * mib}, log)
	if err != nil {
		return nil, err
	}
	defer c.Down()
	node := c.Node(nodeName)
	o.kubepodsMemPath = filepath.Join(signals.DefaultCgroupRoot, "memory", node.CgroupRoot, "kubepods")
	b := &bench{o: o, c: c, node: node, hogDir: hogDir, start: start}
	if b.admin, err = c.Admin(); err != nil {
		return nil, err
	}
	res := &result{Bench: "pressure", Rounds: o.rounds, Node: nodeName, Threshold: "memory.available<" + o.threshold + " (allocatableMemory.available)",
		AllocatableMiB: o.podsLimit, HogMiB: o.hog, StepMiB: o.step, StepPauseMs: float64(o.stepPause.Microseconds()) / 1000, JitterS: o.jitter.Seconds(), FastInterval: o.fastInterval}
	if res.FastInterval == "" {
		res.FastInterval = "agent default"
	}

	if err := b.nodefenceSide(ctx, res, bin, log); err != nil {
		return nil, err
	}
	if err := b.kubeletSide(ctx, res); err != nil {
		return nil, err
	}
	res.summarize()
	return res, nil
}

// nodefenceSide runs the rounds in which nodefence's agent evicts and kubelet has no threshold.
func (b *bench) nodefenceSide(ctx context.Context, res *result, bin string, log *slog.Logger) error {
	o, c, node := b.o, b.c, b.node
	// Side a: nodefence's agent evicts; kubelet has no threshold.
	if err := b.kubelet(ctx, "{}"); err != nil {
		return err
	}
	// nfcluster's agents run in Kubernetes mode with their node's token and no threshold; node-1's
	// gets the bench's.
	args := []string{"--eviction-hard=memory.available<" + o.threshold, "--enforce-node-allocatable=pods"}
	if o.fastInterval != "" {
		args = append(args, "--memory-fast-interval="+o.fastInterval)
	}
	d, err := nfcluster.Deploy(ctx, c, nfcluster.Options{BinDir: bin, Dir: filepath.Join(o.dir, "nodefence"), Log: log,
		AgentArgs: func(n *cluster.Node) []string {
			if n.Name == nodeName {
				return args
			}
			return nil
		}})
	if err != nil {
		return err
	}
	for i := 1; i <= o.rounds; i++ {
		ms, err := b.round(ctx, "nodefence", i)
		if errors.Is(err, errEarly) && res.NodefenceRerun <= o.rounds/2 {
			fmt.Fprintln(os.Stderr, "nodefence round", i, "run again:", err)
			res.NodefenceRerun++
			i--
			continue
		}
		if err != nil {
			d.Stop()
			return fmt.Errorf("nodefence round %d: %w\nnode-agent log:\n%s", i, err, procs.Tail(filepath.Join(node.Dir, "log", "node-agent.log"), 15))
		}
		res.NodefenceEach = append(res.NodefenceEach, ms)
	}
	d.Stop()
	return nil
}

// kubeletSide runs the rounds in which kubelet's eviction manager evicts and no agent runs.
func (b *bench) kubeletSide(ctx context.Context, res *result) error {
	o := b.o
	// Side b: kubelet's eviction manager evicts; no agent runs.
	if err := b.kubelet(ctx, fmt.Sprintf("{memory.available: %q}", o.threshold)); err != nil {
		return err
	}
	for i := 1; i <= o.rounds; i++ {
		ms, err := b.round(ctx, "kubelet", i)
		if errors.Is(err, errEarly) && res.KubeletRerun <= o.rounds/2 {
			fmt.Fprintln(os.Stderr, "kubelet round", i, "run again:", err)
			res.KubeletRerun++
			i--
			continue
		}
		if err != nil {
			return fmt.Errorf("kubelet round %d: %w", i, err)
		}
		res.KubeletEach = append(res.KubeletEach, ms)
	}
	return nil
}

// errEarly: the pod was marked before the hog logged its crossing step.
var errEarly = errors.New("marked before the crossing was logged")

type bench struct {
	o      options
	c      *cluster.Cluster
	node   *cluster.Node
	admin  *kubernetes.Clientset
	hogDir string
	start  time.Time
}

// kubelet gives node-1's kubelet evictionHard, restarts it, and waits until the node is Ready
// and its pods' cgroup has the limit (the cluster's PodsMemory).
func (b *bench) kubelet(ctx context.Context, evictionHard string) error {
	restarted := time.Now().Truncate(time.Second)
	if err := b.node.ReconfigureKubelet(map[string]string{"evictionHard": evictionHard}); err != nil {
		return err
	}
	// The restarted kubelet posts a Ready status of its own.
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		n, err := b.admin.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err == nil && cluster.NodeReady(n) && readySince(n, restarted) {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: the restarted kubelet did not report Ready within 90 s (%v); log tail:\n%s", nodeName, err, procs.Tail(filepath.Join(b.node.Dir, "log", "kubelet.log"), 15))
		}
	}
	want := b.o.podsLimit * mib
	for deadline := time.Now().Add(30 * time.Second); ; {
		data, err := os.ReadFile(filepath.Join(b.o.kubepodsMemPath, "memory.limit_in_bytes"))
		if err == nil {
			if v, err := signals.ParseUint(data); err == nil && int64(v) <= want && int64(v) > want-mib {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: memory.limit_in_bytes is %q, want about %d", b.o.kubepodsMemPath, strings.TrimSpace(string(data)), want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// readySince reports whether the node's Ready condition was posted at or after t.
func readySince(n *corev1.Node, t time.Time) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return !c.LastHeartbeatTime.Time.Before(t)
		}
	}
	return false
}

// round runs one hog and returns the milliseconds from its threshold crossing to its pod marked
// for eviction.
func (b *bench) round(ctx context.Context, side string, i int) (float64, error) {
	name := fmt.Sprintf("hog-%s-%d", side, i)
	if err := b.settle(ctx); err != nil {
		return 0, err
	}
	pods := b.admin.CoreV1().Pods(namespace)
	if _, err := pods.Create(ctx, b.hogPod(name), metav1.CreateOptions{}); err != nil {
		return 0, err
	}
	defer b.remove(name)
	p, err := b.running(ctx, name)
	if err != nil {
		return 0, err
	}
	w, err := pods.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name, ResourceVersion: p.ResourceVersion})
	if err != nil {
		return 0, err
	}
	defer w.Stop()
	type mark struct {
		at  time.Time
		how string
	}
	marked := make(chan mark, 1)
	go func() {
		for ev := range w.ResultChan() {
			at := time.Now()
			q, ok := ev.Object.(*corev1.Pod)
			switch {
			case ev.Type == watch.Deleted:
				marked <- mark{at, "deleted"}
			case !ok:
				continue
			case q.DeletionTimestamp != nil:
				marked <- mark{at, "deletionTimestamp"}
			case q.Status.Reason == "Evicted":
				marked <- mark{at, "reason Evicted"}
			default:
				continue
			}
			return
		}
	}()
	if b.o.jitter > 0 {
		time.Sleep(rand.N(b.o.jitter))
	}
	if err := os.WriteFile(filepath.Join(b.hogDir, name+".go"), nil, 0o644); err != nil {
		return 0, err
	}
	var m mark
	select {
	case m = <-marked:
	case <-time.After(b.o.wait):
		return 0, fmt.Errorf("%s not marked for eviction within %s; hog log tail:\n%s", name, b.o.wait, procs.Tail(filepath.Join(b.hogDir, name+".log"), 5))
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	data, err := os.ReadFile(filepath.Join(b.hogDir, name+".log"))
	if err != nil {
		return 0, err
	}
	h, err := parseHogLog(data)
	if err != nil {
		return 0, err
	}
	s, ok := h.crossing(b.o.thresholdBytes)
	if !ok {
		return 0, fmt.Errorf("%w: %s marked (%s) before the hog logged its threshold crossing; %d steps logged", errEarly, name, m.how, len(h.Steps))
	}
	ms := round1(float64(m.at.Sub(s.Begin).Microseconds()) / 1000)
	fmt.Fprintf(os.Stderr, "%s round %d: %.1f ms (crossing at step %d, %d MiB, available %d MiB; marked by %s; %s into the run)\n",
		side, i, ms, s.N, s.Allocated/mib, s.Available/mib, m.how, time.Since(b.start).Round(time.Second))
	return ms, nil
}

// hogPod is the hog's pod on node-1: Burstable (kubelet admits it under memory pressure), every
// taint tolerated, the hog from the hostPath hogDir, the pods' cgroup read-only.
func (b *bench) hogPod(name string) *corev1.Pod {
	cmd := fmt.Sprintf("exec /hog/hog %d %d %d /hog/%s.go /kubepods > /hog/%s.log 2>&1",
		b.o.step*mib, b.o.hog*mib, b.o.stepPause.Microseconds(), name, name)
	zero := int64(0)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: map[string]string{"app": "bench-pressure"}},
		Spec: corev1.PodSpec{
			NodeName:                      nodeName,
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &zero,
			Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers: []corev1.Container{{
				Name: "hog", Image: cluster.BusyboxImage, ImagePullPolicy: corev1.PullNever,
				Command: []string{"sh", "-c", cmd},
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
					corev1.ResourceMemory: resource.MustParse("16Mi"), corev1.ResourceCPU: resource.MustParse("10m")}},
				VolumeMounts: []corev1.VolumeMount{{Name: "hog", MountPath: "/hog"}, {Name: "kubepods", MountPath: "/kubepods", ReadOnly: true}},
			}},
			Volumes: []corev1.Volume{
				{Name: "hog", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: b.hogDir}}},
				{Name: "kubepods", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: b.o.kubepodsMemPath}}},
			},
		},
	}
}

// running waits up to 60 s for the pod's container to run.
func (b *bench) running(ctx context.Context, name string) (*corev1.Pod, error) {
	var last *corev1.Pod
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		p, err := b.admin.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		last = p
		switch p.Status.Phase {
		case corev1.PodRunning:
			return p, nil
		case corev1.PodFailed, corev1.PodSucceeded:
			return nil, fmt.Errorf("%s %s before the hog started: %s %s", name, p.Status.Phase, p.Status.Reason, p.Status.Message)
		}
	}
	return nil, fmt.Errorf("%s not running within 60 s: phase %s, %v", name, last.Status.Phase, last.Status.ContainerStatuses)
}

// remove deletes the pod at once and waits up to 60 s for it to be gone.
func (b *bench) remove(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pods := b.admin.CoreV1().Pods(namespace)
	zero := int64(0)
	_ = pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	for ctx.Err() == nil {
		if _, err := pods.Get(ctx, name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	fmt.Fprintf(os.Stderr, "warning: pod %s not gone 60 s after its deletion\n", name)
}

// settle waits up to 60 s until the pods' cgroup is well clear of the threshold (the last
// round's memory freed).
func (b *bench) settle(ctx context.Context) error {
	r := signals.Reader{}
	rel := strings.TrimPrefix(b.o.kubepodsMemPath, filepath.Join(signals.DefaultCgroupRoot, "memory"))
	var avail int64
	for deadline := time.Now().Add(60 * time.Second); ; {
		a, _, ok, err := r.AllocatableMemory([]string{rel})
		avail = a
		if err == nil && ok && a >= b.o.thresholdBytes+128*mib {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("the pods' cgroup has %d MiB available, not back above the threshold + 128 MiB within 60 s (ok=%v err=%v)", avail/mib, ok, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
