package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
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
	err := retry.RetryOnConflict(conflictBackoff, func() error {
		n, err := w.core.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.NewTime(w.now())
		taints, ok := EditTaints(n.Spec.Taints, add, remove, now)
		if !ok {
			changed = false
			return nil
		}
		patch, err := taintPatch(n.ResourceVersion, taints)
		if err != nil {
			return err
		}
		if _, err := w.core.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: FieldManager}); err != nil {
			return err
		}
		changed = true
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("node %s taints: %w", node, err)
	}
	return changed, nil
}

// taintPatch is a JSON merge patch replacing the node's taints, valid only at resourceVersion rv
// (the apiserver answers 409 Conflict otherwise).
func taintPatch(rv string, taints []corev1.Taint) ([]byte, error) {
	if taints == nil {
		taints = []corev1.Taint{}
	}
	return json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": rv},
		"spec":     map[string]any{"taints": taints},
	})
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
