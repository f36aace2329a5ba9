package kube

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/nodefence/nodefence/coordinator/engine"
)

// Labels kube-controller-manager reads from Nodes.
const (
	// LabelExcludeDisruption excludes a node from its zone's disruption state (labelNodeDisruptionExclusion).
	LabelExcludeDisruption = "node.kubernetes.io/exclude-disruption"
	// NodeLeaseNamespace holds the kubelets' heartbeat Leases.
	NodeLeaseNamespace = corev1.NamespaceNodeLease
)

// nodefence's own Node metadata (docs/observe.md).
const (
	// AnnotationFenceMode puts one node in observe mode: "observe" records its automatic fences as
	// would fence and executes none; "enforce" (or no annotation) follows --fence-mode. An
	// annotation, not a label: it says how to treat the node, nothing selects nodes by it.
	AnnotationFenceMode = "nodefence.io/fence-mode"
	// LabelExcludeFencing excludes a node from automatic fencing (any value; remove the label to
	// end it). A label, like node.kubernetes.io/exclude-disruption: operators select by it
	// (kubectl get nodes -l nodefence.io/exclude-from-fencing).
	LabelExcludeFencing = engine.LabelExcludeFencing
)

// FenceMode reads a Node's fence-mode annotation: whether the node is observed, and what was wrong
// with the annotation ("" when nothing). A value other than observe or enforce observes the node:
// in doubt, nothing is switched.
func FenceMode(n *corev1.Node) (observe bool, note string) {
	v, ok := n.Annotations[AnnotationFenceMode]
	if !ok {
		return false, ""
	}
	m, err := engine.ParseFenceMode(v)
	if err != nil {
		return true, fmt.Sprintf("annotation %s: %v; the node is observed (nothing is switched) until it is fixed", AnnotationFenceMode, err)
	}
	return m == engine.FenceModeObserve, ""
}

// Zone labels, current and legacy, in the order kube-controller-manager's GetZoneKey reads them.
var (
	zoneLabels   = []string{corev1.LabelTopologyZone, corev1.LabelFailureDomainBetaZone}
	regionLabels = []string{corev1.LabelTopologyRegion, corev1.LabelFailureDomainBetaRegion}
)

// NodeInput is what the engine learns from a Node object: its zone, whether it is fenceable (has a
// fence configuration), excluded from disruption checks, a control-plane node, observed (its
// fence-mode annotation) or excluded from automatic fencing (its label).
func NodeInput(n *corev1.Node, fenceable bool, controlPlane labels.Selector, at time.Time) engine.Configured {
	_, excluded := n.Labels[LabelExcludeDisruption]
	_, noFence := n.Labels[LabelExcludeFencing]
	observe, note := FenceMode(n)
	conds := map[string]string{}
	for _, c := range n.Status.Conditions {
		if len(conds) < maxNodeConditions {
			conds[string(c.Type)] = string(c.Status)
		}
	}
	return engine.Configured{
		Node: n.Name, Region: firstLabel(n.Labels, regionLabels), Zone: firstLabel(n.Labels, zoneLabels),
		Fenceable: fenceable, ExcludeDisruption: excluded, ExcludeFencing: noFence, Observe: observe, ModeNote: note, Conditions: conds,
		Maintenance:  maintenance(n),
		ControlPlane: controlPlane != nil && !controlPlane.Empty() && controlPlane.Matches(labels.Set(n.Labels)),
		At:           at,
	}
}

// AnnotationMaintenance puts a node in maintenance: its value says why (kubectl annotate node NODE
// nodefence.io/maintenance="kernel upgrade", then kubectl drain; remove it when done).
const AnnotationMaintenance = engine.AnnotationMaintenance

// maintenance is why the Node is in maintenance ("" when it is not; an empty value says "yes").
func maintenance(n *corev1.Node) string {
	v, ok := n.Annotations[AnnotationMaintenance]
	if !ok {
		return ""
	}
	v = strings.TrimSpace(v)
	if len(v) > 200 {
		v = v[:200]
	}
	if v == "" {
		v = "no reason given"
	}
	return v
}

// maxNodeConditions bounds the conditions read from one Node (a Node carries a handful).
const maxNodeConditions = 64

func firstLabel(l map[string]string, keys []string) string {
	for _, k := range keys {
		if v := l[k]; v != "" {
			return v
		}
	}
	return ""
}

// KubeletHeartbeat is the later of the kubelet's two heartbeats kube-controller-manager watches:
// the node's Lease renewTime and its Ready condition's lastHeartbeatTime. Zero if neither.
func KubeletHeartbeat(n *corev1.Node, lease *coordinationv1.Lease) time.Time {
	var beat time.Time
	if n != nil {
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				beat = c.LastHeartbeatTime.Time
			}
		}
	}
	if lease != nil && lease.Spec.RenewTime != nil && lease.Spec.RenewTime.After(beat) {
		beat = lease.Spec.RenewTime.Time
	}
	return beat
}

// KubeletRenew is how often the kubelet renews its Lease: a quarter of the Lease's duration (the
// kubelet's fixed renew-interval fraction). Zero without a Lease or a duration.
func KubeletRenew(lease *coordinationv1.Lease) time.Duration {
	if lease == nil || lease.Spec.LeaseDurationSeconds == nil || *lease.Spec.LeaseDurationSeconds <= 0 {
		return 0
	}
	return time.Duration(*lease.Spec.LeaseDurationSeconds) * time.Second / 4
}

// Witness reads the kubelet witness (Nodes and their Leases in kube-node-lease) through informers
// and hands the engine what it sees: Configured for every Node (zones, labels), Kubelet for every
// heartbeat, Removed for every deleted Node, and APIServer whenever the apiserver becomes
// unreadable or readable again.
type Witness struct {
	core         kubernetes.Interface
	log          *slog.Logger
	controlPlane labels.Selector
	fenceable    func(node string) bool
	nodeInf      cache.SharedIndexInformer
	leaseInf     cache.SharedIndexInformer
	Nodes        corelisters.NodeLister
	now          func() time.Time
	sink         chan sink // holds the current sink (its func nil: no leader)
	sinks        uint64    // ids handed out by SetSink
	probeEvery   time.Duration
	failures     atomic.Int32 // consecutive failed probes
}

// WitnessOptions configure a Witness.
type WitnessOptions struct {
	// ControlPlane selects the control-plane nodes.
	ControlPlane labels.Selector
	// Fenceable tells whether a node has a fence configuration.
	Fenceable func(node string) bool
	// ProbeInterval is how often the apiserver's /readyz is read (2 s); three failures in a row
	// make it unreadable.
	ProbeInterval time.Duration
	// Now is the clock of the inputs the witness emits; nil means time.Now.
	Now func() time.Time
	Log *slog.Logger
}

// NewWitness returns a Witness on core. Run starts it.
func NewWitness(core kubernetes.Interface, opts WitnessOptions) *Witness {
	nodes := informers.NewSharedInformerFactory(core, 0)
	leases := informers.NewSharedInformerFactoryWithOptions(core, 0, informers.WithNamespace(NodeLeaseNamespace))
	w := &Witness{core: core, log: opts.Log, controlPlane: opts.ControlPlane, fenceable: opts.Fenceable,
		nodeInf: nodes.Core().V1().Nodes().Informer(), leaseInf: leases.Coordination().V1().Leases().Informer(),
		Nodes: nodes.Core().V1().Nodes().Lister(), now: opts.Now, sink: make(chan sink, 1), probeEvery: opts.ProbeInterval}
	if w.log == nil {
		w.log = slog.New(slog.DiscardHandler)
	}
	if w.now == nil {
		w.now = time.Now
	}
	if w.fenceable == nil {
		w.fenceable = func(string) bool { return false }
	}
	if w.probeEvery == 0 {
		w.probeEvery = 2 * time.Second
	}
	w.sink <- sink{}
	return w
}

// Informer is the Node informer, for other handlers (the reconciler's).
func (w *Witness) Informer() cache.SharedIndexInformer { return w.nodeInf }

// Run starts the informers and the apiserver probe until ctx ends, and returns after them.
func (w *Witness) Run(ctx context.Context) {
	_, _ = w.nodeInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { w.nodeChanged(o) },
		UpdateFunc: func(_, o any) { w.nodeChanged(o) },
		DeleteFunc: func(o any) {
			if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			if n, ok := o.(*corev1.Node); ok {
				w.emit(engine.Removed{Node: n.Name, At: w.now()})
			}
		},
	})
	_, _ = w.leaseInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { w.leaseChanged(o) },
		UpdateFunc: func(_, o any) { w.leaseChanged(o) },
	})
	var informers sync.WaitGroup // Run returns after its informers: nothing it starts outlives it
	defer informers.Wait()
	informers.Go(func() { w.nodeInf.Run(ctx.Done()) })
	informers.Go(func() { w.leaseInf.Run(ctx.Done()) })
	if cache.WaitForCacheSync(ctx.Done(), w.nodeInf.HasSynced, w.leaseInf.HasSynced) {
		w.relist(w.Readable())
	}
	t := time.NewTicker(w.probeEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.probe(ctx)
		}
	}
}

// probe reads /readyz; three failures in a row make the apiserver unreadable for the engine.
func (w *Witness) probe(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, w.probeEvery)
	defer cancel()
	err := w.core.Discovery().RESTClient().Get().AbsPath("/readyz").Do(pctx).Error()
	switch {
	case err == nil && w.failures.Load() >= 3:
		w.log.Info("apiserver readable again: every node gets a fresh grace period")
		w.failures.Store(0)
		w.relist(true)
	case err == nil:
		w.failures.Store(0)
	default:
		if w.failures.Add(1) == 3 {
			w.log.Warn("apiserver unreadable: kubelets are not judged and no node becomes a fence candidate", "err", err)
			w.emit(engine.APIServer{Reachable: false, At: w.now()})
		}
	}
}

// Readable tells whether the last probes could read the apiserver.
func (w *Witness) Readable() bool { return w.failures.Load() < 3 }

type sink struct {
	id uint64
	f  func(engine.Input)
}

// SetSink directs the inputs to a new leader's engine and hands it everything the informers know,
// as a relist would: every Node, every heartbeat, and whether the apiserver can be read. Inputs
// reach the sink in order. It returns the id that ClearSink takes.
func (w *Witness) SetSink(f func(engine.Input)) uint64 {
	<-w.sink // the token: no input is emitted while the sink changes
	w.sinks++
	id := w.sinks
	w.sink <- sink{id: id, f: f}
	w.relist(w.Readable() && w.nodeInf.HasSynced() && w.leaseInf.HasSynced())
	return id
}

// ClearSink stops the inputs to the sink SetSink returned id for, unless another replaced it.
func (w *Witness) ClearSink(id uint64) {
	s := <-w.sink
	if s.id == id {
		s = sink{}
	}
	w.sink <- s
}

// relist hands the sink every Node and heartbeat in the caches, then the apiserver's readability.
func (w *Witness) relist(readable bool) {
	now := w.now()
	nodes, _ := w.Nodes.List(labels.Everything())
	for _, n := range nodes {
		w.emit(NodeInput(n, w.fenceable(n.Name), w.controlPlane, now))
		l := w.lease(n.Name)
		w.emit(engine.Kubelet{Node: n.Name, Heartbeat: KubeletHeartbeat(n, l), At: now, Renew: KubeletRenew(l)})
	}
	w.emit(engine.APIServer{Reachable: readable, At: now})
}

// Refresh hands the sink every Node again (after the fence configuration changed, for Fenceable).
func (w *Witness) Refresh() {
	now := w.now()
	nodes, _ := w.Nodes.List(labels.Everything())
	for _, n := range nodes {
		w.emit(NodeInput(n, w.fenceable(n.Name), w.controlPlane, now))
	}
}

func (w *Witness) lease(node string) *coordinationv1.Lease {
	o, ok, err := w.leaseInf.GetStore().GetByKey(NodeLeaseNamespace + "/" + node)
	if err != nil || !ok {
		return nil
	}
	l, _ := o.(*coordinationv1.Lease)
	return l
}

func (w *Witness) nodeChanged(o any) {
	n, ok := o.(*corev1.Node)
	if !ok {
		return
	}
	now := w.now()
	w.emit(NodeInput(n, w.fenceable(n.Name), w.controlPlane, now))
	l := w.lease(n.Name)
	w.emit(engine.Kubelet{Node: n.Name, Heartbeat: KubeletHeartbeat(n, l), At: now, Renew: KubeletRenew(l)})
}

func (w *Witness) leaseChanged(o any) {
	l, ok := o.(*coordinationv1.Lease)
	if !ok || l.Spec.RenewTime == nil {
		return
	}
	// A Lease without its Node is no kubelet the engine counts (kube-controller-manager reads
	// Leases only for Nodes it knows).
	n, err := w.Nodes.Get(l.Name)
	if err != nil {
		return
	}
	w.emit(engine.Kubelet{Node: l.Name, Heartbeat: KubeletHeartbeat(n, l), At: w.now(), Renew: KubeletRenew(l)})
}

// emit hands one input to the current sink, if any.
func (w *Witness) emit(in engine.Input) {
	s := <-w.sink
	defer func() { w.sink <- s }()
	if s.f != nil {
		s.f(in)
	}
}
