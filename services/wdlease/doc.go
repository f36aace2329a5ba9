// Package wdlease is the one home of the rule that makes a node's watchdog a proof (issue 24): when
// an agent may feed its watchdog, and when the leader may take a silent node as self-fenced. It is
// pure: no clock, no I/O, no goroutines; every time is a value the caller passes, read from the
// caller's own clock. Agents and the leader apply the same Bounds.
//
// # The protocol
//
//  1. An agent's heartbeat (a request) carries the id of the latest grant it holds (its echo). The
//     agent remembers when, by its clock, it sent each request.
//  2. The leader answers a heartbeat with a grant: its epoch, an id and the lease duration D. The
//     agent's lease runs from the moment it SENT the request the grant answers (not from the grant's
//     arrival), for D by its own clock. A grant delayed in the network only shortens the lease.
//  3. The agent feeds its watchdog only while [Agent.MayFeed] says so: (a) it holds an unexpired
//     lease, or (b) a query it sent at most Q ago was answered "I hold no lease" by at least
//     [Bounds.PeerQuorum] OTHER agents of the cluster. An agent that (re)started answers "no lease"
//     only after [Bounds.NoLeaseGuard] by its clock: its previous incarnation may have held one.
//  4. The leader takes a silent node N as self-fenced at its time t ([Leader.SelfFenced]) only if
//     N's last report said "armed", t is at or after [Leader.SafeTime] (N's last grant, or the
//     leader's term start if later, plus [Bounds.SafeAfterGrant]), and a majority of the cluster's
//     agents other than N have provably held the leader's lease for the whole window [t - W, t]
//     (W = [Bounds.Window]). A lease is provably held from the arrival of a request that echoes it
//     (the agent had it then) until the send time of the grant that the request answered by it had
//     echoed, plus D·(1-ρ)/(1+ρ) (the agent sent that request after that grant left the leader).
//
// # Assumptions (the bound the proof holds under)
//
//   - Every clock that measures a duration — each agent's, the leader's, each watchdog's own timer —
//     advances at a rate within [1-ρ, 1+ρ] of real time (ρ = RatePPM/10⁶; default 1%, twenty
//     times NTP's largest slew of 500 ppm). Clocks need not agree on the time of day: only rates
//     matter, and only durations are compared across machines.
//   - A process acts at most S after it decided (scheduling, a stalled goroutine): an agent that
//     decided at time c to feed writes to the device by c + S.
//   - Two leaders never grant at once: a leader stops granting before another's term starts (the
//     election's guarantee; see coordinator/leader).
//   - At most f = Liars agents lie ("no lease" while holding one). A liar is counted by
//     nobody as more than one answer; agents are told apart by their certificates.
//   - The watchdog, unfed for T by its own timer, resets its machine (a hardware watchdog; softdog
//     depends on the kernel still running its timers).
//
// # The formula, derived
//
// SBD's msgwait is 2 × the watchdog timeout: the victim needs up to one timeout to read its slot and
// stop feeding, and its watchdog up to one more to fire. medik8s self-node-remediation computes its
// safe time the same way, from how long an agent may go on believing it is healthy (its API and peer
// check intervals and timeouts) plus the watchdog timeout plus an allowance for the reboot. Here the
// time the node may go on believing it may run is its lease, measured from a point no later than the
// grant, and every duration is converted between clocks at the worst rate:
//
//	lease-path feed ends (real)  ≤ τ(grant) + D/(1-ρ) + S
//	node stops (real)            ≤ τ(grant) + D/(1-ρ) + S + T/(1-ρ)
//	leader waits (its clock)     ≥ (1+ρ) · that span, since its clock may run fast:
//
//	SafeAfterGrant = max( ⌈(D + T)·(1+ρ)/(1-ρ)⌉ + ⌈S·(1+ρ)⌉ , 2·T )
//
// The floor 2·T keeps it never weaker than SBD's msgwait for the same watchdog. For feeds on peers'
// answers (path b), the answers that allowed a feed at real time c were given in [c - Q/(1-ρ), c], and
// the node lives until c + S + T/(1-ρ). If the agents of a majority M2 (not N) provably held leases
// throughout the leader's window [t - W, t], with
//
//	W = ⌈(T + Q)·(1+ρ)/(1-ρ)⌉ + ⌈S·(1+ρ)⌉
//
// then every answer given in the real span that window covers came from a quorum M1 (≥ ⌊n/2⌋ + f of
// the n-1 others) that meets M2 (≥ ⌊n/2⌋ + 1 of them) in at least f+1 agents: an honest one among
// them said "I hold a lease", so no such feed happened, and every earlier peer-path feed has run out.
// With the defaults (heartbeat 1 s, D = 4 s, T = 15 s, S = 2 s, Q = 2 s, ρ = 1%, f = 1)
// SafeAfterGrant is 30 s (the 2·T floor; the rate formula gives 21.4 s) and W is 19.4 s, against
// self-node-remediation's default safe time of about 180 s. A new leader counts every node's last
// grant from its own term's start, and has proven nothing about anyone's lease before W has passed.
//
// # The invariant
//
// A node considered self-fenced at time t does not run at t: it has not run a pod since the end of
// its last right to run (its last lease's expiry, or the last peer-confirmed feed) plus the
// watchdog's timeout plus the scheduling allowance. The randomized checker in this package's tests
// (TestInvariantRandomSchedules, and -wdlease.long for 10⁵ schedules; the bounds there are scaled to
// a 1 s watchdog and ρ = 5%) asserts it at every instant the leader's rule holds, under drifting clocks, leader changes, partitions of every shape, loss,
// delay, agent restarts, node resets and lying peers; TestCheckerCatchesWeakenedRules shows that each
// weakened rule (no rate margin, no majority, no liar margin, no restart guard, a lease counted from
// the grant's arrival) is caught.
package wdlease
