package api

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"runtime/pprof"
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

// ingestServer serves AgentService over real gRPC on 127.0.0.1 with a real loop and embedded
// etcd, any caller allowed (the identity rules have tests of their own), and returns a client
// connection to it.
func ingestServer(t *testing.T, ctx context.Context) *grpc.ClientConn {
	t.Helper()
	_, cli := etcdtest.Start(t)
	log := slog.New(slog.DiscardHandler)
	term, err := leader.NewElector(cli, "/t/leader", leader.Info{ID: "one"}, 1, log).Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lp := loop.New(loop.Config{Engine: engine.DefaultConfig(), Term: term, Store: store.New(cli, "/t"), TickInterval: 20 * time.Millisecond, Log: log})
	go lp.Run(ctx)
	deps := &Deps{
		Leadership: fixedLeader{&Leading{Term: term, Loop: lp}},
		Store:      store.New(cli, "/t"),
		Config:     func() *fenceconfig.Config { return nil },
		KnownNode:  func(context.Context, string) error { return nil },
	}
	srv, err := server.New(server.Config{Listen: "127.0.0.1:0", TLS: tlsfiles.Files{Insecure: true}, UnauthenticatedCaller: "any"}, log)
	if err != nil {
		t.Fatal(err)
	}
	agentv1.RegisterAgentServiceServer(srv.GRPC, &AgentServer{Deps: deps})
	go srv.Serve()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(srv.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// goroutinesIn counts the goroutines whose stack has a function of this package in it.
func goroutinesIn(t *testing.T) int {
	t.Helper()
	var b bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&b, 2); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, g := range bytes.Split(b.Bytes(), []byte("\n\n")) {
		if bytes.Contains(g, []byte("nodefence/coordinator/api.")) {
			n++
		}
	}
	return n
}

// An idle agent stream holds one goroutine on the coordinator, the one serving it: the engine's
// rare grants get a sender only while one waits (10,000 agents kept 10,000 more goroutines and
// ~40 MB of stacks for them).
func TestIdleStreamHoldsOneGoroutine(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn := ingestServer(t, ctx)
	base := goroutinesIn(t) // this test's own, and the loop's
	const agents = 20
	for i := range agents {
		stream, err := agentv1.NewAgentServiceClient(conn).Connect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		hello := &agentv1.Hello{NodeName: fmt.Sprintf("n%d", i), Zone: "z", BootId: "b"}
		if err := stream.Send(&agentv1.ConnectRequest{Seq: 1, Msg: &agentv1.ConnectRequest_Hello{Hello: hello}}); err != nil {
			t.Fatal(err)
		}
		for { // the configuration, then the hello's acknowledgement: the stream is up
			m, err := stream.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if m.GetAck() != nil {
				break
			}
		}
	}
	var n int
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if n = goroutinesIn(t) - base; n <= agents {
			return
		}
	}
	t.Fatalf("%d idle agent streams hold %d goroutines in coordinator/api, want at most one each", agents, n)
}
