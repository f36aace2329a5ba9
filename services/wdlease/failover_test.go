package wdlease

import (
	"math/rand/v2"
	"testing"
	"time"
)

// A new leader continues a watchdog fence it did not start (issue 24, failover): it never knew the
// old leader's grants, only that the old leader stepped down before this term began
// (coordinator/leader: a leader that cannot read its key for 4/5 of the election TTL ends its term,
// and no other replica is elected before the key's lease expired). Its safe time for a node it has
// granted nothing is then counted from its own term start: at least start + (D + T) — the lease
// and the watchdog timeout — plus the rate and scheduling margins; never earlier than the bound the
// old leader persisted with its pill (Watchdog.NotBefore, read on the new leader's clock); and in
// real time never before the node's watchdog has certainly reset it after the old leader's last
// grant. Randomized over leases, timeouts, grant times, step-down delays and clock rates within
// the bound (the clocks agree at the old term's start and drift apart at their rates). Without
// the persisted bound a fast new clock takes the node as self-fenced before the old leader's bound.
func TestNewLeaderSafeTimeIsConservative(t *testing.T) {
	const schedules = 20_000
	rng := rand.New(rand.NewPCG(24, 7))
	base := time.Unix(1_000_000, 0)
	for i := range schedules {
		T := time.Duration(1+rng.IntN(60)) * time.Second
		b := Defaults(T)
		b.Lease = time.Duration(1+rng.IntN(30)) * time.Second
		rho := float64(b.RatePPM) / ppm
		rate := func() float64 { return 1 - rho + 2*rho*rng.Float64() } // a clock's rate against real time
		// Real time in seconds from the old term's start; a clock's reading at real time r.
		oldRate, newRate := rate(), rate()
		clock := func(rate, r float64) time.Time { return base.Add(time.Duration(r * rate * float64(time.Second))) }
		old := NewLeader(b, 1, clock(oldRate, 0))
		lastGrant := 0.0
		for g := rng.Float64() * 5; g < 60; g += 0.2 + rng.Float64() {
			old.Request("n", 0, 0, clock(oldRate, g))
			lastGrant = g
		}
		persisted := old.SafeTime("n", T)               // what the old leader wrote with its pill
		stepDown := lastGrant + rng.Float64()*3         // it grants nothing after it steps down
		start := stepDown + rng.Float64()*rng.Float64() // the new term begins after that (maybe at once)
		nl := NewLeader(b, 2, clock(newRate, start))

		w := Watchdog{Armed: true, Timeout: T, NotBefore: persisted}
		safe := nl.SafeTimeFor("n", w)
		onNew := safe.Sub(clock(newRate, start))
		if onNew < b.Lease+T+b.Sched || onNew < b.SafeAfterGrant() {
			t.Fatalf("schedule %d: the new leader's safe time is %s after its term start, less than D + T + S (%s) or SafeAfterGrant (%s)", i, onNew, b.Lease+T+b.Sched, b.SafeAfterGrant())
		}
		if safe.Before(persisted) {
			t.Fatalf("schedule %d: the new leader's safe time %s is before the persisted bound %s", i, safe, persisted)
		}
		// The node's lease, anchored no later than the last grant, runs at most D on a clock at
		// 1-ρ; its last feed is at most S after; its watchdog fires at most T (slow device) later.
		dead := lastGrant + (b.Lease+T).Seconds()/(1-rho) + b.Sched.Seconds()
		if real := start + onNew.Seconds()/newRate; real < dead-1e-6 {
			t.Fatalf("schedule %d: the new leader's safe time (real %.3f s) is before the node's certain reset (%.3f s)", i, real, dead)
		}
		if ok, why := nl.SelfFenced("n", w, 3, safe.Add(-time.Nanosecond)); ok || why != BeforeSafe {
			t.Fatalf("schedule %d: self-fenced before the safe time (%v, %v)", i, ok, why)
		}
	}
}
