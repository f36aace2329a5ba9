package app

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/coordinator/fencing"
	"github.com/nodefence/nodefence/coordinator/kube"
	"github.com/nodefence/nodefence/coordinator/leader"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// Observe mode's I/O (docs/observe.md): the engine decides (coordinator/engine/observe.go), the
// record rules say what an observed decision's record is (coordinator/fencing/observe.go), the
// release reconciler decides "would release" (coordinator/release.Decide); this file writes
// the records, the audit and the counters. It never calls a driver, never starts the runner, and
// never writes to a Node or a Pod.

// logFenceMode says at start when the coordinator only observes.
func logFenceMode(cfg Config, log *slog.Logger) {
	if cfg.Engine.Fence.Mode == engine.FenceModeObserve {
		log.Warn("--fence-mode=observe: automatic decisions are recorded as would fence / would release; nothing is switched, tainted or deleted (operators' own fences still run)")
	}
}

// observeMetrics count what observe mode would have done.
type observeMetrics struct {
	wouldFence   prometheus.Counter
	wouldRelease prometheus.Counter
}

func newObserveMetrics(reg prometheus.Registerer) *observeMetrics {
	m := &observeMetrics{
		wouldFence: prometheus.NewCounter(prometheus.CounterOpts{Name: "nodefence_would_fence_total",
			Help: "Automatic fences decided in observe mode and recorded as would fence (nothing was switched)."}),
		wouldRelease: prometheus.NewCounter(prometheus.CounterOpts{Name: "nodefence_would_release_total",
			Help: "Releases of a node's pods that observe mode would have made (nothing was tainted or deleted)."}),
	}
	reg.MustRegister(m.wouldFence, m.wouldRelease)
	return m
}

// observeFence records an automatic decision made in observe mode: the node's record says would
// fence, finished when written, and no runner ever sees it. The Kubernetes fencing policy applies as
// it would to the fence (a node that would not be fenced is not recorded as would fence). It runs
// on a goroutine of its own, started from the loop's OnReady after the decision was persisted.
func (t *termParts) observeFence(req engine.FenceRequest) {
	a, term := t.a, t.term
	rec := a.admit(term, req, 0)
	if rec == nil {
		return
	}
	ctx, cancel := context.WithTimeout(term.Context(), 10*time.Second)
	defer cancel()
	got, _, created, err := a.store.CreateFence(ctx, term, rec)
	if err != nil {
		a.log.Error("would-fence record not written", "node", req.Node, "err", err)
		return
	}
	if !created {
		// An active record of the node (an operator's fence) is running: that is what happens.
		a.log.Info("would fence, but the node's active record runs", "node", req.Node, "fence", got.GetId())
		return
	}
	a.observeMx.wouldFence.Inc()
	a.log.Warn("would fence (observe mode: nothing switched)", "node", req.Node, "fence", got.Id, "evidence", strings.Join(rec.Evidence, "; "))
	a.audit(term, req.Node, "would-fence", fmt.Sprintf("fence %s recorded as would fence (observe mode): no driver was called", got.Id))
	for _, in := range engine.RecordWritten(got, a.now()) {
		_ = t.loop.Step(ctx, in)
	}
	if a.kube != nil {
		a.kube.onObserved(got)
	}
}

// wouldRelease writes on an observed record that the reconciler would have released the node's
// pods now, audits and counts it, once: a record that says so already is left as it is.
func (a *App) wouldRelease(ctx context.Context, term *leader.Term, node string, f *coordv1.NodeFence, why string) (*coordv1.NodeFence, error) {
	v, err := a.store.GetFence(ctx, f.GetId())
	if err != nil {
		return nil, err
	}
	next := fencing.WouldRelease(v.Fence, a.now(), term.Epoch)
	if next == nil {
		return nil, nil
	}
	if _, err := a.store.UpdateFence(ctx, term, next, v.Revision); err != nil {
		return nil, fmt.Errorf("record would release on fence %s: %w", f.GetId(), err)
	}
	a.observeMx.wouldRelease.Inc()
	a.audit(term, node, "would-release", why)
	return next, nil
}

// onObserved records an Event for a would-fence record on its Node and NodeFence, and asks for a
// reconciler pass over the node (the mirror, and would release).
func (k *kubeMode) onObserved(f *coordv1.NodeFence) {
	msg := fmt.Sprintf("fence %s recorded as would fence (observe mode): nothing was switched", f.GetId())
	k.recorder.Event(kube.NodeRef(f.GetNode()), corev1.EventTypeNormal, "WouldFence", msg)
	if ref := kube.FenceRef(f.GetId()); ref != nil {
		k.recorder.Event(ref, corev1.EventTypeNormal, "WouldFence", msg)
	}
	if r := k.rec.Load(); r != nil {
		r.Enqueue(f.GetNode())
	}
}
