package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/nodefence/nodefence/services/wire"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

// recorder is an AgentService that acks every message and records what each stream sent.
type recorder struct {
	agentv1.UnimplementedAgentServiceServer
	mu   sync.Mutex
	seqs map[string][]uint64
}

func (r *recorder) Connect(stream agentv1.AgentService_ConnectServer) error {
	name := ""
	for {
		m, err := stream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if h := m.GetHello(); h != nil {
			name = h.NodeName
		}
		if name == "refuse" {
			return status.Error(codes.InvalidArgument, "refused on purpose")
		}
		r.mu.Lock()
		r.seqs[name] = append(r.seqs[name], m.Seq)
		r.mu.Unlock()
		if err := stream.Send(&agentv1.ConnectResponse{Msg: &agentv1.ConnectResponse_Ack{Ack: &agentv1.Ack{AckedSeq: m.Seq}}}); err != nil {
			return err
		}
	}
}

// encode frames m; it is called on the streams' goroutines too, where t.Fatal may not be, and
// only with messages protobuf can always encode.
func encode(m proto.Message) []byte {
	b, err := appendMessage(nil, m)
	if err != nil {
		panic(err)
	}
	return b
}

// TestH2ConnAgainstGRPCServer: the hand-framed client talks to grpc-go's server over TCP. Each
// stream sends more than the server's 64 KiB stream window and gets more acks than the 64 KiB the
// client grants, so both directions' flow control must work or the test hangs; an error the
// handler returns arrives as the stream's end.
func TestH2ConnAgainstGRPCServer(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.InitialWindowSize(wire.StreamWindow), grpc.InitialConnWindowSize(wire.ConnWindow))
	rec := &recorder{seqs: map[string][]uint64{}}
	agentv1.RegisterAgentServiceServer(srv, rec)
	go srv.Serve(lis)
	defer srv.Stop()

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := dialH2(ctx, lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	go func() { <-ctx.Done(); c.Close() }() // a flow-control bug hangs sends: fail instead

	const streams, messages = 3, 7000 // 7000 samples of ~60 bytes; 7000 acks of ~10 bytes
	var wg sync.WaitGroup
	errs := make(chan error, streams)
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := c.open(agentv1.AgentService_Connect_FullMethodName)
			if err != nil {
				errs <- err
				return
			}
			if err := c.send(s, encode(hello(i))); err != nil {
				errs <- err
				return
			}
			smp := newSampler()
			for seq := uint64(2); seq <= messages; seq++ {
				if err := c.send(s, encode(smp.next(seq, time.Now()))); err != nil {
					errs <- err
					return
				}
			}
			// The acks: all of them arrive only if the client keeps granting the server window.
			var want int64
			for seq := uint64(1); seq <= messages; seq++ {
				want += int64(len(encode(&agentv1.ConnectResponse{Msg: &agentv1.ConnectResponse_Ack{Ack: &agentv1.Ack{AckedSeq: seq}}})))
			}
			for c.receivedBytes(s) < want && ctx.Err() == nil {
				time.Sleep(10 * time.Millisecond)
			}
			if got := c.receivedBytes(s); got != want {
				errs <- fmt.Errorf("stream %d received %d bytes of acks, want %d", i, got, want)
				return
			}
			errs <- c.closeSend(s)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for i := range streams {
		name := hello(i).GetHello().NodeName
		for {
			rec.mu.Lock()
			got := append([]uint64(nil), rec.seqs[name]...)
			rec.mu.Unlock()
			if len(got) == messages {
				for j, seq := range got {
					if seq != uint64(j+1) {
						t.Fatalf("%s: message %d has seq %d", name, j, seq)
					}
				}
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("%s: the server got %d of %d messages", name, len(got), messages)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// A stream whose handler fails ends with the handler's status.
	s, err := c.open(agentv1.AgentService_Connect_FullMethodName)
	if err != nil {
		t.Fatal(err)
	}
	refuse := &agentv1.ConnectRequest{Seq: 1, Msg: &agentv1.ConnectRequest_Hello{Hello: &agentv1.Hello{NodeName: "refuse"}}}
	if err := c.send(s, encode(refuse)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.answered:
	case <-ctx.Done():
		t.Fatal("no end of the refused stream")
	}
	if err := c.streamErr(s); err == nil || !strings.Contains(err.Error(), "grpc-status 3") || !strings.Contains(err.Error(), "refused on purpose") {
		t.Fatalf("refused stream ended with %v, want grpc-status 3 and the message", err)
	}
}
