package api

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/coordinator/fenceconfig"
	"github.com/nodefence/nodefence/coordinator/leader"
	"github.com/nodefence/nodefence/coordinator/loop"
	"github.com/nodefence/nodefence/coordinator/store"
	"github.com/nodefence/nodefence/services/server"
	"github.com/nodefence/nodefence/services/tlsfiles"
	"github.com/nodefence/nodefence/testbed/etcdtest"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

type fixedLeader struct{ l *Leading }

func (f fixedLeader) Leading(context.Context) (*Leading, error) { return f.l, nil }

// Connect paces its acknowledgements by the injected clock, the one the engine sees, not by the
// wall clock: with a clock that moves two seconds per reading, every heartbeat is acknowledged at
// once, although the wall clock has moved only milliseconds.
func TestConnectAcksByInjectedClock(t *testing.T) {
	_, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	term, err := leader.NewElector(cli, "/t/leader", leader.Info{ID: "one"}, 1, log).Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lp := loop.New(loop.Config{Engine: engine.DefaultConfig(), Term: term, Store: store.New(cli, "/t"), TickInterval: 20 * time.Millisecond, Log: log})
	go lp.Run(ctx)

	var ticks atomic.Int64
	base := time.Now()
	deps := &Deps{
		Leadership: fixedLeader{&Leading{Term: term, Loop: lp}},
		Store:      store.New(cli, "/t"),
		Config:     func() *fenceconfig.Config { return nil },
		KnownNode:  func(context.Context, string) error { return nil },
		Now:        func() time.Time { return base.Add(time.Duration(ticks.Add(1)) * 2 * time.Second) },
	}
	srv, err := server.New(server.Config{Listen: "127.0.0.1:0", TLS: tlsfiles.Files{Insecure: true}, UnauthenticatedCaller: "spiffe://nodefence/agent/n1"}, log)
	if err != nil {
		t.Fatal(err)
	}
	agentv1.RegisterAgentServiceServer(srv.GRPC, &AgentServer{Deps: deps})
	go srv.Serve()
	defer srv.Stop()

	conn, err := grpc.NewClient(srv.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream, err := agentv1.NewAgentServiceClient(conn).Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&agentv1.ConnectRequest{Seq: 1, Msg: &agentv1.ConnectRequest_Hello{Hello: &agentv1.Hello{NodeName: "n1", Zone: "z", BootId: "b"}}}); err != nil {
		t.Fatal(err)
	}
	acked := func() uint64 {
		for {
			m, err := stream.Recv()
			if err != nil {
				t.Fatalf("recv: %v", err)
			}
			if a := m.GetAck(); a != nil {
				return a.GetAckedSeq()
			}
		}
	}
	if got := acked(); got != 1 {
		t.Fatalf("hello acknowledged as %d, want 1", got)
	}
	for seq := uint64(2); seq <= 4; seq++ {
		if err := stream.Send(&agentv1.ConnectRequest{Seq: seq, Msg: &agentv1.ConnectRequest_Heartbeat{Heartbeat: &agentv1.Heartbeat{}}}); err != nil {
			t.Fatal(err)
		}
		if got := acked(); got != seq {
			t.Fatalf("heartbeat %d acknowledged as %d", seq, got)
		}
	}
}
