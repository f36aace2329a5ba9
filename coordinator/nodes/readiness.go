// Package nodes keeps the leader's in-memory view of agent contact and judges node readiness.
// Judge and ZoneStateOf are pure; Registry is the small mutable bookkeeping around them.
package nodes

import (
	"fmt"
	"time"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// ShuttingDownReason is the readiness reason of a node that announced a graceful shutdown; the same
// words kubelet uses.
const ShuttingDownReason = "node is shutting down"

// Observation is what readiness is judged from.
type Observation struct {
	// LastContact is the last agent message; zero if never seen.
	LastContact time.Time
	// GraceFloor is when this leader's term began: nobody is judged silent for time before it, so a
	// failover never makes nodes look dead.
	GraceFloor time.Time
	// ShuttingDown is set after the agent announced a graceful shutdown.
	ShuttingDown bool
	// Known is set for a node that reported in an earlier term (restored from the store) although it
	// has not been heard from in this one.
	Known bool
}

// Judge returns the readiness and its reason at now, given the node-monitor grace period.
func Judge(o Observation, now time.Time, grace time.Duration) (coordv1.Readiness, string) {
	if o.ShuttingDown {
		return coordv1.Readiness_READINESS_NOT_READY, ShuttingDownReason
	}
	since := o.LastContact
	if since.Before(o.GraceFloor) {
		since = o.GraceFloor
	}
	silent := now.Sub(since)
	if silent > grace {
		if o.LastContact.IsZero() {
			if o.Known {
				return coordv1.Readiness_READINESS_UNKNOWN, fmt.Sprintf("no agent contact since this leader started %s ago (grace %s)", silent.Round(time.Second), grace)
			}
			return coordv1.Readiness_READINESS_UNKNOWN, fmt.Sprintf("agent never connected (grace %s)", grace)
		}
		return coordv1.Readiness_READINESS_UNKNOWN, fmt.Sprintf("no agent contact for %s (grace %s)", silent.Round(time.Second), grace)
	}
	if o.LastContact.IsZero() || o.LastContact.Before(o.GraceFloor) {
		return coordv1.Readiness_READINESS_READY, "within grace period after leader start"
	}
	return coordv1.Readiness_READINESS_READY, "agent reporting"
}

// ZoneStateOf classifies a zone from its ready and not-ready counts, as kube-controller-manager's
// ComputeZoneState: no ready node and at least one not ready is a full disruption; more than two not
// ready and at least unhealthyThreshold of the zone not ready is a partial disruption.
func ZoneStateOf(ready, notReady int, unhealthyThreshold float64) coordv1.ZoneState {
	switch {
	case ready == 0 && notReady > 0:
		return coordv1.ZoneState_ZONE_STATE_FULL_DISRUPTION
	case notReady > 2 && float64(notReady)/float64(notReady+ready) >= unhealthyThreshold:
		return coordv1.ZoneState_ZONE_STATE_PARTIAL_DISRUPTION
	default:
		return coordv1.ZoneState_ZONE_STATE_NORMAL
	}
}

// ZoneKey joins region and zone the way the API shows it.
func ZoneKey(region, zone string) string { return region + "/" + zone }
