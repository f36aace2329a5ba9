package kubescenario

import (
	"context"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
)

// KubeletManager is the field manager of the kubelet stand-in, as a real kubelet's is "kubelet".
const KubeletManager = "kubelet"

// startKubelet is the node's kubelet heartbeat as kube-apiserver sees it, for a cluster of one
// apiserver without kubelets: it posts the Node's Ready=True condition once and renews the node's
// Lease in kube-node-lease every renew interval, as the kubelet's node lease controller does, until
// stopped. (The real kubelet runs in the multi-node cluster harness; this stand-in speaks the same
// API objects and nothing more.)
func (e *Env) startKubelet(ctx context.Context, n *Node, renew time.Duration) error {
	// The coordinator writes its own condition on the same Node: re-read on a conflict.
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		node, err := e.Admin.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.Now()
		ready := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
			Reason: "KubeletReady", Message: "kubelet is posting ready status", LastHeartbeatTime: now, LastTransitionTime: now}
		conds := []corev1.NodeCondition{ready}
		for _, c := range node.Status.Conditions {
			if c.Type != corev1.NodeReady {
				conds = append(conds, c)
			}
		}
		node.Status.Conditions = conds
		_, err = e.Admin.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{FieldManager: KubeletManager})
		return err
	})
	if err != nil {
		return fmt.Errorf("kubelet %s: post Ready: %w", n.Name, err)
	}
	leases := e.Admin.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	// The Lease says the cadence it is renewed at, as the kubelet's does (renew = a quarter of the
	// duration): the coordinator judges the kubelet's silence against it.
	holder, seconds := n.Name, int32(max(1, (4*renew+time.Second-1)/time.Second))
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Namespace: corev1.NamespaceNodeLease},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &seconds, RenewTime: &metav1.MicroTime{Time: time.Now()}}}
	if _, err := leases.Create(ctx, lease, metav1.CreateOptions{FieldManager: KubeletManager}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("kubelet %s: lease: %w", n.Name, err)
	}
	kctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(renew)
		defer t.Stop()
		for {
			select {
			case <-kctx.Done():
				return
			case <-t.C:
			}
			l, err := leases.Get(kctx, n.Name, metav1.GetOptions{})
			if err != nil {
				continue
			}
			l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
			_, _ = leases.Update(kctx, l, metav1.UpdateOptions{FieldManager: KubeletManager})
		}
	}()
	var once sync.Once
	n.stopKubelet = func() { once.Do(func() { cancel(); <-done }) }
	e.stops = append(e.stops, n.stopKubelet)
	return nil
}
