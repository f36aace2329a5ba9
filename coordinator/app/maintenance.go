package app

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/nodefence/nodefence/coordinator/kube"
	"github.com/nodefence/nodefence/services/job"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// maintenanceEvery is how often the maintenance controller drains the Nodes in maintenance.
const maintenanceEvery = 2 * time.Second

// startMaintenance runs the term's maintenance controller as a job of the term's group g: the
// drains of the Nodes put in maintenance through StartMaintenance, each eviction an Event on its
// Node.
func (k *kubeMode) startMaintenance(g *job.Group) {
	mc := kube.NewMaintenanceController(k.writer, func() ([]*corev1.Node, error) { return k.witness.Nodes.List(labels.Everything()) }, k.a.log, k.a.now)
	mc.OnEvict = func(node string, p *corev1.Pod) {
		k.recorder.Eventf(kube.NodeRef(node), corev1.EventTypeNormal, "MaintenanceEviction", "evicted pod %s/%s: the node is in maintenance", p.Namespace, p.Name)
	}
	k.maint.Store(mc)
	g.Go("maintenance-controller-detach", func(ctx context.Context) error {
		<-ctx.Done()
		k.maint.CompareAndSwap(mc, nil)
		return nil
	})
	g.Go("maintenance-controller", func(ctx context.Context) error { mc.Run(ctx, maintenanceEvery); return nil })
}

// StartMaintenance annotates and cordons the Node; the term's controller drains it within
// maintenanceEvery.
func (k *kubeMode) StartMaintenance(ctx context.Context, node, reason, requester string, drain bool) error {
	return k.writer.StartMaintenance(ctx, node, reason, requester, drain)
}

// StopMaintenance removes the annotations and nodefence's cordon.
func (k *kubeMode) StopMaintenance(ctx context.Context, node string) error {
	return k.writer.StopMaintenance(ctx, node)
}

// Maintenance reports the node's maintenance with the term's latest eviction outcomes.
func (k *kubeMode) Maintenance(ctx context.Context, node string) (*coordv1.Maintenance, error) {
	if mc := k.maint.Load(); mc != nil {
		return mc.View(ctx, node)
	}
	return k.writer.MaintenanceView(ctx, node, nil)
}
