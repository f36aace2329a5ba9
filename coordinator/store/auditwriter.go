package store

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/nodefence/nodefence/coordinator/leader"
)

// AuditWriter appends a term's audit entries in transactions of their own, apart from every other
// write: fence records and the engine's state never wait behind an entry. An entry waits in a
// bounded queue and leaves at a bounded rate (AuditLimits), so the trail grows by at most
// AuditLimits.Rate entries a second, which Prune is sized to keep up with. An entry is dropped —
// counted and reported to OnDrop, never retried — when the queue is full or etcd refuses its batch
// (out of space, say): the audit trail is the first thing given up when the store is short.
type AuditWriter struct {
	s     *Store
	term  *leader.Term
	lim   AuditLimits
	queue chan clientv3.Op
	// OnDrop, if set, hears of every entry dropped, with why: "queue-full" or "write-failed".
	OnDrop func(reason string, n int)
	// Log receives one warning per failed batch; nil discards.
	Log *slog.Logger

	dropped atomic.Int64
}

// AuditLimits bounds the audit trail's growth.
type AuditLimits struct {
	// Rate is the most entries written a second (200).
	Rate int
	// Queue is the most entries waiting to be written (4096); more are dropped.
	Queue int
}

// Defaults of AuditLimits.
const (
	DefaultAuditRate  = 200
	DefaultAuditQueue = 4096
)

// SetDefaults fills the zero (or negative) fields.
func (l *AuditLimits) SetDefaults() {
	if l.Rate <= 0 {
		l.Rate = DefaultAuditRate
	}
	if l.Queue <= 0 {
		l.Queue = DefaultAuditQueue
	}
}

// auditPace is how often the writer sends what waits: Rate/10 entries every 100 ms.
const auditPace = 100 * time.Millisecond

// maxAuditBatch keeps an audit transaction under etcd's default --max-txn-ops (128) with the
// guard.
const maxAuditBatch = 100

// NewAuditWriter returns term t's audit writer; Run sends what it queues.
func (s *Store) NewAuditWriter(t *leader.Term, lim AuditLimits) *AuditWriter {
	lim.SetDefaults()
	return &AuditWriter{s: s, term: t, lim: lim, queue: make(chan clientv3.Op, lim.Queue)}
}

// Append queues one entry under the writer's term; it never blocks. It returns false when the
// entry was dropped because the queue is full.
func (w *AuditWriter) Append(at time.Time, node, kind, text string) bool {
	select {
	case w.queue <- w.s.AuditOp(at, w.term.Epoch, node, kind, text):
		return true
	default:
		w.drop("queue-full", 1)
		return false
	}
}

// Dropped is how many entries the writer dropped.
func (w *AuditWriter) Dropped() int64 { return w.dropped.Load() }

func (w *AuditWriter) drop(reason string, n int) {
	w.dropped.Add(int64(n))
	if w.OnDrop != nil {
		w.OnDrop(reason, n)
	}
}

// Run writes the queued entries, at most Rate a second, until ctx ends or the term does.
func (w *AuditWriter) Run(ctx context.Context) {
	pace := time.NewTicker(auditPace)
	defer pace.Stop()
	perPace := max(1, w.lim.Rate*int(auditPace/time.Millisecond)/1000)
	batch := make([]clientv3.Op, 0, maxAuditBatch)
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.term.Context().Done():
			return
		case <-pace.C:
		}
		for sent := 0; sent < perPace; {
			batch = batch[:0]
			for len(batch) < min(maxAuditBatch, perPace-sent) {
				select {
				case op := <-w.queue:
					batch = append(batch, op)
					continue
				default:
				}
				break
			}
			if len(batch) == 0 {
				break
			}
			sent += len(batch)
			w.write(ctx, batch)
		}
	}
}

// write sends one batch, once.
func (w *AuditWriter) write(ctx context.Context, batch []clientv3.Op) {
	if _, err := w.term.Txn(ctx, nil, batch...); err != nil {
		w.drop("write-failed", len(batch))
		if w.Log != nil && w.term.Context().Err() == nil {
			w.Log.Warn("audit entries not written; dropped", "entries", len(batch), "err", err)
		}
	}
}
