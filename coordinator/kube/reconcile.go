package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/nodefence/nodefence/coordinator/release"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// ConditionAgentReady is nodefence's own Node condition: whether the node's agent reports. It is the
// only Node condition nodefence writes; Ready and the pressure conditions belong to kubelet and
// kube-controller-manager.
const ConditionAgentReady corev1.NodeConditionType = "nodefence.io/AgentReady"

// ReleaseFacts is what the reconciler reads from the coordinator on every pass. It is defined here,
// at its consumer, because the facts live in two places the kube package must not reach into:
// fence records in etcd and the witnesses' judgement in the leader's engine.
type ReleaseFacts interface {
	// Fence returns the node's newest fence record (nil if none) and whether a record of the node
	// is still running.
	Fence(ctx context.Context, node string) (latest *coordv1.NodeFence, running bool, err error)
	// Node returns the engine's view of the node, nil if the engine does not know it.
	Node(ctx context.Context, node string) (*coordv1.Node, error)
	// Proof returns the leader's proof of the node's newest record (coordinator/fencing's rules,
	// applied by the engine to every witness it hears).
	Proof(ctx context.Context, node string) (release.Proven, error)
}

// ReconcilerOptions configure a Reconciler.
type ReconcilerOptions struct {
	// HealthyDelay is how long a fenced node must be back and Ready before its out-of-service taint
	// comes off.
	HealthyDelay time.Duration
	// Recorder receives the Kubernetes Events; nil records none.
	Recorder record.EventRecorder
	// OnRelease, if set, is told what each release did (for the audit trail and metrics).
	OnRelease func(node string, fence *coordv1.NodeFence, r Released)
	// OnRecover, if set, is told when a node's out-of-service taint was removed.
	OnRecover func(node, why string)
	// OnWouldRelease, if set, records that an observed record would have released the node's
	// pods (would_release_at, the audit, the metric) and returns the record's new version (nil if
	// it wrote none), which the pass mirrors; an error retries the pass.
	OnWouldRelease func(ctx context.Context, node string, fence *coordv1.NodeFence, why string) (*coordv1.NodeFence, error)
	Log            *slog.Logger
	Now            func() time.Time
	// RateLimiter paces retries of a failing node (default: 200 ms doubling to 30 s).
	RateLimiter workqueue.TypedRateLimiter[string]
}

// Reconciler is the release controller: a level-triggered loop over a client-go work queue keyed
// by node name. Each pass reads the node's fence records, the engine's judgement and the Node, and
// moves the node's out-of-service taint, pods and VolumeAttachments toward what they should be;
// a pass that fails is retried with a rate-limited backoff until it succeeds. It keeps no state
// of its own beyond the queue, so a new leader (or a restarted coordinator) needs only to enqueue
// every node to finish whatever was left.
type Reconciler struct {
	w     *Writer
	nodes corelisters.NodeLister
	facts ReleaseFacts
	opts  ReconcilerOptions
	queue workqueue.TypedRateLimitingInterface[string]
}

// NewReconciler returns a Reconciler; Run starts it.
func NewReconciler(w *Writer, nodes corelisters.NodeLister, facts ReleaseFacts, opts ReconcilerOptions) *Reconciler {
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.RateLimiter == nil {
		opts.RateLimiter = workqueue.NewTypedItemExponentialFailureRateLimiter[string](200*time.Millisecond, 30*time.Second)
	}
	return &Reconciler{w: w, nodes: nodes, facts: facts, opts: opts,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(opts.RateLimiter, workqueue.TypedRateLimitingQueueConfig[string]{Name: "nodefence-release"})}
}

// Enqueue asks for a pass over the node.
func (r *Reconciler) Enqueue(node string) { r.queue.Add(node) }

// EnqueueAll asks for a pass over every Node the lister knows.
func (r *Reconciler) EnqueueAll() {
	nodes, _ := r.nodes.List(labels.Everything())
	for _, n := range nodes {
		r.queue.Add(n.Name)
	}
}

// Run works the queue until ctx ends, resyncing every node every resync (0: never).
func (r *Reconciler) Run(ctx context.Context, resync time.Duration) {
	defer r.queue.ShutDown()
	defer context.AfterFunc(ctx, r.queue.ShutDown)()
	var resyncs sync.WaitGroup // Run returns after its resyncs: nothing it starts outlives it
	defer resyncs.Wait()
	if resync > 0 {
		resyncs.Go(func() {
			t := time.NewTicker(resync)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					r.EnqueueAll()
				}
			}
		})
	}
	for {
		node, quit := r.queue.Get()
		if quit {
			return
		}
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		after, err := r.Sync(pctx, node)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil:
			r.opts.Log.Warn("release pass failed; retrying", "node", node, "attempt", r.queue.NumRequeues(node)+1, "err", err)
			r.queue.AddRateLimited(node)
		case after > 0:
			r.queue.Forget(node)
			r.queue.AddAfter(node, after)
		default:
			r.queue.Forget(node)
		}
		r.queue.Done(node)
	}
}

// Sync is one pass over a node. It returns when to look again (0: on the next change) or the error
// that makes the queue retry it.
func (r *Reconciler) Sync(ctx context.Context, node string) (time.Duration, error) {
	n, err := r.nodes.Get(node)
	if apierrors.IsNotFound(err) {
		return 0, nil // deleted: nothing of it to release or restore
	}
	if err != nil {
		return 0, err
	}
	view, err := r.facts.Node(ctx, node)
	if err != nil {
		return 0, err
	}
	var errs []error
	if err := r.syncAgentCondition(ctx, n, view); err != nil {
		errs = append(errs, err)
	}
	after, err := r.syncRelease(ctx, n, view)
	if err != nil {
		errs = append(errs, err)
	}
	return after, errors.Join(errs...)
}

func (r *Reconciler) syncRelease(ctx context.Context, n *corev1.Node, view *coordv1.Node) (time.Duration, error) {
	latest, running, err := r.facts.Fence(ctx, n.Name)
	if err != nil {
		return 0, err
	}
	if latest != nil {
		if err := r.w.MirrorFence(ctx, latest); err != nil {
			return 0, err
		}
	}
	st := release.State{Fence: latest, Running: running, Tainted: hasOutOfService(n)}
	if latest != nil {
		if st.Proof, err = r.facts.Proof(ctx, n.Name); err != nil {
			return 0, err
		}
	}
	st.Witnesses(view)
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
			st.NodeReady, st.ReadySince = true, c.LastTransitionTime.Time
		}
	}
	now := r.opts.Now()
	action, after, why := release.Decide(st, now, r.opts.HealthyDelay)
	switch action {
	case release.Apply:
		rel, err := r.w.ReleaseNode(ctx, n.Name)
		if err != nil {
			return 0, err
		}
		if rel.Tainted || len(rel.DeletedPods) > 0 || len(rel.DeletedVolumeAttachments) > 0 {
			msg := fmt.Sprintf("%s: out-of-service taint; deleted pods %v; deleted volumeattachments %v", why, rel.DeletedPods, rel.DeletedVolumeAttachments)
			r.event(n.Name, latest, corev1.EventTypeNormal, "PodsReleased", msg)
			if r.opts.OnRelease != nil {
				r.opts.OnRelease(n.Name, latest, rel)
			}
		}
	case release.Remove:
		removed, err := r.w.Unrelease(ctx, n.Name)
		if err != nil {
			return 0, err
		}
		if removed {
			r.event(n.Name, latest, corev1.EventTypeNormal, "Recovered", why+": out-of-service taint removed")
			if r.opts.OnRecover != nil {
				r.opts.OnRecover(n.Name, why)
			}
		}
	case release.Withdraw:
		removed, err := r.w.Unrelease(ctx, n.Name)
		if err != nil {
			return 0, err
		}
		if removed {
			r.event(n.Name, latest, corev1.EventTypeWarning, "ReleaseWithdrawn", why)
		}
	case release.Would:
		if err := r.wouldRelease(ctx, n.Name, latest, why); err != nil {
			return 0, err
		}
	case release.Hold:
		if after == 0 {
			r.event(n.Name, latest, corev1.EventTypeWarning, "ReleaseHeldBack", why)
		}
	}
	return after, nil
}

// wouldRelease records that an observed record would have released the node's pods (through
// OnWouldRelease), mirrors the record's new version, and says so in an Event. Nothing is released.
func (r *Reconciler) wouldRelease(ctx context.Context, node string, f *coordv1.NodeFence, why string) error {
	if r.opts.OnWouldRelease != nil {
		next, err := r.opts.OnWouldRelease(ctx, node, f, why)
		if err != nil {
			return err
		}
		if next != nil {
			if err := r.w.MirrorFence(ctx, next); err != nil {
				return err
			}
		}
	}
	r.event(node, f, corev1.EventTypeNormal, "WouldRelease", why)
	return nil
}

// AgentCondition is the desired nodefence.io/AgentReady condition for the engine's view of a node.
func AgentCondition(view *coordv1.Node) (corev1.ConditionStatus, string, string) {
	switch {
	case view == nil:
		return corev1.ConditionUnknown, "AgentUnknown", "the coordinator has not judged this node yet"
	case view.GetAgentDown(), view.GetReadiness() == coordv1.Readiness_READINESS_UNKNOWN && !view.GetKubeletDown():
		return corev1.ConditionFalse, "AgentSilent", view.GetReason()
	}
	return corev1.ConditionTrue, "AgentReporting", "the nodefence agent reports"
}

// syncAgentCondition applies the AgentReady condition when it differs (server-side apply of that
// one condition: the Node's other conditions keep their owners).
func (r *Reconciler) syncAgentCondition(ctx context.Context, n *corev1.Node, view *coordv1.Node) error {
	status, reason, msg := AgentCondition(view)
	now := metav1.NewTime(r.opts.Now())
	transition := now
	for _, c := range n.Status.Conditions {
		if c.Type != ConditionAgentReady {
			continue
		}
		if c.Status == status && c.Reason == reason {
			return nil
		}
		if c.Status == status {
			transition = c.LastTransitionTime
		}
	}
	ac := corev1ac.Node(n.Name).WithStatus(corev1ac.NodeStatus().WithConditions(corev1ac.NodeCondition().
		WithType(ConditionAgentReady).WithStatus(status).WithReason(reason).WithMessage(msg).
		WithLastHeartbeatTime(now).WithLastTransitionTime(transition)))
	if _, err := r.w.core.CoreV1().Nodes().ApplyStatus(ctx, ac, metav1.ApplyOptions{FieldManager: FieldManager, Force: true}); err != nil {
		return fmt.Errorf("node %s condition %s: %w", n.Name, ConditionAgentReady, err)
	}
	if reason == "AgentSilent" {
		r.event(n.Name, nil, corev1.EventTypeWarning, "AgentDown", msg)
	}
	return nil
}

// event records one Event on the Node and, when a record is given, on its NodeFence.
func (r *Reconciler) event(node string, f *coordv1.NodeFence, kind, reason, msg string) {
	r.opts.Log.Info(msg, "node", node, "reason", reason)
	if r.opts.Recorder == nil {
		return
	}
	r.opts.Recorder.Event(NodeRef(node), kind, reason, msg)
	if f != nil {
		if ref := FenceRef(f.GetId()); ref != nil {
			r.opts.Recorder.Event(ref, kind, reason, msg)
		}
	}
}

// NodeRef is the Event reference of a Node (kube-controller-manager uses the name as the UID).
func NodeRef(node string) *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: "Node", Name: node, UID: types.UID(node)}
}

// FenceRef is the Event reference of a record's NodeFence object, nil if the id is no object name.
func FenceRef(id string) *corev1.ObjectReference {
	name, err := FenceObjectName(id)
	if err != nil {
		return nil
	}
	return &corev1.ObjectReference{APIVersion: FenceGroup + "/" + FenceVersion, Kind: FenceKind, Name: name}
}

func hasOutOfService(n *corev1.Node) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == TaintKeyOutOfService && t.Effect == corev1.TaintEffectNoExecute {
			return true
		}
	}
	return false
}
