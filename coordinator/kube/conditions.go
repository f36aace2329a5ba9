package kube

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
)

// Reasons and messages of the Ready condition, as kubelet and kube-controller-manager write them.
const (
	// ReasonNodeStatusUnknown and MessageNodeStatusUnknown mark a node whose agent went silent.
	ReasonNodeStatusUnknown  = "NodeStatusUnknown"
	MessageNodeStatusUnknown = "Kubelet stopped posting node status."
	// ReasonShuttingDown and MessageShuttingDown mark a node in graceful shutdown (seed 000).
	ReasonShuttingDown  = "KubeletNotReady"
	MessageShuttingDown = "node is shutting down"
)

// MarkNotReady sets the node's Ready condition to status (Unknown for a silent node, False for a
// node shutting down) with reason and message. Like kube-controller-manager for a silent node, it
// keeps lastHeartbeatTime, so the last time the node was heard of stays visible.
func (w *Writer) MarkNotReady(ctx context.Context, node, reason, message string, status corev1.ConditionStatus) error {
	if status == corev1.ConditionTrue {
		return fmt.Errorf("MarkNotReady of %s with status True", node)
	}
	return w.SetConditions(ctx, node, corev1.NodeCondition{
		Type: corev1.NodeReady, Status: status, Reason: reason, Message: message,
	})
}

// SetConditions upserts node conditions by type (Ready, MemoryPressure, DiskPressure, PIDPressure,
// ...) on the node's status subresource. A condition whose status changes gets
// lastTransitionTime = now; lastHeartbeatTime is the given one, or kept when zero. Nothing is written
// when every condition already has the same status, reason and message.
func (w *Writer) SetConditions(ctx context.Context, node string, conds ...corev1.NodeCondition) error {
	wrote := false
	err := retry.RetryOnConflict(conflictBackoff, func() error {
		n, err := w.core.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		out, changed := MergeConditions(n.Status.Conditions, conds, metav1.NewTime(w.now()))
		if !changed {
			wrote = false
			return nil
		}
		n.Status.Conditions = out
		if _, err := w.core.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{FieldManager: FieldManager}); err != nil {
			return err
		}
		wrote = true
		return nil
	})
	if err != nil {
		return fmt.Errorf("node %s conditions: %w", node, err)
	}
	if wrote {
		for _, c := range conds {
			w.log.Info("node condition", "node", node, "type", string(c.Type), "status", string(c.Status), "reason", c.Reason)
		}
	}
	return nil
}

// MergeConditions returns have with every condition of set upserted by type (see SetConditions);
// changed is false when nothing differs in status, reason or message. have is not modified.
func MergeConditions(have, set []corev1.NodeCondition, now metav1.Time) (out []corev1.NodeCondition, changed bool) {
	out = append([]corev1.NodeCondition(nil), have...)
	for _, c := range set {
		i := -1
		for j := range out {
			if out[j].Type == c.Type {
				i = j
				break
			}
		}
		if i < 0 {
			c.LastTransitionTime = now
			if c.LastHeartbeatTime.IsZero() {
				c.LastHeartbeatTime = now
			}
			out = append(out, c)
			changed = true
			continue
		}
		old := out[i]
		if old.Status == c.Status && old.Reason == c.Reason && old.Message == c.Message {
			continue
		}
		if old.Status != c.Status {
			c.LastTransitionTime = now
		} else {
			c.LastTransitionTime = old.LastTransitionTime
		}
		if c.LastHeartbeatTime.IsZero() {
			c.LastHeartbeatTime = old.LastHeartbeatTime
		}
		out[i] = c
		changed = true
	}
	if !changed {
		return have, false
	}
	return out, true
}
