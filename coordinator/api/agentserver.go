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
	"github.com/nodefence/nodefence/coordinator/loop"
	"github.com/nodefence/nodefence/coordinator/store"
	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/wire"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

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
	// One node holds at most MaxStreamsPerNode streams, counted from here: a stream waiting for a
	// leader counts too.
	release, err := s.streams.acquire(hello.NodeName)
	if err != nil {
		return err
	}
	defer release()
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
	at := s.now()
	if err := l.Loop.StepSync(ctx, engine.Hello{Node: name, Region: hello.Region, Zone: hello.Zone, BootID: hello.BootId, At: at, Watchdog: hello.Watchdog}); err != nil {
		return err
	}
	defer l.Loop.Step(context.WithoutCancel(ctx), engine.Disconnected{Node: name})
	// The registration is written at most as often as the node's limit allows (a reconnect loop
	// with a new boot id each time writes nothing more; counted in RegistrationsHeld).
	if err := onOwnStack(func() error {
		return s.Store.PutNodeIfChanged(ctx, l.Term, store.Registration{Name: name, BootID: hello.BootId, Zone: hello.Zone, Region: hello.Region}, at)
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
	// The engine's grants for this node leave on this stream, from a goroutine the loop runs
	// only while grants wait; in serializes them with the acks.
	defer l.Loop.Subscribe(name, in.send)()
	return s.receive(ctx, in, l, name, first.Seq)
}

// receive is the stream's receive loop after the hello (whose seq was firstSeq): every message of
// node name goes to leader l's engine, and is acknowledged when it is an event or an acknowledgement
// is due.
func (s *AgentServer) receive(ctx context.Context, in *agentStream, l *Leading, name string, firstSeq uint64) error {
	lastAck := s.now()  // one clock: the acknowledgement pacing reads the same clock as the engine
	lastSeq := firstSeq // seqs strictly increase on a stream (agentv1.ConnectRequest.seq)
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
		if g := l.Leases.grant(name, m.Seq, m.GetHeartbeat(), at); g != nil {
			if err := in.send(g); err != nil {
				return err
			}
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
	sendMu sync.Mutex // acks and grants are sent from two goroutines
	buf    wire.Encoded
	dec    agentwire.Decoder
	out    wire.Encoded
}

func newAgentStream(stream agentv1.AgentService_ConnectServer) *agentStream {
	return &agentStream{AgentService_ConnectServer: stream}
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
// streams, so it is encoded by hand into a buffer the stream reuses.
func (s *agentStream) ack(seq uint64) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	s.out.B = agentwire.AppendAck(s.out.B[:0], seq)
	return s.SendMsg(&s.out)
}
