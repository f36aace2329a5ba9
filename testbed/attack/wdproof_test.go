package attack

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/nodefence/nodefence/node-agent/agent"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/server"
	"github.com/nodefence/nodefence/services/wdlease"
	"github.com/nodefence/nodefence/testbed/wait"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// TestWatchdogPillAttacks: the watchdog method (an operator's poison pill, issue 24) is an operator's
// Fence like any other: an agent's certificate cannot trigger it for another node nor for its own,
// a viewer cannot, a method name other than "watchdog" is refused by field, and a node whose agent
// never reported an armed watchdog is refused before anything is written. Nothing changes: no BMC
// switched, no etcd key written.
func TestWatchdogPillAttacks(t *testing.T) {
	s := start(t, "")
	s.runAgent(t, "node-b") // connected, without a watchdog
	operator := dialWith(t, s.coord.Addr(), s.files(t, identity.Operator, "alice"))
	wait.Until(t, 20*time.Second, "leader elected", func() error {
		_, err := coordv1.NewClusterServiceClient(operator).ListNodes(context.Background(), &coordv1.ListNodesRequest{})
		return err
	})
	agentA := dialWith(t, s.coord.Addr(), s.files(t, identity.Agent, "node-a"))
	agentB := dialWith(t, s.coord.Addr(), s.files(t, identity.Agent, "node-b"))
	viewer := dialWith(t, s.coord.Addr(), s.files(t, identity.Viewer, "bob"))
	before := s.settled(t)
	fc := coordv1.NewFenceServiceClient
	for _, tc := range []struct {
		name string
		code codes.Code
		want string
		call func(ctx context.Context) error
	}{
		{"an agent sends another node a pill", codes.PermissionDenied, "", func(ctx context.Context) error {
			_, err := fc(agentA).Fence(ctx, &coordv1.FenceRequest{Node: "node-b", Method: "watchdog"})
			return err
		}},
		{"an agent sends its own node a pill", codes.PermissionDenied, "", func(ctx context.Context) error {
			_, err := fc(agentB).Fence(ctx, &coordv1.FenceRequest{Node: "node-b", Method: "watchdog"})
			return err
		}},
		{"a viewer sends a pill", codes.PermissionDenied, "", func(ctx context.Context) error {
			_, err := fc(viewer).Fence(ctx, &coordv1.FenceRequest{Node: "node-b", Method: "watchdog"})
			return err
		}},
		{"an operator names a program as the method", codes.InvalidArgument, "method", func(ctx context.Context) error {
			_, err := fc(operator).Fence(ctx, &coordv1.FenceRequest{Node: "node-b", Method: "/bin/sh -c reboot"})
			return err
		}},
		{"an operator's pill for a node without an armed watchdog", codes.FailedPrecondition, "armed", func(ctx context.Context) error {
			_, err := fc(operator).Fence(ctx, &coordv1.FenceRequest{Node: "node-b", Method: "watchdog"})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := tc.call(ctx)
			if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.want) {
				t.Fatalf("got %v, want %s naming %q", err, tc.code, tc.want)
			}
		})
	}
	if d := before.diff(s.snapshot(t)); d != "" {
		t.Fatalf("the attacks changed the system: %s", d)
	}
}

// staleLeader is a coordinator that lost its leadership (epoch 5) after a newer leader (epoch 7)
// granted the agent a lease: it answers the agent's first heartbeat with the newer leader's grant
// (as that leader would have), then sends its own, older pill, then the newer leader's pill.
type staleLeader struct {
	agentv1.UnimplementedAgentServiceServer
	send chan *agentv1.ConnectResponse
}

func (s *staleLeader) Connect(st agentv1.AgentService_ConnectServer) error {
	if _, err := st.Recv(); err != nil { // hello
		return err
	}
	for {
		m, err := st.Recv()
		if err != nil {
			return err
		}
		if m.GetHeartbeat().GetLeaseWanted() {
			if err := st.Send(&agentv1.ConnectResponse{Msg: &agentv1.ConnectResponse_Lease{Lease: &agentv1.LeaseGrant{
				Epoch: 7, GrantId: 1, Duration: durationpb.New(4 * time.Second), RequestSeq: m.Seq}}}); err != nil {
				return err
			}
			break
		}
	}
	go func() {
		for {
			if _, err := st.Recv(); err != nil {
				return
			}
		}
	}()
	for {
		select {
		case <-st.Context().Done():
			return nil
		case r := <-s.send:
			if err := st.Send(r); err != nil {
				return err
			}
		}
	}
}

// TestStaleLeaderPillIgnored: a real agent over mutual TLS takes a lease of epoch 7; a pill of epoch
// 5 (a deposed leader's) changes nothing, and it keeps the right to feed; the pill of epoch 7 stops
// its feeding for good.
func TestStaleLeaderPillIgnored(t *testing.T) {
	s := start(t, "")
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := server.New(server.Config{Listen: "127.0.0.1:0", TLS: s.files(t, identity.Coordinator, "stale"), DrainTimeout: time.Second}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	sl := &staleLeader{send: make(chan *agentv1.ConnectResponse)}
	agentv1.RegisterAgentServiceServer(srv.GRPC, sl)
	go func() { _ = srv.Serve() }()
	t.Cleanup(srv.Stop)

	b := wdlease.Defaults(3 * time.Second)
	b.Lease = wdlease.MaxGrant
	lease := agent.NewLease(b, time.Now().Add(-time.Hour), quiet)
	a, err := agent.New(agent.Config{Coordinators: []string{srv.Addr()}, TLS: s.files(t, identity.Agent, "node-a"), NodeName: "node-a",
		BootID: "boot-node-a", Zone: "z", Region: "r", Log: quiet, Lease: lease}, sampler{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	wait.Until(t, 20*time.Second, "the agent holds the epoch-7 lease", func() error {
		if d := lease.MayFeed(time.Now(), "node-a", 0, wdlease.Confirmation{}); d != wdlease.FeedLease {
			return errors.New("no lease yet")
		}
		return nil
	})
	sl.send <- &agentv1.ConnectResponse{Msg: &agentv1.ConnectResponse_StopFeeding{StopFeeding: &agentv1.StopFeeding{Epoch: 5, FenceId: "stale"}}}
	sl.send <- &agentv1.ConnectResponse{Msg: &agentv1.ConnectResponse_Ack{Ack: &agentv1.Ack{}}} // the pill was read before this
	time.Sleep(200 * time.Millisecond)
	if lease.Poisoned() || lease.MayFeed(time.Now(), "node-a", 0, wdlease.Confirmation{}) != wdlease.FeedLease {
		t.Fatal("a deposed leader's pill (epoch 5 after a grant of epoch 7) stopped the feeding")
	}
	sl.send <- &agentv1.ConnectResponse{Msg: &agentv1.ConnectResponse_StopFeeding{StopFeeding: &agentv1.StopFeeding{Epoch: 7, FenceId: "current"}}}
	wait.Until(t, 5*time.Second, "the current leader's pill stops the feeding", func() error {
		if !lease.Poisoned() || lease.MayFeed(time.Now(), "node-a", 0, wdlease.Confirmation{}) != wdlease.Stop {
			return errors.New("still feeding")
		}
		return nil
	})
}
