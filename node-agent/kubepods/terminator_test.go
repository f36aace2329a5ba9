package kubepods

import (
	"context"
	"errors"
	"io"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodefence/nodefence/node-agent/eviction"
	"github.com/nodefence/nodefence/node-agent/shutdown"
	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

// fakeInhibitor stands in for logind: it hands out one lock and announces the shutdown.
type fakeInhibitor struct {
	prepare  chan bool
	released chan struct{}
}

func (f *fakeInhibitor) Inhibit(context.Context, string, string, string, string) (io.Closer, error) {
	return closerFunc(func() error { close(f.released); return nil }), nil
}

func (f *fakeInhibitor) PrepareForShutdown() <-chan bool { return f.prepare }

type closerFunc func() error

func (c closerFunc) Close() error { return c() }

// discard is a shutdown.Sender that drops the events.
type discard struct{}

func (discard) Send(*agentv1.ConnectRequest) {}

// deletion is a pod deletion a kubelet stand-in saw.
type deletion struct {
	Name  string
	Grace int64
}

// TestTerminatorShutdownPhases runs a graceful shutdown through shutdown.Manager with this
// package's Source and Terminator: each phase deletes its priority range's pods with the phase's
// grace period, lowest priority first, never the DaemonSet's or the static pod; a kubelet
// stand-in finishes the deleted pods so each phase ends as soon as its pods are gone.
func TestTerminatorShutdownPhases(t *testing.T) {
	ctx := testContext(t)
	ns := namespace(ctx, t)
	const node = "node-shut"
	createPod(ctx, t, ns, podSpec{name: "app-low", node: node})
	createPod(ctx, t, ns, podSpec{name: "app-low-2", node: node})
	createPod(ctx, t, ns, podSpec{name: "app-mid", node: node, priorityClass: "nf-mid"})
	createPod(ctx, t, ns, podSpec{name: "dns", node: node, priorityClass: "system-node-critical"})
	createPod(ctx, t, ns, podSpec{name: "daemon", node: node, daemonSet: true})
	createPod(ctx, t, ns, podSpec{name: "static", node: node, mirror: true, priorityClass: "system-node-critical"})
	createPod(ctx, t, ns, podSpec{name: "neighbour", node: "node-shut-other"})

	// The kubelet stand-in: it notes each deletion and finishes it.
	var mu sync.Mutex
	var seen []deletion
	kctx, stopKubelet := context.WithCancel(ctx)
	kubeletDone := make(chan struct{})
	go func() {
		defer close(kubeletDone)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		zero := int64(0)
		for {
			select {
			case <-kctx.Done():
				return
			case <-tick.C:
			}
			pods, err := admin.CoreV1().Pods(ns).List(kctx, metav1.ListOptions{FieldSelector: NodeSelector(node)})
			if err != nil {
				continue
			}
			for _, p := range pods.Items {
				if p.DeletionTimestamp == nil {
					continue
				}
				mu.Lock()
				seen = append(seen, deletion{p.Name, *p.DeletionGracePeriodSeconds})
				mu.Unlock()
				_ = admin.CoreV1().Pods(ns).Delete(kctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
			}
		}
	}()
	defer func() { stopKubelet(); <-kubeletDone }()

	src := runSource(t, node, nil)
	eventually(ctx, t, "the source to see six pods", func() bool {
		pods, _ := src.Pods(ctx)
		return len(pods) == 6
	})
	inh := &fakeInhibitor{prepare: make(chan bool, 1), released: make(chan struct{})}
	cfg := shutdown.Config{ByPriority: []shutdown.PriorityGrace{
		{Priority: 0, GracePeriod: 20 * time.Second}, {Priority: 10000, GracePeriod: 15 * time.Second},
		{Priority: 100000, GracePeriod: 10 * time.Second}, // empty: skipped
		{Priority: shutdown.SystemCriticalPriority, GracePeriod: 12 * time.Second}}}
	m, err := shutdown.NewManager(cfg, shutdown.Options{Inhibitor: inh, Sender: discard{}, Pods: src,
		Terminator: NewTerminator(agentClient(t, nil), TerminatorConfig{PollInterval: 20 * time.Millisecond, Log: testLog(t)}),
		Log:        testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	mctx, stopManager := context.WithCancel(ctx)
	mdone := make(chan error, 1)
	go func() { mdone <- m.Run(mctx) }()
	defer func() {
		stopManager()
		if err := <-mdone; err != nil {
			t.Errorf("Manager.Run: %v", err)
		}
	}()
	inh.prepare <- true
	start := time.Now()
	select {
	case <-inh.released:
	case <-ctx.Done():
		t.Fatal("the shutdown never released its lock")
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("shutdown took %v: phases should end when their pods are gone", took)
	}
	mu.Lock()
	got := slices.Clone(seen)
	mu.Unlock()
	// Within a phase the order is the deletes'; compare phase by phase.
	want := [][]deletion{{{"app-low", 20}, {"app-low-2", 20}}, {{"app-mid", 15}}, {{"dns", 12}}}
	if len(got) != 4 {
		t.Fatalf("deletions %v; want %v", got, want)
	}
	slices.SortFunc(got[:2], func(a, b deletion) int { return cmpString(a.Name, b.Name) })
	if diff := cmp.Diff(want, [][]deletion{got[:2], got[2:3], got[3:]}); diff != "" {
		t.Errorf("deletions by phase (-want +got):\n%s", diff)
	}
	for _, name := range []string{"daemon", "static"} {
		p, err := admin.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil || p.DeletionTimestamp != nil {
			t.Errorf("%s: %v, deleting %v; a shutdown must leave it alone", name, err, p.GetDeletionTimestamp())
		}
	}
	if p, err := admin.CoreV1().Pods(ns).Get(ctx, "neighbour", metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil {
		t.Errorf("another node's pod was touched: %v", err)
	}
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// TestTerminatorWaitsForThePods: without a kubelet the deleted pod stays Terminating, and
// Terminate reports it when the phase's time is up.
func TestTerminatorWaitsForThePods(t *testing.T) {
	ctx := testContext(t)
	ns := namespace(ctx, t)
	p := Convert(local(t, createPod(ctx, t, ns, podSpec{name: "stuck", node: "node-stuck"})))
	term := NewTerminator(agentClient(t, nil), TerminatorConfig{PollInterval: 20 * time.Millisecond, Log: testLog(t)})
	pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	err := term.Terminate(pctx, []eviction.Pod{p}, 1500*time.Millisecond)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Terminate = %v; want the deadline", err)
	}
	got, gerr := admin.CoreV1().Pods(ns).Get(ctx, "stuck", metav1.GetOptions{})
	if gerr != nil || got.DeletionTimestamp == nil || *got.DeletionGracePeriodSeconds != 2 {
		t.Errorf("stuck: %v, deletion grace %v; want Terminating with 2s (1.5s rounded up)", gerr, got.GetDeletionGracePeriodSeconds())
	}
}

// TestTerminatorGraceZeroAndPodGrace: a phase whose time is already up (grace 0) still deletes its
// pods at once, as kubelet kills them; a pod's own terminationGracePeriodSeconds below the phase's
// grace wins (kubelet's shutdown manager takes the smaller).
func TestTerminatorGraceZeroAndPodGrace(t *testing.T) {
	ctx := testContext(t)
	ns := namespace(ctx, t)
	zeroPod := Convert(local(t, createPod(ctx, t, ns, podSpec{name: "zero-phase", node: "node-z"})))
	shortPod := Convert(local(t, createPod(ctx, t, ns, podSpec{name: "short-grace", node: "node-z", grace: 5})))
	term := NewTerminator(agentClient(t, nil), TerminatorConfig{PollInterval: 20 * time.Millisecond, Log: testLog(t)})

	expired, cancel := context.WithTimeout(ctx, 0)
	defer cancel()
	<-expired.Done()
	if err := term.Terminate(expired, []eviction.Pod{zeroPod}, 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Terminate(grace 0) = %v; want the deadline (no kubelet finishes the pod)", err)
	}
	pctx, cancel2 := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel2()
	_ = term.Terminate(pctx, []eviction.Pod{shortPod}, 20*time.Second)
	for name, want := range map[string]int64{"zero-phase": 1, "short-grace": 5} {
		got, err := admin.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil || got.DeletionTimestamp == nil || *got.DeletionGracePeriodSeconds != want {
			t.Errorf("%s: %v, deletion grace %v; want Terminating with %ds", name, err, got.GetDeletionGracePeriodSeconds(), want)
		}
	}

	cancelled, cancel3 := context.WithCancel(ctx)
	cancel3()
	never := Convert(local(t, createPod(ctx, t, ns, podSpec{name: "called-off", node: "node-z"})))
	_ = term.Terminate(cancelled, []eviction.Pod{never}, time.Minute)
	if got, err := admin.CoreV1().Pods(ns).Get(ctx, "called-off", metav1.GetOptions{}); err != nil || got.DeletionTimestamp != nil {
		t.Errorf("a cancelled shutdown deleted a pod: %v", err)
	}
}
