package engine

import (
	"slices"
	"time"

	"golang.org/x/time/rate"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

// Pod-eviction pacing: agents evict on their own for hard thresholds (as kubelet does) and report
// it; for soft thresholds past their grace period they propose one candidate at a time and wait for
// a grant. The engine grants per zone under a budget, so that a zone-wide pressure event (a noisy
// neighbour, a bad rollout) does not evict on every node of the zone at once:
//
//   - a token bucket per zone (PodEvictionConfig.Rate grants per second, Burst at once), and
//   - a cap on grants in flight per zone (MaxInFlight): a grant is in flight from the moment it is
//     given until the agent reports its outcome, or GrantTimeout passes without a report.
//
// Candidates wait in the zone in the order they arrived. A node's newer candidate replaces its older
// one and keeps its place. Nothing is granted while evictions are paused or all zones are down.

// Defaults of PodEvictionConfig.
const (
	DefaultPodEvictionRate        = 0.1
	DefaultPodEvictionBurst       = 1
	DefaultPodEvictionMaxInFlight = 2
	DefaultPodEvictionGrantTTL    = 2 * time.Minute
)

// PodEvictionConfig is the per-zone budget for soft-threshold pod evictions.
type PodEvictionConfig struct {
	// Rate is the grants per second per zone (0.1: one every 10 s). Zero grants nothing (agents
	// then fall back to local evictions after their grant timeout).
	Rate float64
	// Burst is how many grants a zone may give at once after a quiet spell (1).
	Burst int
	// MaxInFlight caps the grants per zone whose outcome is not reported yet (2).
	MaxInFlight int
	// GrantTTL is how long a grant counts as in flight without the agent's report (2m).
	GrantTTL time.Duration
}

// SetDefaults fills the zero fields except Rate (a zero rate is a choice).
func (c *PodEvictionConfig) SetDefaults() {
	if c.Burst <= 0 {
		c.Burst = DefaultPodEvictionBurst
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = DefaultPodEvictionMaxInFlight
	}
	if c.GrantTTL <= 0 {
		c.GrantTTL = DefaultPodEvictionGrantTTL
	}
}

// Grant is a pod eviction the engine allows: the loop sends it on the node's agent stream.
type Grant struct {
	Node, Zone string
	Grant      *agentv1.EvictionGrant
}

// candidate is a node's pending proposal.
type candidate struct {
	signal string
	pod    *agentv1.EvictionCandidate
	at     time.Time
}

// podZone is a zone's pod-eviction budget and counters.
type podZone struct {
	limiter   *rate.Limiter
	inFlight  map[string]time.Time // podKey -> when its grant stops counting
	granted   int64
	local     int64
	fallbacks int64
}

func (e *Engine) podZone(key string) *podZone {
	if e.podZones == nil {
		e.podZones = map[string]*podZone{}
	}
	z, ok := e.podZones[key]
	if !ok {
		c := e.cfg.PodEviction
		z = &podZone{limiter: rate.NewLimiter(rate.Limit(c.Rate), c.Burst), inFlight: map[string]time.Time{}}
		e.podZones[key] = z
	}
	return z
}

// podKey names a granted pod within its node: a report frees only its own node's grants, whatever
// uid it names.
func podKey(node, namespace, name, uid string) string {
	if uid != "" {
		return node + "/" + uid
	}
	return node + "/" + namespace + "/" + name
}

// Bounds of a candidate's fields (Kubernetes' own: a DNS label namespace, a DNS subdomain name, a
// uid); a candidate beyond them is ignored.
const (
	maxNamespace = 63
	maxName      = 253
	maxUID       = 64
	maxSignal    = 64
)

// maxPending bounds the nodes with a pending candidate the engine keeps (one per node anyway).
const maxPending = 1 << 16

// onCandidates records a node's proposal: its first candidate replaces any earlier one.
func (e *Engine) onCandidates(n *node, m *agentv1.EvictionCandidates, at time.Time) {
	if len(m.GetCandidates()) == 0 || m.GetCandidates()[0] == nil {
		return
	}
	p := m.GetCandidates()[0]
	if len(p.GetNamespace()) > maxNamespace || len(p.GetName()) > maxName || len(p.GetUid()) > maxUID || len(m.GetSignal()) > maxSignal {
		e.agentEvent(n, at, kindCandidate, "pod-eviction", "node %s: eviction candidate ignored: a field is longer than Kubernetes allows", n.name)
		return
	}
	c := &candidate{signal: m.GetSignal(), pod: p, at: at}
	if n.candidate == nil {
		if len(e.pending) >= maxPending {
			return
		}
		e.pending = append(e.pending, n)
		e.agentEvent(n, at, kindCandidate, "pod-eviction", "node %s: proposes evicting %s/%s for %s; waiting for zone %s's budget",
			n.name, c.pod.GetNamespace(), c.pod.GetName(), c.signal, n.zoneKey)
	} else {
		c.at = n.candidate.at // keeps its place
	}
	n.candidate = c
}

// onEvictionReport records what an agent did: a local eviction counts for its zone; a grant's
// outcome frees its slot.
func (e *Engine) onEvictionReport(n *node, r *agentv1.EvictionReport, at time.Time) {
	if len(r.GetNamespace()) > maxNamespace || len(r.GetName()) > maxName || len(r.GetUid()) > maxUID || len(r.GetSignal()) > maxSignal {
		e.agentEvent(n, at, kindEviction, "pod-eviction", "node %s: eviction report ignored: a field is longer than Kubernetes allows", n.name)
		return
	}
	z := e.podZone(n.zoneKey)
	key := podKey(n.name, r.GetNamespace(), r.GetName(), r.GetUid())
	pod := r.GetNamespace() + "/" + r.GetName()
	switch r.GetKind() {
	case agentv1.EvictionKind_EVICTION_KIND_HARD, agentv1.EvictionKind_EVICTION_KIND_FALLBACK:
		z.local++
		if r.GetKind() == agentv1.EvictionKind_EVICTION_KIND_FALLBACK {
			z.fallbacks++
		}
		if n.candidate != nil && podKey(n.name, n.candidate.pod.GetNamespace(), n.candidate.pod.GetName(), n.candidate.pod.GetUid()) == key {
			e.dropCandidate(n)
		}
		e.agentEvent(n, at, kindEviction, "pod-eviction", "node %s: evicted %s locally (%s, %s)", n.name, pod, kindWord(r.GetKind()), r.GetSignal())
	case agentv1.EvictionKind_EVICTION_KIND_GRANTED, agentv1.EvictionKind_EVICTION_KIND_FAILED, agentv1.EvictionKind_EVICTION_KIND_DECLINED:
		if _, ok := z.inFlight[key]; ok {
			delete(z.inFlight, key)
			e.event(at, "pod-eviction", n.name, "node %s: granted eviction of %s done (%s)", n.name, pod, kindWord(r.GetKind()))
		}
	}
}

func kindWord(k agentv1.EvictionKind) string {
	switch k {
	case agentv1.EvictionKind_EVICTION_KIND_HARD:
		return "hard threshold"
	case agentv1.EvictionKind_EVICTION_KIND_FALLBACK:
		return "no grant in time"
	case agentv1.EvictionKind_EVICTION_KIND_GRANTED:
		return "evicted"
	case agentv1.EvictionKind_EVICTION_KIND_FAILED:
		return "refused"
	case agentv1.EvictionKind_EVICTION_KIND_DECLINED:
		return "declined"
	}
	return k.String()
}

func (e *Engine) dropCandidate(n *node) {
	n.candidate = nil
	e.pending = slices.DeleteFunc(e.pending, func(p *node) bool { return p == n })
}

// grantPods gives the waiting candidates the grants their zones' budgets allow, oldest first.
func (e *Engine) grantPods(now time.Time) {
	for _, z := range e.podZones {
		for k, until := range z.inFlight {
			if !now.Before(until) {
				delete(z.inFlight, k)
			}
		}
	}
	if e.halted || e.paused || len(e.pending) == 0 {
		return
	}
	slices.SortStableFunc(e.pending, func(a, b *node) int {
		if c := a.candidate.at.Compare(b.candidate.at); c != 0 {
			return c
		}
		return compareNames(a.name, b.name)
	})
	var granted []*node
	for _, n := range e.pending {
		if n.streams == 0 {
			continue // nobody to send the grant to; the agent falls back on its own
		}
		z := e.podZone(n.zoneKey)
		if len(z.inFlight) >= e.cfg.PodEviction.MaxInFlight || z.limiter.TokensAt(now) < 1 {
			continue
		}
		z.limiter.AllowN(now, 1)
		c := n.candidate
		z.inFlight[podKey(n.name, c.pod.GetNamespace(), c.pod.GetName(), c.pod.GetUid())] = now.Add(e.cfg.PodEviction.GrantTTL)
		z.granted++
		e.ready.Grants = append(e.ready.Grants, Grant{Node: n.name, Zone: n.zoneKey,
			Grant: &agentv1.EvictionGrant{Signal: c.signal, Pods: []*agentv1.EvictionCandidate{c.pod}}})
		e.event(now, "pod-eviction", n.name, "node %s: eviction of %s/%s granted in zone %s (waited %s)",
			n.name, c.pod.GetNamespace(), c.pod.GetName(), n.zoneKey, now.Sub(c.at).Round(time.Millisecond))
		granted = append(granted, n)
	}
	for _, n := range granted {
		e.dropCandidate(n)
	}
}

func compareNames(a, b string) int {
	switch {
	case naturalLess(a, b):
		return -1
	case naturalLess(b, a):
		return 1
	}
	return 0
}

// podZoneView fills a zone's pod-eviction fields for the API.
func (e *Engine) podZoneView(key string) (rate float64, inFlight, held int32, granted, local, fallbacks int64) {
	rate = e.cfg.PodEviction.Rate
	if e.halted || e.paused {
		rate = 0
	}
	if z, ok := e.podZones[key]; ok {
		inFlight, granted, local, fallbacks = int32(len(z.inFlight)), z.granted, z.local, z.fallbacks
	}
	for _, n := range e.pending {
		if n.zoneKey == key {
			held++
		}
	}
	return rate, inFlight, held, granted, local, fallbacks
}
