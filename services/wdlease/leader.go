package wdlease

import "time"

// recentGrants is how many of a node's latest grants the leader remembers to recognize an echo:
// heartbeats and grants may be lost, an echo names the latest grant that arrived.
const recentGrants = 4

// Leader is the leader's side of the lease for one term: what it granted to whom and when (its
// clock), and for how long each agent provably held a lease without a gap. The zero value is not
// usable; NewLeader starts one.
type Leader struct {
	b      Bounds
	epoch  int64
	start  time.Time
	nextID uint64
	nodes  map[string]*nodeLease
}

type sentGrant struct {
	id       uint64
	sent     time.Time
	floor    time.Time // the agent's lease runs from no earlier than this; zero: unknown
	hasFloor bool
}

// nodeLease is one node's lease as the leader knows it.
type nodeLease struct {
	lastGrant time.Time
	recent    [recentGrants]sentGrant
	n         int // grants sent, for the ring
	// The latest run of provable holding: the node held a lease throughout [runFrom, runUntil).
	runFrom, runUntil time.Time
}

// NewLeader starts a term of epoch at start (the leader's clock).
func NewLeader(b Bounds, epoch int64, start time.Time) *Leader {
	return &Leader{b: b, epoch: epoch, start: start, nodes: map[string]*nodeLease{}}
}

// Epoch is the term's fencing token.
func (l *Leader) Epoch() int64 { return l.epoch }

func (l *Leader) node(name string) *nodeLease {
	n := l.nodes[name]
	if n == nil {
		n = &nodeLease{}
		l.nodes[name] = n
	}
	return n
}

func (n *nodeLease) find(id uint64) (sentGrant, bool) {
	for _, g := range n.recent {
		if g.id == id && id != 0 {
			return g, true
		}
	}
	return sentGrant{}, false
}

// Request takes a node's request (a heartbeat) that arrived at now echoing the grant (echoEpoch,
// echoID) it holds, and returns the grant to send it. The caller sends it after this returns:
// the recorded send time is never later than the real one.
func (l *Leader) Request(name string, echoEpoch int64, echoID uint64, now time.Time) Grant {
	n := l.node(name)
	g := sentGrant{sent: now}
	if echoEpoch == l.epoch {
		if e, ok := n.find(echoID); ok {
			// The request was sent after grant e left: the lease answering it runs from no earlier.
			g.floor, g.hasFloor = e.sent, true
			if e.hasFloor {
				// The node held grant e when it sent this request, until at least e.floor + D'.
				n.held(now, e.floor.Add(l.b.heldAtLeast(l.b.Lease)))
			}
		}
	}
	l.nextID++
	g.id = l.nextID
	n.recent[n.n%recentGrants] = g
	n.n++
	if now.After(n.lastGrant) {
		n.lastGrant = now
	}
	return Grant{Epoch: l.epoch, ID: g.id, Duration: l.b.Lease}
}

// held adds the proven span [from, until) to the node's latest run (from never goes back: it is the
// arrival time of a request).
func (n *nodeLease) held(from, until time.Time) {
	if !until.After(from) {
		return
	}
	if n.runUntil.IsZero() || from.After(n.runUntil) {
		n.runFrom, n.runUntil = from, until
		return
	}
	if until.After(n.runUntil) {
		n.runUntil = until
	}
}

// Forget drops a node that left the cluster.
func (l *Leader) Forget(name string) { delete(l.nodes, name) }

// SafeTime is the earliest time (the leader's clock) at which the node's watchdog, of timeout t as
// its agent reported it, has certainly reset it, if it has had no grant since: its last grant of
// this term, or the term's start if later (a grant of an earlier leader left before this term
// began), plus SafeAfterGrant.
func (l *Leader) SafeTime(name string, t time.Duration) time.Time {
	last := l.start
	if n := l.nodes[name]; n != nil && n.lastGrant.After(last) {
		last = n.lastGrant
	}
	return last.Add(l.b.withWatchdog(t).SafeAfterGrant())
}

// SafeTimeFor is the node's safe time for its watchdog w: SafeTime, and never before w.NotBefore,
// the bound an earlier term persisted. A new leader's SafeTime counts from its own term start (it
// never knew the old leader's grants, all sent before the old leader stepped down, before this
// term began); the persisted bound keeps it from being earlier, on this clock, than what the old
// leader itself computed.
func (l *Leader) SafeTimeFor(name string, w Watchdog) time.Time {
	s := l.SafeTime(name, w.Timeout)
	if w.NotBefore.After(s) {
		return w.NotBefore
	}
	return s
}

// MajorityHeld says whether, of a cluster of n agents, a majority other than except provably held
// this leader's lease throughout [now - Window, now], the window of a node whose watchdog's timeout
// is t.
func (l *Leader) MajorityHeld(except string, t time.Duration, n int, now time.Time) bool {
	from := now.Add(-l.b.withWatchdog(t).Window())
	count := 0
	for name, nl := range l.nodes {
		if name != except && !nl.runFrom.After(from) && nl.runUntil.After(now) && !nl.runUntil.IsZero() {
			count++
		}
	}
	return count >= Majority(n)
}

// Refusal says why the leader may not (yet) take a node as self-fenced.
type Refusal int

// Refusals.
const (
	Allowed    Refusal = iota // it may
	NotArmed                  // the node's agent last reported no armed watchdog
	BeforeSafe                // the node's safe time has not come
	NoMajority                // the leader has not held leases with a majority for the window
)

func (r Refusal) String() string {
	switch r {
	case NotArmed:
		return "its agent's last report was not \"armed\""
	case BeforeSafe:
		return "its watchdog's safe time has not come"
	case NoMajority:
		return "the leader has not held leases with a majority of the other agents for the whole window"
	}
	return "self-fenced"
}

// Watchdog is a node's watchdog as its agent last reported it.
type Watchdog struct {
	Armed   bool
	Timeout time.Duration
	// NotBefore is a safe time an earlier term persisted for the node when it sent the node its
	// stop-feeding pill (zero: none): the node is never taken as self-fenced before it, whatever
	// this term's own bound says (a leader whose lease or clock differs from the one that granted).
	NotBefore time.Time
}

// SelfFenced says whether the leader may take the silent node name, whose agent last reported its
// watchdog w, as self-fenced at now in a cluster of n agents; when not, why not.
func (l *Leader) SelfFenced(name string, w Watchdog, n int, now time.Time) (bool, Refusal) {
	if !w.Armed || w.Timeout <= 0 || w.Timeout > MaxWatchdog {
		return false, NotArmed
	}
	if now.Before(l.SafeTimeFor(name, w)) {
		return false, BeforeSafe
	}
	if l.b.weaken&noMajority == 0 && !l.MajorityHeld(name, w.Timeout, n, now) {
		return false, NoMajority
	}
	return true, Allowed
}
