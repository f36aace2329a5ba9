package agent

import (
	"log/slog"
	"sync"
	"time"

	"github.com/nodefence/nodefence/services/wdlease"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

// keptSends bounds how far back (in seqs) a Lease remembers heartbeats' send times: a grant
// answering an older one finds nothing to count from and is not taken.
const keptSends = 64

// Lease is the agent's watchdog lease (services/wdlease) kept on its stream: each heartbeat asks
// for it and echoes the latest grant taken; a grant runs from the moment its heartbeat was queued
// (never later than the send). The watchdog's feeder asks MayFeed. Safe for concurrent use.
type Lease struct {
	mu    sync.Mutex
	rule  *wdlease.Agent
	sends map[uint64]time.Time
	log   *slog.Logger
}

// NewLease starts the lease state of an agent that started at started (its clock), under bounds b
// (b.Lease is the longest grant it takes).
func NewLease(b wdlease.Bounds, started time.Time, log *slog.Logger) *Lease {
	if log == nil {
		log = slog.Default()
	}
	return &Lease{rule: wdlease.NewAgent(b, started), sends: map[uint64]time.Time{}, log: log}
}

// stamp asks for the lease on hb and echoes the latest grant taken.
func (l *Lease) stamp(hb *agentv1.Heartbeat) {
	l.mu.Lock()
	defer l.mu.Unlock()
	hb.LeaseWanted = true
	hb.LeaseEpoch, hb.LeaseGrantId = l.rule.Echo()
}

// queued records that the heartbeat seq was queued at at, before it can be sent.
func (l *Lease) queued(seq uint64, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sends[seq] = at
	if len(l.sends) > keptSends { // seqs are shared with samples and events: drop by age, not by seq-64
		for k := range l.sends {
			if k+keptSends <= seq {
				delete(l.sends, k)
			}
		}
	}
}

// granted takes the leader's grant, arrived at now.
func (l *Lease) granted(g *agentv1.LeaseGrant, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	sent, ok := l.sends[g.GetRequestSeq()]
	if !ok {
		l.log.Warn("watchdog lease: a grant answering a heartbeat this agent does not remember; not taken", "request_seq", g.GetRequestSeq(), "epoch", g.GetEpoch())
		return
	}
	err := l.rule.Grant(wdlease.Grant{Epoch: g.GetEpoch(), ID: g.GetGrantId(), Duration: g.GetDuration().AsDuration()}, sent, now)
	if err != nil {
		l.log.Warn("watchdog lease: grant refused", "error", err, "epoch", g.GetEpoch())
	}
}

// Poison takes the leader's stop-feeding pill: the watchdog is never fed again by this agent, and a
// clean stop leaves it armed (Poisoned). A deposed leader's pill is logged and ignored.
func (l *Lease) Poison(p *agentv1.StopFeeding) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.rule.Poison(p.GetEpoch()); err != nil {
		l.log.Warn("watchdog: stop-feeding pill ignored", "error", err, "epoch", p.GetEpoch(), "fence", p.GetFenceId())
		return
	}
	l.log.Error("watchdog: the leader told this agent to stop feeding (a watchdog fence): this node resets when the watchdog's timeout passes",
		"epoch", p.GetEpoch(), "fence", p.GetFenceId())
}

// Poisoned says whether the agent took a stop-feeding pill: its watchdog must then never be
// disarmed (no magic close), even on a clean stop.
func (l *Lease) Poisoned() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rule.Poisoned()
}

// MayFeed is the rule's answer for the node self in a cluster of n agents at now, with the latest
// peer confirmation c (zero: none).
func (l *Lease) MayFeed(now time.Time, self string, n int, c wdlease.Confirmation) wdlease.Decision {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rule.MayFeed(now, self, n, c)
}

// Expiry is when the held lease ends (zero: never held one).
func (l *Lease) Expiry() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rule.Expiry()
}

// AnswerNoLease is this agent's answer to a peer asking whether it holds a lease (PeerService).
func (l *Lease) AnswerNoLease(now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rule.AnswerNoLease(now)
}
