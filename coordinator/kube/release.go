package kube

import (
	"context"
	"errors"
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/klog/v2"
)

// Released is what ReleaseNode did, each list sorted.
type Released struct {
	// Tainted is true when this call added the out-of-service taint (false: it was there).
	Tainted bool
	// DeletedPods are the force-deleted pods, as namespace/name.
	DeletedPods []string
	// KeptPods are the node's pods left alone, as namespace/name: DaemonSet pods, pods tolerating
	// the out-of-service taint, and pods already finished.
	KeptPods []string
	// DeletedVolumeAttachments are the node's VolumeAttachments deleted.
	DeletedVolumeAttachments []string
}

// ReleaseNode releases the workloads of a node that is PROVEN off or isolated — call it only after
// the fence flow confirmed the power-off (or storage isolation) by a status read-back. It applies the
// seed's non-graceful shutdown steps itself, without waiting for kube-controller-manager:
//  1. taint node.kubernetes.io/out-of-service=nodeshutdown:NoExecute;
//  2. force-delete (grace period 0) the node's pods that do not tolerate that taint, never
//     DaemonSet pods, each guarded by its UID so a StatefulSet pod recreated under the same name
//     elsewhere is never hit;
//  3. delete the node's VolumeAttachments, so the volumes can attach to another node.
//
// It is idempotent: a second call finds the taint present and nothing left to delete. On error it
// returns what it did so far; calling it again completes the release.
func (w *Writer) ReleaseNode(ctx context.Context, node string) (Released, error) {
	var r Released
	tainted, err := w.updateTaints(ctx, node, []corev1.Taint{OutOfServiceTaint()}, nil)
	if err != nil {
		return r, err
	}
	r.Tainted = tainted
	if tainted {
		w.log.Warn("node out of service", "node", node, "taint", TaintKeyOutOfService+"="+OutOfServiceValue+":NoExecute")
	}
	pods, err := w.nodePods(ctx, node)
	if err != nil {
		return r, err
	}
	taint := OutOfServiceTaint()
	var errs []error
	for i := range pods {
		p := &pods[i]
		name := p.Namespace + "/" + p.Name
		if !ReleasablePod(p, &taint) {
			r.KeptPods = append(r.KeptPods, name)
			continue
		}
		uid := p.UID
		err := w.core.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{
			GracePeriodSeconds: new(int64), Preconditions: &metav1.Preconditions{UID: &uid},
		})
		switch {
		case err == nil:
			r.DeletedPods = append(r.DeletedPods, name)
			w.log.Info("pod force-deleted", "node", node, "pod", name)
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
			// Gone already, or replaced by a new pod of the same name: nothing of this node's left.
		default:
			errs = append(errs, fmt.Errorf("delete pod %s: %w", name, err))
		}
	}
	vas, err := w.core.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		errs = append(errs, fmt.Errorf("list volumeattachments: %w", err))
	} else {
		for _, va := range vas.Items {
			if va.Spec.NodeName != node {
				continue
			}
			uid := va.UID
			err := w.core.StorageV1().VolumeAttachments().Delete(ctx, va.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
			switch {
			case err == nil:
				r.DeletedVolumeAttachments = append(r.DeletedVolumeAttachments, va.Name)
				w.log.Info("volumeattachment deleted", "node", node, "volumeattachment", va.Name)
			case apierrors.IsNotFound(err), apierrors.IsConflict(err):
			default:
				errs = append(errs, fmt.Errorf("delete volumeattachment %s: %w", va.Name, err))
			}
		}
	}
	sort.Strings(r.DeletedPods)
	sort.Strings(r.KeptPods)
	sort.Strings(r.DeletedVolumeAttachments)
	if err := errors.Join(errs...); err != nil {
		return r, fmt.Errorf("release node %s: %w", node, err)
	}
	return r, nil
}

// Unrelease removes the out-of-service NoExecute taint from a node that is back and recovered. It
// reports whether the taint was there.
func (w *Writer) Unrelease(ctx context.Context, node string) (bool, error) {
	removed, err := w.updateTaints(ctx, node, nil, []corev1.Taint{OutOfServiceTaint()})
	if err == nil && removed {
		w.log.Info("node back in service", "node", node)
	}
	return removed, err
}

// ReleasablePod tells whether ReleaseNode force-deletes p from a node tainted with taint: not when
// a DaemonSet controls it, not when it tolerates the taint, not when it has already finished.
func ReleasablePod(p *corev1.Pod, taint *corev1.Taint) bool {
	if ownedBy(p, "apps", "DaemonSet") {
		return false
	}
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return false
	}
	for i := range p.Spec.Tolerations {
		if p.Spec.Tolerations[i].ToleratesTaint(klog.Background(), taint, false) {
			return false
		}
	}
	return true
}

// ownedBy tells whether p's controller is of the given API group and kind.
func ownedBy(p *corev1.Pod, group, kind string) bool {
	ref := metav1.GetControllerOf(p)
	if ref == nil || ref.Kind != kind {
		return false
	}
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	return err == nil && gv.Group == group
}

// nodePods lists the pods bound to node (field selector spec.nodeName), sorted by namespace/name.
func (w *Writer) nodePods(ctx context.Context, node string) ([]corev1.Pod, error) {
	list, err := w.core.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String(),
	})
	if err != nil {
		return nil, fmt.Errorf("list pods of node %s: %w", node, err)
	}
	pods := list.Items
	sort.Slice(pods, func(i, j int) bool {
		if pods[i].Namespace != pods[j].Namespace {
			return pods[i].Namespace < pods[j].Namespace
		}
		return pods[i].Name < pods[j].Name
	})
	return pods, nil
}

// Policy chooses which nodes are worth fencing.
type Policy int

// Policies.
const (
	// PolicyStateful (the default) fences only nodes running stateful pods: pods using a
	// PersistentVolumeClaim (also through a generic ephemeral volume) or controlled by a StatefulSet.
	// The seed: fencing "applies exclusively to nodes running StatefulSets"; other pods are
	// rescheduled by their controllers without it.
	PolicyStateful Policy = iota
	// PolicyAll fences every node that goes silent.
	PolicyAll
)

// ParsePolicy parses "stateful" or "all".
func ParsePolicy(s string) (Policy, error) {
	switch s {
	case "stateful", "":
		return PolicyStateful, nil
	case "all":
		return PolicyAll, nil
	}
	return 0, fmt.Errorf("fence policy %q: want stateful or all", s)
}

func (p Policy) String() string {
	if p == PolicyAll {
		return "all"
	}
	return "stateful"
}

// NeedsFencing tells whether the silent node should be fenced under policy: always for PolicyAll;
// for PolicyStateful, when one of its pods is stateful (see StatefulPod). It also returns the
// stateful pods found, as namespace/name, for logs and events.
func (w *Writer) NeedsFencing(ctx context.Context, node string, policy Policy) (bool, []string, error) {
	if policy == PolicyAll {
		return true, nil, nil
	}
	pods, err := w.nodePods(ctx, node)
	if err != nil {
		return false, nil, err
	}
	var why []string
	for i := range pods {
		if StatefulPod(&pods[i]) {
			why = append(why, pods[i].Namespace+"/"+pods[i].Name)
		}
	}
	return len(why) > 0, why, nil
}

// StatefulPod tells whether p pins state to its node: it is not finished, not a DaemonSet pod
// (those are never released anyway), and uses a PersistentVolumeClaim, a generic ephemeral
// volume, or is controlled by a StatefulSet.
func StatefulPod(p *corev1.Pod) bool {
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed || ownedBy(p, "apps", "DaemonSet") {
		return false
	}
	if ownedBy(p, "apps", "StatefulSet") {
		return true
	}
	for _, v := range p.Spec.Volumes {
		if v.PersistentVolumeClaim != nil || v.Ephemeral != nil {
			return true
		}
	}
	return false
}
