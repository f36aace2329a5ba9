package app

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodefence/nodefence/services/fault"
)

// knownNode says whether an agent may say hello for node: a node of the fence configuration, or
// in Kubernetes mode an existing Node.
func (a *App) knownNode(ctx context.Context, node string) error {
	if a.fences() != nil && a.fences().HasNode(node) {
		return nil
	}
	if a.kube == nil {
		return fmt.Errorf("node %q is not in the fence configuration: %w", node, fault.ErrPermissionDenied)
	}
	_, err := a.getNode(ctx, node)
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("node %q does not exist in the cluster: %w", node, fault.ErrPermissionDenied)
	case err != nil:
		return fmt.Errorf("cannot look up node %q: %w: %v", node, fault.ErrUnreachable, err)
	}
	return nil
}

// getNode reads a Node from the witness's informer cache, and from the apiserver when the cache
// does not have it (not synced yet, or the Node is brand new): a reconnect storm of agents costs
// no apiserver call, and a new node is not refused for the cache's delay.
func (a *App) getNode(ctx context.Context, node string) (*corev1.Node, error) {
	if n, err := a.kube.witness.Nodes.Get(node); err == nil {
		return n, nil
	}
	return a.kube.core.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
}

// kubeletReporting says whether the node's kubelet still reports: its Ready condition, which
// kube-controller-manager turns Unknown once the kubelet's lease and status go stale, is True.
// It reads the apiserver, not a cache: an acknowledgement is rare and must see the present.
func (a *App) kubeletReporting(ctx context.Context, node string) (bool, error) {
	n, err := a.kube.core.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue, nil
		}
	}
	return false, nil
}
