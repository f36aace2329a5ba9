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
	"io"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/nodefence/nodefence/coordinator/agentwire"
	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/coordinator/fenceconfig"
	"github.com/nodefence/nodefence/coordinator/fencing"
	"github.com/nodefence/nodefence/coordinator/leader"
	"github.com/nodefence/nodefence/coordinator/loop"
	"github.com/nodefence/nodefence/coordinator/store"
	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/wire"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// Leading is what a leader has during one term.
type Leading struct {
	Term   *leader.Term
	Runner *fencing.Runner
	Loop   *loop.Loop
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
}

// start creates (or returns the active) record for node with action, and runs it.
func (s *FenceServer) start(ctx context.Context, node, reason string, action coordv1.FenceAction) (*coordv1.NodeFence, error) {
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
	rec := fencing.OperatorRecord(node, action, reason, identity.Name(ctx),
		func(step string) ([]fenceconfig.Resolved, error) { return s.Config().Plan(node, step) }, l.Term.Epoch, s.now())
	got, _, created, err := s.Store.CreateFence(ctx, l.Term, rec)
	if err != nil {
		return nil, err
	}
	if !created {
		if err := fencing.Joined(got, action); err != nil {
			return nil, err
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
	f, err := s.start(ctx, req.GetNode(), req.GetReason(), coordv1.FenceAction_FENCE_ACTION_OFF)
	if err != nil {
		return nil, err
	}
	return &coordv1.FenceResponse{Fence: f}, nil
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
				poweredOff(ctx, l.Loop, got)
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
		poweredOff(ctx, l.Loop, next)
		return &coordv1.AcknowledgeResponse{Fence: next}, nil
	}
	return nil, fmt.Errorf("acknowledge %s: too many concurrent changes, retry: %w", req.Node, leader.ErrConflict)
}

// poweredOff tells the engine an acknowledged node is off, for its node view.
func poweredOff(ctx context.Context, lp *loop.Loop, f *coordv1.NodeFence) {
	if f.GetConfirmedOffAt() != nil {
		_ = lp.Step(ctx, engine.PoweredOff{Node: f.Node, Fence: f.Id, At: f.ConfirmedOffAt.AsTime()})
	}
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
func (s *FenceServer) audit(ctx context.Context, l *Leading, node, kind, text string) {
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
	if err := s.Store.SetPaused(ctx, l.Term, paused, "paused by "+identity.Name(ctx)+": "+reason); err != nil {
		return err
	}
	return l.Loop.StepSync(ctx, engine.Paused{Paused: paused})
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

// ackEvery bounds how long a heartbeat or sample may wait for its (cumulative) acknowledgement.
const ackEvery = time.Second

// Connect serves one agent stream. Heartbeats and samples are applied on the stream's own goroutine
// (Loop.Observe) and acknowledged cumulatively at most once a second; every other message
// (conditions, shutdown announcements) only after the engine applied it and persisted what it
// changed, so an acknowledged event survives a failover.
func (s *AgentServer) Connect(stream agentv1.AgentService_ConnectServer) error {
	ctx := stream.Context()
	in := newAgentStream(stream)
	first, _, err := in.recv()
	if err != nil {
		return err
	}
	hello := first.GetHello()
	if hello == nil {
		return fault.Invalid{{Field: "hello", Problem: "the first message on a stream must be a hello"}}
	}
	if err := agentwire.ValidateHello(hello); err != nil {
		return err
	}
	// An agent speaks only for its own node.
	if id, _ := identity.From(ctx); id.Role != identity.Any && (id.Role != identity.Agent || id.Name != hello.NodeName) {
		return fmt.Errorf("%s may not speak for node %q: %w", id, hello.NodeName, fault.ErrPermissionDenied)
	}
	if err := s.knownNode(ctx, hello.NodeName); err != nil {
		return err
	}
	if err := s.configuredPlace(hello); err != nil {
		return err
	}
	l, err := s.awaitLeader(ctx)
	if err != nil {
		return err
	}
	name := hello.NodeName
	if err := l.Loop.StepSync(ctx, engine.Hello{Node: name, Region: hello.Region, Zone: hello.Zone, BootID: hello.BootId, At: s.now()}); err != nil {
		return err
	}
	defer l.Loop.Step(context.WithoutCancel(ctx), engine.Disconnected{Node: name})
	if err := onOwnStack(func() error {
		return s.Store.PutNodeIfChanged(ctx, l.Term, store.Registration{Name: name, BootID: hello.BootId, Zone: hello.Zone, Region: hello.Region})
	}); err != nil {
		return err
	}
	cfg := &agentv1.ConnectResponse{Msg: &agentv1.ConnectResponse_Config{Config: &agentv1.AgentConfig{
		HeartbeatInterval: durationpb.New(s.HeartbeatInterval), SampleInterval: durationpb.New(s.SampleInterval), Epoch: l.Term.Epoch,
	}}}
	if err := in.send(cfg); err != nil {
		return err
	}
	if err := in.ack(first.Seq); err != nil {
		return err
	}
	// The engine's grants for this node leave on this stream, from a goroutine of their own; in
	// serializes them with the acks.
	grants, unsubscribe := l.Loop.Subscribe(name)
	defer unsubscribe()
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case g := <-grants:
				if err := in.send(g); err != nil {
					return
				}
			}
		}
	}()
	lastAck := s.now()   // one clock: the acknowledgement pacing reads the same clock as the engine
	lastSeq := first.Seq // seqs strictly increase on a stream (agentv1.ConnectRequest.seq)
	for {
		m, reused, err := in.recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if m.GetHello() != nil {
			return fault.Invalid{{Field: "hello", Problem: "hello may only be the first message"}}
		}
		if m.Seq <= lastSeq {
			return fault.Invalid{{Field: "seq", Problem: fmt.Sprintf("%d does not increase (the previous message had %d)", m.Seq, lastSeq)}}
		}
		lastSeq = m.Seq
		at := s.now()
		event := loop.IsEvent(m)
		if event {
			if err := agentwire.ValidateEvent(m); err != nil {
				return err
			}
		}
		applied := false
		if !event {
			// The hot path: a heartbeat or sample of a known node is recorded on this goroutine.
			applied, err = l.Loop.Observe(name, at, m.GetSample())
		}
		if err == nil && !applied {
			if reused {
				m = proto.Clone(m).(*agentv1.ConnectRequest) // the engine may keep what it is given
			}
			err = l.Loop.StepSync(ctx, engine.Message{Node: name, At: at, Msg: m})
		}
		if err != nil {
			if errors.Is(err, loop.ErrStopped) {
				// The term is over: name the new leader if there already is one.
				if _, lerr := s.Leadership.Leading(ctx); lerr != nil {
					return lerr
				}
			}
			return err
		}
		if event || at.Sub(lastAck) >= ackEvery {
			if err := in.ack(m.Seq); err != nil {
				return err
			}
			lastAck = at
		}
	}
}

// helloWait is how long a replica that knows no live leader holds an agent's hello before answering:
// during an election, a redirect the moment a leader is verified beats thousands of agents asking
// every replica again and again.
const helloWait = 2 * time.Second

// awaitLeader returns this replica's term, or the error naming the leader, waiting up to helloWait
// while no leader is verified.
func (s *AgentServer) awaitLeader(ctx context.Context) (*Leading, error) {
	wait := time.NewTimer(helloWait) // a bound on waiting, not a reading of the clock
	defer wait.Stop()
	poll := time.NewTicker(100 * time.Millisecond)
	defer poll.Stop()
	for {
		l, err := s.Leadership.Leading(ctx)
		var nl *fault.NotLeaderError
		if err == nil || (errors.As(err, &nl) && nl.LeaderAddress != "") {
			return l, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-wait.C:
			return l, err
		case <-poll.C:
		}
	}
}

// onOwnStack runs f on a goroutine of its own and waits for it. An agent stream's goroutine lives
// as long as the agent's connection, and Go shrinks a stack only when less than a quarter of it is in
// use: one deep call at hello (the etcd client's) would double the stack each of 10,000 streams keeps
// for good (make bench-ingest: 168 MB of stacks instead of 84 MB).
func onOwnStack(f func() error) error {
	done := make(chan error, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				done <- fmt.Errorf("panic: %v", p)
			}
		}()
		done <- f()
	}()
	return <-done
}

// agentStream receives an agent's requests through one agentwire.Decoder, so heartbeats and
// samples are decoded into memory the stream reuses: a message recv reports as reused is valid only
// until the next recv.
type agentStream struct {
	agentv1.AgentService_ConnectServer
	sendMu  sync.Mutex // acks and grants are sent from two goroutines
	buf     wire.Encoded
	dec     agentwire.Decoder
	out     wire.Encoded
	ackMsg  *agentv1.Ack
	ackResp *agentv1.ConnectResponse
}

func newAgentStream(stream agentv1.AgentService_ConnectServer) *agentStream {
	ack := &agentv1.Ack{}
	return &agentStream{AgentService_ConnectServer: stream, ackMsg: ack,
		ackResp: &agentv1.ConnectResponse{Msg: &agentv1.ConnectResponse_Ack{Ack: ack}}}
}

// send sends one coordinator message, serialized with the acks.
func (s *agentStream) send(m *agentv1.ConnectResponse) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	return s.Send(m)
}

// maxKeptBuffer is the largest receive buffer a stream keeps between messages.
const maxKeptBuffer = 64 << 10

func (s *agentStream) recv() (m *agentv1.ConnectRequest, reused bool, err error) {
	if err := s.RecvMsg(&s.buf); err != nil {
		return nil, false, err
	}
	m, reused, err = s.dec.Decode(s.buf.B)
	if cap(s.buf.B) > maxKeptBuffer {
		s.buf.B = nil // the decoded message does not point into the buffer
	}
	if err != nil {
		return nil, false, fault.Invalid{{Field: "request", Problem: "not a ConnectRequest: " + err.Error()}}
	}
	return m, reused, nil
}

// ack acknowledges every message up to seq. It is sent once a second by each of thousands of
// streams, so the response and its encoding are reused too.
func (s *agentStream) ack(seq uint64) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	s.ackMsg.AckedSeq = seq
	var err error
	if s.out.B, err = (proto.MarshalOptions{}).MarshalAppend(s.out.B[:0], s.ackResp); err != nil {
		return err
	}
	return s.SendMsg(&s.out)
}
