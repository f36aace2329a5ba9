package store

import (
	"context"
	"fmt"
	"strings"

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

// FencedNodes returns those of nodes that have a record in the key range LatestFence reads (a
// superset of the nodes LatestFence finds a record for: "a" is listed for a record of "a-2b"), in
// the order given. It reads the record keys alone, a batch at a time: a new term asks for the
// records of the few fenced nodes instead of one read per configured node (10,000 reads at a
// term's start competed with the agents' hellos and samples).
func (s *Store) FencedNodes(ctx context.Context, nodes []string) ([]string, error) {
	want := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		want[n] = false
	}
	prefix := s.fenceKey("")
	from, end := prefix, clientv3.GetPrefixRangeEnd(prefix)
	for {
		resp, err := s.cli.Get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(keysBatch), clientv3.WithKeysOnly())
		if err != nil {
			return nil, fmt.Errorf("list fenced nodes: %w", err)
		}
		for _, kv := range resp.Kvs {
			markFenced(want, strings.TrimPrefix(string(kv.Key), prefix))
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	var out []string
	for _, n := range nodes {
		if want[n] {
			out = append(out, n)
		}
	}
	return out, nil
}

// keysBatch is how many keys FencedNodes reads at a time (keys alone: small).
const keysBatch = 1000

// markFenced marks every node of want whose LatestFence range holds id: the nodes named by a
// prefix of id that "-2" follows.
func markFenced(want map[string]bool, id string) {
	for i := strings.Index(id, "-2"); i >= 0; {
		if _, ok := want[id[:i]]; ok {
			want[id[:i]] = true
		}
		j := strings.Index(id[i+1:], "-2")
		if j < 0 {
			return
		}
		i += 1 + j
	}
}
