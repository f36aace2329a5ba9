// Package loop owns the coordinator engine for one leadership term. Agent streams and API handlers
// hand inputs and queries to the loop goroutine; the one exception is the hot path (Observe), where a
// stream records a heartbeat or signal sample of a known node itself, under the loop's engine lock,
// instead of waiting for the loop goroutine to be scheduled. The loop ticks the engine,
// persists its writes under the leader's epoch BEFORE anything else leaves the engine, then queues
// the eviction grants on their nodes' agent streams (Subscribe), passes the other decisions to
// OnReady, and keeps the Prometheus zone metrics current. A save etcd is slow to take is retried and
// one it refuses is left out (persistOps): after its first read of etcd, only the end of the term (or
// of its context) or a deposed write stops the loop.
package loop

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/coordinator/leader"
	"github.com/nodefence/nodefence/coordinator/store"
	"github.com/nodefence/nodefence/services/clock"
	"github.com/nodefence/nodefence/services/fault"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

// Config configures a loop.
type Config struct {
	// Engine is the engine configuration.
	Engine engine.Config
	// Term is the leadership term the loop runs in; the loop stops when it ends.
	Term *leader.Term
	// Store holds the persisted engine state: the loop restores it at the start and saves the
	// engine's writes there.
	Store *store.Store
	// TickInterval is how often time-based decisions are made (100 ms, like the controller's passes).
	TickInterval time.Duration
	// Initial inputs applied after LeaderElected and the restore (configured nodes).
	Initial []engine.Input
	// OnReady receives the engine's decisions after their writes were persisted. It runs on the
	// loop goroutine and must not block for long.
	OnReady func(engine.Ready)
	// Metrics receives the loop's collectors; nil skips metrics.
	Metrics *Metrics
	// Audit, if set, hears of each engine event once its batch's state is persisted, to append it
	// to the audit trail in writes of its own that never hold the state back; it must not block
	// (store.AuditWriter.Append).
	Audit func(ev engine.Event)
	Log   *slog.Logger
	// Now is the clock the engine is ticked with and the ingest latencies are measured by; nil
	// means time.Now. It must be the clock the inputs are stamped with (api.Deps.Now).
	Now func() time.Time
	// After waits on Now's clock (the pause before a failed write is retried); nil waits on the
	// machine's timers.
	After func(time.Duration) <-chan time.Time
}

func (l *Loop) now() time.Time {
	clock := l.cfg.Now
	if clock == nil {
		clock = time.Now
	}
	return clock()
}

// Loop is the running owner of one engine.
type Loop struct {
	cfg     Config
	in      chan engine.Input
	queries chan func(*engine.Engine)
	done    chan struct{}
	err     error

	// mu guards eng. The loop goroutine holds it for every engine call except while it persists a
	// batch: Observe, the only other caller, never touches what Ready reports.
	mu      sync.Mutex
	eng     *engine.Engine
	stopped bool

	outMu sync.Mutex
	out   map[string]*outbox // node -> its latest agent stream's outbound queue (outbox.go)
}

// New returns a loop; Run starts it.
func New(cfg Config) *Loop {
	if cfg.TickInterval == 0 {
		cfg.TickInterval = 100 * time.Millisecond
	}
	return &Loop{cfg: cfg, in: make(chan engine.Input, 1<<16), queries: make(chan func(*engine.Engine)), done: make(chan struct{})}
}

// ErrStopped is returned to callers of a loop whose term has ended.
var ErrStopped = &fault.NotLeaderError{}

// Step hands an input to the loop. It blocks while the loop's queue is full (back-pressure on the
// agent streams) and fails once the loop has stopped.
func (l *Loop) Step(ctx context.Context, in engine.Input) error {
	select {
	case <-l.done:
		return ErrStopped
	default:
	}
	select {
	case l.in <- in:
		return nil
	case <-l.done:
		return ErrStopped
	case <-ctx.Done():
		return ctx.Err()
	}
}

// StepSync is Step, returning only after the input was applied and the state it changed was
// persisted: an agent event acknowledged after StepSync survives a failover.
func (l *Loop) StepSync(ctx context.Context, in engine.Input) error {
	done := make(chan struct{})
	select {
	case l.in <- wrapSynced(in, done):
	case <-l.done:
		return ErrStopped
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-done:
		return nil
	case <-l.done:
		return ErrStopped
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Observe records a heartbeat (sample nil) or signal sample of a node at once, on the caller's
// goroutine. It returns false, having changed nothing, while the loop has no engine yet or the node
// is unknown to it; the caller then steps a Message instead. It fails once the loop has stopped.
func (l *Loop) Observe(node string, at time.Time, sample *agentv1.SignalSample) (bool, error) {
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		return false, ErrStopped
	}
	applied := l.eng != nil && l.eng.Observe(node, at, sample)
	l.mu.Unlock()
	if !applied {
		return false, nil
	}
	l.observed(at, sample) // the metrics are safe for concurrent use: the other streams need not wait
	return true, nil
}

// observed updates the ingest metrics for one heartbeat or sample received at at.
func (l *Loop) observed(at time.Time, sample *agentv1.SignalSample) {
	m := l.cfg.Metrics
	if m == nil {
		return
	}
	now := l.now() // one reading for both latencies: a clock reading per update is not free
	if sample != nil && sample.ObservedAt != nil {
		m.ApplyLatency.Observe(now.Sub(sample.ObservedAt.AsTime()).Seconds())
	}
	m.QueueLatency.Observe(now.Sub(at).Seconds())
	m.Updates.Inc()
}

// Query runs f on the loop goroutine with the engine and waits for it.
func (l *Loop) Query(ctx context.Context, f func(*engine.Engine)) error {
	ran := make(chan struct{})
	select {
	case l.queries <- func(e *engine.Engine) { f(e); close(ran) }:
	case <-l.done:
		return ErrStopped
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-ran:
		return nil
	case <-l.done:
		return ErrStopped
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Done is closed when the loop has stopped.
func (l *Loop) Done() <-chan struct{} { return l.done }

// Err is why the loop stopped (after Done).
func (l *Loop) Err() error { return l.err }

// Run owns the engine until the term ends or ctx is cancelled.
func (l *Loop) Run(ctx context.Context) error {
	defer close(l.done)
	defer func() {
		l.mu.Lock()
		l.stopped = true
		l.mu.Unlock()
	}()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The term's end ends the loop, without a goroutine that could outlive it.
	defer context.AfterFunc(l.cfg.Term.Context(), cancel)()
	e, err := l.start(ctx)
	if err != nil {
		l.err = err
		return err
	}
	tick := time.NewTicker(l.cfg.TickInterval)
	defer tick.Stop()
	var waiting []chan struct{}
	l.mu.Lock()
	defer l.mu.Unlock() // the loop goroutine holds the engine lock except while it waits or persists
	l.eng = e
	for {
		l.mu.Unlock()
		select {
		case <-ctx.Done():
			l.mu.Lock()
			l.err = ctx.Err()
			return nil
		case in := <-l.in:
			l.mu.Lock()
			waiting = l.apply(e, in, waiting)
			// Drain what is already queued before flushing: one flush per batch.
			for drained := 0; drained < 4096; drained++ {
				select {
				case in := <-l.in:
					waiting = l.apply(e, in, waiting)
					continue
				default:
				}
				break
			}
		case q := <-l.queries:
			l.mu.Lock()
			q(e)
		case <-tick.C:
			l.mu.Lock()
			e.Tick(l.now())
			if l.cfg.Metrics != nil {
				l.cfg.Metrics.observeZones(e)
			}
		}
		if err := l.flush(ctx, e); err != nil {
			l.err = err
			if errors.Is(err, leader.ErrDeposed) || ctx.Err() != nil {
				return nil
			}
			return err
		}
		for _, w := range waiting {
			close(w)
		}
		waiting = waiting[:0]
	}
}

// start makes the term's engine: elected now, restored from the store (the persisted node
// records and the pause flag), then given the initial inputs (step 1 of the engine's Ready
// contract).
func (l *Loop) start(ctx context.Context) (*engine.Engine, error) {
	e := engine.New(l.cfg.Engine)
	e.Step(engine.LeaderElected{At: l.now()})
	st, err := l.cfg.Store.LoadEngineState(ctx)
	if err != nil {
		return nil, err
	}
	e.Step(engine.Restored{Nodes: l.nodeRecords(st.Nodes)})
	e.Step(engine.Paused{Paused: st.Paused, Note: st.PauseNote})
	for _, in := range l.cfg.Initial {
		e.Step(in)
	}
	return e, nil
}

// nodeRecords decodes the stored node records, skipping (and logging) any that is not one.
func (l *Loop) nodeRecords(raw []json.RawMessage) []engine.NodeRecord {
	recs := make([]engine.NodeRecord, 0, len(raw))
	for _, b := range raw {
		var r engine.NodeRecord
		if err := json.Unmarshal(b, &r); err != nil || r.Name == "" {
			l.cfg.Log.Warn("skipping unreadable node record", "record", string(b[:min(len(b), 200)]), "err", err)
			continue
		}
		recs = append(recs, r)
	}
	return recs
}

// stateWrites are the engine's writes as the store persists them.
func stateWrites(writes []engine.Write) []store.StateWrite {
	out := make([]store.StateWrite, 0, len(writes))
	for _, w := range writes {
		switch {
		case w.Node != nil:
			out = append(out, store.StateWrite{Node: w.Node.Name, Record: w.Node})
		case w.Zone != nil:
			out = append(out, store.StateWrite{Zone: w.Zone.Key, Record: w.Zone})
		case w.Halted != nil:
			out = append(out, store.StateWrite{Halted: w.Halted})
		case w.Forget != "":
			out = append(out, store.StateWrite{Forget: w.Forget})
		}
	}
	return out
}

// syncedInput carries a StepSync input through the same queue as every other input, so it is
// applied in order.
type syncedInput struct {
	engine.Input
	done chan struct{}
}

func wrapSynced(in engine.Input, done chan struct{}) engine.Input { return syncedInput{in, done} }

func (l *Loop) apply(e *engine.Engine, in engine.Input, waiting []chan struct{}) []chan struct{} {
	if s, ok := in.(syncedInput); ok {
		waiting = append(waiting, s.done)
		in = s.Input
	}
	if m, ok := in.(engine.Message); ok {
		l.observed(m.At, m.Msg.GetSample())
	}
	e.Step(in)
	return waiting
}

// flush persists the engine's writes, then hands the rest to OnReady, then advances. It is called
// with the engine lock held and releases it while it persists and hands over the batch.
func (l *Loop) flush(ctx context.Context, e *engine.Engine) error {
	rd := e.Ready()
	if rd.Empty() {
		return nil
	}
	l.mu.Unlock()
	err := l.handOver(ctx, rd)
	l.mu.Lock()
	if err != nil {
		return err
	}
	e.Advance()
	return nil
}

// handOver persists a batch's writes and then passes its decisions on.
func (l *Loop) handOver(ctx context.Context, rd engine.Ready) error {
	if err := l.persist(ctx, rd.Writes); err != nil {
		return err
	}
	l.audit(rd)
	if l.cfg.Metrics != nil {
		for _, ev := range rd.Evictions {
			l.cfg.Metrics.Evictions.WithLabelValues(ev.Zone).Inc()
		}
		for _, sk := range rd.Skips {
			l.cfg.Metrics.FenceSkips.WithLabelValues(sk.Kind).Inc()
		}
		for _, f := range rd.Fences {
			if !f.Observe { // a would-fence is counted apart (nodefence_would_fence_total)
				l.cfg.Metrics.FenceRequests.Inc()
			}
		}
	}
	for _, g := range rd.Grants {
		l.deliver(g)
	}
	if l.cfg.OnReady != nil {
		l.cfg.OnReady(rd)
	}
	return nil
}

// maxOps stays under etcd's default --max-txn-ops (128) with room for the guard.
const maxOps = 100

// persist writes the engine's writes, in batches under etcd's limit of operations per
// transaction. The audit entries of the batch's events are not among them (audit.go).
func (l *Loop) persist(ctx context.Context, writes []engine.Write) error {
	ops := l.cfg.Store.StateOps(stateWrites(writes))
	for len(ops) > 0 {
		n := min(len(ops), maxOps)
		if err := l.persistOps(ctx, ops[:n]); err != nil {
			return err
		}
		ops = ops[n:]
	}
	return nil
}

// persistOps writes one batch under the term. One failed save never ends the term by itself: a
// failure etcd may get over (slow, briefly away) is retried with a growing pause for as long as the
// term lasts — the batch's decisions wait for their writes, and a leader that cannot reach etcd
// steps down through its lease, not here. A batch etcd refuses outright (a record over its request
// size) is written one operation at a time, and an operation refused alone is logged and left out:
// the engine's state of one node is then not durable (a new leader re-learns it from the agent),
// and everything else is.
func (l *Loop) persistOps(ctx context.Context, ops []clientv3.Op) error {
	wait := 100 * time.Millisecond
	for {
		_, err := l.cfg.Term.Txn(ctx, nil, ops...)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, leader.ErrDeposed) || ctx.Err() != nil:
			return fmt.Errorf("persist engine state: %w", err)
		case refused(err) && len(ops) > 1:
			for _, op := range ops {
				if err := l.persistOps(ctx, []clientv3.Op{op}); err != nil {
					return err
				}
			}
			return nil
		case refused(err):
			l.cfg.Log.Error("etcd refused an engine state write; left out", "key", string(ops[0].KeyBytes()), "err", err)
			return nil
		}
		l.cfg.Log.Warn("cannot persist the engine's decisions; retrying before acting on them", "err", err, "retry_in", wait)
		select {
		case <-ctx.Done():
			return fmt.Errorf("persist engine state: %w", ctx.Err())
		case <-clock.Of(l.cfg.Now, l.cfg.After).After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// refused reports an error etcd gives the same request every time.
func refused(err error) bool {
	return errors.Is(err, rpctypes.ErrRequestTooLarge) || errors.Is(err, rpctypes.ErrTooManyOps) ||
		errors.Is(err, rpctypes.ErrGRPCRequestTooLarge) ||
		status.Code(err) == codes.ResourceExhausted || status.Code(err) == codes.InvalidArgument
}

// IsEvent reports whether an agent message must be acknowledged at once (everything but
// heartbeats and samples, which may be acknowledged in batches).
func IsEvent(m *agentv1.ConnectRequest) bool {
	switch m.GetMsg().(type) {
	case *agentv1.ConnectRequest_Heartbeat, *agentv1.ConnectRequest_Sample:
		return false
	}
	return true
}
