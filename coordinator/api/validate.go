package api

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/coordinator/fenceconfig"
	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/services/identity"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// MaxText caps every free-text field of a request (reasons, the acknowledging operator's name).
const MaxText = 1024

// Limits of the list requests.
const (
	maxListFences = 1000
	maxListAudit  = 5000
)

// Validate checks one request of FenceService or ClusterService: names are Kubernetes object names,
// text is capped at MaxText, enums are known, limits in range. It lists every problem with its
// field; handlers call it before anything else.
func Validate(req proto.Message) error {
	var v fault.Invalid
	switch r := req.(type) {
	case *coordv1.FenceRequest:
		checkName(&v, "node", r.GetNode())
		checkText(&v, "reason", r.GetReason())
		checkMethod(&v, r.GetMethod())
	case *coordv1.UnfenceRequest:
		checkName(&v, "node", r.GetNode())
		checkText(&v, "reason", r.GetReason())
	case *coordv1.RebootRequest:
		checkName(&v, "node", r.GetNode())
		checkText(&v, "reason", r.GetReason())
	case *coordv1.AcknowledgeRequest:
		checkName(&v, "node", r.GetNode())
		checkText(&v, "reason", r.GetReason())
		checkText(&v, "operator", r.GetOperator())
		if r.GetForce() && strings.TrimSpace(r.GetReason()) == "" {
			v.Add("reason", "required with force: say how you know the node is off")
		}
	case *coordv1.GetFenceRequest:
		checkID(&v, "id", r.GetId())
	case *coordv1.ListFencesRequest:
		if r.GetLimit() < 0 || r.GetLimit() > maxListFences {
			v.Add("limit", "must be between 0 and %d", maxListFences)
		}
		if r.GetPageSize() < 0 || r.GetPageSize() > maxListFences {
			v.Add("page_size", "must be between 0 and %d", maxListFences)
		} else if r.GetPageSize() != 0 && r.GetLimit() != 0 && r.GetPageSize() != r.GetLimit() {
			v.Add("page_size", "differs from limit; set one of them")
		}
		if _, ok := coordv1.FenceStatus_name[int32(r.GetStatus())]; !ok {
			v.Add("status", "unknown status %d", r.GetStatus())
		}
		optionalName(&v, "node", r.GetNode())
		if len(r.GetPageToken()) > MaxText {
			v.Add("page_token", "%d bytes, more than %d", len(r.GetPageToken()), MaxText)
		}
	case *coordv1.WatchFenceRequest:
		switch {
		case r.GetId() != "":
			checkID(&v, "id", r.GetId())
			optionalName(&v, "node", r.GetNode())
		case r.GetNode() == "":
			v.Add("id", "id or node is required")
		default:
			checkName(&v, "node", r.GetNode())
		}
	case *coordv1.GetNodeRequest:
		checkNodeOrName(&v, r)
	case *coordv1.CheckNodeRequest:
		checkName(&v, "node", r.GetNode())
	case *coordv1.PauseEvictionsRequest:
		checkText(&v, "reason", r.GetReason())
	case *coordv1.StartMaintenanceRequest:
		checkName(&v, "node", r.GetNode())
		if strings.TrimSpace(r.GetReason()) == "" {
			v.Add("reason", "required: it is the value of the node's %s annotation", engine.AnnotationMaintenance)
		}
		checkText(&v, "reason", r.GetReason())
	case *coordv1.StopMaintenanceRequest:
		checkName(&v, "node", r.GetNode())
	case *coordv1.GetMaintenanceRequest:
		checkName(&v, "node", r.GetNode())
	case *coordv1.ListAuditRequest:
		if r.GetLimit() < 0 || r.GetLimit() > maxListAudit {
			v.Add("limit", "must be between 0 and %d", maxListAudit)
		}
		if r.GetAfterRevision() < 0 {
			v.Add("after_revision", "must not be negative")
		}
		optionalName(&v, "node", r.GetNode())
	case *coordv1.ListNodesRequest, *coordv1.ListZonesRequest, *coordv1.ResumeEvictionsRequest, *coordv1.GetLeaderRequest,
		*coordv1.GetConfigRequest:
	default:
		return fmt.Errorf("api: no validation for %T", req)
	}
	return v.Err()
}

// checkName adds a problem when value is not a valid node name (a Kubernetes object name).
func checkName(v *fault.Invalid, field, value string) {
	if strings.TrimSpace(value) == "" {
		v.Add(field, "required")
	} else if err := identity.ValidName(value); err != nil {
		v.Add(field, "%v", err)
	}
}

// optionalName checks a name filter that may be empty.
func optionalName(v *fault.Invalid, field, value string) {
	if value != "" {
		checkName(v, field, value)
	}
}

// checkText adds a problem when a free-text field is longer than MaxText or not UTF-8.
// checkMethod accepts a fence request's method: none, or the watchdog method.
func checkMethod(v *fault.Invalid, m string) {
	if m == "" || m == fenceconfig.WatchdogDriver {
		return
	}
	if len(m) > 64 || !utf8.ValidString(m) {
		m = "(a long or invalid value)"
	}
	v.Add("method", "%q is not a method a fence request may name (the one accepted: %q)", m, fenceconfig.WatchdogDriver)
}

func checkText(v *fault.Invalid, field, value string) {
	if len(value) > MaxText {
		v.Add(field, "%d bytes, more than %d", len(value), MaxText)
	} else if !utf8.ValidString(value) {
		v.Add(field, "not valid UTF-8")
	}
}

// checkID adds a problem when a record id is empty or not the shape fencing.NewID makes: a node name and
// a timestamp.
func checkID(v *fault.Invalid, field, value string) {
	if strings.TrimSpace(value) == "" {
		v.Add(field, "required")
	} else if len(value) > identity.MaxName+40 || !utf8.ValidString(value) || strings.ContainsAny(value, "/\\\x00") {
		v.Add(field, "not a fence record id")
	}
}

// checkNodeOrName checks GetNodeRequest, whose node name is node (or, deprecated, name): one of them,
// or both equal.
func checkNodeOrName(v *fault.Invalid, r *coordv1.GetNodeRequest) {
	name := r.GetName() //lint:ignore SA1019 the deprecated field is still accepted
	switch {
	case r.GetNode() != "" && name != "" && name != r.GetNode():
		v.Add("name", "deprecated alias of node; %q differs from node %q: set only node", name, r.GetNode())
	case r.GetNode() != "":
		checkName(v, "node", r.GetNode())
	default:
		checkName(v, "node", name)
	}
}

// NodeName returns the node a GetNodeRequest names: node, or the deprecated name.
func NodeName(r *coordv1.GetNodeRequest) string {
	if r.GetNode() != "" {
		return r.GetNode()
	}
	return r.GetName() //lint:ignore SA1019 the deprecated field is still accepted
}
