// Package api holds the coordinator's gRPC handlers. Mutations and the hot node view are served only
// by the leader; a follower answers them with a fault.NotLeaderError (UNAVAILABLE naming the leader,
// also in the "nodefence-leader" trailer). Reads of durable records (GetFence, ListFences,
// WatchFence, GetLeader) are answered by any replica straight from etcd, and GetConfig by any replica
// from its own configuration.
package api

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/coordinator/fenceconfig"
	"github.com/nodefence/nodefence/coordinator/fencing"
	"github.com/nodefence/nodefence/coordinator/leader"
	"github.com/nodefence/nodefence/coordinator/loop"
	"github.com/nodefence/nodefence/coordinator/store"
	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/services/identity"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// Leading is what a leader has during one term.
type Leading struct {
	Term   *leader.Term
	Runner *fencing.Runner
	Loop   *loop.Loop
	// Leases grants the agents' watchdog leases of this term (nil: none are granted).
	Leases *Leases
}

// Leadership tells handlers whether this replica leads. Leading returns the current term's resources
// or a *fault.NotLeaderError naming the leader.
type Leadership interface {
	Leading(ctx context.Context) (*Leading, error)
}

// Deps are the handlers' dependencies.
type Deps struct {
	Leadership Leadership
	Store      *store.Store
	// Config returns the current fence configuration.
	Config func() *fenceconfig.Config
	// HeartbeatInterval and SampleInterval are sent to agents.
	HeartbeatInterval, SampleInterval time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// KnownNode returns nil when node may say hello: a configured node in standalone mode, an
	// existing Node in Kubernetes mode. Nil allows only configured nodes.
	KnownNode func(ctx context.Context, node string) error
	// KubeletReporting reports whether the node's kubelet still reports (Kubernetes mode), so that
	// Acknowledge refuses a node one of whose witnesses is alive. Nil in standalone mode.
	KubeletReporting func(ctx context.Context, node string) (bool, error)
	// CheckDevices checks every fence method of a node without changing anything (CheckNode); nil
	// makes CheckNode unimplemented.
	CheckDevices DeviceChecker
	// LiveConfig returns the configuration GetConfig shows, secrets redacted; nil makes GetConfig
	// unimplemented.
	LiveConfig func() *coordv1.GetConfigResponse
	// Maintenance starts, stops and reports nodes' maintenance (Kubernetes mode); nil makes the
	// maintenance calls fail with FAILED_PRECONDITION.
	Maintenance Maintainer

	checkOnce  sync.Once
	checkSlots chan struct{} // maxConcurrentChecks; see ClusterServer.CheckNode
}

// configuredPlace refuses a hello that moves its node out of the zone or region the fence
// configuration gives it: an agent cannot push its node into another zone (or make up zones).
func (d *Deps) configuredPlace(h *agentv1.Hello) error {
	cfg := d.Config()
	if cfg == nil {
		return nil
	}
	n, ok := cfg.Nodes[h.NodeName]
	if !ok {
		return nil
	}
	var v fault.Invalid
	if n.Zone != "" && h.Zone != "" && h.Zone != n.Zone {
		v.Add("hello.zone", "node %s is configured in zone %q, not %q", h.NodeName, n.Zone, h.Zone)
	}
	if n.Region != "" && h.Region != "" && h.Region != n.Region {
		v.Add("hello.region", "node %s is configured in region %q, not %q", h.NodeName, n.Region, h.Region)
	}
	return v.Err()
}

// knownNode applies KnownNode, or the fence configuration when it is nil.
func (d *Deps) knownNode(ctx context.Context, node string) error {
	if d.KnownNode != nil {
		return d.KnownNode(ctx, node)
	}
	if !d.Config().HasNode(node) {
		return fmt.Errorf("node %q is not in the fence configuration: %w", node, fault.ErrNotFound)
	}
	return nil
}

func (d *Deps) now() time.Time {
	clock := d.Now
	if clock == nil {
		clock = time.Now
	}
	return clock()
}

// FenceServer implements FenceService.
type FenceServer struct {
	coordv1.UnimplementedFenceServiceServer
	*Deps
}

// ClusterServer implements ClusterService.
type ClusterServer struct {
	coordv1.UnimplementedClusterServiceServer
	*Deps
}

// AgentServer implements AgentService.
type AgentServer struct {
	agentv1.UnimplementedAgentServiceServer
	*Deps

	streams streamCount // open streams by node, at most MaxStreamsPerNode each
}

// start creates (or returns the active) record for node with action, and runs it, on behalf of the
// caller's identity.
func (s *FenceServer) start(ctx context.Context, node, reason string, action coordv1.FenceAction) (*coordv1.NodeFence, error) {
	return s.StartAs(ctx, identity.Name(ctx), node, reason, action)
}

// StartAs creates (or returns the active) record for node with action, and runs it, on behalf of
// requester: the same rules as an operator's call (a node the engine refuses is refused), for
// callers inside the coordinator that act for someone else (a NodeFenceRemediation).
func (s *FenceServer) StartAs(ctx context.Context, requester, node, reason string, action coordv1.FenceAction) (*coordv1.NodeFence, error) {
	return s.startWith(ctx, requester, node, reason, action, "")
}

// startWith is StartAs with the one method the record runs ("": the node's steps; "watchdog": its
// watchdog alone, whether or not its steps list one, for a node whose agent last reported its
// watchdog armed).
func (s *FenceServer) startWith(ctx context.Context, requester, node, reason string, action coordv1.FenceAction, method string) (*coordv1.NodeFence, error) {
	l, err := s.Leadership.Leading(ctx)
	if err != nil {
		return nil, err
	}
	if !s.Config().HasNode(node) {
		return nil, fmt.Errorf("node %q is not in the fence configuration: %w", node, fault.ErrNotFound)
	}
	if action != coordv1.FenceAction_FENCE_ACTION_ON { // a reboot powers the node off too
		var refused string
		if err := l.Loop.Query(ctx, func(e *engine.Engine) { refused = e.FenceRefusal(node) }); err != nil {
			return nil, err
		}
		if refused != "" {
			return nil, fmt.Errorf("%s: %w", refused, fault.ErrFailedPrecondition)
		}
	}
	if method != "" {
		if err := s.watchdogArmed(ctx, l, node); err != nil {
			return nil, err
		}
	}
	rec := fencing.OperatorRecord(node, action, reason, requester,
		func(step string) ([]fenceconfig.Resolved, error) { return s.Config().Plan(node, step) }, l.Term.Epoch, s.now())
	if method != "" {
		rec.Method, rec.Step = method, coordv1.FenceStep_FENCE_STEP_POWER_MANAGEMENT
	}
	got, _, created, err := s.Store.CreateFence(ctx, l.Term, rec)
	if err != nil {
		return nil, err
	}
	if !created {
		if err := fencing.Joined(got, action); err != nil {
			return nil, err
		}
	} else {
		// The operator acted: the node's newest record is this one (a standing power-off no
		// longer holds its automatic fences).
		for _, in := range engine.RecordWritten(got, s.now()) {
			_ = l.Loop.Step(ctx, in)
		}
	}
	l.Runner.Start(got.Id)
	return got, nil
}

// Fence starts (or returns the active) power-off of a node.
func (s *FenceServer) Fence(ctx context.Context, req *coordv1.FenceRequest) (*coordv1.FenceResponse, error) {
	if err := Validate(req); err != nil {
		return nil, err
	}
	if !req.GetAgain() {
		standing, err := s.standingOff(ctx, req.GetNode())
		if err != nil || standing != nil {
			return &coordv1.FenceResponse{Fence: standing, AlreadyOff: standing != nil}, err
		}
	}
	f, err := s.startWith(ctx, identity.Name(ctx), req.GetNode(), req.GetReason(), coordv1.FenceAction_FENCE_ACTION_OFF, req.GetMethod())
	if err != nil {
		return nil, err
	}
	return &coordv1.FenceResponse{Fence: f}, nil
}

// watchdogArmed refuses a watchdog fence of a node whose agent did not last report an armed
// watchdog: the timing rule could never prove it off.
func (s *FenceServer) watchdogArmed(ctx context.Context, l *Leading, node string) error {
	var n *coordv1.Node
	if err := l.Loop.Query(ctx, func(e *engine.Engine) { n = e.Node(node) }); err != nil {
		return err
	}
	if !n.GetWatchdogArmed() {
		return fmt.Errorf("node %s: its agent's last report was not \"armed\": the watchdog method cannot prove it off: %w", node, fault.ErrFailedPrecondition)
	}
	return nil
}

// standingOff returns the node's newest record when the node stands confirmed off
// (fencing.StandingOff), after writing the request to the audit trail; nil when a fence is to run.
func (s *FenceServer) standingOff(ctx context.Context, node string) (*coordv1.NodeFence, error) {
	l, err := s.Leadership.Leading(ctx)
	if err != nil {
		return nil, err
	}
	if !s.Config().HasNode(node) {
		return nil, fmt.Errorf("node %q is not in the fence configuration: %w", node, fault.ErrNotFound)
	}
	page, err := s.Store.ListFences(ctx, store.ListOptions{Node: node, Limit: 1})
	if err != nil || len(page.Fences) == 0 {
		return nil, err
	}
	var n *coordv1.Node
	if err := l.Loop.Query(ctx, func(e *engine.Engine) { n = e.Node(node) }); err != nil {
		return nil, err
	}
	slack := fencing.ProofRule{Heartbeat: s.HeartbeatInterval}.AgentSlack()
	why := fencing.StandingOff(page.Fences[0], n, slack)
	if why == "" {
		return nil, nil
	}
	s.audit(ctx, l, node, "fence", fmt.Sprintf("%s asked to fence %s: %s; not fenced again", identity.Name(ctx), node, why))
	return page.Fences[0], nil
}

// Unfence starts a verified power-on of a node.
func (s *FenceServer) Unfence(ctx context.Context, req *coordv1.UnfenceRequest) (*coordv1.UnfenceResponse, error) {
	if err := Validate(req); err != nil {
		return nil, err
	}
	f, err := s.start(ctx, req.GetNode(), req.GetReason(), coordv1.FenceAction_FENCE_ACTION_ON)
	if err != nil {
		return nil, err
	}
	return &coordv1.UnfenceResponse{Fence: f}, nil
}

// Acknowledge records an operator's confirmation that a node is off. The operator is the caller's
// certificate. A node whose agent (or kubelet) is still reporting is refused unless forced with a
// reason; either way the acknowledgement is in the audit trail.
func (s *FenceServer) Acknowledge(ctx context.Context, req *coordv1.AcknowledgeRequest) (*coordv1.AcknowledgeResponse, error) {
	if err := Validate(req); err != nil {
		return nil, err
	}
	id, _ := identity.From(ctx)
	who, err := fencing.AckCaller(id, req.GetOperator())
	if err != nil {
		return nil, err
	}
	l, err := s.Leadership.Leading(ctx)
	if err != nil {
		return nil, err
	}
	if !s.Config().HasNode(req.Node) {
		return nil, fmt.Errorf("node %q is not in the fence configuration: %w", req.Node, fault.ErrNotFound)
	}
	live, err := s.witnesses(ctx, l, req.Node)
	if err != nil {
		return nil, err
	}
	note, err := fencing.AckNote(req.Node, live, req.Reason, req.GetForce())
	if err != nil {
		return nil, err
	}
	s.audit(ctx, l, req.Node, "acknowledge", fencing.AckAudit(who, req.Node, note))
	ack := fencing.Ack{Node: req.Node, Operator: who, Note: note, RequestedBy: identity.Name(ctx), Epoch: l.Term.Epoch}
	for attempt := 0; attempt < 5; attempt++ {
		cur, err := s.Store.ActiveFence(ctx, req.Node)
		if err != nil {
			return nil, err
		}
		var f *coordv1.NodeFence
		if cur != nil {
			f = cur.Fence
		}
		next, err := fencing.Acknowledged(f, ack, s.now())
		if err != nil {
			return nil, err
		}
		if cur == nil {
			got, _, created, err := s.Store.CreateFence(ctx, l.Term, next)
			if err != nil {
				return nil, err
			}
			if created {
				l.Runner.Notify(got)
				return &coordv1.AcknowledgeResponse{Fence: got}, nil
			}
			continue
		}
		if _, err := s.Store.UpdateFence(ctx, l.Term, next, cur.Revision); err != nil {
			if errors.Is(err, leader.ErrConflict) {
				continue
			}
			return nil, err
		}
		l.Runner.Notify(next)
		return &coordv1.AcknowledgeResponse{Fence: next}, nil
	}
	return nil, fmt.Errorf("acknowledge %s: too many concurrent changes, retry: %w", req.Node, leader.ErrConflict)
}

// witnesses returns why the node looks alive ("" when every witness is silent): its agent is
// connected or the engine judges it ready, or (Kubernetes mode) its kubelet reports.
func (s *FenceServer) witnesses(ctx context.Context, l *Leading, node string) (string, error) {
	var n *coordv1.Node
	if err := l.Loop.Query(ctx, func(e *engine.Engine) { n = e.Node(node) }); err != nil {
		return "", err
	}
	if live := fencing.Witness(n, false); live != "" || s.KubeletReporting == nil {
		return live, nil
	}
	up, err := s.KubeletReporting(ctx, node)
	if err != nil {
		return "", fmt.Errorf("cannot tell whether the kubelet of %s reports: %w", node, err)
	}
	return fencing.Witness(n, up), nil
}

// audit appends an entry to the audit trail under the term's epoch.
func (s *Deps) audit(ctx context.Context, l *Leading, node, kind, text string) {
	_, _ = l.Term.Txn(ctx, nil, s.Store.AuditOp(s.now(), l.Term.Epoch, node, kind, text))
}

// GetFence returns one record.
func (s *FenceServer) GetFence(ctx context.Context, req *coordv1.GetFenceRequest) (*coordv1.GetFenceResponse, error) {
	if err := Validate(req); err != nil {
		return nil, err
	}
	v, err := s.Store.GetFence(ctx, req.Id)
	if err != nil {
		return nil, err
	}
	return &coordv1.GetFenceResponse{Fence: v.Fence}, nil
}

// ListFences returns records newest first.
func (s *FenceServer) ListFences(ctx context.Context, req *coordv1.ListFencesRequest) (*coordv1.ListFencesResponse, error) {
	if err := Validate(req); err != nil {
		return nil, err
	}
	limit := int(req.GetLimit())
	if ps := int(req.GetPageSize()); ps != 0 {
		limit = ps // Validate checked it agrees with limit
	}
	if limit == 0 {
		limit = 100
	}
	page, err := s.Store.ListFences(ctx, store.ListOptions{Node: req.Node, Status: req.Status, Limit: limit, PageToken: req.PageToken})
	if err != nil {
		return nil, err
	}
	return &coordv1.ListFencesResponse{Fences: page.Fences, NextPageToken: page.NextPageToken, CorruptIds: page.Corrupt}, nil
}

// WatchFence streams a record until it is final.
func (s *FenceServer) WatchFence(req *coordv1.WatchFenceRequest, stream coordv1.FenceService_WatchFenceServer) error {
	ctx := stream.Context()
	if err := Validate(req); err != nil {
		return err
	}
	id := req.GetId()
	if id == "" {
		page, err := s.Store.ListFences(ctx, store.ListOptions{Node: req.Node, Limit: 1})
		if err != nil {
			return err
		}
		if len(page.Fences) == 0 {
			return fmt.Errorf("node %q has no recent fence records: %w", req.Node, fault.ErrNotFound)
		}
		id = page.Fences[0].Id
	}
	updates, errc := s.Store.WatchFence(ctx, id)
	for v := range updates {
		if err := stream.Send(&coordv1.WatchFenceResponse{Fence: v.Fence}); err != nil {
			return err
		}
	}
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}
