package api

import (
	"context"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// Reboot starts a power cycle of a node: one record that powers it off, then, once that is
// confirmed, on again (fencing.Methods and Decide). The control-plane rule of Fence applies.
func (s *FenceServer) Reboot(ctx context.Context, req *coordv1.RebootRequest) (*coordv1.RebootResponse, error) {
	if err := Validate(req); err != nil {
		return nil, err
	}
	f, err := s.start(ctx, req.GetNode(), req.GetReason(), coordv1.FenceAction_FENCE_ACTION_REBOOT)
	if err != nil {
		return nil, err
	}
	return &coordv1.RebootResponse{Fence: f}, nil
}
