// Package engine is the coordinator's judgement, as a pure state machine in the style of etcd's raft
// RawNode: no goroutines, no clock, no I/O. Inputs arrive through Step (agent contact, samples,
// conditions, shutdown announcements, configuration, leadership, and in Kubernetes mode the kubelets'
// heartbeats, Node deletions and the apiserver's readability) and Tick (the passage of time, as a
// value); decisions leave through Ready — store writes to persist first, then taint changes (the
// pacing tokens; in Kubernetes mode kube-controller-manager taints Nodes itself and these are never
// written), paced evictions, fence requests and events — and the caller acknowledges them with
// Advance.
//
// The semantics are kube-controller-manager's node lifecycle controller (seed 004): a node is Unknown
// after the node-monitor grace period without contact (the startup grace period if it never reported;
// in Kubernetes mode only when both its agent and its kubelet are silent); zones are Normal,
// PartialDisruption or FullDisruption by ComputeZoneState (never-reported nodes count not ready,
// exclude-disruption nodes do not count); not-ready nodes are queued per zone and released one token
// at a time by a token bucket whose rate follows the zone state (a new bucket starts empty when the
// old one was); when every zone is fully disrupted the engine assumes it is the one cut off, withdraws
// granted taints, empties the queues and halts. A leader change, leaving the halt and the apiserver
// readable again give every node a fresh grace period. A released node is fenced after the fence
// timeout counted from its release, once silent a full grace period since the last grace restart and
// once the storm guard has let it pass for the settle window.
//
// In observe mode (FenceConfig.Mode, or one node's Configured.Observe; observe.go) every decision
// is made the same way and an automatic fence leaves Ready marked Observe: the caller records it as
// "would fence" and executes nothing; a node leaving observe mode gets a fresh grace period. A node
// excluded from fencing is never fenced automatically, and the storm guard counts nodes being
// fenced, fenced, observed as would fence and excluded as unhealthy.
//
// Beyond kube-controller-manager, the engine paces the agents' soft-threshold pod evictions per
// zone (pods.go): candidates in, grants out through Ready.Grants, under a token bucket and a cap on
// grants in flight.
//
// # The Ready contract
//
// One goroutine owns an Engine; Observe is the one call another goroutine may make, under the
// owner's lock, because it never adds to Ready. A leadership term drives the engine in these steps
// (package loop is exactly this sequence, and the scenario scripts in testdata drive the same calls
// with a scripted clock):
//
//  1. Start: New(cfg); Step(LeaderElected{At: now}); Step(Restored{...}) with the node records an
//     earlier term persisted (step 4's Write.Node values); Step(Paused{...}) with the operator's
//     pause flag; Step(Configured{...}) for every configured node. Readiness is not restored:
//     LeaderElected gives every node a fresh grace period.
//  2. Feed: Step each input as it arrives, and Tick(now) at a steady interval (100 ms in the
//     coordinator). The engine has no clock of its own: time is what Tick and the inputs' At fields
//     say, and it never goes backwards inside the engine.
//  3. Collect: after a batch of inputs or a Tick, call Ready. If it is Empty, go back to step 2.
//  4. Persist: write Ready.Writes in order — a node's record (Node), a zone's (Zone), the halt
//     (Halted), the deletion of a removed node's record (Forget); a key written twice keeps its last
//     value — and the audit entries of Ready.Events, durably and under the leader's epoch (in as
//     many transactions as etcd's limits ask), BEFORE anything else in this Ready leaves the process. An automatic fence request is among
//     these writes as its node's FenceRequested, so it is made once per episode, across failovers
//     too. If the write is refused because the epoch is no longer the leader's, stop: act on
//     nothing and do not Advance; the term is over and the next leader restores from step 1.
//  5. Act: hand the rest on, without blocking the engine's owner for long — Grants to their nodes'
//     agent streams, Fences to the fence runner, Taints, Evictions, Conditions and Skips to the
//     Kubernetes side and the metrics, Events to the log. Each decision appears in exactly one Ready.
//  6. Acknowledge: call Advance, which empties Ready. No Step or Tick may run between Ready and
//     Advance (Advance would drop what they decided); Observe may. Go back to step 2.
package engine
