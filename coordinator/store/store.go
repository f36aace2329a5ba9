// Package store keeps the coordinator's durable state in etcd: fence records, the one-active-fence-
// per-node index, a creation-time index, node registrations, the audit trail, the engine's state
// and the pause flag. It is the only package that knows the key layout (the election's keys live
// under LeaderPrefix, which the leader package is handed). Reads are plain; every write goes
// through a leader.Term, so it is valid only while the writer's epoch is the leader's. Records are
// stored as protobuf JSON so operators can read them with etcdctl.
//
// Key layout under the prefix:
//
//	fences/<id>                    the record (protobuf JSON)
//	active/<node>                  id of the node's active (unfinished) record
//	fences-by-time/<ns>/<id>       empty; <ns> is the record's creation time (20 digits), so
//	                               listings and pruning walk records in time order a page at a time
//	audit/<ns>-<seq>               one audit entry
//	nodes/<node>                   the node's registration (Registration, JSON)
//	fences-by-time-complete        marker: the creation-time index holds every record
//	state/...                      the engine's state and the pause flag (state.go)
//	leader/<lease>                 the election (package leader)
//
// A record that cannot be decoded (written by something other than the coordinator, or damaged)
// is skipped by every listing, logged once and counted (CorruptRecords); it never stops a listing,
// a watch or the resume of the other records.
package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/time/rate"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/nodefence/nodefence/coordinator/leader"
	"github.com/nodefence/nodefence/services/fault"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// Store reads and writes records under a key prefix.
type Store struct {
	cli    *clientv3.Client
	prefix string
	// Log receives one warning per corrupt record version; nil discards.
	Log *slog.Logger

	corruptMu   sync.Mutex
	corruptSeen map[string]int64 // key -> mod revision already reported
	corrupt     atomic.Int64

	// nodesMu guards nodes: the node registrations as stored, read once per term, so that the
	// hellos of every agent after a failover write only the registrations that changed.
	nodesMu    sync.Mutex
	nodesEpoch int64
	nodes      map[string]string

	// RegistrationLimits bounds the registration writes of each node (registration.go); set it
	// before the first PutNodeIfChanged. Zero fields take the defaults.
	RegistrationLimits RegistrationLimits
	regBuckets         map[string]*rate.Limiter // guarded by nodesMu
	regHeld            atomic.Int64
	regMu              sync.Mutex
	regQ               *regQueue // the current term's registrations waiting to be written
	regFailed          atomic.Int64
}

// New returns a store under prefix (for example "/nodefence").
func New(cli *clientv3.Client, prefix string) *Store { return &Store{cli: cli, prefix: prefix} }

// ErrCorrupt marks a stored record that cannot be decoded.
var ErrCorrupt = fmt.Errorf("%w: stored record is corrupt", fault.ErrFailedPrecondition)

// maxCorruptRemembered bounds the set of corrupt record versions already logged.
const maxCorruptRemembered = 1024

// CorruptRecords is how many corrupt record versions the store has met since it started.
func (s *Store) CorruptRecords() int64 { return s.corrupt.Load() }

// reportCorrupt logs and counts a corrupt record version once.
func (s *Store) reportCorrupt(key string, rev int64, err error) {
	s.corruptMu.Lock()
	if s.corruptSeen == nil || len(s.corruptSeen) >= maxCorruptRemembered {
		s.corruptSeen = map[string]int64{}
	}
	seen := s.corruptSeen[key] == rev
	s.corruptSeen[key] = rev
	s.corruptMu.Unlock()
	if seen {
		return
	}
	s.corrupt.Add(1)
	if s.Log != nil {
		s.Log.Warn("skipping corrupt record in etcd", "key", key, "mod_revision", rev, "err", err)
	}
}

// decodeAt decodes the record at key, reporting it when corrupt.
func (s *Store) decodeAt(key string, rev int64, data []byte) (*coordv1.NodeFence, error) {
	f, err := decode(data)
	if err != nil {
		s.reportCorrupt(key, rev, err)
		return nil, fmt.Errorf("%s: %w (%v)", key, ErrCorrupt, err)
	}
	return f, nil
}

// Prefix is the store's key prefix.
func (s *Store) Prefix() string { return s.prefix }

// LeaderPrefix is the election prefix under this store's prefix.
func (s *Store) LeaderPrefix() string { return s.prefix + "/leader" }

func (s *Store) fenceKey(id string) string    { return s.prefix + "/fences/" + id }
func (s *Store) timePrefix() string           { return s.prefix + "/fences-by-time/" }
func (s *Store) activeKey(node string) string { return s.prefix + "/active/" + node }
func (s *Store) nodeKey(node string) string   { return s.prefix + "/nodes/" + node }

// Finished reports whether a record is final: DONE at the end of its flow, or ERROR with every
// retry spent. A DONE isolation step, or an ERROR awaiting its retry, is not finished.
func Finished(f *coordv1.NodeFence) bool { return f.GetFinishedAt() != nil }

var marshal = protojson.MarshalOptions{UseProtoNames: true}

// CreateFence writes a new record unless the node already has an active one, which is returned
// instead with created=false. The returned revision is the record's mod revision.
func (s *Store) CreateFence(ctx context.Context, t *leader.Term, rec *coordv1.NodeFence) (*coordv1.NodeFence, int64, bool, error) {
	data, err := marshal.Marshal(rec)
	if err != nil {
		return nil, 0, false, err
	}
	ak := s.activeKey(rec.Node)
	ops := []clientv3.Op{clientv3.OpPut(s.fenceKey(rec.Id), string(data)), clientv3.OpPut(s.timeKey(rec), "")}
	if !Finished(rec) {
		ops = append(ops, clientv3.OpPut(ak, rec.Id))
	}
	resp, err := t.Txn(ctx, []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(ak), "=", 0)}, ops...)
	if errors.Is(err, leader.ErrConflict) {
		var stale string
		stale, err = s.staleActive(ctx, rec.Node)
		if err != nil {
			return nil, 0, false, err
		}
		if stale == "" {
			cur, err := s.ActiveFence(ctx, rec.Node)
			if err != nil {
				return nil, 0, false, err
			}
			if cur == nil {
				return nil, 0, false, fmt.Errorf("node %s: active fence vanished during create: %w", rec.Node, leader.ErrConflict)
			}
			return cur.Fence, cur.Revision, false, nil
		}
		// The index names a record that is gone or corrupt: nothing runs it, so it blocks nobody.
		if s.Log != nil {
			s.Log.Warn("replacing an active-fence index entry whose record is missing or corrupt", "node", rec.Node, "stale", stale, "fence", rec.Id)
		}
		resp, err = t.Txn(ctx, []clientv3.Cmp{clientv3.Compare(clientv3.Value(ak), "=", stale)}, ops...)
	}
	if err != nil {
		return nil, 0, false, err
	}
	return rec, resp.Header.Revision, true, nil
}

// staleActive returns the id the node's active index names when that record is missing or
// corrupt, and "" when the index is empty or names a readable record.
func (s *Store) staleActive(ctx context.Context, node string) (string, error) {
	resp, err := s.cli.Get(ctx, s.activeKey(node))
	if err != nil || len(resp.Kvs) == 0 {
		return "", err
	}
	id := string(resp.Kvs[0].Value)
	_, err = s.GetFence(ctx, id)
	switch {
	case errors.Is(err, fault.ErrNotFound), errors.Is(err, ErrCorrupt):
		return id, nil
	case err != nil:
		return "", err
	}
	return "", nil
}

// Versioned is a record with the mod revision it was read at.
type Versioned struct {
	Fence    *coordv1.NodeFence
	Revision int64
}

// UpdateFence writes rec if its stored mod revision is still rev (compare-and-swap). When rec is
// finished the node's active index is released. It returns the new revision.
func (s *Store) UpdateFence(ctx context.Context, t *leader.Term, rec *coordv1.NodeFence, rev int64) (int64, error) {
	data, err := marshal.Marshal(rec)
	if err != nil {
		return 0, err
	}
	fk := s.fenceKey(rec.Id)
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(fk), "=", rev)}
	ops := []clientv3.Op{clientv3.OpPut(fk, string(data))}
	if Finished(rec) {
		// Release the index only if it still points at this record.
		ops = append(ops, clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.Value(s.activeKey(rec.Node)), "=", rec.Id)},
			[]clientv3.Op{clientv3.OpDelete(s.activeKey(rec.Node))}, nil))
	}
	resp, err := t.Txn(ctx, cmps, ops...)
	if err != nil {
		return 0, err
	}
	return resp.Header.Revision, nil
}

// GetFence reads one record.
func (s *Store) GetFence(ctx context.Context, id string) (Versioned, error) {
	v, _, err := s.readFence(ctx, id)
	return v, err
}

// readFence is GetFence that also returns the store revision the record was read at.
func (s *Store) readFence(ctx context.Context, id string) (Versioned, int64, error) {
	resp, err := s.cli.Get(ctx, s.fenceKey(id))
	if err != nil {
		return Versioned{}, 0, fmt.Errorf("read fence %s: %w", id, err)
	}
	if len(resp.Kvs) == 0 {
		return Versioned{}, 0, fmt.Errorf("fence %q: %w", id, fault.ErrNotFound)
	}
	kv := resp.Kvs[0]
	f, err := s.decodeAt(string(kv.Key), kv.ModRevision, kv.Value)
	if err != nil {
		return Versioned{}, 0, err
	}
	return Versioned{Fence: f, Revision: kv.ModRevision}, resp.Header.Revision, nil
}

// ActiveFence returns the node's active (not terminal) record, or nil.
func (s *Store) ActiveFence(ctx context.Context, node string) (*Versioned, error) {
	resp, err := s.cli.Get(ctx, s.activeKey(node))
	if err != nil {
		return nil, fmt.Errorf("read active fence of %s: %w", node, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	v, err := s.GetFence(ctx, string(resp.Kvs[0].Value))
	if errors.Is(err, fault.ErrNotFound) {
		return nil, nil
	}
	return &v, err
}

// timeKey is the record's entry in the creation-time index.
func (s *Store) timeKey(f *coordv1.NodeFence) string {
	return fmt.Sprintf("%s%020d/%s", s.timePrefix(), f.GetCreatedAt().AsTime().UnixNano(), f.Id)
}

// ListOptions selects a page of records.
type ListOptions struct {
	// Node and Status, if set, keep only matching records.
	Node   string
	Status coordv1.FenceStatus
	// Limit is the most records in the page (at least 1).
	Limit int
	// PageToken continues a listing where the previous page's NextPageToken left it.
	PageToken string
}

// Page is one page of records, newest first.
type Page struct {
	Fences []*coordv1.NodeFence
	// NextPageToken continues the listing; empty at the end.
	NextPageToken string
	// Corrupt names the records met on this page that could not be decoded.
	Corrupt []string
}

// Bounds of one listing call: index entries read per batch (each batch is one Txn of gets, under
// etcd's default limit of 128 operations per Txn) and in all. A filter that matches rarely returns
// a short page with a NextPageToken rather than reading the whole history.
const (
	listBatch   = 100
	maxListScan = 2000
)

// ListFences returns a page of records, newest first. It reads at most maxListScan index entries
// and their records, never the whole history.
func (s *Store) ListFences(ctx context.Context, o ListOptions) (Page, error) {
	end := clientv3.GetPrefixRangeEnd(s.timePrefix())
	if o.PageToken != "" {
		if !validToken(o.PageToken) {
			return Page{}, fault.Invalid{{Field: "page_token", Problem: "not a token from a previous page"}}
		}
		end = s.timePrefix() + o.PageToken
	}
	limit := max(o.Limit, 1)
	var page Page
	for scanned := 0; scanned < maxListScan; {
		resp, err := s.cli.Get(ctx, s.timePrefix(), clientv3.WithRange(end), clientv3.WithKeysOnly(),
			clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(listBatch))
		if err != nil {
			return Page{}, fmt.Errorf("list fences: %w", err)
		}
		if len(resp.Kvs) == 0 {
			return page, nil
		}
		ops := make([]clientv3.Op, len(resp.Kvs))
		for i, kv := range resp.Kvs {
			ops[i] = clientv3.OpGet(s.fenceKey(idOfTimeKey(string(kv.Key))))
		}
		recs, err := s.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return Page{}, fmt.Errorf("list fences: %w", err)
		}
		for i, r := range recs.Responses {
			scanned++
			end = string(resp.Kvs[i].Key)
			kvs := r.GetResponseRange().GetKvs()
			if len(kvs) == 0 {
				continue // pruned between the two reads
			}
			f, err := s.decodeAt(string(kvs[0].Key), kvs[0].ModRevision, kvs[0].Value)
			if err != nil {
				page.Corrupt = append(page.Corrupt, idOfTimeKey(end))
				continue
			}
			if (o.Node != "" && f.Node != o.Node) || (o.Status != coordv1.FenceStatus_FENCE_STATUS_UNSPECIFIED && f.Status != o.Status) {
				continue
			}
			page.Fences = append(page.Fences, f)
			if len(page.Fences) == limit {
				page.NextPageToken = strings.TrimPrefix(end, s.timePrefix())
				return page, nil
			}
		}
		if !resp.More {
			return page, nil
		}
	}
	page.NextPageToken = strings.TrimPrefix(end, s.timePrefix())
	return page, nil
}

// idOfTimeKey is the record id of a creation-time index key.
func idOfTimeKey(k string) string {
	_, id, _ := strings.Cut(k[strings.LastIndex(k, "fences-by-time/")+len("fences-by-time/"):], "/")
	return id
}

// validToken reports whether t has the shape of a time index entry: 20 digits, a slash, an id.
func validToken(t string) bool {
	ns, id, ok := strings.Cut(t, "/")
	if !ok || len(ns) != 20 || id == "" || len(t) > 1024 || strings.Contains(id, "/") {
		return false
	}
	_, err := strconv.ParseUint(ns, 10, 64)
	return err == nil
}

// IndexHistory adds records written before the creation-time index existed to it, once: a marker
// key records that the index is complete, so later terms skip this. It reads the records a batch
// at a time.
func (s *Store) IndexHistory(ctx context.Context, t *leader.Term) (indexed int, err error) {
	marker := s.prefix + "/fences-by-time-complete"
	resp, err := s.cli.Get(ctx, marker, clientv3.WithCountOnly())
	if err != nil || resp.Count > 0 {
		return 0, err
	}
	from, end := s.prefix+"/fences/", clientv3.GetPrefixRangeEnd(s.prefix+"/fences/")
	for {
		resp, err := s.cli.Get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(listBatch))
		if err != nil {
			return indexed, fmt.Errorf("index fence history: %w", err)
		}
		var ops []clientv3.Op
		for _, kv := range resp.Kvs {
			if f, err := s.decodeAt(string(kv.Key), kv.ModRevision, kv.Value); err == nil {
				ops = append(ops, clientv3.OpPut(s.timeKey(f), ""))
			}
		}
		if len(ops) > 0 {
			if _, err := t.Txn(ctx, nil, ops...); err != nil {
				return indexed, fmt.Errorf("index fence history: %w", err)
			}
			indexed += len(ops)
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	_, err = t.Txn(ctx, nil, clientv3.OpPut(marker, "1"))
	return indexed, err
}

// ActiveFences returns every node's active (unfinished) record through the active index, so a
// leader resumes its work without reading the history. Corrupt records are skipped and reported.
func (s *Store) ActiveFences(ctx context.Context) ([]*coordv1.NodeFence, error) {
	resp, err := s.cli.Get(ctx, s.prefix+"/active/", clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("list active fences: %w", err)
	}
	var out []*coordv1.NodeFence
	for _, kv := range resp.Kvs {
		v, err := s.GetFence(ctx, string(kv.Value))
		switch {
		case errors.Is(err, fault.ErrNotFound), errors.Is(err, ErrCorrupt):
			continue
		case err != nil:
			return nil, err
		}
		out = append(out, v.Fence)
	}
	return out, nil
}

// WatchFence sends the record's current state and then every new version until ctx ends or the
// record is finished; the channel is closed then. Errors end the stream with a last Versioned{} and
// are returned through errc.
func (s *Store) WatchFence(ctx context.Context, id string) (<-chan Versioned, <-chan error) {
	out := make(chan Versioned, 16)
	errc := make(chan error, 1)
	go func() {
		defer close(out)
		cur, readAt, err := s.readFence(ctx, id)
		if err != nil {
			errc <- err
			return
		}
		select {
		case out <- cur:
		case <-ctx.Done():
			return
		}
		if Finished(cur.Fence) {
			return
		}
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		// From the revision the record was read at, not the record's own: the record may be older
		// than etcd's compaction point (a quiet record under auto-compaction, or every record after
		// a restore with --mark-compacted), and nothing changed it between the two.
		for wr := range s.cli.Watch(wctx, s.fenceKey(id), clientv3.WithRev(readAt+1)) {
			if err := wr.Err(); err != nil {
				errc <- fmt.Errorf("watch fence %s: %w", id, err)
				return
			}
			for _, ev := range wr.Events {
				if ev.Type != clientv3.EventTypePut {
					continue
				}
				f, err := s.decodeAt(string(ev.Kv.Key), ev.Kv.ModRevision, ev.Kv.Value)
				if err != nil {
					continue // reported; the next good version follows
				}
				select {
				case out <- Versioned{Fence: f, Revision: ev.Kv.ModRevision}:
				case <-ctx.Done():
					return
				}
				if Finished(f) {
					return
				}
			}
		}
		if ctx.Err() != nil {
			errc <- ctx.Err()
		}
	}()
	return out, errc
}

func decode(data []byte) (*coordv1.NodeFence, error) {
	var f coordv1.NodeFence
	if err := protojson.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("decode record: %w", err)
	}
	return &f, nil
}
