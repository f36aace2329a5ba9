package wdlease

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

var (
	long   = flag.Bool("wdlease.long", false, "run the invariant checker over 100,000 schedules (minutes)")
	replay = flag.Uint64("wdlease.seed", 0, "replay one schedule of TestInvariantRandomSchedules by its seed")
)

// simBounds are the rule's bounds in the checker: scaled down (a 1 s watchdog) and with a clock rate
// bound of 5%, so that the margins are many steps wide and a missing one shows.
func simBounds(liars int) Bounds {
	return Bounds{Lease: time.Second, Watchdog: time.Second, RatePPM: 50_000, Sched: 100 * time.Millisecond, PeerAge: 300 * time.Millisecond, Liars: liars}
}

func pick[T any](r *rand.Rand, xs ...T) T { return xs[r.IntN(len(xs))] }

// drawParams draws a schedule's world from seed: cluster size, liars, loss, delay, restarts, power
// losses, partition shapes and leader changes.
func drawParams(seed uint64, weaken weakening) params {
	r := rand.New(rand.NewPCG(seed, ^seed))
	b := simBounds(pick(r, 0, 1, 1, 2))
	b.weaken = weaken
	n := 3 + r.IntN(5)
	return params{
		b: b, n: n, liars: r.IntN(b.Liars + 1),
		duration: 15 * time.Second, heartbeat: pick(r, 250*time.Millisecond, 250*time.Millisecond, 100*time.Millisecond),
		loss: pick(r, 0, 0.02, 0.2), longDelayP: pick(r, 0, 0.02, 0.1), maxDelay: 3 * time.Second,
		restartP: pick(r, 0, 0.002, 0.01), crashP: pick(r, 0, 0.0005),
		partitionP: pick(r, 0.0007, 0.0015, 0.004), oneWay: r.IntN(2) == 0, leaderP: pick(r, 0, 0.001, 0.003),
	}
}

func runSchedule(seed uint64, weaken weakening, tune ...func(*params)) *world {
	p := drawParams(seed, weaken)
	for _, f := range tune {
		f(&p)
	}
	w := newWorld(p, seed)
	w.run()
	return w
}

// The invariant over randomized schedules: wherever the leader's rule says "self-fenced", the node
// does not run. The run must not be vacuous: the rule must say so often, and agents must live on
// their peers' word often.
func TestInvariantRandomSchedules(t *testing.T) {
	if *replay != 0 {
		w := runSchedule(*replay, 0)
		t.Logf("params %+v stats %+v", w.p, w.stats)
		if w.viol != "" {
			t.Fatal(w.viol)
		}
		return
	}
	n := 2500
	switch {
	case *long:
		n = 100_000
	case testing.Short():
		n = 200
	case raceOn:
		n = 400
	}
	var declared, peerFed, resets int
	base := rand.Uint64()
	for i := range n {
		seed := base + uint64(i)
		w := runSchedule(seed, 0)
		if w.viol != "" {
			t.Fatalf("seed %d (replay: -wdlease.seed=%d): %s\nparams %+v", seed, seed, w.viol, w.p)
		}
		declared += min(w.stats.declared, 1)
		peerFed += min(w.stats.peerFeeds, 1)
		resets += min(w.stats.resets, 1)
	}
	t.Logf("%d schedules: self-fenced in %d, fed on peers' word in %d, a reset in %d", n, declared, peerFed, resets)
	if declared < n/20 || peerFed < n/10 || resets < n/5 {
		t.Fatalf("a vacuous run: self-fenced in %d, peer-fed in %d, reset in %d of %d schedules", declared, peerFed, resets, n)
	}
}

// Each rule the proof depends on, removed alone, lets the checker find a node taken as self-fenced
// while it runs: the checker is not blind to the margins it is meant to check.
func TestCheckerCatchesWeakenedRules(t *testing.T) {
	for _, tc := range []struct {
		name   string
		weaken weakening
		tune   func(*params) // where the weakness shows; nil: the checker's own mix
	}{
		{"margin 0 (no clock rate, no scheduling, no 2T floor)", noRateMargin, nil},
		{"no majority check", noMajority, nil},
		{"no room for a liar in the peer quorum", noLiarMargin, func(p *params) {
			p.b.Liars, p.liars, p.n = 1, 1, 3+2*(p.n%3) // an odd cluster with its one liar
		}},
		{"a restarted agent answers at once", noRestartGuard, func(p *params) {
			// No room for a liar to hide in, frequent restarts, and a lease of ten heartbeats: the
			// leader's proof of the old incarnation's lease outlasts the restart.
			p.b.Liars, p.liars, p.restartP, p.heartbeat = 0, 0, 0.02, 100*time.Millisecond
		}},
		{"a lease counted from the grant's arrival", anchorAtArrival, func(p *params) {
			p.longDelayP, p.oneWay = 0.1, true // grants that arrive late, heartbeats that do not arrive
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := rand.Uint64()
			for i := range 5000 {
				if w := runSchedule(base+uint64(i), tc.weaken, tune(tc.tune)...); w.viol != "" {
					t.Logf("caught after %d schedules: %s", i+1, w.viol)
					return
				}
			}
			t.Fatal("5000 schedules and the weakened rule was never caught")
		})
	}
}

// The control plane away for everyone: no leader at all, a whole network; every agent lives on its
// peers' word and no node resets.
func TestControlPlaneAwayNobodyResets(t *testing.T) {
	for n := 3; n <= 7; n++ {
		t.Run(fmt.Sprint(n, " nodes"), func(t *testing.T) {
			p := drawParams(1, 0)
			p.n, p.liars, p.b.Liars = n, 0, 1
			p.loss, p.longDelayP, p.restartP, p.crashP, p.partitionP, p.leaderP = 0, 0, 0, 0, 0, 0
			p.duration = 2 * time.Second
			w := newWorld(p, uint64(n))
			w.run() // 2 s with a leader, then none for 40 s: 40 watchdog timeouts
			w.p.duration, w.leader.up, w.leader.next = 42*time.Second, false, 1<<40
			w.run()
			if w.stats.resets != 0 || w.stats.peerFeeds == 0 {
				t.Fatalf("%d resets, %d feeds on peers' word with the control plane away", w.stats.resets, w.stats.peerFeeds)
			}
		})
	}
}

// A minority partition that sees itself: two of five nodes cut off together from the leader and the
// other three. Both reset (their peers' quorum is out of reach), the majority never does, and the
// leader takes both as self-fenced once its rule allows — while they are down.
func TestMinorityPartitionResets(t *testing.T) {
	p := drawParams(2, 0)
	p.n, p.liars, p.b.Liars = 5, 0, 1
	p.loss, p.longDelayP, p.restartP, p.crashP, p.partitionP, p.leaderP = 0, 0, 0, 0, 0, 0
	p.duration = 3 * time.Second
	w := newWorld(p, 7)
	w.run()
	w.group = []int{1, 1, 0, 0, 0, 0} // n0, n1 | n2, n3, n4 and the leader
	cut := w.now
	w.p.duration = 15 * time.Second
	var declaredAt [2]int
	for ; w.now < int(w.p.duration/step) && w.viol == ""; w.now++ {
		before := w.stats.declared
		w.runStep()
		for i := range 2 {
			if ok, _ := w.leader.l.SelfFenced(w.agents[i].name, Watchdog{Armed: true, Timeout: w.p.b.Watchdog}, 5, w.leader.clk.now()); ok && declaredAt[i] == 0 {
				declaredAt[i] = w.now
			}
		}
		_ = before
	}
	if w.viol != "" {
		t.Fatal(w.viol)
	}
	for i, a := range w.agents {
		down := !a.alive || !a.fed || a.inc > 1
		if i < 2 && (!down || declaredAt[i] == 0) {
			t.Errorf("%s cut off in the minority: reset %v, taken as self-fenced at step %d", a.name, down, declaredAt[i])
		}
		if i >= 2 && (!a.alive || a.inc != 1) {
			t.Errorf("%s on the majority side reset or restarted", a.name)
		}
	}
	safe := w.p.b.SafeAfterGrant()
	for i := range 2 {
		// The last grant came up to a heartbeat before the cut, and the leader's clock may run 5% fast.
		earliest := time.Duration(float64(safe)/1.05) - w.p.heartbeat - step
		if after := time.Duration(declaredAt[i]-cut) * step; after < earliest || after > safe+w.p.b.Window()+time.Second {
			t.Errorf("%s taken as self-fenced %s after the cut; safe time %s", w.agents[i].name, after, safe)
		}
	}
}

func tune(f func(*params)) []func(*params) {
	if f == nil {
		return nil
	}
	return []func(*params){f}
}
