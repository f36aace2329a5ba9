package api

import (
	"context"
	"fmt"

	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/services/identity"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// Maintainer starts, stops and reports nodes' maintenance through the Kubernetes API: the
// nodefence.io/maintenance annotation (which holds the node's automatic fence back), the cordon,
// and the drain through the Eviction API.
type Maintainer interface {
	// StartMaintenance puts node in maintenance on behalf of requester; drain evicts its pods.
	StartMaintenance(ctx context.Context, node, reason, requester string, drain bool) error
	// StopMaintenance ends node's maintenance and undoes nodefence's cordon.
	StopMaintenance(ctx context.Context, node string) error
	// Maintenance reports node's maintenance and the drain's progress.
	Maintenance(ctx context.Context, node string) (*coordv1.Maintenance, error)
}

// maintainer returns the Maintainer and the term, or the reason there is none.
func (s *ClusterServer) maintainer(ctx context.Context, node string) (Maintainer, *Leading, error) {
	if s.Maintenance == nil {
		return nil, nil, fmt.Errorf("maintenance needs Kubernetes mode (--kubeconfig): nodefence cordons and drains Nodes through the Kubernetes API: %w", fault.ErrFailedPrecondition)
	}
	l, err := s.Leadership.Leading(ctx)
	if err != nil {
		return nil, nil, err
	}
	if err := s.knownNode(ctx, node); err != nil {
		return nil, nil, err
	}
	return s.Maintenance, l, nil
}

// StartMaintenance cordons the node, starts its drain unless no_drain, holds its automatic fence
// back, and audits who asked and why.
func (s *ClusterServer) StartMaintenance(ctx context.Context, req *coordv1.StartMaintenanceRequest) (*coordv1.StartMaintenanceResponse, error) {
	if err := Validate(req); err != nil {
		return nil, err
	}
	m, l, err := s.maintainer(ctx, req.GetNode())
	if err != nil {
		return nil, err
	}
	who, drain := identity.Name(ctx), !req.GetNoDrain()
	if err := m.StartMaintenance(ctx, req.GetNode(), req.GetReason(), who, drain); err != nil {
		return nil, err
	}
	what := "cordoned and drained"
	if !drain {
		what = "cordoned, not drained"
	}
	s.audit(ctx, l, req.GetNode(), "maintenance", fmt.Sprintf("maintenance started by %s (%s): %s; no automatic fence until it ends", who, req.GetReason(), what))
	v, err := m.Maintenance(ctx, req.GetNode())
	if err != nil {
		return nil, err
	}
	return &coordv1.StartMaintenanceResponse{Maintenance: v}, nil
}

// StopMaintenance ends the node's maintenance and audits it.
func (s *ClusterServer) StopMaintenance(ctx context.Context, req *coordv1.StopMaintenanceRequest) (*coordv1.StopMaintenanceResponse, error) {
	if err := Validate(req); err != nil {
		return nil, err
	}
	m, l, err := s.maintainer(ctx, req.GetNode())
	if err != nil {
		return nil, err
	}
	if err := m.StopMaintenance(ctx, req.GetNode()); err != nil {
		return nil, err
	}
	s.audit(ctx, l, req.GetNode(), "maintenance", fmt.Sprintf("maintenance ended by %s: automatic fencing applies again", identity.Name(ctx)))
	v, err := m.Maintenance(ctx, req.GetNode())
	if err != nil {
		return nil, err
	}
	return &coordv1.StopMaintenanceResponse{Maintenance: v}, nil
}

// GetMaintenance reports the node's maintenance and its drain's progress.
func (s *ClusterServer) GetMaintenance(ctx context.Context, req *coordv1.GetMaintenanceRequest) (*coordv1.GetMaintenanceResponse, error) {
	if err := Validate(req); err != nil {
		return nil, err
	}
	m, _, err := s.maintainer(ctx, req.GetNode())
	if err != nil {
		return nil, err
	}
	v, err := m.Maintenance(ctx, req.GetNode())
	if err != nil {
		return nil, err
	}
	return &coordv1.GetMaintenanceResponse{Maintenance: v}, nil
}
