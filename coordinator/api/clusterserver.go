package api

import (
	"context"
	"fmt"

	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/services/identity"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// ListNodes returns the leader's node view.
func (s *ClusterServer) ListNodes(ctx context.Context, _ *coordv1.ListNodesRequest) (*coordv1.ListNodesResponse, error) {
	l, err := s.Leadership.Leading(ctx)
	if err != nil {
		return nil, err
	}
	var out []*coordv1.Node
	if err := l.Loop.Query(ctx, func(e *engine.Engine) { out = e.Nodes() }); err != nil {
		return nil, err
	}
	return &coordv1.ListNodesResponse{Nodes: out}, nil
}

// GetNode returns one node.
func (s *ClusterServer) GetNode(ctx context.Context, req *coordv1.GetNodeRequest) (*coordv1.GetNodeResponse, error) {
	if err := Validate(req); err != nil {
		return nil, err
	}
	l, err := s.Leadership.Leading(ctx)
	if err != nil {
		return nil, err
	}
	var n *coordv1.Node
	name := NodeName(req)
	if err := l.Loop.Query(ctx, func(e *engine.Engine) { n = e.Node(name) }); err != nil {
		return nil, err
	}
	if n == nil {
		return nil, fmt.Errorf("node %q: %w", name, fault.ErrNotFound)
	}
	return &coordv1.GetNodeResponse{Node: n}, nil
}

// ListZones returns every zone with its state, rate and queue.
func (s *ClusterServer) ListZones(ctx context.Context, _ *coordv1.ListZonesRequest) (*coordv1.ListZonesResponse, error) {
	l, err := s.Leadership.Leading(ctx)
	if err != nil {
		return nil, err
	}
	resp := &coordv1.ListZonesResponse{}
	if err := l.Loop.Query(ctx, func(e *engine.Engine) { resp.Zones, resp.EvictionsPaused = e.Zones(), e.Paused() }); err != nil {
		return nil, err
	}
	return resp, nil
}

// PauseEvictions persists the pause flag, then tells the engine.
func (s *ClusterServer) PauseEvictions(ctx context.Context, req *coordv1.PauseEvictionsRequest) (*coordv1.PauseEvictionsResponse, error) {
	if err := Validate(req); err != nil {
		return nil, err
	}
	if err := s.setPaused(ctx, true, req.GetReason()); err != nil {
		return nil, err
	}
	return &coordv1.PauseEvictionsResponse{}, nil
}

// ResumeEvictions clears the pause flag.
func (s *ClusterServer) ResumeEvictions(ctx context.Context, _ *coordv1.ResumeEvictionsRequest) (*coordv1.ResumeEvictionsResponse, error) {
	if err := s.setPaused(ctx, false, ""); err != nil {
		return nil, err
	}
	return &coordv1.ResumeEvictionsResponse{}, nil
}

func (s *ClusterServer) setPaused(ctx context.Context, paused bool, reason string) error {
	l, err := s.Leadership.Leading(ctx)
	if err != nil {
		return err
	}
	note := "paused by " + identity.Name(ctx) + ": " + reason
	if err := s.Store.SetPaused(ctx, l.Term, paused, note); err != nil {
		return err
	}
	return l.Loop.StepSync(ctx, engine.Paused{Paused: paused, Note: note})
}

// ListAudit returns the audit trail, oldest first; any replica answers.
func (s *ClusterServer) ListAudit(ctx context.Context, req *coordv1.ListAuditRequest) (*coordv1.ListAuditResponse, error) {
	if err := Validate(req); err != nil {
		return nil, err
	}
	limit := int(req.GetLimit())
	if limit == 0 {
		limit = 200
	}
	entries, err := s.Store.ListAudit(ctx, req.GetNode(), req.GetAfterRevision(), limit)
	if err != nil {
		return nil, err
	}
	return &coordv1.ListAuditResponse{Entries: entries}, nil
}

// GetLeader names the leader; any replica answers.
func (s *ClusterServer) GetLeader(ctx context.Context, _ *coordv1.GetLeaderRequest) (*coordv1.GetLeaderResponse, error) {
	info, epoch, ok, err := s.Store.CurrentLeader(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", fault.ErrUnreachable, err)
	}
	if !ok {
		return nil, &fault.NotLeaderError{}
	}
	_, lerr := s.Leadership.Leading(ctx)
	return &coordv1.GetLeaderResponse{Id: info.ID, Address: info.Address, Epoch: epoch, IsSelf: lerr == nil}, nil
}
