package kube

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Taint keys. nodefence writes only the out-of-service taint; the not-ready and unreachable taints
// are kube-controller-manager's, named here to check that nodefence never touches them.
const (
	TaintKeyNotReady     = "node.kubernetes.io/not-ready"
	TaintKeyUnreachable  = "node.kubernetes.io/unreachable"
	TaintKeyOutOfService = "node.kubernetes.io/out-of-service"
	// OutOfServiceValue is the value of the out-of-service taint the seed's example uses.
	OutOfServiceValue = "nodeshutdown"
)

// OutOfServiceTaint is the taint ReleaseNode puts on a node proven off.
func OutOfServiceTaint() corev1.Taint {
	return corev1.Taint{Key: TaintKeyOutOfService, Value: OutOfServiceValue, Effect: corev1.TaintEffectNoExecute}
}

// updateTaints adds and removes taints (matched by key and effect) on node with a merge patch
// guarded by the resourceVersion it read, re-reading on conflict. It reports whether it wrote.
func (w *Writer) updateTaints(ctx context.Context, node string, add, remove []corev1.Taint) (bool, error) {
	changed := false
	err := w.patchNode(ctx, node, func(n *corev1.Node) (map[string]any, error) {
		taints, ok := EditTaints(n.Spec.Taints, add, remove, metav1.NewTime(w.now()))
		if changed = ok; !ok {
			return nil, nil
		}
		if taints == nil {
			taints = []corev1.Taint{}
		}
		return map[string]any{"spec": map[string]any{"taints": taints}}, nil
	})
	if err != nil {
		return false, fmt.Errorf("node %s taints: %w", node, err)
	}
	return changed, nil
}

// EditTaints returns taints without those matching remove (by key and effect) and with every taint
// of add that is not there yet (by key and effect; a present one keeps its value and timeAdded),
// stamped with now when it carries no timeAdded. changed is false when the result equals taints.
// The input is not modified.
func EditTaints(taints, add, remove []corev1.Taint, now metav1.Time) (out []corev1.Taint, changed bool) {
	same := func(a, b corev1.Taint) bool { return a.Key == b.Key && a.Effect == b.Effect }
	for _, t := range taints {
		if slices.ContainsFunc(remove, func(r corev1.Taint) bool { return same(r, t) }) &&
			!slices.ContainsFunc(add, func(a corev1.Taint) bool { return same(a, t) }) {
			changed = true
			continue
		}
		out = append(out, t)
	}
	for _, a := range add {
		if slices.ContainsFunc(out, func(t corev1.Taint) bool { return same(a, t) }) {
			continue
		}
		if a.TimeAdded == nil {
			a.TimeAdded = &now
		}
		out = append(out, a)
		changed = true
	}
	if !changed {
		return taints, false
	}
	return out, true
}
