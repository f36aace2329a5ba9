package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/services/wire"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

func (b *bench) agent(ctx context.Context, i, perConn, start int, answered *atomic.Int64) {
	idx := start
	next := -1
	tried := 0
	for ctx.Err() == nil {
		c := idx
		if next >= 0 {
			c, next = next, -1
		}
		leader, worked := b.stream(ctx, b.agentConns[c][i/perConn], i, answered)
		if worked {
			tried = 0
		}
		if leader != "" {
			for j, a := range b.coordAddr {
				if a == leader {
					next = j
				}
			}
			if next >= 0 && next != c {
				continue
			}
			next = -1
		}
		idx = (c + 1) % len(b.coordAddr)
		if tried++; tried >= len(b.coordAddr) {
			tried = 0
			select {
			case <-ctx.Done():
			case <-time.After(time.Duration(50+rand.IntN(50)) * time.Millisecond):
			}
		}
	}
}

// stream runs one stream; it returns the leader a follower named, and whether the hello was answered.
func (b *bench) stream(ctx context.Context, conn *grpc.ClientConn, i int, answered *atomic.Int64) (string, bool) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := agentv1.NewAgentServiceClient(conn).Connect(sctx, grpc.ForceCodecV2(wire.Codec()))
	if err != nil {
		return "", false
	}
	hello := &agentv1.ConnectRequest{Seq: 1, Msg: &agentv1.ConnectRequest_Hello{Hello: &agentv1.Hello{
		NodeName: fmt.Sprintf("agent-%d", i), BootId: "bench", Zone: fmt.Sprintf("zone-%d", i%10), Region: "bench"}}}
	if err := st.Send(hello); err != nil {
		return leaderOf(st.Trailer(), err), false
	}
	var resp wire.Encoded
	if err := st.RecvMsg(&resp); err != nil {
		return leaderOf(st.Trailer(), err), false
	}
	answered.Store(time.Now().UnixNano())
	recvErr := make(chan error, 1)
	go func() {
		var ack wire.Encoded
		for {
			if err := st.RecvMsg(&ack); err != nil {
				recvErr <- err
				return
			}
		}
	}()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for seq := uint64(2); ; seq++ {
		select {
		case <-ctx.Done():
			return "", true
		case err := <-recvErr:
			return leaderOf(st.Trailer(), err), true
		case <-tick.C:
		}
		if err := st.Send(&agentv1.ConnectRequest{Seq: seq, Msg: &agentv1.ConnectRequest_Heartbeat{Heartbeat: &agentv1.Heartbeat{SentAt: timestamppb.Now()}}}); err != nil {
			return leaderOf(st.Trailer(), <-recvErr), true
		}
	}
}

func leaderOf(md metadata.MD, err error) string {
	if status.Code(err) != codes.Unavailable {
		return ""
	}
	return fault.LeaderFromTrailer(md)
}

// driverCalled reports when the driver first logged an operation with epoch (the fence resumed).
