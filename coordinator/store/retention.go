package store

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/nodefence/nodefence/coordinator/leader"
)

// Retention bounds the history kept in etcd. A zero field is no bound of that kind. Records that
// are not finished are never deleted, whatever their age.
type Retention struct {
	// FenceMaxAge deletes finished records created longer ago.
	FenceMaxAge time.Duration
	// FenceMaxRecords deletes the oldest finished records beyond this many records in all.
	FenceMaxRecords int
	// AuditMaxAge deletes audit entries written longer ago.
	AuditMaxAge time.Duration
	// AuditMaxEntries deletes the oldest audit entries beyond this many.
	AuditMaxEntries int
}

// Defaults of Retention: 90 days and 10,000 records; 90 days and 100,000 audit entries.
const (
	DefaultFenceMaxAge     = 90 * 24 * time.Hour
	DefaultFenceMaxRecords = 10000
	DefaultAuditMaxAge     = 90 * 24 * time.Hour
	DefaultAuditMaxEntries = 100000
)

// DefaultRetention is the retention the coordinator's flags default to.
func DefaultRetention() Retention {
	return Retention{FenceMaxAge: DefaultFenceMaxAge, FenceMaxRecords: DefaultFenceMaxRecords,
		AuditMaxAge: DefaultAuditMaxAge, AuditMaxEntries: DefaultAuditMaxEntries}
}

// maxPrunePerPass bounds the fence records one Prune call deletes, and the audit entries one of its
// deletes removes, so a pass is short; the next pass goes on.
const maxPrunePerPass = 1000

// Pruned is what one Prune call deleted.
type Pruned struct {
	Fences, Audit int
}

// Prune deletes the oldest history beyond r, at most maxPrunePerPass records and entries of each
// kind, with leader-guarded writes. It reads the history in time order, a batch at a time, and
// stops at the first record that is within bounds. etcd's compaction (automatic in the embedded
// etcd; configure --auto-compaction-* on an external one) then frees the space.
func (s *Store) Prune(ctx context.Context, t *leader.Term, now time.Time, r Retention) (Pruned, error) {
	var p Pruned
	var err error
	if p.Fences, err = s.pruneFences(ctx, t, now, r); err != nil {
		return p, err
	}
	p.Audit, err = s.pruneAudit(ctx, t, now, r)
	return p, err
}

func (s *Store) pruneFences(ctx context.Context, t *leader.Term, now time.Time, r Retention) (int, error) {
	if r.FenceMaxAge <= 0 && r.FenceMaxRecords <= 0 {
		return 0, nil
	}
	cnt, err := s.cli.Get(ctx, s.timePrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, fmt.Errorf("count fence records: %w", err)
	}
	total := int(cnt.Count)
	cutoff := fmt.Sprintf("%s%020d", s.timePrefix(), now.Add(-r.FenceMaxAge).UnixNano())
	from, end := s.timePrefix(), clientv3.GetPrefixRangeEnd(s.timePrefix())
	deleted := 0
	for deleted < maxPrunePerPass {
		resp, err := s.cli.Get(ctx, from, clientv3.WithRange(end), clientv3.WithKeysOnly(),
			clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend), clientv3.WithLimit(listBatch))
		if err != nil {
			return deleted, fmt.Errorf("prune fence records: %w", err)
		}
		if len(resp.Kvs) == 0 {
			return deleted, nil
		}
		ops := make([]clientv3.Op, len(resp.Kvs))
		for i, kv := range resp.Kvs {
			ops[i] = clientv3.OpGet(s.fenceKey(idOfTimeKey(string(kv.Key))))
		}
		recs, err := s.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return deleted, fmt.Errorf("prune fence records: %w", err)
		}
		for i, rr := range recs.Responses {
			tk := string(resp.Kvs[i].Key)
			old := r.FenceMaxAge > 0 && tk < cutoff
			over := r.FenceMaxRecords > 0 && total > r.FenceMaxRecords
			if !old && !over {
				return deleted, nil // everything newer is within bounds too
			}
			kvs := rr.GetResponseRange().GetKvs()
			del := []clientv3.Op{clientv3.OpDelete(tk)}
			var cmps []clientv3.Cmp
			if len(kvs) > 0 {
				f, err := s.decodeAt(string(kvs[0].Key), kvs[0].ModRevision, kvs[0].Value)
				if err == nil && !Finished(f) {
					continue // never delete a record in progress
				}
				// A corrupt record beyond the bounds goes too. The comparison keeps a record that
				// changed since it was read.
				cmps = []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(string(kvs[0].Key)), "=", kvs[0].ModRevision)}
				del = append(del, clientv3.OpDelete(string(kvs[0].Key)))
			}
			if _, err := t.Txn(ctx, cmps, del...); err != nil {
				return deleted, fmt.Errorf("prune fence record %s: %w", idOfTimeKey(tk), err)
			}
			deleted++
			total--
			if deleted == maxPrunePerPass {
				return deleted, nil
			}
		}
		if !resp.More {
			return deleted, nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	return deleted, nil
}

// The audit trail is pruned more often than the fence history, and further per pass: PruneAudit
// every AuditPruneEvery deletes up to auditPrunePass entries, so pruning keeps up with a trail that
// grows by up to auditPrunePass/AuditPruneEvery entries a second (2,000), ten times what the
// audit writer lets it grow (DefaultAuditRate). TestAuditPruningKeepsUp holds the two together.
const (
	AuditPruneEvery = 10 * time.Second
	auditPrunePass  = 20000
)

// PruneAudit deletes the oldest audit entries beyond r, at most auditPrunePass of them, a batch of
// maxPrunePerPass at a time, with leader-guarded deletes (which etcd takes even when it is out of
// space).
func (s *Store) PruneAudit(ctx context.Context, t *leader.Term, now time.Time, r Retention) (int, error) {
	return s.pruneAudit(ctx, t, now, r)
}

func (s *Store) pruneAudit(ctx context.Context, t *leader.Term, now time.Time, r Retention) (int, error) {
	deleted := 0
	for deleted < auditPrunePass {
		n, err := s.pruneAuditBatch(ctx, t, now, r, min(maxPrunePerPass, auditPrunePass-deleted))
		deleted += n
		if err != nil || n == 0 {
			return deleted, err
		}
	}
	return deleted, nil
}

// pruneAuditBatch deletes up to limit of the oldest audit entries beyond r in one delete.
func (s *Store) pruneAuditBatch(ctx context.Context, t *leader.Term, now time.Time, r Retention, limit int) (int, error) {
	prefix := s.prefix + "/audit/"
	// Entries older than the cutoff, oldest first, at most one pass's worth.
	var victims int64
	var last string
	if r.AuditMaxAge > 0 {
		cutoff := fmt.Sprintf("%s%020d", prefix, now.Add(-r.AuditMaxAge).UnixNano())
		resp, err := s.cli.Get(ctx, prefix, clientv3.WithRange(cutoff), clientv3.WithKeysOnly(),
			clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend), clientv3.WithLimit(int64(limit)))
		if err != nil {
			return 0, fmt.Errorf("prune audit trail: %w", err)
		}
		if n := len(resp.Kvs); n > 0 {
			victims, last = int64(n), string(resp.Kvs[n-1].Key)
		}
	}
	if r.AuditMaxEntries > 0 {
		cnt, err := s.cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return 0, fmt.Errorf("count audit entries: %w", err)
		}
		if over := min(cnt.Count-int64(r.AuditMaxEntries), int64(limit)); over > victims {
			resp, err := s.cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly(),
				clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend), clientv3.WithLimit(over))
			if err != nil {
				return 0, fmt.Errorf("prune audit trail: %w", err)
			}
			if n := len(resp.Kvs); n > 0 {
				victims, last = int64(n), string(resp.Kvs[n-1].Key)
			}
		}
	}
	if victims == 0 {
		return 0, nil
	}
	resp, err := t.Txn(ctx, nil, clientv3.OpDelete(prefix, clientv3.WithRange(last+"\x00")))
	if err != nil {
		return 0, fmt.Errorf("prune audit trail: %w", err)
	}
	return int(resp.Responses[0].GetResponseDeleteRange().Deleted), nil
}
