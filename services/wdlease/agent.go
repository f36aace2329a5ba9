package wdlease

import (
	"errors"
	"fmt"
	"time"
)

// Grant is a lease the leader hands an agent, answering one of its requests.
type Grant struct {
	// Epoch is the granting leader's fencing token.
	Epoch int64
	// ID is the grant's number within the epoch; the agent echoes the latest it holds.
	ID uint64
	// Duration is the lease, counted on the agent's clock from its request's send time.
	Duration time.Duration
}

// Errors of an agent refusing a grant. A refused grant is neither held nor echoed.
var (
	ErrGrantDuration = errors.New("lease grant: duration out of range")
	ErrGrantStale    = errors.New("lease grant: from an older epoch than one already held")
	ErrGrantTime     = errors.New("lease grant: answers a request sent after now")
	// ErrPillStale: a stop-feeding pill from an older epoch than a grant the agent took (a deposed
	// leader's); it is ignored.
	ErrPillStale = errors.New("stop-feeding pill: from an older epoch than a grant already held")
)

// Agent is an agent's side of the lease: the lease it holds, by its own clock. The zero value is not
// usable; NewAgent starts one.
type Agent struct {
	b       Bounds
	started time.Time
	expiry  time.Time // zero: never held one
	epoch   int64
	id      uint64
	// poisoned: the leader told the agent to stop feeding (a watchdog fence); it never feeds again.
	poisoned bool
}

// NewAgent starts an agent's lease state at its start time (its clock); it holds no lease.
func NewAgent(b Bounds, started time.Time) *Agent {
	return &Agent{b: b, started: started}
}

// Grant takes a grant answering a request the agent sent at sentAt (its clock). The lease runs until
// sentAt + Duration; an earlier grant's later expiry stands.
func (a *Agent) Grant(g Grant, sentAt, now time.Time) error {
	switch {
	case g.Duration <= 0 || g.Duration > a.b.Lease:
		return fmt.Errorf("%w: %s (at most %s)", ErrGrantDuration, g.Duration, a.b.Lease)
	case g.Epoch < a.epoch:
		return fmt.Errorf("%w: epoch %d, held %d", ErrGrantStale, g.Epoch, a.epoch)
	case sentAt.After(now):
		return ErrGrantTime
	}
	anchor := sentAt
	if a.b.weaken&anchorAtArrival != 0 {
		anchor = now
	}
	if e := anchor.Add(g.Duration); e.After(a.expiry) {
		a.expiry = e
	}
	a.epoch, a.id = g.Epoch, g.ID
	return nil
}

// Poison takes the leader's stop-feeding pill of epoch: from now on MayFeed says Stop, whatever
// lease or peer answers the agent holds, for as long as this Agent lives (the node resets). A pill
// from an epoch older than a grant the agent took is a deposed leader's and is refused.
func (a *Agent) Poison(epoch int64) error {
	if epoch < a.epoch {
		return fmt.Errorf("%w: epoch %d, held %d", ErrPillStale, epoch, a.epoch)
	}
	a.poisoned = true
	return nil
}

// Poisoned says whether the agent took a stop-feeding pill.
func (a *Agent) Poisoned() bool { return a.poisoned }

// Echo is the latest grant the agent took (epoch 0: none), for its next request.
func (a *Agent) Echo() (epoch int64, id uint64) { return a.epoch, a.id }

// Holds says whether the agent holds an unexpired lease at now.
func (a *Agent) Holds(now time.Time) bool { return now.Before(a.expiry) }

// Expiry is when the held lease ends (its clock; zero when it never held one).
func (a *Agent) Expiry() time.Time { return a.expiry }

// AnswerNoLease is the agent's honest answer to a peer asking whether it holds a lease: true ("I
// hold none") only when it holds none and it started at least NoLeaseGuard ago.
func (a *Agent) AnswerNoLease(now time.Time) bool {
	return !a.Holds(now) && !now.Before(a.started.Add(a.b.NoLeaseGuard()))
}

// Confirmation is what a peer query brought back: the query's send time (the agent's clock) and the
// distinct other agents (by certificate identity) that answered "no lease" to it.
type Confirmation struct {
	QueriedAt time.Time
	NoLease   []string
}

// Decision is the answer to "may I feed my watchdog now?".
type Decision int

// Decisions.
const (
	Stop      Decision = iota // no right to run: let the watchdog reset the node
	FeedLease                 // (a) the agent holds the leader's lease
	FeedPeers                 // (b) a quorum of other agents confirmed nobody holds one
)

func (d Decision) String() string {
	switch d {
	case FeedLease:
		return "lease"
	case FeedPeers:
		return "peers"
	}
	return "stop"
}

// MayFeed decides whether the agent named self, in a cluster of n agents, may feed its watchdog at
// now, given its latest peer confirmation (zero when it has none).
func (a *Agent) MayFeed(now time.Time, self string, n int, c Confirmation) Decision {
	if a.poisoned {
		return Stop
	}
	if a.Holds(now) {
		return FeedLease
	}
	if c.QueriedAt.IsZero() || c.QueriedAt.After(now) || now.Sub(c.QueriedAt) > a.b.PeerAge {
		return Stop
	}
	need := a.b.PeerQuorum(n)
	if need > n-1 || need <= 0 || len(c.NoLease) < need {
		return Stop
	}
	seen := make(map[string]bool, len(c.NoLease))
	for _, p := range c.NoLease {
		if p != self && p != "" {
			seen[p] = true
		}
	}
	if len(seen) >= need {
		return FeedPeers
	}
	return Stop
}
