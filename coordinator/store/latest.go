package store

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// LatestFence returns the node's newest record, or nil. Record ids are <node>-<UTC time> with a
// year of four digits starting with 2, so the node's records are the keys from <node>-2 up to
// <node>-3; another node whose name extends this one's with "-2..." may share the range and is
// skipped by name. Newest first, without reading the rest of the history; a corrupt record is
// skipped.
func (s *Store) LatestFence(ctx context.Context, node string) (*coordv1.NodeFence, error) {
	from, to := s.fenceKey(node+"-2"), s.fenceKey(node+"-3")
	const page = 16
	for {
		resp, err := s.cli.Get(ctx, from, clientv3.WithRange(to), clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(page))
		if err != nil {
			return nil, fmt.Errorf("read latest fence of %s: %w", node, err)
		}
		for _, kv := range resp.Kvs {
			f, err := s.decodeAt(string(kv.Key), kv.ModRevision, kv.Value)
			if err != nil {
				continue // reported and counted; a corrupt record is skipped as every listing skips it
			}
			if f.GetNode() == node {
				return f, nil
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return nil, nil
		}
		to = string(resp.Kvs[len(resp.Kvs)-1].Key) // exclusive: continue below the last key read
	}
}
