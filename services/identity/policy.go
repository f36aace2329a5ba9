package identity

import (
	"fmt"
	"slices"
	"strings"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
)

// Policy maps a full gRPC method name ("/package.Service/Method"), or MetricsEndpoint, to the roles
// that may call it. A method it does not name is refused to everyone, except the open services
// (health, reflection).
type Policy map[string][]Role

// MetricsEndpoint is the policy's entry for the Prometheus /metrics (and /debug/pprof) endpoint a
// binary serves over mutual TLS (--metrics-tls). A plaintext metrics endpoint, on loopback, has no
// caller identity and is not checked.
const MetricsEndpoint = "/metrics"

var (
	operators = []Role{Operator}
	readers   = []Role{Operator, Viewer}
)

// Default is nodefence's authorization table, one rule per method of every service:
//   - an agent may only open its stream (and the stream checks the node is its own), and ask
//     another agent whether it holds a watchdog lease;
//   - only an operator changes anything: Fence, Unfence, Acknowledge, pause and resume;
//   - operators and viewers read;
//   - a monitoring identity (Prometheus) reads /metrics only, as operators and viewers may;
//   - only the coordinator calls a fence driver, reads included (a Status or Describe is a device
//     login, and a driver's answers name devices and plugs).
var Default = Policy{
	agentv1.AgentService_Connect_FullMethodName: {Agent},
	// Agents ask each other, agent to agent, whether anyone holds the leader's watchdog lease.
	agentv1.PeerService_LeaseStatus_FullMethodName: {Agent},

	coordv1.FenceService_Fence_FullMethodName:       operators,
	coordv1.FenceService_Unfence_FullMethodName:     operators,
	coordv1.FenceService_Reboot_FullMethodName:      operators,
	coordv1.FenceService_Acknowledge_FullMethodName: operators,
	coordv1.FenceService_GetFence_FullMethodName:    readers,
	coordv1.FenceService_ListFences_FullMethodName:  readers,
	coordv1.FenceService_WatchFence_FullMethodName:  readers,

	coordv1.ClusterService_PauseEvictions_FullMethodName:  operators,
	coordv1.ClusterService_ResumeEvictions_FullMethodName: operators,
	// Maintenance cordons and drains a node: operators change it, everyone who reads may follow it.
	coordv1.ClusterService_StartMaintenance_FullMethodName: operators,
	coordv1.ClusterService_StopMaintenance_FullMethodName:  operators,
	coordv1.ClusterService_GetMaintenance_FullMethodName:   readers,
	coordv1.ClusterService_ListNodes_FullMethodName:        readers,
	coordv1.ClusterService_GetNode_FullMethodName:          readers,
	coordv1.ClusterService_ListZones_FullMethodName:        readers,
	coordv1.ClusterService_GetLeader_FullMethodName:        readers,
	coordv1.ClusterService_ListAudit_FullMethodName:        readers,
	// A device check changes nothing, but it is a login on the node's BMC or PDU: operators only.
	coordv1.ClusterService_CheckNode_FullMethodName: operators,
	// The live configuration, secrets redacted.
	coordv1.ClusterService_GetConfig_FullMethodName: readers,

	driverv1.FenceDriverService_PowerOff_FullMethodName: {Coordinator},
	driverv1.FenceDriverService_PowerOn_FullMethodName:  {Coordinator},
	driverv1.FenceDriverService_Reboot_FullMethodName:   {Coordinator},
	driverv1.FenceDriverService_Status_FullMethodName:   {Coordinator},
	driverv1.FenceDriverService_List_FullMethodName:     {Coordinator},
	driverv1.FenceDriverService_Monitor_FullMethodName:  {Coordinator},
	driverv1.FenceDriverService_Describe_FullMethodName: {Coordinator},

	MetricsEndpoint: {Monitoring, Operator, Viewer},
}

// openServices need no identity: health checks (load balancers, kubelet probes) and reflection
// (grpcurl list), which describe the API but touch nothing.
var openServices = []string{
	"/grpc.health.v1.Health/",
	"/grpc.reflection.v1.ServerReflection/",
	"/grpc.reflection.v1alpha.ServerReflection/",
}

// Open reports whether a method is served to every caller, identified or not.
func Open(fullMethod string) bool {
	for _, p := range openServices {
		if strings.HasPrefix(fullMethod, p) {
			return true
		}
	}
	return false
}

// Allow returns nil when id may call fullMethod, else an error saying who may. Any may call every
// method the policy names.
func (p Policy) Allow(id Identity, fullMethod string) error {
	if Open(fullMethod) {
		return nil
	}
	roles, ok := p[fullMethod]
	if !ok {
		return fmt.Errorf("method %s is not in the authorization policy", clip(fullMethod))
	}
	if id.Role == Any || slices.Contains(roles, id.Role) {
		return nil
	}
	names := make([]string, len(roles))
	for i, r := range roles {
		names[i] = string(r)
	}
	return fmt.Errorf("%s may not call %s (allowed: %s)", id, fullMethod, strings.Join(names, ", "))
}
