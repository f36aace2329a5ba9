// Package agent is the node agent's client of the coordinator: one long-lived, resumable
// AgentService.Connect stream that carries heartbeats, signal samples and events with sequence
// numbers, resends what the coordinator has not acknowledged after every reconnect, follows leader
// redirects and backs off with jitter.
//
// The bookkeeping (Outbox) and the wait between attempts (Backoff) are pure and tested on their own;
// Agent does the I/O.
package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
	"github.com/nodefence/nodefence/services/dial"
	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/tlsfiles"
)

// Sampler reads the node's eviction signals. It is an interface here, where it is used, so that
// tests can feed the agent fixed values; signals.HostSampler is the real one.
type Sampler interface {
	Sample(ctx context.Context) (*agentv1.SignalSample, error)
}

// maxRedirects is how many leader redirects one round of attempts follows (a round ends when every
// configured address was tried); it bounds a loop of followers pointing at each other.
const maxRedirects = 3

// silenceTimeout is how long a coordinator that took the stream may stay silent while messages wait
// for its acknowledgement (it acknowledges at least once a second) before the agent leaves it: a
// stopped or cut-off coordinator never closes the stream itself.
const silenceTimeout = 5 * time.Second

// helloTimeout is how long a coordinator may take to answer the Hello before the agent gives up on
// it and tries the next address: a stopped process still accepts TCP connections.
const helloTimeout = 10 * time.Second

// Agent keeps one stream to the coordinator leader. Create it with New, then call Run once.
type Agent struct {
	cfg     Config
	sampler Sampler
	log     *slog.Logger
	version string
	certs   *tlsfiles.Reloader // nil when plaintext

	notify    chan struct{} // a message was queued; capacity 1
	cfgNotify chan struct{} // a new AgentConfig arrived; capacity 1
	connected atomic.Bool

	mu        sync.Mutex
	out       *Outbox
	heartbeat time.Duration          // current heartbeat interval (coordinator's when it sent one)
	sample    time.Duration          // current sample interval
	newConfig *agentv1.AgentConfig   // the latest AgentConfig not yet applied by the stream loop
	watchdog  *agentv1.WatchdogState // what every Hello reports (ReportWatchdog)
}

// New validates cfg (after SetDefaults) and returns an agent that samples with s.
func New(cfg Config, s Sampler) (*Agent, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if s == nil {
		return nil, fault.Invalid{{Field: "Sampler", Problem: "required"}}
	}
	version := "(unknown)"
	if bi, ok := debug.ReadBuildInfo(); ok {
		version = bi.Main.Version
	}
	certs, err := cfg.TLS.Watch(cfg.Log, "the agent's connection to the coordinator")
	if err != nil {
		return nil, err
	}
	return &Agent{
		cfg: cfg, sampler: s, log: cfg.Log, version: version, certs: certs,
		notify: make(chan struct{}, 1), cfgNotify: make(chan struct{}, 1),
		out: NewOutbox(cfg.BufferSize), heartbeat: cfg.HeartbeatInterval, sample: cfg.SampleInterval,
		watchdog: cfg.Watchdog,
	}, nil
}

// Certs is the reloader of the agent's certificate and CA bundle (nil when plaintext), for the
// metrics: every new stream takes the files as they are then.
func (a *Agent) Certs() *tlsfiles.Reloader { return a.certs }

// Connected reports whether a stream is up: the coordinator has answered this stream's Hello.
func (a *Agent) Connected() bool { return a.connected.Load() }

// Send queues an event (a condition change, shutdown event or eviction candidates) for the
// coordinator. The agent assigns the seq; msg is copied, so the caller keeps ownership. Events are
// resent on every new stream until acknowledged and are never dropped. A Hello or an empty message is
// ignored (and logged): the agent sends its own Hellos.
func (a *Agent) Send(msg *agentv1.ConnectRequest) {
	if msg == nil || msg.Msg == nil || msg.GetHello() != nil {
		a.log.Error("agent: Send ignores empty messages and hellos", "msg", msg)
		return
	}
	a.push(proto.Clone(msg).(*agentv1.ConnectRequest))
}

// ReportWatchdog reports a change of the node's watchdog (armed when the agent first may feed it,
// disarmed before a clean stop): queued as an event, and what every later Hello says.
func (a *Agent) ReportWatchdog(s *agentv1.WatchdogState) (seq uint64) {
	s = proto.Clone(s).(*agentv1.WatchdogState)
	a.mu.Lock()
	a.watchdog = s
	a.mu.Unlock()
	a.pushThen(&agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Watchdog{Watchdog: s}}, func(n uint64) { seq = n })
	return seq
}

// Acked reports whether the coordinator acknowledged every message up to seq (a report's seq, say).
func (a *Agent) Acked(seq uint64) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.out.AckedThrough(seq)
}

// pushHeartbeat queues a heartbeat, asking for the watchdog lease when the agent keeps one. The
// lease counts from the time read before the heartbeat is queued: it cannot be sent before.
func (a *Agent) pushHeartbeat() {
	at := time.Now()
	hb := &agentv1.Heartbeat{SentAt: timestamppb.New(at)}
	if a.cfg.Lease == nil {
		a.push(&agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Heartbeat{Heartbeat: hb}})
		return
	}
	a.cfg.Lease.stamp(hb)
	a.pushThen(&agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Heartbeat{Heartbeat: hb}}, func(seq uint64) { a.cfg.Lease.queued(seq, at) })
}

func (a *Agent) push(m *agentv1.ConnectRequest) { a.pushThen(m, nil) }

// pushThen queues m and, while the outbox is still locked (m cannot be sent yet), calls then with
// its seq.
func (a *Agent) pushThen(m *agentv1.ConnectRequest, then func(seq uint64)) {
	a.mu.Lock()
	seq, dropped := a.out.Push(m)
	if then != nil {
		then(seq)
	}
	n := a.out.Len()
	a.mu.Unlock()
	if len(dropped) > 0 {
		a.log.Warn("outbox full: dropped unacked samples/heartbeats", "dropped_seqs", dropped, "unacked", n)
	}
	if n > a.cfg.BufferSize {
		a.log.Warn("outbox over its limit with events that are never dropped", "unacked", n, "limit", a.cfg.BufferSize, "seq", seq)
	}
	select {
	case a.notify <- struct{}{}:
	default:
	}
}

// Unacked returns how many messages wait for an acknowledgement.
func (a *Agent) Unacked() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.out.Len()
}

// Run keeps a stream to the coordinator leader until ctx is done, then returns nil. It reconnects
// forever, without waiting while there is an address left to try: to the same coordinator after a
// stream that worked, to the leader a follower named, and otherwise to the next address in
// Coordinators. Only when a whole round of addresses failed does it wait: briefly (a few MinBackoff)
// while some coordinator answered, as during an election, and with a growing Backoff while none
// answered at all.
func (a *Agent) Run(ctx context.Context) error {
	addrs := a.cfg.Coordinators
	idx, addr := 0, addrs[0]
	var r round
	for {
		res := a.session(ctx, addr)
		if ctx.Err() != nil {
			return nil
		}
		log := a.log.With("coordinator", addr, "code", status.Code(res.err).String(), "error", res.err)
		next, wait := r.next(res, len(addrs), a.cfg.MinBackoff, a.cfg.MaxBackoff, rand.Float64())
		switch {
		case next == nextLeader:
			log.Info("coordinator is not the leader; following the redirect", "leader", res.leader)
			addr = res.leader
			continue
		case next == nextAddress:
			idx = (idx + 1) % len(addrs)
			addr = addrs[idx]
			log.Info("coordinator unavailable; trying the next at once", "next", addr)
			continue
		case next == nextSame:
			log.Warn("stream ended; reconnecting", "next", addr)
			continue
		}
		idx = (idx + 1) % len(addrs)
		addr = addrs[idx]
		log.Warn("no coordinator took the stream; waiting", "next", addr, "backoff", wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// next is where the agent goes after a stream ended.
type next int

const (
	nextWait    next = iota // the round is over: wait, then the next address
	nextSame                // reconnect to the same address at once
	nextLeader              // follow the redirect at once
	nextAddress             // try the next configured address at once
)

// round is the pure bookkeeping of Run: which attempts belong to the current round of addresses, and
// how many rounds in a row failed.
type round struct {
	tried, redirects int  // configured addresses tried and redirects followed in this round
	atLeader         bool // the attempt being judged went to a leader a coordinator named
	answered         bool // a coordinator answered in this round (it named no reachable leader)
	failed           int  // rounds in a row in which no coordinator answered
	waits            int  // rounds in a row that ended in a wait
}

// next decides after one attempt; u in [0, 1) jitters the wait.
func (r *round) next(res result, addrs int, minD, maxD time.Duration, u float64) (next, time.Duration) {
	if res.worked {
		*r = round{}
		if res.leader != "" { // the stream worked, then its coordinator stepped down naming another
			r.redirects, r.atLeader = 1, true
			return nextLeader, 0
		}
		return nextSame, 0
	}
	r.answered = r.answered || res.answered
	if !r.atLeader {
		r.tried++ // a configured address; a leader it named is part of its turn
	}
	r.atLeader = false
	if res.leader != "" && r.redirects < maxRedirects {
		r.redirects, r.atLeader = r.redirects+1, true
		return nextLeader, 0
	}
	if r.tried < addrs {
		return nextAddress, 0
	}
	var wait time.Duration
	if r.answered {
		// The coordinators are up and electing or verifying a leader: look again soon.
		wait = Backoff(min(r.waits, 2), minD, maxD, u)
		r.failed = 0
	} else {
		wait = Backoff(r.failed, minD, maxD, u)
		r.failed++
	}
	r.waits++
	r.tried, r.redirects, r.answered, r.atLeader = 0, 0, false, false
	return nextWait, wait
}

// result is how one stream ended.
type result struct {
	worked   bool   // the coordinator answered the Hello
	answered bool   // a coordinator answered at all (its connection was up)
	leader   string // the leader a follower named, if it did
	err      error
}

type recvEnd struct {
	err     error
	trailer metadata.MD
}

// session runs one stream to addr until it ends or ctx is done.
func (a *Agent) session(ctx context.Context, addr string) (res result) {
	defer a.connected.Store(false)
	// Only a coordinator may answer: another certificate of the same CA (another node's agent, a
	// driver) fails the handshake before the hello, which names the node, is sent.
	conn, err := dial.New(addr, a.cfg.TLS, dial.Peer(identity.Coordinator, ""), dial.Log(a.log), dial.Certs(a.certs))
	if err != nil {
		return result{err: err}
	}
	defer conn.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer func() { res.answered = res.answered || conn.GetState() == connectivity.Ready }()
	st, err := agentv1.NewAgentServiceClient(conn).Connect(sctx)
	if err != nil {
		return result{err: err}
	}

	a.mu.Lock()
	helloSeq, resume := a.out.Resume()
	wd := a.watchdog
	a.mu.Unlock()
	hello := &agentv1.ConnectRequest{Seq: helloSeq, Msg: &agentv1.ConnectRequest_Hello{Hello: &agentv1.Hello{
		NodeName: a.cfg.NodeName, BootId: a.cfg.BootID, Zone: a.cfg.Zone, Region: a.cfg.Region,
		Labels: a.cfg.Labels, Capacity: a.cfg.Capacity, AgentVersion: a.version, ResumeFromSeq: resume, Watchdog: wd,
	}}}
	if err := st.Send(hello); err != nil && !errors.Is(err, io.EOF) {
		return result{err: err}
	}

	ss := &sessionStream{st: st, ended: make(chan recvEnd, 1)}
	go a.recvLoop(ss, addr, resume)
	// A coordinator that does not answer the Hello in time (a stopped process) is given up.
	helloTimer := time.AfterFunc(helloTimeout, func() {
		if !ss.worked.Load() {
			cancel()
		}
	})
	defer helloTimer.Stop()
	return a.sendLoop(ctx, sctx, cancel, ss, addr, helloSeq)
}

// sessionStream is one session's stream and what its receive goroutine shares with its send loop.
type sessionStream struct {
	st       agentv1.AgentService_ConnectClient
	worked   atomic.Bool  // the coordinator answered the Hello
	lastRecv atomic.Int64 // when the latest answer came, in Unix nanoseconds
	ended    chan recvEnd // why Recv ended (buffered, one)
}

// finish is the session's result once its stream ended with e.
func (ss *sessionStream) finish(e recvEnd) result {
	r := result{worked: ss.worked.Load(), err: e.err}
	if status.Code(e.err) == codes.Unavailable {
		r.leader = fault.LeaderFromTrailer(e.trailer)
	}
	return r
}

// recvLoop receives the coordinator's answers on ss until the stream ends, and says why on ss.ended.
func (a *Agent) recvLoop(ss *sessionStream, addr string, resume uint64) {
	for {
		resp, err := ss.st.Recv()
		if err != nil {
			ss.ended <- recvEnd{err: err, trailer: ss.st.Trailer()}
			return
		}
		ss.lastRecv.Store(time.Now().UnixNano())
		if !ss.worked.Swap(true) {
			a.connected.Store(true)
			a.log.Info("connected to the coordinator", "coordinator", addr, "resume_from_seq", resume)
			if a.cfg.Connected != nil {
				a.cfg.Connected()
			}
		}
		a.receive(resp)
	}
}

// sendLoop sends the queued messages after helloSeq on ss, heartbeats and samples, until the stream
// ends, ctx is done (then it cancels the session's context sctx), or the coordinator stops answering.
func (a *Agent) sendLoop(ctx, sctx context.Context, cancel context.CancelFunc, ss *sessionStream, addr string, helloSeq uint64) result {
	a.mu.Lock()
	hbEvery, sampleEvery := a.heartbeat, a.sample
	a.mu.Unlock()
	hb := time.NewTicker(hbEvery)
	defer hb.Stop()
	sm := time.NewTicker(sampleEvery)
	defer sm.Stop()
	a.takeSample(sctx, sampleEvery)

	lastSent := helloSeq
	for {
		a.mu.Lock()
		pending := a.out.After(lastSent)
		a.mu.Unlock()
		for _, m := range pending {
			if err := ss.st.Send(m); err != nil {
				// The stream is over; Recv tells why.
				select {
				case e := <-ss.ended:
					return ss.finish(e)
				case <-ctx.Done():
					cancel()
					return ss.finish(<-ss.ended)
				}
			}
			lastSent = m.Seq
		}
		select {
		case <-ctx.Done():
			cancel()
			return ss.finish(<-ss.ended)
		case e := <-ss.ended:
			return ss.finish(e)
		case <-a.notify:
		case <-hb.C:
			if silent := time.Since(time.Unix(0, ss.lastRecv.Load())); ss.worked.Load() && silent > max(silenceTimeout, 5*hbEvery) && a.Unacked() > 0 {
				a.log.Warn("coordinator stopped answering; leaving it", "coordinator", addr, "silent_for", silent.Round(time.Millisecond))
				cancel()
				r := ss.finish(<-ss.ended)
				r.worked = false // go on to the next address, not back to this one
				return r
			}
			a.pushHeartbeat()
		case <-sm.C:
			a.takeSample(sctx, sampleEvery)
		case <-a.cfgNotify:
			h, s := a.applyConfig()
			if h != hbEvery {
				hbEvery = h
				hb.Reset(h)
			}
			if s != sampleEvery {
				sampleEvery = s
				sm.Reset(s)
			}
		}
	}
}

// receive handles one coordinator message.
func (a *Agent) receive(resp *agentv1.ConnectResponse) {
	switch m := resp.Msg.(type) {
	case *agentv1.ConnectResponse_Ack:
		a.mu.Lock()
		n := a.out.Ack(m.Ack.AckedSeq)
		last := a.out.Last()
		a.mu.Unlock()
		if m.Ack.AckedSeq > last {
			a.log.Warn("coordinator acked a seq the agent never sent", "acked_seq", m.Ack.AckedSeq, "last_seq", last)
		}
		a.log.Debug("ack", "acked_seq", m.Ack.AckedSeq, "removed", n)
	case *agentv1.ConnectResponse_Config:
		a.mu.Lock()
		a.newConfig = m.Config
		a.mu.Unlock()
		select {
		case a.cfgNotify <- struct{}{}:
		default:
		}
	case *agentv1.ConnectResponse_Lease:
		if a.cfg.Lease != nil {
			a.cfg.Lease.granted(m.Lease, time.Now())
		}
	case *agentv1.ConnectResponse_StopFeeding:
		if a.cfg.Lease == nil {
			a.log.Warn("stop-feeding pill received; this agent keeps no watchdog", "fence", m.StopFeeding.GetFenceId())
			return
		}
		a.cfg.Lease.Poison(m.StopFeeding)
	case *agentv1.ConnectResponse_Grant:
		if a.cfg.Grants == nil {
			a.log.Warn("eviction grant received; no pods to evict in standalone mode", "signal", m.Grant.Signal, "pods", len(m.Grant.Pods))
			return
		}
		a.cfg.Grants.Grant(m.Grant)
	default:
		a.log.Warn("unknown coordinator message", "msg", fmt.Sprintf("%T", resp.Msg))
	}
}

// applyConfig takes the latest AgentConfig into the agent's intervals (ignoring unset or
// non-positive durations) and returns the intervals now in force.
func (a *Agent) applyConfig() (heartbeat, sample time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if c := a.newConfig; c != nil {
		if d := c.GetHeartbeatInterval().AsDuration(); c.HeartbeatInterval != nil && d > 0 {
			a.heartbeat = d
		}
		if d := c.GetSampleInterval().AsDuration(); c.SampleInterval != nil && d > 0 {
			a.sample = d
		}
		a.log.Info("coordinator config", "heartbeat_interval", a.heartbeat, "sample_interval", a.sample, "epoch", c.Epoch)
		a.newConfig = nil
	}
	return a.heartbeat, a.sample
}

// takeSample reads the signals (within one interval) and queues them.
func (a *Agent) takeSample(ctx context.Context, within time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	s, err := a.sampler.Sample(ctx)
	if err != nil {
		if ctx.Err() == nil {
			a.log.Warn("sampling the eviction signals failed", "error", err)
		}
		return
	}
	a.push(&agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Sample{Sample: s}})
}
