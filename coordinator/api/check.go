package api

import (
	"context"
	"fmt"
	"strings"

	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/services/identity"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// DeviceChecker checks the fence devices of one node under the leader's term: for each method the
// driver's Monitor, then its Status. It exists so that CheckNode reuses the coordinator's scheduled
// device check (the driver clients and the secrets live in the wiring, not in the handlers).
type DeviceChecker func(ctx context.Context, l *Leading, node string) ([]*coordv1.DeviceCheck, error)

// maxConcurrentChecks bounds the on-demand device checks running at once on a coordinator: each is a
// login on a BMC or PDU, and a caller must not be able to hammer the devices through it.
const maxConcurrentChecks = 2

// slots returns the coordinator's semaphore of maxConcurrentChecks.
func (d *Deps) slots() chan struct{} {
	d.checkOnce.Do(func() { d.checkSlots = make(chan struct{}, maxConcurrentChecks) })
	return d.checkSlots
}

// CheckNode checks every fence method of a node without changing anything. Only the leader checks,
// and only after the request is in the audit trail under its epoch: a deposed leader's audit write
// fails, so it never reaches a device; the checks stop when the term ends.
func (s *ClusterServer) CheckNode(ctx context.Context, req *coordv1.CheckNodeRequest) (*coordv1.CheckNodeResponse, error) {
	if err := Validate(req); err != nil {
		return nil, err
	}
	if s.CheckDevices == nil {
		return nil, fmt.Errorf("CheckNode: %w", fault.ErrUnimplemented)
	}
	l, err := s.Leadership.Leading(ctx)
	if err != nil {
		return nil, err
	}
	node := req.GetNode()
	if !s.Config().HasNode(node) {
		return nil, fmt.Errorf("node %q is not in the fence configuration: %w", node, fault.ErrNotFound)
	}
	slots := s.slots()
	select {
	case slots <- struct{}{}:
		defer func() { <-slots }()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	who := identity.Name(ctx)
	if _, err := l.Term.Txn(ctx, nil, s.Store.AuditOp(s.now(), l.Term.Epoch, node, "device-check",
		fmt.Sprintf("%s asked to check the fence devices of %s", who, node))); err != nil {
		return nil, err
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(l.Term.Context(), cancel)
	defer stop()
	checks, err := s.CheckDevices(cctx, l, node)
	if err != nil {
		return nil, err
	}
	resp := &coordv1.CheckNodeResponse{Node: node, Checks: checks, Ok: len(checks) > 0}
	var words []string
	for _, c := range checks {
		ok := c.GetReachable() && c.GetCredentialsOk()
		resp.Ok = resp.Ok && ok
		words = append(words, fmt.Sprintf("%s (%s) %s", c.GetMethod(), c.GetDriver(), checkWord(c)))
	}
	_, _ = l.Term.Txn(context.WithoutCancel(ctx), nil, s.Store.AuditOp(s.now(), l.Term.Epoch, node, "device-check",
		fmt.Sprintf("fence devices of %s checked for %s: %s", node, who, strings.Join(words, "; "))))
	return resp, nil
}

// checkWord says in one word what a device check found.
func checkWord(c *coordv1.DeviceCheck) string {
	switch {
	case !c.GetReachable():
		return "unreachable"
	case !c.GetCredentialsOk():
		return "credentials rejected"
	}
	return "ok"
}

// GetConfig returns this replica's live configuration, secrets redacted.
func (s *ClusterServer) GetConfig(ctx context.Context, req *coordv1.GetConfigRequest) (*coordv1.GetConfigResponse, error) {
	if err := Validate(req); err != nil {
		return nil, err
	}
	if s.LiveConfig == nil {
		return nil, fmt.Errorf("GetConfig: %w", fault.ErrUnimplemented)
	}
	return s.LiveConfig(), nil
}
