package pressure

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nodefence/nodefence/node-agent/eviction"
	"github.com/nodefence/nodefence/node-agent/signals"
	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

// Acting defaults.
const (
	// DefaultCleanupTimeout is kubelet's podCleanupTimeout: after evicting a pod, how long to wait
	// for its resources to be reclaimed before evicting another.
	DefaultCleanupTimeout = 30 * time.Second
	// DefaultGrantTimeout is how long a soft-threshold candidate waits for the coordinator's grant
	// before the agent evicts it on its own.
	DefaultGrantTimeout = 2 * time.Minute
)

// Killer evicts a pod on the node at once, without the coordinator, the way kubelet's eviction
// manager does (kubepods.Killer: pod status Failed/Evicted with a DisruptionTarget condition, an
// Event, then the pod's termination with c's grace period). Used for hard thresholds and for the
// fallback when no grant comes.
type Killer interface {
	Kill(ctx context.Context, c eviction.Candidate, r eviction.Reclaim) (message string, err error)
}

// CleanupChecker reports whether an evicted pod's resources are reclaimed (kubelet's
// podCleanedUpFunc): the pod is gone, or its cgroup is.
type CleanupChecker interface {
	CleanedUp(ctx context.Context, c eviction.Candidate) bool
}

// GrantExecutor carries out a granted eviction through the Eviction API (kubepods.Evictor).
type GrantExecutor interface {
	Grant(g *agentv1.EvictionGrant)
}

// NodeReclaimer frees node-level resources before pods are evicted for a filesystem signal, as
// kubelet's eviction manager does (cri.Client.Reclaim: dead containers, unused images); it
// describes what it freed.
type NodeReclaimer func(ctx context.Context, containers, images bool) (string, error)

// Actions are what Monitor needs to act on the node's pods in Kubernetes mode. A nil Actions (or a
// nil Killer) only reports.
type Actions struct {
	Killer  Killer
	Cleanup CleanupChecker
	Granted GrantExecutor
	// Node, when set, frees dead containers and unused images first for filesystem signals.
	Node NodeReclaimer
}

// nodeReclaimFor is kubelet's buildSignalToNodeReclaimFuncs: what node-level reclaim may relieve
// signal in layout (containers: dead containers; images: unused images).
func nodeReclaimFor(signal string, layout eviction.Layout) (containers, images bool) {
	if !eviction.IsDiskSignal(signal) {
		return false, false
	}
	fs, _, _ := strings.Cut(signal, ".")
	switch layout {
	case eviction.LayoutSplitDisk:
		if fs == "nodefs" {
			return false, false
		}
		return true, true
	case eviction.LayoutSplitImage:
		if fs == "imagefs" {
			return false, true
		}
		return true, false
	}
	return true, true
}

// reclaimNode runs the node-level reclaim for r and reports whether it relieved every threshold
// (each at its minimum reclaim), in which case no pod is evicted (kubelet's
// reclaimNodeLevelResources).
func (m *Monitor) reclaimNode(ctx context.Context, r eviction.Reclaim, log *slog.Logger) bool {
	containers, images := nodeReclaimFor(r.Threshold.Signal, m.cfg.Layout)
	if m.actions.Node == nil || (!containers && !images) {
		return false
	}
	res, err := m.actions.Node(ctx, containers, images)
	if err != nil {
		log.Warn("node-level reclaim failed", "error", err)
	}
	sigs, err := m.reader.Read()
	if err != nil {
		log.Warn("reading the signals after node-level reclaim failed", "error", err)
		return false
	}
	obs := signals.Observations(sigs)
	all := append(slices.Clone(m.cfg.Eviction.Hard), m.cfg.Eviction.Soft...)
	if len(eviction.ThresholdsMet(all, obs, true)) == 0 {
		log.Info("node-level reclaim relieved the pressure without evicting pods", "reclaimed", res)
		return true
	}
	log.Info("node-level reclaim was not enough; evicting", "reclaimed", res)
	return false
}

// step is what the acting state machine decides for one evaluation.
type step int

const (
	stepNone     step = iota
	stepKill          // hard threshold: kill cand at once
	stepPropose       // soft threshold: propose cand to the coordinator
	stepFallback      // soft threshold, no grant within the timeout: kill cand locally
)

// actor is the pure part of acting: kubelet's one pod per interval and wait for reclaim, plus the
// coordinator's grant for soft thresholds. Time comes in as now.
type actor struct {
	cleanupTimeout, grantTimeout time.Duration

	waiting   *eviction.Candidate // evicted, resources not yet reclaimed
	waitUntil time.Time

	proposed   *eviction.Candidate // proposed to the coordinator, no grant yet
	proposedAt time.Time
	signal     string
}

// waitFor starts kubelet's wait for c's resources, at most cleanupTimeout.
func (a *actor) waitFor(c eviction.Candidate, now time.Time) {
	a.waiting, a.waitUntil = &c, now.Add(a.cleanupTimeout)
	a.proposed = nil
}

// busy reports whether a previous eviction's resources are still being waited for; cleaned says
// whether they are reclaimed now (asked only while waiting).
func (a *actor) busy(now time.Time, cleaned func(eviction.Candidate) bool) bool {
	if a.waiting == nil {
		return false
	}
	if !now.Before(a.waitUntil) || cleaned(*a.waiting) {
		a.waiting = nil
		return false
	}
	return true
}

// decide returns what to do about r with next the pod kubelet would evict now.
func (a *actor) decide(r eviction.Reclaim, next eviction.Candidate, now time.Time) (step, eviction.Candidate) {
	if r.Hard() {
		a.proposed = nil
		return stepKill, next
	}
	if a.proposed != nil {
		if now.Sub(a.proposedAt) >= a.grantTimeout {
			c := *a.proposed
			a.proposed = nil
			return stepFallback, c
		}
		return stepNone, eviction.Candidate{}
	}
	a.proposed, a.proposedAt, a.signal = &next, now, r.Threshold.Signal
	return stepPropose, next
}

// granted reports whether a grant for the pod uid matches the pending proposal, and clears it.
func (a *actor) granted(uid string) (eviction.Candidate, bool) {
	if a.proposed == nil || a.proposed.UID != uid {
		return eviction.Candidate{}, false
	}
	c := *a.proposed
	a.proposed = nil
	return c, true
}

// Grant takes a coordinator grant (agent.GrantHandler); it is handed to the Run loop and returns
// at once.
func (m *Monitor) Grant(g *agentv1.EvictionGrant) {
	select {
	case m.grants <- g:
	default:
		m.log.Warn("grant dropped: too many grants queued", "signal", g.GetSignal())
	}
}

// Connected tells the monitor that a new coordinator stream is up (agent.Config.Connected); it
// returns at once.
func (m *Monitor) Connected() {
	select {
	case m.streams <- struct{}{}:
	default: // one already queued does the same
	}
}

// repropose sends the pending candidate again on a new stream. A candidate the previous leader
// had acknowledged lives only in that leader's memory: after a leader change nobody would grant
// it and the node would stay under pressure until the grant timeout. The timeout is not
// restarted: the candidate keeps its first proposal time, so a node never waits longer than
// GrantTimeout for relief, however many leaders come and go (the coordinator keeps one candidate
// per node, and the agent carries out one grant per proposal, so a repeat is harmless).
func (m *Monitor) repropose() {
	c := m.act.proposed
	if c == nil {
		return
	}
	m.send.Send(candidatesMessage(m.act.signal, *c))
	m.log.Info("proposed the pending eviction candidate again on a new coordinator stream", "pod", c.Namespace+"/"+c.Name,
		"signal", m.act.signal, "proposed_at", m.act.proposedAt)
}

func candidatesMessage(signal string, c eviction.Candidate) *agentv1.ConnectRequest {
	return &agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Candidates{Candidates: &agentv1.EvictionCandidates{
		Signal: signal, Candidates: []*agentv1.EvictionCandidate{{
			Namespace: c.Namespace, Name: c.Name, Uid: c.UID, GracePeriod: durationpb.New(c.GracePeriod)}}}}}
}

// handleGrant carries out a grant that matches the pending proposal and declines any other.
func (m *Monitor) handleGrant(g *agentv1.EvictionGrant, now time.Time) {
	for _, p := range g.GetPods() {
		c, ok := m.act.granted(p.GetUid())
		if !ok || m.actions.Granted == nil {
			m.log.Info("declining a grant that is not the pending candidate", "pod", p.GetNamespace()+"/"+p.GetName())
			m.report(eviction.Candidate{Namespace: p.GetNamespace(), Name: p.GetName(), UID: p.GetUid()}, g.GetSignal(),
				agentv1.EvictionKind_EVICTION_KIND_DECLINED, "not the agent's pending candidate (pressure gone or pod changed)", now)
			continue
		}
		m.actions.Granted.Grant(&agentv1.EvictionGrant{Signal: g.GetSignal(), Pods: []*agentv1.EvictionCandidate{{
			Namespace: c.Namespace, Name: c.Name, Uid: c.UID, GracePeriod: durationpb.New(c.GracePeriod)}}})
		m.act.waitFor(c, now)
	}
}

// reclaim acts on the first threshold to reclaim: kubelet's synchronize after the thresholds.
func (m *Monitor) reclaim(ctx context.Context, r eviction.Reclaim, now time.Time) {
	if m.act.busy(now, m.cleanedUp(ctx)) {
		return
	}
	log := m.log.With("signal", r.Threshold.Signal, "hard", r.Hard(), "need", r.Need, "target", r.Target)
	if m.reclaimNode(ctx, r, log) {
		return
	}
	if m.pods == nil {
		log.Warn("threshold met past its grace period; no pod source in standalone mode, reporting only")
		return
	}
	list := m.pods.Pods
	if ds, ok := m.pods.(DiskPodSource); ok && eviction.IsDiskSignal(r.Threshold.Signal) {
		list = ds.PodsWithDisk
	}
	pods, err := list(ctx)
	if err != nil {
		log.Warn("listing pods failed", "error", err)
		return
	}
	next, ok := eviction.Next(r, m.cfg.Layout, pods, m.cfg.Eviction.MaxPodGracePeriod)
	if !ok {
		log.Warn("threshold met past its grace period but no pod to evict")
		return
	}
	st, c := m.act.decide(r, next, now)
	switch st {
	case stepPropose:
		m.send.Send(candidatesMessage(r.Threshold.Signal, c))
		log.Info("proposed an eviction candidate to the coordinator", "pod", c.Namespace+"/"+c.Name)
	case stepKill, stepFallback:
		kind := agentv1.EvictionKind_EVICTION_KIND_HARD
		if st == stepFallback {
			kind = agentv1.EvictionKind_EVICTION_KIND_FALLBACK
			log.Warn("no grant from the coordinator in time; evicting locally", "pod", c.Namespace+"/"+c.Name, "grant_timeout", m.act.grantTimeout)
		}
		if m.actions.Killer == nil {
			log.Warn("threshold met past its grace period; nothing to evict with, reporting only")
			return
		}
		msg, err := m.actions.Killer.Kill(ctx, c, r)
		// Like kubelet's evictPod, a pod whose kill failed still counts as this interval's eviction:
		// its cleanup is waited for (at most CleanupTimeout) before another pod is tried, so a
		// failing kill is not retried at every fast read.
		m.act.waitFor(c, now)
		if err != nil {
			log.Error("evicting the pod failed", "pod", c.Namespace+"/"+c.Name, "error", err)
			return
		}
		m.report(c, r.Threshold.Signal, kind, msg, now)
		if m.rec != nil {
			if er, ok := m.rec.(EvictionRecorder); ok {
				er.Eviction(r.Threshold.Signal, kind.String())
			}
		}
		log.Info("evicted a pod", "pod", c.Namespace+"/"+c.Name, "grace_period", c.GracePeriod, "kind", kind.String())
	}
}

// EvictionRecorder counts evictions by signal and kind (metrics.Metrics is one); optional.
type EvictionRecorder interface {
	Eviction(signal, kind string)
}

// report tells the coordinator about an eviction.
func (m *Monitor) report(c eviction.Candidate, signal string, kind agentv1.EvictionKind, msg string, now time.Time) {
	m.send.Send(EvictionReport(c, signal, kind, msg, now))
}

// maxReportMessage is the longest message the coordinator accepts in a report (agentwire.MaxText):
// a longer one (an Eviction API error can be) would have the stream refused, again at every resend.
const maxReportMessage = 1024

// EvictionReport builds the message reporting an eviction to the coordinator. The message is cut
// to what the coordinator accepts, as valid UTF-8.
func EvictionReport(c eviction.Candidate, signal string, kind agentv1.EvictionKind, msg string, at time.Time) *agentv1.ConnectRequest {
	msg = strings.ToValidUTF8(msg, "?")
	if len(msg) > maxReportMessage {
		cut := maxReportMessage
		for cut > 0 && !utf8.RuneStart(msg[cut]) {
			cut--
		}
		msg = msg[:cut]
	}
	return &agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Eviction{Eviction: &agentv1.EvictionReport{
		Namespace: c.Namespace, Name: c.Name, Uid: c.UID, Signal: signal, Kind: kind,
		GracePeriod: durationpb.New(c.GracePeriod), Message: msg, At: timestamppb.New(at)}}}
}
