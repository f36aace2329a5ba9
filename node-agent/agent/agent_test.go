package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/nodefence/nodefence/node-agent/signals"
	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/services/tlsfiles"
)

// coordinator is a real AgentService on 127.0.0.1 that records every stream and, unless told not
// to, acks every message it receives (as the real coordinator does).
type coordinator struct {
	agentv1.UnimplementedAgentServiceServer
	addr string
	srv  *grpc.Server

	noAck  bool                   // never ack
	leader string                 // when set, act as a follower naming this leader
	config *agentv1.AgentConfig   // sent after the hello when set
	grant  *agentv1.EvictionGrant // sent after the hello when set

	mu      sync.Mutex
	streams [][]*agentv1.ConnectRequest
}

// serve starts c on addr ("127.0.0.1:0" for any port) and stops it at the end of the test.
func (c *coordinator) serve(t *testing.T, addr string) *coordinator {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.addr = lis.Addr().String()
	c.srv = grpc.NewServer()
	agentv1.RegisterAgentServiceServer(c.srv, c)
	go func() { _ = c.srv.Serve(lis) }()
	t.Cleanup(c.srv.Stop)
	return c
}

func (c *coordinator) Connect(st agentv1.AgentService_ConnectServer) error {
	c.mu.Lock()
	i := len(c.streams)
	c.streams = append(c.streams, nil)
	c.mu.Unlock()
	for first := true; ; first = false {
		m, err := st.Recv()
		if err != nil {
			return nil
		}
		c.mu.Lock()
		c.streams[i] = append(c.streams[i], m)
		c.mu.Unlock()
		if c.leader != "" {
			_ = st.SetHeader(nil)
			st.SetTrailer(metadata.Pairs(fault.LeaderTrailer, c.leader))
			return status.Error(codes.Unavailable, "not the leader")
		}
		if first && c.config != nil {
			if err := st.Send(&agentv1.ConnectResponse{Msg: &agentv1.ConnectResponse_Config{Config: c.config}}); err != nil {
				return err
			}
		}
		if first && c.grant != nil {
			if err := st.Send(&agentv1.ConnectResponse{Msg: &agentv1.ConnectResponse_Grant{Grant: c.grant}}); err != nil {
				return err
			}
		}
		if !c.noAck {
			if err := st.Send(&agentv1.ConnectResponse{Msg: &agentv1.ConnectResponse_Ack{Ack: &agentv1.Ack{AckedSeq: m.Seq}}}); err != nil {
				return err
			}
		}
	}
}

// received returns a copy of what every stream received so far.
func (c *coordinator) received() [][]*agentv1.ConnectRequest {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([][]*agentv1.ConnectRequest, len(c.streams))
	for i, s := range c.streams {
		out[i] = append([]*agentv1.ConnectRequest(nil), s...)
	}
	return out
}

// all returns every message of every stream, in order.
func (c *coordinator) all() []*agentv1.ConnectRequest {
	var out []*agentv1.ConnectRequest
	for _, s := range c.received() {
		out = append(out, s...)
	}
	return out
}

// eventually polls cond until it holds or ctx ends.
func eventually(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-tick.C:
		}
	}
}

type testLogWriter struct{ t *testing.T }

func (w testLogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

func testConfig(t *testing.T, addrs ...string) Config {
	return Config{
		Coordinators: addrs,
		TLS:          tlsfiles.Files{Insecure: true},
		NodeName:     "node-a1", BootID: "3f1c2d4e-0000-4000-8000-000000000001", Zone: "a", Region: "eu",
		Labels:            map[string]string{"rack": "r1"},
		Capacity:          &agentv1.Capacity{MemoryBytes: 16 << 30, CpuMillis: 2000, Pids: 4194304},
		HeartbeatInterval: time.Hour, SampleInterval: time.Hour, // the coordinator's config overrides
		MinBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
		Log: slog.New(slog.NewTextHandler(testLogWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
}

// fixtureSampler reads the signals package's v1 fixtures: memory.available = 13Gi of 16Gi.
var fixtureSampler = signals.HostSampler{Reader: signals.Reader{ProcRoot: "../signals/testdata/proc", CgroupRoot: "../signals/testdata/v1"}}

// start runs an agent until the end of the test.
func start(t *testing.T, cfg Config) *Agent {
	t.Helper()
	a, err := New(cfg, fixtureSampler)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run() = %v", err)
		}
	})
	return a
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func count(ms []*agentv1.ConnectRequest, pred func(*agentv1.ConnectRequest) bool) int {
	n := 0
	for _, m := range ms {
		if pred(m) {
			n++
		}
	}
	return n
}

// checkStream asserts the invariants of one stream: a Hello first (and only first) with the
// agent's identity, then strictly increasing seqs.
func checkStream(t *testing.T, cfg Config, ms []*agentv1.ConnectRequest) {
	t.Helper()
	if len(ms) == 0 {
		t.Fatal("empty stream")
	}
	h := ms[0].GetHello()
	if h == nil {
		t.Fatalf("first message is %v; want a hello", ms[0])
	}
	if h.NodeName != cfg.NodeName || h.BootId != cfg.BootID || h.Zone != cfg.Zone || h.Region != cfg.Region ||
		h.Labels["rack"] != "r1" || !proto.Equal(h.Capacity, cfg.Capacity) {
		t.Errorf("hello = %v; want the agent's identity", h)
	}
	for i := 1; i < len(ms); i++ {
		if ms[i].GetHello() != nil {
			t.Errorf("message %d is a second hello", i)
		}
		if ms[i].Seq <= ms[i-1].Seq {
			t.Errorf("seq %d at %d follows %d: not strictly increasing", ms[i].Seq, i, ms[i-1].Seq)
		}
	}
}

func TestAgentStreams(t *testing.T) {
	ctx := testCtx(t)
	c := (&coordinator{config: &agentv1.AgentConfig{
		HeartbeatInterval: durationpb.New(10 * time.Millisecond), SampleInterval: durationpb.New(10 * time.Millisecond), Epoch: 7,
	}}).serve(t, "127.0.0.1:0")
	cfg := testConfig(t, c.addr)
	a := start(t, cfg)

	// The agent's own intervals are an hour: several heartbeats and samples mean the coordinator's
	// AgentConfig was honoured.
	eventually(ctx, t, "3 heartbeats and 3 samples", func() bool {
		all := c.all()
		return count(all, isHeartbeat) >= 3 && count(all, isSample) >= 3
	})
	if !a.Connected() {
		t.Error("Connected() = false on a working stream")
	}
	streams := c.received()
	if len(streams) != 1 {
		t.Fatalf("%d streams; want 1", len(streams))
	}
	checkStream(t, cfg, streams[0])
	if h := streams[0][0].GetHello(); h.ResumeFromSeq != 0 || streams[0][0].Seq != 0 {
		t.Errorf("first hello: seq %d resume %d; want 0, 0", streams[0][0].Seq, h.ResumeFromSeq)
	}
	for _, m := range streams[0] {
		if s := m.GetSample(); s != nil {
			got := s.Signals[0]
			if got.Name != signals.MemoryAvailable || got.Available != 13<<30 || got.Capacity != 16<<30 {
				t.Errorf("sample signal = %v; want memory.available 13Gi of 16Gi", got)
			}
		}
	}

	// Events are sent, acked and leave the buffer.
	a.Send(&agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Condition{Condition: &agentv1.ConditionChange{
		Type: agentv1.ConditionType_CONDITION_TYPE_MEMORY_PRESSURE, Status: agentv1.ConditionStatus_CONDITION_STATUS_TRUE,
	}}})
	eventually(ctx, t, "the condition", func() bool { return count(c.all(), isCondition) == 1 })
	eventually(ctx, t, "an empty buffer", func() bool { return a.Unacked() == 0 })
}

func isCondition(m *agentv1.ConnectRequest) bool { return m.GetCondition() != nil }

func condition(reason string) *agentv1.ConnectRequest {
	return &agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Condition{Condition: &agentv1.ConditionChange{
		Type: agentv1.ConditionType_CONDITION_TYPE_PID_PRESSURE, Status: agentv1.ConditionStatus_CONDITION_STATUS_TRUE, Reason: reason,
	}}}
}

func reasons(ms []*agentv1.ConnectRequest) []string {
	var out []string
	for _, m := range ms {
		if c := m.GetCondition(); c != nil {
			out = append(out, fmt.Sprintf("%s@%d", c.Reason, m.Seq))
		}
	}
	return out
}

func TestAgentResendsAfterCoordinatorRestart(t *testing.T) {
	ctx := testCtx(t)
	// The first coordinator never acks: everything stays in the agent's buffer.
	c1 := (&coordinator{noAck: true, config: &agentv1.AgentConfig{
		HeartbeatInterval: durationpb.New(20 * time.Millisecond), SampleInterval: durationpb.New(20 * time.Millisecond),
	}}).serve(t, "127.0.0.1:0")
	cfg := testConfig(t, c1.addr)
	a := start(t, cfg)
	eventually(ctx, t, "a sample", func() bool { return count(c1.all(), isSample) >= 1 })
	for _, r := range []string{"First", "Second", "Third"} {
		a.Send(condition(r))
	}
	eventually(ctx, t, "three conditions", func() bool { return count(c1.all(), isCondition) == 3 })
	sent := reasons(c1.all())
	c1.srv.Stop()
	eventually(ctx, t, "the agent to notice", func() bool { return !a.Connected() })

	// A new coordinator on the same address, acking.
	c2 := (&coordinator{}).serve(t, c1.addr)
	eventually(ctx, t, "an empty buffer", func() bool {
		return len(c2.received()) > 0 && count(c2.all(), isCondition) >= 3 && a.Unacked() <= 1
	})
	s := c2.received()[0]
	checkStream(t, cfg, s)
	// Resent before anything new, in order, with their original seqs; ResumeFromSeq names the first.
	if got := reasons(s); strings.Join(got, " ") != strings.Join(sent, " ") {
		t.Errorf("resent conditions %v; want %v", got, sent)
	}
	h := s[0].GetHello()
	if h.ResumeFromSeq != s[1].Seq || s[0].Seq != h.ResumeFromSeq-1 {
		t.Errorf("hello seq %d resume_from_seq %d; first resent seq %d", s[0].Seq, h.ResumeFromSeq, s[1].Seq)
	}
	if h.ResumeFromSeq != c1.all()[1].Seq {
		t.Errorf("resume_from_seq %d; want the first message the old coordinator never acked (%d)", h.ResumeFromSeq, c1.all()[1].Seq)
	}
	eventually(ctx, t, "an empty buffer", func() bool { return a.Unacked() == 0 })
}

func TestAgentFollowsLeaderRedirect(t *testing.T) {
	ctx := testCtx(t)
	leader := (&coordinator{}).serve(t, "127.0.0.1:0")
	follower := (&coordinator{leader: leader.addr}).serve(t, "127.0.0.1:0")
	cfg := testConfig(t, follower.addr)
	cfg.MinBackoff, cfg.MaxBackoff = time.Minute, time.Minute // a redirect must not wait for the backoff
	a := start(t, cfg)
	eventually(ctx, t, "a hello at the leader", func() bool { return len(leader.all()) > 0 })
	eventually(ctx, t, "Connected()", a.Connected)
	if f := follower.received(); len(f) != 1 || f[0][0].GetHello() == nil {
		t.Errorf("follower streams = %v; want one that began with a hello", f)
	}
	checkStream(t, cfg, leader.received()[0])
}

func TestAgentRotatesCoordinators(t *testing.T) {
	ctx := testCtx(t)
	// A port nothing listens on.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := lis.Addr().String()
	lis.Close()
	live := (&coordinator{}).serve(t, "127.0.0.1:0")
	cfg := testConfig(t, dead, live.addr)
	cfg.MinBackoff, cfg.MaxBackoff = time.Minute, time.Minute // an address left to try must not wait
	a := start(t, cfg)
	eventually(ctx, t, "a hello at the second coordinator", func() bool { return len(live.all()) > 0 })
	eventually(ctx, t, "Connected()", a.Connected)
}

// After a redirect to a dead leader, the agent tries the next address at once (no backoff), and a
// follower's redirect after that is followed at once too.
func TestAgentSkipsADeadLeaderWithoutWaiting(t *testing.T) {
	ctx := testCtx(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := lis.Addr().String()
	lis.Close()
	live := (&coordinator{}).serve(t, "127.0.0.1:0")
	stale := (&coordinator{leader: dead}).serve(t, "127.0.0.1:0")
	fresh := (&coordinator{leader: live.addr}).serve(t, "127.0.0.1:0")
	cfg := testConfig(t, stale.addr, fresh.addr)
	cfg.MinBackoff, cfg.MaxBackoff = time.Minute, time.Minute
	a := start(t, cfg)
	eventually(ctx, t, "Connected() to the live leader", a.Connected)
	if len(live.all()) == 0 {
		t.Fatal("no hello at the live leader")
	}
}

func TestRoundNext(t *testing.T) {
	const minD, maxD = 100 * time.Millisecond, 10 * time.Second
	type step struct {
		res  result
		want next
		wait time.Duration // with u = 0: half the backoff
	}
	refused := result{}
	answered := result{answered: true}
	redirect := result{answered: true, leader: "l:1"}
	for _, tc := range []struct {
		name  string
		addrs int
		steps []step
	}{
		{"every address refused: growing waits", 3, []step{
			{refused, nextAddress, 0}, {refused, nextAddress, 0}, {refused, nextWait, 50 * time.Millisecond},
			{refused, nextAddress, 0}, {refused, nextAddress, 0}, {refused, nextWait, 100 * time.Millisecond},
			{refused, nextAddress, 0}, {refused, nextAddress, 0}, {refused, nextWait, 200 * time.Millisecond},
		}},
		{"followers answer during an election: short waits that stop growing", 2, []step{
			{answered, nextAddress, 0}, {answered, nextWait, 50 * time.Millisecond},
			{answered, nextAddress, 0}, {answered, nextWait, 100 * time.Millisecond},
			{answered, nextAddress, 0}, {answered, nextWait, 200 * time.Millisecond},
			{answered, nextAddress, 0}, {answered, nextWait, 200 * time.Millisecond},
			{answered, nextAddress, 0}, {answered, nextWait, 200 * time.Millisecond},
		}},
		{"redirect to a dead leader, then the next address at once", 3, []step{
			{redirect, nextLeader, 0}, {refused, nextAddress, 0}, {redirect, nextLeader, 0}, {refused, nextAddress, 0},
			{redirect, nextLeader, 0}, {refused, nextWait, 50 * time.Millisecond},
			{refused, nextAddress, 0}, {redirect, nextLeader, 0}, {answered, nextAddress, 0},
			{redirect, nextLeader, 0}, {refused, nextWait, 100 * time.Millisecond},
		}},
		{"a stream that worked resets the round", 2, []step{
			{refused, nextAddress, 0}, {refused, nextWait, 50 * time.Millisecond},
			{refused, nextAddress, 0}, {refused, nextWait, 100 * time.Millisecond},
			{result{worked: true}, nextSame, 0}, {refused, nextAddress, 0}, {refused, nextWait, 50 * time.Millisecond},
		}},
		{"a leader that stepped down naming another is followed", 2, []step{
			{result{worked: true, answered: true, leader: "l:2"}, nextLeader, 0},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r round
			for i, s := range tc.steps {
				got, wait := r.next(s.res, tc.addrs, minD, maxD, 0)
				if got != s.want || wait != s.wait {
					t.Fatalf("step %d (%+v): next = %v, wait %s; want %v, %s", i, s.res, got, wait, s.want, s.wait)
				}
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	good := testConfig(t, "127.0.0.1:7400", "dns:///coordinator:7400")
	if err := good.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	bad := Config{
		Coordinators: []string{"", "nohost", "a b:1"},
		NodeName:     "Node_A", BootID: "x y", Zone: "bad zone", Region: strings.Repeat("r", 64),
		Labels:            map[string]string{"/x": "v", "ok": "-bad"},
		Capacity:          &agentv1.Capacity{Pids: -1},
		HeartbeatInterval: -time.Second, SampleInterval: -time.Second,
		MinBackoff: time.Second, MaxBackoff: time.Millisecond, BufferSize: -1,
	}
	err := bad.Validate()
	inv, ok := err.(fault.Invalid)
	if !ok {
		t.Fatalf("Validate() = %v (%T); want fault.Invalid", err, err)
	}
	var fields []string
	for _, fe := range inv {
		fields = append(fields, fe.Field)
	}
	want := "BootID BufferSize Capacity Coordinators[0] Coordinators[1] Coordinators[2] HeartbeatInterval Labels Labels MaxBackoff NodeName Region SampleInterval TLS Zone"
	if got := strings.Join(fields, " "); got != want {
		t.Errorf("fields:\n got %s\nwant %s\n(%v)", got, want, err)
	}
	if err := (Config{}).Validate(); err == nil || !strings.Contains(err.Error(), "Coordinators: at least one") {
		t.Errorf("empty config: %v", err)
	}
	if _, err := New(good, nil); err == nil {
		t.Error("New without a sampler: no error")
	}
}

// grantRecorder is a GrantHandler that keeps the grants.
type grantRecorder struct {
	mu     sync.Mutex
	grants []*agentv1.EvictionGrant
}

func (g *grantRecorder) Grant(gr *agentv1.EvictionGrant) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.grants = append(g.grants, gr)
}

func (g *grantRecorder) got() []*agentv1.EvictionGrant {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]*agentv1.EvictionGrant(nil), g.grants...)
}

// TestGrantsReachTheHandler: the coordinator's EvictionGrant is handed to Config.Grants.
func TestGrantsReachTheHandler(t *testing.T) {
	ctx := testCtx(t)
	grant := &agentv1.EvictionGrant{Signal: "memory.available", Pods: []*agentv1.EvictionCandidate{
		{Namespace: "default", Name: "web-0", Uid: "u1", GracePeriod: durationpb.New(0)}}}
	c := (&coordinator{grant: grant}).serve(t, "127.0.0.1:0")
	h := &grantRecorder{}
	cfg := testConfig(t, c.addr)
	cfg.Grants = h
	start(t, cfg)
	eventually(ctx, t, "the grant", func() bool { return len(h.got()) > 0 })
	if got := h.got()[0]; !proto.Equal(got, grant) {
		t.Errorf("grant = %v; want %v", got, grant)
	}
}
