package main

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nodefence/nodefence/coordinator/kube"
	"github.com/nodefence/nodefence/testbed/nfcluster"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// phaseNames are a nodefence round's phases in the order of the recovery (issue 25.3).
var phaseNames = []string{"agent_last_contact", "kubelet_last_renew", "witnesses_silent", "decision", "driver_call",
	"confirmed_off", "taint", "pod_deleted", "pod_scheduled", "pod_running"}

// phases are seconds from the kill to each phase (absent: not seen; negative: before the kill).
type phases map[string]float64

func (p phases) String() string {
	var b strings.Builder
	for _, n := range phaseNames {
		if v, ok := p[n]; ok {
			fmt.Fprintf(&b, "%s=%.1f ", n, v)
		}
	}
	return strings.TrimSpace(b.String())
}

// phaseMedians is each of names' median over the rounds that saw it.
func phaseMedians(all []phases, names []string) map[string]float64 {
	out := map[string]float64{}
	for _, n := range names {
		var v []float64
		for _, p := range all {
			if x, ok := p[n]; ok {
				v = append(v, x)
			}
		}
		if len(v) > 0 {
			out[n] = p50(v)
		}
	}
	return out
}

// watchDeleted sends when the pod with uid is gone (deleted, or replaced under its name).
func (b *bench) watchDeleted(ctx context.Context, w *nfcluster.Writer, uid types.UID, out chan<- time.Time) {
	for {
		p, err := b.admin.CoreV1().Pods(nfcluster.WriterNamespace).Get(ctx, w.Pod(), metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && p.UID != uid) {
			out <- time.Now()
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// phasesOf reads a finished round's phases: the node's newest fence record from the leader, the
// Node's Lease and out-of-service taint, the old pod's deletion and the new pod's scheduling.
func (b *bench) phasesOf(ctx context.Context, node string, t0 time.Time, deleted <-chan time.Time, np *corev1.Pod, running time.Time) phases {
	p := phases{}
	at := func(name string, t time.Time) {
		if !t.IsZero() {
			p[name] = math.Round(t.Sub(t0).Seconds()*10) / 10
		}
	}
	at("pod_running", running)
	select {
	case t := <-deleted:
		at("pod_deleted", t)
	default:
	}
	for _, c := range np.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionTrue {
			at("pod_scheduled", c.LastTransitionTime.Time)
		}
	}
	if l, err := b.admin.CoordinationV1().Leases("kube-node-lease").Get(ctx, node, metav1.GetOptions{}); err == nil && l.Spec.RenewTime != nil {
		at("kubelet_last_renew", l.Spec.RenewTime.Time)
	}
	if n, err := b.admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); err == nil {
		for _, t := range n.Spec.Taints {
			if t.Key == kube.TaintKeyOutOfService && t.TimeAdded != nil {
				at("taint", t.TimeAdded.Time)
			}
		}
	}
	stamp := func(name string, ts *timestamppb.Timestamp) {
		if ts != nil {
			at(name, ts.AsTime())
		}
	}
	if f := b.fenceOf(ctx, node); f != nil {
		stamp("agent_last_contact", f.GetLastContactAt())
		stamp("witnesses_silent", f.GetNotReadySince())
		stamp("decision", f.GetCreatedAt())
		stamp("confirmed_off", f.GetConfirmedOffAt())
		for _, op := range f.GetOperations() {
			if op.GetStartedAt() != nil {
				stamp("driver_call", op.GetStartedAt())
				break
			}
		}
	}
	return p
}

// fenceOf is the node's newest fence record as the leader lists it (nil: none or no answer).
func (b *bench) fenceOf(ctx context.Context, node string) *coordv1.NodeFence {
	co := b.d.Leader(ctx)
	if co == nil {
		return nil
	}
	_, fc, closeConn, err := b.d.Conn(co.Addr)
	if err != nil {
		return nil
	}
	defer closeConn()
	r, err := fc.ListFences(ctx, &coordv1.ListFencesRequest{Node: node, Limit: 1})
	if err != nil || len(r.GetFences()) == 0 {
		return nil
	}
	return r.GetFences()[0]
}
