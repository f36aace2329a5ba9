package kubepods

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/nodefence/nodefence/node-agent/eviction"
)

// UsageReader reads a pod's usage from its cgroup; Cgroups is the real one. An interface so that a
// node without the kubelet's cgroups (a test) can say "unknown" for every pod.
type UsageReader interface {
	Read(qos eviction.QoSClass, uid string) (u Usage, ok bool, err error)
}

// Source is the node's pods, from an informer watching the pods bound to the node. It implements
// pressure.PodSource and shutdown.PodSource. Create it with NewSource, start it with Run.
type Source struct {
	node     string
	informer cache.SharedIndexInformer
	synced   cache.InformerSynced
	lister   corelisters.PodLister
	usage    UsageReader
	disk     DiskReader
	writable WritableReader
	log      *slog.Logger
}

// WritableReader returns each pod's writable-layer use (bytes, inodes) by pod uid, from the
// container runtime (cri.Client.Writable through an adapter).
type WritableReader func(ctx context.Context) (map[string][2]int64, error)

// SetWritable sets the Source's WritableReader (see WithWritable); call it before Run.
func (s *Source) SetWritable(w WritableReader) { s.writable = w }

// WithWritable has the Source fill its pods' writable-layer use from the container runtime when
// ranking on a filesystem signal (default: none, 0).
func WithWritable(w WritableReader) SourceOption {
	return func(s *Source) { s.writable = w }
}

// SourceOption configures a Source beyond what NewSource requires.
type SourceOption func(*Source)

// WithDisk has the Source measure its pods' disk use with d (default: none, every pod's disk use
// is 0).
func WithDisk(d DiskReader) SourceOption {
	return func(s *Source) { s.disk = d }
}

// NewSource returns a Source for the pods on node; usage may be nil (usage unknown for every pod).
// The client needs get, list and watch on pods.
func NewSource(client *Client, node string, usage UsageReader, log *slog.Logger, opts ...SourceOption) (*Source, error) {
	if node == "" {
		return nil, errors.New("kubepods: a node name is required")
	}
	if log == nil {
		log = slog.Default()
	}
	lw := cache.NewListWatchFromClient(client.core, "pods", metav1.NamespaceAll, fields.OneTermEqualSelector("spec.nodeName", node))
	inf := cache.NewSharedIndexInformer(lw, &corev1.Pod{}, 0, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	// The cache keeps every pod of the node; their managed fields (often the largest part of a
	// pod object) are never read here.
	_ = inf.SetTransform(func(o any) (any, error) {
		if p, ok := o.(*corev1.Pod); ok {
			p.ManagedFields = nil
		}
		return o, nil
	})
	s := &Source{node: node, informer: inf, synced: inf.HasSynced, lister: corelisters.NewPodLister(inf.GetIndexer()),
		usage: usage, log: log.With("component", "kubepods", "node", node)}
	for _, o := range opts {
		o(s)
	}
	return s, nil
}

// NodeSelector is the field selector of the pods bound to node.
func NodeSelector(node string) string {
	return fields.OneTermEqualSelector("spec.nodeName", node).String()
}

// Run watches the node's pods until ctx is done, then returns nil.
func (s *Source) Run(ctx context.Context) error {
	s.informer.Run(ctx.Done())
	return nil
}

// WaitForSync waits until the first list has arrived or ctx ends.
func (s *Source) WaitForSync(ctx context.Context) error {
	if !cache.WaitForCacheSync(ctx.Done(), s.synced) {
		return fmt.Errorf("kubepods: the pods of node %s were not listed: %w", s.node, context.Cause(ctx))
	}
	return nil
}

// SyncTimeout bounds how long Pods and APIPods wait for the first list: a graceful shutdown with
// an unreachable apiserver must go on without the pods rather than wait out its grace period.
const SyncTimeout = 5 * time.Second

// APIPods returns the node's pods that are not finished (phase Succeeded or Failed), sorted by
// namespace/name. It waits for the informer's first list, at most SyncTimeout.
func (s *Source) APIPods(ctx context.Context) ([]*corev1.Pod, error) {
	if !s.synced() {
		sctx, cancel := context.WithTimeout(ctx, SyncTimeout)
		err := s.WaitForSync(sctx)
		cancel()
		if err != nil {
			return nil, err
		}
	}
	all, err := s.lister.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	out := make([]*corev1.Pod, 0, len(all))
	for _, p := range all {
		if p.Spec.NodeName != s.node || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b *corev1.Pod) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
	})
	return out, nil
}

// Pods returns the node's running pods as eviction.Pods (see Convert) with their memory working
// set and process count from their cgroups; a pod whose cgroup is absent or unreadable keeps
// MemoryUsageUnknown. Their disk use is 0: PodsWithDisk measures it.
func (s *Source) Pods(ctx context.Context) ([]eviction.Pod, error) {
	api, err := s.APIPods(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]eviction.Pod, 0, len(api))
	for _, p := range api {
		ep := Convert(p)
		if s.usage != nil {
			u, ok, err := s.usage.Read(ep.QoS, ep.UID)
			switch {
			case err != nil:
				s.log.Warn("cannot read the pod's cgroup; its usage is unknown", "pod", ep.Namespace+"/"+ep.Name, "error", err)
			case ok:
				ep.MemoryUsage, ep.MemoryUsageUnknown, ep.Processes = u.MemoryWorkingSet, false, u.Processes
			}
		}
		out = append(out, ep)
	}
	return out, nil
}

// PodsWithDisk is Pods plus each pod's disk use from the DiskReader (WithDisk), for ranking on a
// filesystem signal; a pod whose disk cannot be fully measured keeps what was measured.
func (s *Source) PodsWithDisk(ctx context.Context) ([]eviction.Pod, error) {
	pods, err := s.Pods(ctx)
	if err != nil {
		return nil, err
	}
	s.readDisk(pods, time.Now())
	if s.writable != nil {
		w, err := s.writable(ctx)
		if err != nil {
			s.log.Warn("cannot read the containers' writable layers from the runtime; they count 0", "error", err)
		}
		for i := range pods {
			if u, ok := w[pods[i].UID]; ok {
				pods[i].Disk.Writable, pods[i].DiskInodes.Writable = u[0], u[1]
			}
		}
	}
	return pods, nil
}

// readDisk fills the pods' Disk and DiskInodes.
func (s *Source) readDisk(pods []eviction.Pod, now time.Time) {
	if s.disk == nil {
		return
	}
	refs := make([]PodRef, len(pods))
	for i, p := range pods {
		refs[i] = PodRef{Namespace: p.Namespace, Name: p.Name, UID: p.UID}
	}
	res := s.disk.ReadDisk(refs, now)
	if len(res) != len(pods) {
		s.log.Error("the disk reader answered for the wrong number of pods; disk use unknown", "pods", len(pods), "results", len(res))
		return
	}
	for i, r := range res {
		if r.Err != nil {
			s.log.Warn("cannot measure all of the pod's disk use; it keeps what was measured",
				"pod", pods[i].Namespace+"/"+pods[i].Name, "error", r.Err)
		}
		pods[i].Disk, pods[i].DiskInodes = r.Bytes, r.Inodes
	}
}

// runtimePod finds the node's pod whose containers carry uid: the pod's own uid, or for a static
// pod the uid the kubelet gave it, which its mirror pod names in its config.mirror annotation.
// ok is false before the first list.
func (s *Source) runtimePod(uid string) (pod *corev1.Pod, ok bool) {
	if !s.synced() {
		return nil, false
	}
	all, err := s.lister.List(labels.Everything())
	if err != nil {
		return nil, false
	}
	for _, p := range all {
		if string(p.UID) == uid || (p.Annotations[ConfigMirrorAnnotation] != "" && p.Annotations[ConfigMirrorAnnotation] == uid) {
			return p, true
		}
	}
	return nil, true
}

// PodGone reports whether the pod with uid no longer needs its containers, as kubelet's pod
// workers answer the container GC once they have synced (ShouldPodRuntimeBeRemoved): the pod is
// not bound to the node any more, or it is finished (phase Succeeded or Failed). Before the first
// list it reports false: nothing is known to be gone.
func (s *Source) PodGone(uid string) bool {
	p, ok := s.runtimePod(uid)
	if !ok {
		return false
	}
	return p == nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// PodRemoved reports whether the content (logs) of the pod with uid may be removed, as kubelet's
// pod workers answer once synced (ShouldPodContentBeRemoved): the pod is not bound to the node any
// more, or it was evicted (phase Failed, reason Evicted). Before the first list it reports false.
func (s *Source) PodRemoved(uid string) bool {
	p, ok := s.runtimePod(uid)
	if !ok {
		return false
	}
	return p == nil || (p.Status.Phase == corev1.PodFailed && p.Status.Reason == "Evicted")
}
