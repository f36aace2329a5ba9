// Package coordinator is the root of the nodefence coordinator: the leader-elected, etcd-backed
// service that judges node readiness and drives fencing. Subpackages:
//
//   - etcdembed: the embedded single-member etcd used when no --etcd-endpoints are given
//   - leader: election and the epoch-guarded writes every leader write goes through
//   - store: fence and node records in etcd
//   - config: the standalone YAML fence configuration
//   - nodes: agent contact bookkeeping and the pure readiness judgement
//   - fencing: the fence runner that calls drivers and confirms by read-back
//   - api: the gRPC handlers (AgentService, FenceService, ClusterService)
//   - app: wiring of all of the above into one process
package coordinator
