package app

import (
	"context"
	"time"

	"github.com/nodefence/nodefence/coordinator/api"
	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/coordinator/fencing"
	"github.com/nodefence/nodefence/services/wdlease"
)

// selfFence is a term's side of the watchdog method (fencing.SelfFence): the term's leases and the
// engine's record of each node's last watchdog report. The cluster's size for the majority is the
// number of nodes the engine knows (configured or registered): never fewer than the agents that
// hold leases, so the majority is never easier to reach than the agents' own.
type selfFence struct {
	t      *termParts
	leases *api.Leases
}

// selfFenceQuery bounds one question to the engine.
const selfFenceQuery = 5 * time.Second

// watchdog is the node's last watchdog report and the cluster's size, as the engine knows them.
func (s selfFence) watchdog(node string) (w wdlease.Watchdog, n int, connected bool) {
	ctx, cancel := context.WithTimeout(s.t.term.Context(), selfFenceQuery)
	defer cancel()
	_ = s.t.loop.Query(ctx, func(e *engine.Engine) {
		n = len(e.Nodes())
		if v := e.Node(node); v != nil {
			w = wdlease.Watchdog{Armed: v.GetWatchdogArmed(), Timeout: v.GetWatchdogTimeout().AsDuration(), NotBefore: e.WatchdogNotBefore(node)}
			connected = v.GetConnected()
		}
	})
	return w, n, connected
}

// Poison sends the node's agent the stop-feeding pill with its next lease request, audits it and
// persists the node's safe time from here (engine.WatchdogBound: its last grant of this term is
// now fixed), so that a new leader continuing the fence never proves it off by time earlier. The
// fence waits for the write (StepSync) before it judges; a failed write only leaves the new
// leader's own bound (its term start + the safe time), which is conservative on its own.
func (s selfFence) Poison(node, fence string) {
	s.leases.Poison(node, fence)
	s.t.a.audit(s.t.term, node, "watchdog-pill", "fence "+fence+": the node's agent is told to stop feeding its watchdog (no lease is granted to it in this term)")
	w, _, _ := s.watchdog(node)
	if !w.Armed {
		return
	}
	ctx, cancel := context.WithTimeout(s.t.term.Context(), selfFenceQuery)
	defer cancel()
	if err := s.t.loop.StepSync(ctx, engine.WatchdogBound{Node: node, NotBefore: s.leases.SafeTime(node, w)}); err != nil {
		s.t.a.log.Warn("watchdog fence: the node's safe time was not persisted; a new leader counts its own from its term start", "node", node, "fence", fence, "err", err)
	}
}

// Judge applies the timing rule to the node now.
func (s selfFence) Judge(node string, now time.Time) fencing.ByTime {
	w, n, connected := s.watchdog(node)
	ok, why, safe := s.leases.SelfFenced(node, w, n, now)
	return fencing.ByTime{OK: ok, Refusal: why, SafeTime: safe, Connected: connected}
}

// Armed says whether the node's agent last reported an armed watchdog.
func (s selfFence) Armed(node string) bool {
	w, _, _ := s.watchdog(node)
	return w.Armed
}
