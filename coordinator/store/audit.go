package store

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
	"unicode/utf8"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

var auditSeq atomic.Uint64

// MaxAuditText bounds an entry's text in bytes (longer text is cut), so that an entry is at most
// about MaxAuditEntry bytes and the trail's size is bounded by its count (Retention.AuditMaxEntries).
const (
	MaxAuditText  = 2048
	MaxAuditEntry = MaxAuditText + 512
)

// AuditOp returns the etcd operation that appends one audit entry. Keys sort by time, so the trail
// reads oldest first; entries are never rewritten.
func (s *Store) AuditOp(at time.Time, epoch int64, node, kind, text string) clientv3.Op {
	e := &coordv1.AuditEntry{At: timestamppb.New(at), Epoch: epoch, Node: clip(node, 256), Kind: clip(kind, 64), Text: clip(text, MaxAuditText)}
	b, _ := protojson.Marshal(e)
	key := fmt.Sprintf("%s/audit/%020d-%06d", s.prefix, at.UnixNano(), auditSeq.Add(1)%1000000)
	return clientv3.OpPut(key, string(b))
}

// ListAudit returns entries written after revision after, oldest first, at most limit, optionally
// only those of node.
func (s *Store) ListAudit(ctx context.Context, node string, after int64, limit int) ([]*coordv1.AuditEntry, error) {
	opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend)}
	if after > 0 {
		opts = append(opts, clientv3.WithMinModRev(after+1))
	}
	if node == "" && limit > 0 {
		// etcd applies the limit after the revision filter; with a node filter (applied here) the
		// answer is bounded by the retention of the trail instead.
		opts = append(opts, clientv3.WithLimit(int64(limit)))
	}
	resp, err := s.cli.Get(ctx, s.prefix+"/audit/", opts...)
	if err != nil {
		return nil, fmt.Errorf("read audit trail: %w", err)
	}
	var out []*coordv1.AuditEntry
	for _, kv := range resp.Kvs {
		var e coordv1.AuditEntry
		if err := protojson.Unmarshal(kv.Value, &e); err != nil {
			continue
		}
		if node != "" && e.Node != node {
			continue
		}
		e.Revision = kv.ModRevision
		out = append(out, &e)
		if len(out) == limit {
			break
		}
	}
	return out, nil
}

// clip cuts s to at most n bytes on a rune boundary, marking the cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "...(cut)"
	cut := n - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}
