package app

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/coordinator/kube"
	termcore "github.com/nodefence/nodefence/coordinator/term"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// Observe mode's I/O (docs/observe.md): the engine decides (coordinator/engine/observe.go), the
// record rules say what an observed decision's record is (coordinator/fencing/observe.go), the
// release reconciler decides "would release" (coordinator/release.Decide), the term's core
// (coordinator/term) decides the records' versions and audit entries, which the record writer
// (recordwriter.go) persists; this file acts on them afterwards: the log, the counters, the Events.
// It never calls a driver, never starts the runner, and never writes to a Node or a Pod.

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

// observed follows a would-fence record's create (the record writer's act, after the record was
// persisted): the node's record says would fence, finished when written, and no runner ever sees
// it. The Kubernetes fencing policy applied as it would to the fence (coordinator/term.Admit: a
// node that would not be fenced is not recorded as would fence). Its audit entry is the core's.
func (t *termParts) observed(ctx context.Context, act termcore.Act) {
	a, got := t.a, act.Record
	switch {
	case act.Err != "":
		a.log.Error("would-fence record not written", "node", act.Node, "err", act.Err)
		return
	case !act.Created:
		// An active record of the node (an operator's fence) is running: that is what happens.
		a.log.Info("would fence, but the node's active record runs", "node", act.Node, "fence", got.GetId())
		return
	}
	a.observeMx.wouldFence.Inc()
	a.log.Warn("would fence (observe mode: nothing switched)", "node", act.Node, "fence", got.Id, "evidence", strings.Join(got.Evidence, "; "))
	t.recordWritten(ctx, got)
	if a.kube != nil {
		a.kube.onObserved(got)
	}
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
