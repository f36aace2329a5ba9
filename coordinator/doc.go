// Package coordinator is the root of the nodefence coordinator: the leader-elected, etcd-backed
// service that judges node readiness and drives fencing. Subpackages:
//
//   - etcdembed: the embedded single-member etcd used when no --etcd-endpoints are given
//   - leader: election and the epoch-guarded writes every leader write goes through
//   - store: everything the coordinator keeps in etcd, and the only package that knows its keys:
//     fence records and their indexes, node registrations, the audit trail, the engine's state and
//     the pause flag
//   - config: the standalone YAML fence configuration
//   - nodes: agent contact bookkeeping and the pure readiness judgement
//   - engine: the pure node lifecycle state machine (Step, Tick, Ready, Advance)
//   - loop: one term's owner of the engine, persisting its Ready through store
//   - fencing: the fence runner that calls drivers and confirms by read-back
//   - release: the pure rule that says when a fenced node's pods are released (used by kube's
//     release reconciler and replayed by engine's scenario scripts)
//   - term: the pure core of what a leadership term decides beside the engine (so far: the
//     admission of automatic fence requests), which app persists before acting
//   - api: the gRPC handlers (AgentService, FenceService, ClusterService)
//   - app: one process of all of the above: its configuration, the wiring built before it runs,
//     and what each leadership term starts
package coordinator
