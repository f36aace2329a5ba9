// Package store keeps the coordinator's durable state in etcd: fence records, the one-active-fence-
// per-node index, and node registrations. Reads are plain; every write goes through a leader.Term, so
// it is valid only while the writer's epoch is the leader's. Records are stored as protobuf JSON so
// operators can read them with etcdctl.
package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/nodefence/nodefence/coordinator/leader"
	"github.com/nodefence/nodefence/services/fault"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// Store reads and writes records under a key prefix.
type Store struct {
	cli    *clientv3.Client
	prefix string
}

// New returns a store under prefix (for example "/nodefence").
func New(cli *clientv3.Client, prefix string) *Store { return &Store{cli: cli, prefix: prefix} }

// Prefix is the store's key prefix.
func (s *Store) Prefix() string { return s.prefix }

// LeaderPrefix is the election prefix under this store's prefix.
func (s *Store) LeaderPrefix() string { return s.prefix + "/leader" }

func (s *Store) fenceKey(id string) string    { return s.prefix + "/fences/" + id }
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
	ops := []clientv3.Op{clientv3.OpPut(s.fenceKey(rec.Id), string(data))}
	if !Finished(rec) {
		ops = append(ops, clientv3.OpPut(ak, rec.Id))
	}
	resp, err := t.Txn(ctx, []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(ak), "=", 0)}, ops...)
	switch {
	case errors.Is(err, leader.ErrConflict):
		cur, err := s.ActiveFence(ctx, rec.Node)
		if err != nil {
			return nil, 0, false, err
		}
		if cur == nil {
			return nil, 0, false, fmt.Errorf("node %s: active fence vanished during create: %w", rec.Node, leader.ErrConflict)
		}
		return cur.Fence, cur.Revision, false, nil
	case err != nil:
		return nil, 0, false, err
	}
	return rec, resp.Header.Revision, true, nil
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
	resp, err := s.cli.Get(ctx, s.fenceKey(id))
	if err != nil {
		return Versioned{}, fmt.Errorf("read fence %s: %w", id, err)
	}
	if len(resp.Kvs) == 0 {
		return Versioned{}, fmt.Errorf("fence %q: %w", id, fault.ErrNotFound)
	}
	f, err := decode(resp.Kvs[0].Value)
	if err != nil {
		return Versioned{}, fmt.Errorf("fence %s: %w", id, err)
	}
	return Versioned{Fence: f, Revision: resp.Kvs[0].ModRevision}, nil
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

// ListFences returns every record, newest first, optionally filtered.
func (s *Store) ListFences(ctx context.Context, keep func(*coordv1.NodeFence) bool) ([]*coordv1.NodeFence, error) {
	resp, err := s.cli.Get(ctx, s.prefix+"/fences/", clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("list fences: %w", err)
	}
	var out []*coordv1.NodeFence
	for _, kv := range resp.Kvs {
		f, err := decode(kv.Value)
		if err != nil {
			return nil, fmt.Errorf("fence %s: %w", kv.Key, err)
		}
		if keep == nil || keep(f) {
			out = append(out, f)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i].GetCreatedAt().AsTime(), out[j].GetCreatedAt().AsTime()
		if !a.Equal(b) {
			return a.After(b)
		}
		return out[i].Id > out[j].Id
	})
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
		cur, err := s.GetFence(ctx, id)
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
		for wr := range s.cli.Watch(wctx, s.fenceKey(id), clientv3.WithRev(cur.Revision+1)) {
			if err := wr.Err(); err != nil {
				errc <- fmt.Errorf("watch fence %s: %w", id, err)
				return
			}
			for _, ev := range wr.Events {
				if ev.Type != clientv3.EventTypePut {
					continue
				}
				f, err := decode(ev.Kv.Value)
				if err != nil {
					errc <- err
					return
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

// NodeRecord is what the leader persists about a node when its agent says hello.
type NodeRecord struct {
	Name   string `json:"name"`
	BootID string `json:"boot_id"`
	Zone   string `json:"zone"`
	Region string `json:"region"`
}

// PutNodeIfChanged writes the node's registration when it differs from what is stored.
func (s *Store) PutNodeIfChanged(ctx context.Context, t *leader.Term, n NodeRecord) error {
	raw, err := json.Marshal(n)
	if err != nil {
		return err
	}
	data, k := string(raw), s.nodeKey(n.Name)
	_, err = t.Txn(ctx, nil, clientv3.OpTxn(
		[]clientv3.Cmp{clientv3.Compare(clientv3.Value(k), "=", data)}, nil,
		[]clientv3.Op{clientv3.OpPut(k, data)}))
	return err
}

func decode(data []byte) (*coordv1.NodeFence, error) {
	var f coordv1.NodeFence
	if err := protojson.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("decode record: %w", err)
	}
	return &f, nil
}
