package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/time/rate"

	"github.com/nodefence/nodefence/coordinator/leader"
)

// Registration is what the leader persists about a node when its agent says hello (the engine's
// own record of the node is engine.NodeRecord, under state/nodes/).
type Registration struct {
	Name   string `json:"name"`
	BootID string `json:"boot_id"`
	Zone   string `json:"zone"`
	Region string `json:"region"`
}

// RegistrationLimits bound how often one node's registration is rewritten. An agent's hello is
// one per stream, and a stream is cheap to open: an agent certificate reconnecting in a loop with a
// new boot id each time would otherwise write one etcd revision per hello. A real node changes its
// registration when it boots again or moves (a few times a day); the burst covers a node that
// reboots a few times in a row.
type RegistrationLimits struct {
	// Rate is the registration writes per second one node may cause (0.1: one every 10 s).
	Rate float64
	// Burst is how many it may cause at once after a quiet spell (3).
	Burst int
}

// Defaults of RegistrationLimits.
const (
	DefaultRegistrationRate  = 0.1
	DefaultRegistrationBurst = 3
)

// SetDefaults fills the zero (or negative) fields.
func (l *RegistrationLimits) SetDefaults() {
	if l.Rate <= 0 {
		l.Rate = DefaultRegistrationRate
	}
	if l.Burst <= 0 {
		l.Burst = DefaultRegistrationBurst
	}
}

// RegistrationsHeld is how many registration writes the per-node limit held back since the store
// started (each one was superseded by, or waits for, the node's next hello).
func (s *Store) RegistrationsHeld() int64 { return s.regHeld.Load() }

// PutNodeIfChanged writes the node's registration when it differs from what is stored, at most
// as often as its node's RegistrationLimits allow (at now): a write over the limit is held back —
// counted in RegistrationsHeld, nothing written — and the node's next hello with a token left
// writes its newest registration. Nothing decides by the stored registration (the engine keeps a
// node's boot in its own record), so one held back only delays what the store shows.
//
// Registrations are read once per term (one range read) and compared in memory: after a failover
// every agent says hello again, and a write for each would be thousands of etcd proposals for
// nothing; an unchanged registration takes no token.
func (s *Store) PutNodeIfChanged(ctx context.Context, t *leader.Term, n Registration, now time.Time) error {
	raw, err := json.Marshal(n)
	if err != nil {
		return err
	}
	data := string(raw)
	if same, err := s.storedNode(ctx, t, n.Name, data); err != nil || same {
		return err
	}
	if !s.takeRegistration(n.Name, now) {
		s.regHeld.Add(1)
		return nil
	}
	s.queueRegistration(t, n.Name, data)
	return nil
}

// Registrations are written behind the hello, in batches: when a fleet connects at once (a new
// leader, a restarted coordinator) one etcd transaction carries up to maxRegistrationBatch of them
// instead of one transaction each, and no hello waits for, or fails on, its registration's write.
// A registration whose write fails stays unwritten (logged, counted in RegistrationsFailed); the
// node's next hello writes it, as the cache still shows the old one.
const (
	maxRegistrationBatch = 100                  // under etcd's default --max-txn-ops (128)
	registrationGather   = 5 * time.Millisecond // how long a batch waits for company
)

// regQueue is one term's registrations waiting to be written, the newest per node.
type regQueue struct {
	term    *leader.Term
	pending map[string]string // node -> registration (JSON)
	busy    int               // batches being written
	kick    chan struct{}
}

// queueRegistration queues node's registration for term t's writer, starting the writer for a new
// term; the writer ends with the term.
func (s *Store) queueRegistration(t *leader.Term, node, data string) {
	s.regMu.Lock()
	q := s.regQ
	if q == nil || q.term != t {
		q = &regQueue{term: t, pending: map[string]string{}, kick: make(chan struct{}, 1)}
		s.regQ = q
		go s.writeRegistrations(q)
	}
	q.pending[node] = data
	s.regMu.Unlock()
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

// writeRegistrations writes q's registrations in batches until its term ends.
func (s *Store) writeRegistrations(q *regQueue) {
	ctx := q.term.Context()
	gather := time.NewTimer(registrationGather)
	defer gather.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-q.kick:
		}
		gather.Reset(registrationGather)
		select {
		case <-ctx.Done():
			return
		case <-gather.C:
		}
		for s.writeRegistrationBatch(ctx, q) {
		}
	}
}

// writeRegistrationBatch writes up to maxRegistrationBatch of q's registrations in one
// transaction; it reports whether it took any.
func (s *Store) writeRegistrationBatch(ctx context.Context, q *regQueue) bool {
	s.regMu.Lock()
	batch := make(map[string]string, min(len(q.pending), maxRegistrationBatch))
	q.busy++
	defer func() {
		s.regMu.Lock()
		q.busy--
		s.regMu.Unlock()
	}()
	for node, data := range q.pending {
		if len(batch) == maxRegistrationBatch {
			break
		}
		batch[node] = data
		delete(q.pending, node)
	}
	s.regMu.Unlock()
	if len(batch) == 0 {
		return false
	}
	ops := make([]clientv3.Op, 0, len(batch))
	for node, data := range batch {
		ops = append(ops, clientv3.OpPut(s.nodeKey(node), data))
	}
	wctx, cancel := context.WithTimeout(ctx, registrationWriteTimeout)
	_, err := q.term.Txn(wctx, nil, ops...)
	cancel()
	if err != nil {
		s.regFailed.Add(int64(len(ops)))
		if s.Log != nil && ctx.Err() == nil {
			s.Log.Warn("node registrations not written; the nodes' next hellos write them", "registrations", len(ops), "err", err)
		}
		return true
	}
	s.nodesMu.Lock()
	if s.nodesEpoch == q.term.Epoch {
		for node, data := range batch {
			s.nodes[node] = data
		}
	}
	s.nodesMu.Unlock()
	return true
}

// FlushRegistrations writes the registrations queued so far and waits for the batches being
// written (tests, and a caller that wants the store to show every hello).
func (s *Store) FlushRegistrations(ctx context.Context) error {
	s.regMu.Lock()
	q := s.regQ
	s.regMu.Unlock()
	if q == nil {
		return nil
	}
	for s.writeRegistrationBatch(ctx, q) {
	}
	for {
		s.regMu.Lock()
		busy := q.busy
		s.regMu.Unlock()
		if busy == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

// registrationWriteTimeout bounds one batch's write.
const registrationWriteTimeout = 10 * time.Second

// RegistrationsFailed is how many registration writes failed since the store started.
func (s *Store) RegistrationsFailed() int64 { return s.regFailed.Load() }

// takeRegistration takes a token of node's registration bucket at now. The buckets outlive terms
// (a failover does not refill them); there is one per node that said hello, and only known nodes
// get that far.
func (s *Store) takeRegistration(node string, now time.Time) bool {
	s.nodesMu.Lock()
	defer s.nodesMu.Unlock()
	b := s.regBuckets[node]
	if b == nil {
		lim := s.RegistrationLimits
		lim.SetDefaults()
		if s.regBuckets == nil {
			s.regBuckets = map[string]*rate.Limiter{}
		}
		b = rate.NewLimiter(rate.Limit(lim.Rate), lim.Burst)
		s.regBuckets[node] = b
	}
	return b.AllowN(now, 1)
}

// storedNode reports whether the registration stored for node is data, reading every
// registration once per term.
func (s *Store) storedNode(ctx context.Context, t *leader.Term, node, data string) (bool, error) {
	s.nodesMu.Lock()
	defer s.nodesMu.Unlock()
	if s.nodesEpoch != t.Epoch {
		resp, err := s.cli.Get(ctx, s.prefix+"/nodes/", clientv3.WithPrefix())
		if err != nil {
			return false, fmt.Errorf("read node registrations: %w", err)
		}
		s.nodes = make(map[string]string, len(resp.Kvs))
		for _, kv := range resp.Kvs {
			s.nodes[strings.TrimPrefix(string(kv.Key), s.prefix+"/nodes/")] = string(kv.Value)
		}
		s.nodesEpoch = t.Epoch
	}
	return s.nodes[node] == data, nil
}
