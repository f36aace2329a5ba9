package loop

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/coordinator/leader"
	"github.com/nodefence/nodefence/coordinator/store"
	"github.com/nodefence/nodefence/testbed/etcdtest"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// A node goes silent and is released (tainted) under one leader; another node announces shutdown.
// A new leader's loop restores both from etcd: the silent node stays Unknown and tainted without
// being released a second time, and the shutting-down node is still known to be shutting down.
// Meanwhile the deposed loop's writes are refused and it stops.
func TestStateSurvivesLeaderChange(t *testing.T) {
	endpoint, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	cfg := engine.DefaultConfig()
	cfg.NodeMonitorGracePeriod = 300 * time.Millisecond
	cfg.NodeStartupGracePeriod = 300 * time.Millisecond

	term1, err := leader.NewElector(cli, "/t/leader", leader.Info{ID: "one"}, 1, log).Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var released []string
	l1 := New(Config{Engine: cfg, Term: term1, Store: store.New(cli, "/t"), TickInterval: 20 * time.Millisecond, Log: log,
		OnReady: func(r engine.Ready) {
			for _, ev := range r.Evictions {
				released = append(released, ev.Node)
			}
		}})
	go l1.Run(ctx)
	now := time.Now()
	for _, n := range []string{"a", "b", "c"} {
		if err := l1.StepSync(ctx, engine.Hello{Node: n, Zone: "z", BootID: "boot", At: now}); err != nil {
			t.Fatal(err)
		}
	}
	shutdown := &agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Shutdown{Shutdown: &agentv1.ShutdownEvent{Phase: agentv1.ShutdownPhase_SHUTDOWN_PHASE_STARTED}}}
	if err := l1.StepSync(ctx, engine.Message{Node: "b", At: time.Now(), Msg: shutdown}); err != nil {
		t.Fatal(err)
	}
	// c keeps talking; a is silent until it is released.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := l1.Step(ctx, engine.Message{Node: "c", At: time.Now(), Msg: &agentv1.ConnectRequest{}}); err != nil {
			t.Fatal(err)
		}
		var done bool
		l1.Query(ctx, func(e *engine.Engine) { done = len(released) > 0 })
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a was never released")
		}
		time.Sleep(20 * time.Millisecond)
	}
	var first []string
	l1.Query(ctx, func(*engine.Engine) { first = append(first, released...) })
	if len(first) != 1 || first[0] != "a" {
		t.Fatalf("released %v, want [a]", first)
	}

	// Leadership moves: the first term is abandoned and a second replica takes over.
	term1.Abandon()
	term2, err := leader.NewElector(etcdtest.Client(t, endpoint), "/t/leader", leader.Info{ID: "two"}, 1, log).Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var released2 []string
	l2 := New(Config{Engine: cfg, Term: term2, Store: store.New(cli, "/t"), TickInterval: 20 * time.Millisecond, Log: log,
		OnReady: func(r engine.Ready) {
			for _, ev := range r.Evictions {
				released2 = append(released2, ev.Node)
			}
		}})
	go l2.Run(ctx)
	select {
	case <-l1.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the deposed loop did not stop")
	}
	if err := l1.Step(ctx, engine.Paused{}); !errors.Is(err, ErrStopped) {
		t.Fatalf("Step on a stopped loop: %v", err)
	}
	// Let the new term's grace period pass with c talking.
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		l2.Step(ctx, engine.Message{Node: "c", At: time.Now(), Msg: &agentv1.ConnectRequest{}})
	}
	var nodes []*coordv1.Node
	var again []string
	if err := l2.Query(ctx, func(e *engine.Engine) { nodes, again = e.Nodes(), append(again, released2...) }); err != nil {
		t.Fatal(err)
	}
	got := map[string]*coordv1.Node{}
	for _, n := range nodes {
		got[n.Name] = n
	}
	if got["a"].GetReadiness() != coordv1.Readiness_READINESS_UNKNOWN {
		t.Errorf("a after failover: %v", got["a"])
	}
	if !got["b"].GetShuttingDown() || got["b"].GetReadiness() == coordv1.Readiness_READINESS_READY {
		t.Errorf("b after failover: %v, want shutting down and not ready", got["b"])
	}
	if got["c"].GetReadiness() != coordv1.Readiness_READINESS_READY {
		t.Errorf("c after failover: %v", got["c"])
	}
	if len(again) != 0 {
		t.Errorf("the new leader released %v again; a's taint was already granted", again)
	}
}

// The hot path records a known node's samples and contact on the caller's goroutine, refuses
// unknown nodes without inventing them, and fails once the term is over. Samples observed while the
// loop persists a batch (a shutdown announcement) are neither lost nor persisted by accident.
func TestObserve(t *testing.T) {
	_, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	term, err := leader.NewElector(cli, "/o/leader", leader.Info{ID: "one"}, 1, log).Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l := New(Config{Engine: engine.DefaultConfig(), Term: term, Store: store.New(cli, "/o"), TickInterval: 10 * time.Millisecond, Log: log})
	if ok, err := l.Observe("a", time.Now(), nil); ok || err != nil {
		t.Fatalf("Observe before the loop runs: %v, %v; want false, nil", ok, err)
	}
	lctx, stop := context.WithCancel(ctx)
	go l.Run(lctx)
	if err := l.StepSync(ctx, engine.Hello{Node: "a", Zone: "z", BootID: "boot", At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if ok, err := l.Observe("ghost", time.Now(), nil); ok || err != nil {
		t.Fatalf("Observe of an unknown node: %v, %v; want false, nil", ok, err)
	}
	shutdown := &agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Shutdown{Shutdown: &agentv1.ShutdownEvent{Phase: agentv1.ShutdownPhase_SHUTDOWN_PHASE_STARTED}}}
	synced := make(chan error, 1)
	go func() { synced <- l.StepSync(ctx, engine.Message{Node: "a", At: time.Now(), Msg: shutdown}) }()
	var last time.Time
	for i := int64(1); i <= 200; i++ {
		last = time.Now()
		sample := &agentv1.SignalSample{Signals: []*agentv1.Signal{{Name: "memory.available", Available: i}}}
		if ok, err := l.Observe("a", last, sample); !ok || err != nil {
			t.Fatalf("Observe %d: %v, %v", i, ok, err)
		}
	}
	if err := <-synced; err != nil {
		t.Fatal(err)
	}
	var n *coordv1.Node
	var ghost *coordv1.Node
	if err := l.Query(ctx, func(e *engine.Engine) { n, ghost = e.Node("a"), e.Node("ghost") }); err != nil {
		t.Fatal(err)
	}
	if got := n.GetSignals()["memory.available"]; got != 200 {
		t.Errorf("memory.available = %d, want the last sample's 200", got)
	}
	if n.GetLastSeen().AsTime().Before(last) {
		t.Errorf("last contact %v, want at least the last sample's %v", n.GetLastSeen().AsTime(), last)
	}
	if !n.GetShuttingDown() {
		t.Errorf("the shutdown announcement applied alongside the samples was lost: %v", n)
	}
	if ghost != nil {
		t.Errorf("Observe invented a node: %v", ghost)
	}
	stop()
	<-l.Done()
	if _, err := l.Observe("a", time.Now(), nil); !errors.Is(err, ErrStopped) {
		t.Fatalf("Observe on a stopped loop: %v; want ErrStopped", err)
	}
}

// A node whose Node object was deleted is forgotten by the engine and its persisted record is
// deleted, so the next leader does not restore it into its old zone.
func TestRemovedNodeRecordIsDeleted(t *testing.T) {
	_, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	term, err := leader.NewElector(cli, "/r/leader", leader.Info{ID: "one"}, 1, log).Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st := store.New(cli, "/r")
	l := New(Config{Engine: engine.DefaultConfig(), Term: term, Store: st, TickInterval: 20 * time.Millisecond, Log: log})
	go l.Run(ctx)
	shutdown := &agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Shutdown{Shutdown: &agentv1.ShutdownEvent{Phase: agentv1.ShutdownPhase_SHUTDOWN_PHASE_STARTED}}}
	if err := l.StepSync(ctx, engine.Hello{Node: "gone", Zone: "z", At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := l.StepSync(ctx, engine.Message{Node: "gone", At: time.Now(), Msg: shutdown}); err != nil {
		t.Fatal(err)
	}
	if nodes, err := storedNodes(ctx, st); err != nil || len(nodes) != 1 || nodes[0] != "gone" {
		t.Fatalf("records before removal: %v, %v; want gone's", nodes, err)
	}
	if err := l.StepSync(ctx, engine.Removed{Node: "gone", At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if nodes, err := storedNodes(ctx, st); err != nil || len(nodes) != 0 {
		t.Fatalf("records after removal: %v, %v; want none", nodes, err)
	}
}

// One node's failed save never ends the term: a record etcd refuses (over its request size) is left
// out and logged, the batch's other writes are saved, and the loop goes on leading.
func TestRefusedWriteDoesNotEndTheTerm(t *testing.T) {
	_, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	term, err := leader.NewElector(cli, "/r/leader", leader.Info{ID: "one"}, 5, log).Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st := store.New(cli, "/r")
	l := New(Config{Engine: engine.DefaultConfig(), Term: term, Store: st, TickInterval: time.Second, Log: log})
	huge := &engine.NodeRecord{Name: "huge", Reason: strings.Repeat("x", 3<<20)}
	fine := &engine.NodeRecord{Name: "fine", Zone: "z"}
	if err := l.persist(ctx, []engine.Write{{Node: huge}, {Node: fine}}); err != nil {
		t.Fatalf("persist with one refused record: %v", err)
	}
	nodes, err := storedNodes(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 1 || nodes[0] != "fine" {
		t.Fatalf("saved %v, want only the fine record", nodes)
	}
	if term.Context().Err() != nil {
		t.Fatal("the term ended")
	}
}

// storedNodes names the nodes whose engine records are stored.
func storedNodes(ctx context.Context, st *store.Store) ([]string, error) {
	es, err := st.LoadEngineState(ctx)
	var names []string
	for _, n := range es.Nodes {
		var r engine.NodeRecord
		if err := json.Unmarshal(n, &r); err != nil {
			return nil, err
		}
		names = append(names, r.Name)
	}
	return names, err
}

// The loop ticks the engine with its injected clock (the clock the API stamps inputs with): moving
// that clock past the grace period makes a node Unknown, although no real time passed.
func TestTicksReadTheInjectedClock(t *testing.T) {
	_, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	term, err := leader.NewElector(cli, "/c/leader", leader.Info{ID: "one"}, 1, log).Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	cfg := engine.DefaultConfig()
	l := New(Config{Engine: cfg, Term: term, Store: store.New(cli, "/c"), TickInterval: 10 * time.Millisecond, Log: log, Now: clock})
	go l.Run(ctx)
	if err := l.StepSync(ctx, engine.Hello{Node: "a", Zone: "z", BootID: "boot", At: clock()}); err != nil {
		t.Fatal(err)
	}
	readiness := func() coordv1.Readiness {
		var r coordv1.Readiness
		if err := l.Query(ctx, func(e *engine.Engine) { r = e.Node("a").GetReadiness() }); err != nil {
			t.Fatal(err)
		}
		return r
	}
	time.Sleep(50 * time.Millisecond) // a few ticks at the same injected time: nothing changes
	if r := readiness(); r != coordv1.Readiness_READINESS_READY {
		t.Fatalf("readiness %s before the clock moved, want ready", r)
	}
	mu.Lock()
	now = now.Add(cfg.NodeMonitorGracePeriod + time.Second)
	mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for r := readiness(); r != coordv1.Readiness_READINESS_UNKNOWN; r = readiness() {
		if time.Now().After(deadline) {
			t.Fatalf("readiness %s after the injected clock passed the grace period, want unknown", r)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
