package wdlease

import (
	"errors"
	"fmt"
	"time"
)

// Defaults: see the package doc for why each is what it is.
const (
	DefaultLease   = 4 * time.Second // four heartbeats of 1 s: a majority's holding stays provable between renewals
	DefaultRatePPM = 10_000          // ρ = 1%
	DefaultSched   = 2 * time.Second
	DefaultPeerAge = 2 * time.Second
	DefaultLiars   = 1
)

// MaxGrant is the longest lease a leader grants and an agent takes. It is also how long a restarted
// agent tells its peers it may still hold its previous incarnation's lease (NoLeaseGuard of an agent
// whose Lease is MaxGrant): short enough that a rollout does not keep the peer check closed long.
const MaxGrant = time.Minute

// Limits on the bounds: beyond them a proof by time is no proof anyone would wait for.
const (
	MaxLease    = 10 * time.Minute
	MaxWatchdog = 10 * time.Minute
	MaxRatePPM  = 200_000 // 20%
	MinRatePPM  = 100     // 0.01%: a bound of zero would claim perfect clocks
	MaxSched    = time.Minute
	MaxPeerAge  = time.Minute
	MaxLiars    = 16
)

const ppm = 1_000_000

// Bounds are the durations and assumptions the rule is safe under (the package doc states them).
type Bounds struct {
	// Lease (D) is the lease the leader grants, and the longest an agent accepts.
	Lease time.Duration
	// Watchdog (T) is the node's watchdog timeout, as the device reads it.
	Watchdog time.Duration
	// RatePPM (ρ·10⁶) bounds how far any clock's rate may stray from real time.
	RatePPM int64
	// Sched (S) bounds the delay between deciding to feed and the write reaching the device.
	Sched time.Duration
	// PeerAge (Q) is how old a peer query may be when its answers allow a feed.
	PeerAge time.Duration
	// Liars (f) is how many agents may lie about holding no lease without breaking the invariant.
	Liars int

	// weaken is set only by this package's tests, to show the checker catches each weakened rule.
	weaken weakening
}

// weakening names rules the tests remove one at a time.
type weakening uint8

const (
	noRateMargin    weakening = 1 << iota // SafeAfterGrant = D + T, Window = T + Q
	noMajority                            // SelfFenced skips the majority check
	noLiarMargin                          // PeerQuorum = ⌊n/2⌋: the agent counts itself, no room for a liar
	noRestartGuard                        // a fresh agent answers "no lease" at once
	anchorAtArrival                       // the agent's lease runs from the grant's arrival
)

// Defaults returns the default bounds for a watchdog of timeout t.
func Defaults(t time.Duration) Bounds {
	return Bounds{Lease: DefaultLease, Watchdog: t, RatePPM: DefaultRatePPM, Sched: DefaultSched, PeerAge: DefaultPeerAge, Liars: DefaultLiars}
}

// Validate returns every field out of range, named.
func (b Bounds) Validate() error {
	var errs []error
	check := func(ok bool, name string, v any, want string) {
		if !ok {
			errs = append(errs, fmt.Errorf("watchdog lease bounds: %s %v: want %s", name, v, want))
		}
	}
	check(b.Lease > 0 && b.Lease <= MaxLease, "lease", b.Lease, fmt.Sprintf("more than 0 and at most %s", MaxLease))
	check(b.Watchdog > 0 && b.Watchdog <= MaxWatchdog, "watchdog timeout", b.Watchdog, fmt.Sprintf("more than 0 and at most %s", MaxWatchdog))
	check(b.RatePPM >= MinRatePPM && b.RatePPM <= MaxRatePPM, "clock rate bound (ppm)", b.RatePPM, fmt.Sprintf("%d to %d", MinRatePPM, MaxRatePPM))
	check(b.Sched >= 0 && b.Sched <= MaxSched, "scheduling delay", b.Sched, fmt.Sprintf("0 to %s", MaxSched))
	check(b.PeerAge > 0 && b.PeerAge <= MaxPeerAge, "peer answer age", b.PeerAge, fmt.Sprintf("more than 0 and at most %s", MaxPeerAge))
	check(b.Liars >= 0 && b.Liars <= MaxLiars, "liars", b.Liars, fmt.Sprintf("0 to %d", MaxLiars))
	return errors.Join(errs...)
}

// withWatchdog is b for a node whose watchdog's timeout is t.
func (b Bounds) withWatchdog(t time.Duration) Bounds {
	b.Watchdog = t
	return b
}

// mulDiv returns d·num/den rounded up (up) or down. Validated bounds keep d·num well inside int64:
// d ≤ 20 min = 1.2·10¹² ns, num ≤ 1.2·10⁶.
func mulDiv(d time.Duration, num, den int64, up bool) time.Duration {
	p := int64(d) * num
	q := p / den
	if up && p%den != 0 {
		q++
	}
	return time.Duration(q)
}

// slowest converts a span measured on one clock into the longest real span it may be, then into
// the longest span any other clock may show for it: d·(1+ρ)/(1-ρ), rounded up.
func (b Bounds) slowest(d time.Duration) time.Duration {
	if b.weaken&noRateMargin != 0 {
		return d
	}
	return mulDiv(d, ppm+b.RatePPM, ppm-b.RatePPM, true)
}

// sched is S as the leader's clock may measure it: S·(1+ρ), rounded up.
func (b Bounds) sched() time.Duration {
	if b.weaken&noRateMargin != 0 {
		return 0
	}
	return mulDiv(b.Sched, ppm+b.RatePPM, ppm, true)
}

// SafeAfterGrant is how long after sending its last grant to a node (by its own clock) the leader
// must wait before that node's watchdog has certainly reset it:
// max(⌈(D+T)·(1+ρ)/(1-ρ)⌉ + ⌈S·(1+ρ)⌉, 2·T). It is the benchmark's watchdog_safe_time_s.
func (b Bounds) SafeAfterGrant() time.Duration {
	s := b.slowest(b.Lease+b.Watchdog) + b.sched()
	if b.weaken&noRateMargin == 0 {
		s = max(s, 2*b.Watchdog)
	}
	return s
}

// Window is how long (leader's clock) a majority of the other agents must have provably held the
// leader's lease, without a gap, before a silent node is taken as self-fenced: long enough that no
// peer-confirmed feed can still be keeping it alive: ⌈(T+Q)·(1+ρ)/(1-ρ)⌉ + ⌈S·(1+ρ)⌉.
func (b Bounds) Window() time.Duration {
	return b.slowest(b.Watchdog+b.PeerAge) + b.sched()
}

// NoLeaseGuard is how long (its own clock) a freshly started agent answers "I hold a lease" to its
// peers: its previous incarnation's lease, anchored before this start, has certainly expired after
// D·(1+ρ)/(1-ρ).
func (b Bounds) NoLeaseGuard() time.Duration {
	if b.weaken&noRestartGuard != 0 {
		return 0
	}
	return b.slowest(b.Lease)
}

// heldAtLeast is the shortest span of the leader's clock in which an agent's lease of duration d,
// anchored at or after a known leader instant, certainly still runs: d·(1-ρ)/(1+ρ), rounded down.
func (b Bounds) heldAtLeast(d time.Duration) time.Duration {
	if b.weaken&noRateMargin != 0 {
		return d
	}
	return mulDiv(d, ppm-b.RatePPM, ppm+b.RatePPM, false)
}

// PeerQuorum is how many OTHER agents of a cluster of n must answer "no lease" to one query before
// an agent without a lease may feed: ⌊n/2⌋ + f. It meets any majority of the other agents in at
// least f+1 of them, so f liars cannot make it. It may exceed n-1 (small clusters): then the peer
// path is closed and an agent without a lease lets its watchdog reset the node.
func (b Bounds) PeerQuorum(n int) int {
	if b.weaken&noLiarMargin != 0 {
		return n / 2
	}
	return n/2 + b.Liars
}

// Majority is how many agents other than a silent node must provably hold the leader's lease for
// the leader to take that node as self-fenced: ⌊n/2⌋ + 1 of a cluster of n.
func Majority(n int) int { return n/2 + 1 }
