package store

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nodefence/nodefence/coordinator/leader"
	"github.com/nodefence/nodefence/testbed/etcdtest"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// LatestFence finds a node's newest record by its key range alone, and never another node's whose
// name extends this one's ("a" and "a-2b" share a prefix).
func TestLatestFence(t *testing.T) {
	_, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	term, err := leader.NewElector(cli, "/s/leader", leader.Info{ID: "one"}, 1, slog.New(slog.DiscardHandler)).Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s := New(cli, "/s")
	if f, err := s.LatestFence(ctx, "a"); err != nil || f != nil {
		t.Fatalf("no records: %v %v", f, err)
	}
	t0 := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	put := func(node string, at time.Time) {
		t.Helper()
		id := node + "-" + at.UTC().Format("20060102T150405.000000000")
		rec := &coordv1.NodeFence{Id: id, Node: node, CreatedAt: timestamppb.New(at), FinishedAt: timestamppb.New(at)}
		if _, _, _, err := s.CreateFence(ctx, term, rec); err != nil {
			t.Fatal(err)
		}
	}
	put("a", t0)
	put("a", t0.Add(time.Hour))
	for i := range 40 { // more than a page of the other node, newer and sorted after a's
		put("a-2b", t0.Add(2*time.Hour+time.Duration(i)*time.Second))
	}
	put("b", t0.Add(3*time.Hour))
	f, err := s.LatestFence(ctx, "a")
	if err != nil || f.GetId() != "a-20261124T130000.000000000" {
		t.Fatalf("latest of a: %v %v", f.GetId(), err)
	}
	if f, err := s.LatestFence(ctx, "a-2b"); err != nil || f.GetId() != "a-2b-20261124T140039.000000000" {
		t.Fatalf("latest of a-2b: %v %v", f.GetId(), err)
	}
}

// FencedNodes names exactly the nodes whose LatestFence range holds a record, across more keys
// than one batch, in the order asked, and reads no node twice.
func TestFencedNodes(t *testing.T) {
	_, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	term, err := leader.NewElector(cli, "/s/leader", leader.Info{ID: "one"}, 1, slog.New(slog.DiscardHandler)).Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s := New(cli, "/s")
	if got, err := s.FencedNodes(ctx, []string{"a", "b"}); err != nil || len(got) != 0 {
		t.Fatalf("no records: %v %v", got, err)
	}
	t0 := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	var ops []clientv3.Op
	for i := range keysBatch + 10 { // more keys than one batch, all of node "m"
		id := "m-" + t0.Add(time.Duration(i)*time.Second).Format("20060102T150405.000000000")
		ops = append(ops, clientv3.OpPut(s.fenceKey(id), "{}"))
		if len(ops) == 100 {
			if _, err := term.Txn(ctx, nil, ops...); err != nil {
				t.Fatal(err)
			}
			ops = ops[:0]
		}
	}
	if _, err := term.Txn(ctx, nil, ops...); err != nil {
		t.Fatal(err)
	}
	for _, node := range []string{"a-2b", "z"} {
		id := node + "-" + t0.Format("20060102T150405.000000000")
		if _, _, _, err := s.CreateFence(ctx, term, &coordv1.NodeFence{Id: id, Node: node, CreatedAt: timestamppb.New(t0), FinishedAt: timestamppb.New(t0)}); err != nil {
			t.Fatal(err)
		}
	}
	// "a" shares a-2b's range (LatestFence then skips the record by name); "a-2" and "c" have none.
	got, err := s.FencedNodes(ctx, []string{"z", "c", "a-2", "a", "m", "a-2b"})
	if err != nil || strings.Join(got, ",") != "z,a,m,a-2b" {
		t.Fatalf("fenced nodes: %v %v", got, err)
	}
}

// BenchmarkStandingReads10k is what a new term reads to find the standing records of 10,000
// configured nodes none of which has a record: one LatestFence per node (perNode) against
// FencedNodes' keys-only listing (listed).
func BenchmarkStandingReads10k(b *testing.B) {
	_, cli := etcdtest.Start(b)
	s := New(cli, "/s")
	ctx := context.Background()
	nodes := make([]string, 10000)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("agent-%d", i)
	}
	b.Run("perNode", func(b *testing.B) {
		for b.Loop() {
			for _, n := range nodes {
				if _, err := s.LatestFence(ctx, n); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	b.Run("listed", func(b *testing.B) {
		for b.Loop() {
			if _, err := s.FencedNodes(ctx, nodes); err != nil {
				b.Fatal(err)
			}
		}
	})
}
