package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"google.golang.org/protobuf/types/known/timestamppb"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// AnnotationMaintenanceState is nodefence's own record of a maintenance it started (JSON: who, since
// when, whether it drains, whether nodefence cordoned the node), beside AnnotationMaintenance,
// whose value is the reason. A maintenance set by hand (the reason annotation alone) holds the
// automatic fence back as well; nodefence neither cordons nor drains it.
const AnnotationMaintenanceState = "nodefence.io/maintenance-state"

// MaintenanceState is the value of AnnotationMaintenanceState.
type MaintenanceState struct {
	By    string    `json:"by,omitempty"`
	Since time.Time `json:"since,omitzero"`
	Drain bool      `json:"drain,omitempty"`
	// Cordoned is true when nodefence made the Node unschedulable (and so makes it schedulable
	// again when the maintenance ends); a Node an operator had cordoned before stays cordoned.
	Cordoned bool `json:"cordoned,omitempty"`
}

// MaintenanceOf reads a Node's maintenance: whether it is in maintenance, why, and nodefence's record
// of it (zero when set by hand or unreadable).
func MaintenanceOf(n *corev1.Node) (active bool, reason string, st MaintenanceState) {
	reason, active = n.Annotations[AnnotationMaintenance]
	if raw, ok := n.Annotations[AnnotationMaintenanceState]; ok && active {
		_ = json.Unmarshal([]byte(raw), &st) // an unreadable record reads as "set by hand"
	}
	return active, reason, st
}

// DrainPlan splits a node's pods into those a drain moves and how many it keeps in place: pods of a
// DaemonSet (their controller would start them again on the node), mirror pods (the kubelet runs
// them from files) and pods that already ended — what kubectl drain leaves as well.
func DrainPlan(pods []corev1.Pod) (move []corev1.Pod, kept int) {
	for _, p := range pods {
		if drainKeeps(&p) {
			kept++
			continue
		}
		move = append(move, p)
	}
	return move, kept
}

func drainKeeps(p *corev1.Pod) bool {
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return true
	}
	if _, mirror := p.Annotations[corev1.MirrorPodAnnotationKey]; mirror {
		return true
	}
	return ownedBy(p, "apps", "DaemonSet")
}

// StartMaintenance puts node in maintenance on behalf of requester: the reason annotation,
// nodefence's record, and the Node cordoned (spec.unschedulable, which no kubelet or
// kube-controller-manager owns; kubectl cordon writes the same field). Calling it again updates
// the reason and the drain choice and keeps the start time and who cordoned.
func (w *Writer) StartMaintenance(ctx context.Context, node, reason, requester string, drain bool) error {
	return w.maintenancePatch(ctx, node, func(n *corev1.Node) (map[string]any, error) {
		active, _, st := MaintenanceOf(n)
		if !active || st.By == "" {
			st = MaintenanceState{By: requester, Since: w.now().UTC().Truncate(time.Second), Cordoned: !n.Spec.Unschedulable}
		}
		st.Drain = drain
		raw, err := json.Marshal(st)
		if err != nil {
			return nil, err
		}
		return map[string]any{
			"metadata": map[string]any{"annotations": map[string]any{AnnotationMaintenance: reason, AnnotationMaintenanceState: string(raw)}},
			"spec":     map[string]any{"unschedulable": true},
		}, nil
	})
}

// StopMaintenance ends node's maintenance: both annotations go, and the Node is made schedulable
// again if nodefence cordoned it. A Node not in maintenance is left as it is.
func (w *Writer) StopMaintenance(ctx context.Context, node string) error {
	return w.maintenancePatch(ctx, node, func(n *corev1.Node) (map[string]any, error) {
		active, _, st := MaintenanceOf(n)
		_, hasState := n.Annotations[AnnotationMaintenanceState]
		if !active && !hasState {
			return nil, nil
		}
		p := map[string]any{"metadata": map[string]any{"annotations": map[string]any{AnnotationMaintenance: nil, AnnotationMaintenanceState: nil}}}
		if st.Cordoned {
			p["spec"] = map[string]any{"unschedulable": nil}
		}
		return p, nil
	})
}

// maintenancePatch is patchNode with the error naming the node's maintenance.
func (w *Writer) maintenancePatch(ctx context.Context, node string, edit func(*corev1.Node) (map[string]any, error)) error {
	if err := w.patchNode(ctx, node, edit); err != nil {
		return fmt.Errorf("node %s maintenance: %w", node, err)
	}
	return nil
}

// Evict asks the Eviction API to evict one pod: PodDisruptionBudgets are respected (the apiserver
// answers 429 Too Many Requests while one forbids it) and the pod's own grace period applies.
// A pod already gone is not an error.
func (w *Writer) Evict(ctx context.Context, p *corev1.Pod) error {
	ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace},
		DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &p.UID}}}
	// Not the typed Evict: its client waits out a refusal's Retry-After (10 s) up to ten times;
	// the controller retries refused evictions itself and reports them meanwhile.
	err := w.core.CoreV1().RESTClient().Post().Namespace(p.Namespace).Resource("pods").Name(p.Name).
		SubResource("eviction").MaxRetries(0).Body(ev).Do(ctx).Error()
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) { // gone, or replaced by a new pod of that name
		return nil
	}
	return err
}

// MaintenanceView reads node's maintenance and the pods its drain still has to move, with states
// from the last eviction attempts (tried, by pod UID; nil for none).
func (w *Writer) MaintenanceView(ctx context.Context, node string, tried map[types.UID]PodAttempt) (*coordv1.Maintenance, error) {
	n, err := w.core.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", node, err)
	}
	active, reason, st := MaintenanceOf(n)
	m := &coordv1.Maintenance{Node: node, Active: active, Reason: reason, Requester: st.By, Drain: active && st.Drain, Cordoned: n.Spec.Unschedulable}
	if !st.Since.IsZero() {
		m.StartedAt = timestamppb.New(st.Since)
	}
	if !m.Drain {
		return m, nil
	}
	move, kept, err := w.drainPlan(ctx, node)
	if err != nil {
		return nil, err
	}
	m.Kept = int32(kept)
	for _, p := range move {
		mp := &coordv1.MaintenancePod{Namespace: p.Namespace, Name: p.Name, State: coordv1.MaintenancePodState_MAINTENANCE_POD_STATE_PENDING}
		if a, ok := tried[p.UID]; ok {
			mp.State, mp.Detail = a.State, a.Detail
		}
		if p.DeletionTimestamp != nil {
			mp.State, mp.Detail = coordv1.MaintenancePodState_MAINTENANCE_POD_STATE_TERMINATING, ""
		}
		m.Pods = append(m.Pods, mp)
	}
	m.Drained = len(move) == 0
	return m, nil
}

// drainPlan is DrainPlan of the pods bound to node now.
func (w *Writer) drainPlan(ctx context.Context, node string) (move []corev1.Pod, kept int, err error) {
	pods, err := w.nodePods(ctx, node)
	if err != nil {
		return nil, 0, err
	}
	move, kept = DrainPlan(pods)
	return move, kept, nil
}

// PodAttempt is the outcome of the last eviction of a pod.
type PodAttempt struct {
	State  coordv1.MaintenancePodState
	Detail string
	At     time.Time
}

// attemptOf classifies an eviction's outcome.
func attemptOf(err error, at time.Time) PodAttempt {
	switch {
	case err == nil:
		return PodAttempt{State: coordv1.MaintenancePodState_MAINTENANCE_POD_STATE_TERMINATING, At: at}
	case apierrors.IsTooManyRequests(err):
		return PodAttempt{State: coordv1.MaintenancePodState_MAINTENANCE_POD_STATE_BLOCKED, Detail: err.Error(), At: at}
	default:
		return PodAttempt{State: coordv1.MaintenancePodState_MAINTENANCE_POD_STATE_FAILED, Detail: err.Error(), At: at}
	}
}
