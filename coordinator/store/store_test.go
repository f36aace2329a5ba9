package store_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nodefence/nodefence/coordinator/leader"
	"github.com/nodefence/nodefence/coordinator/store"
	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/testbed/etcdtest"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

const prefix = "/t"

func setup(t *testing.T) (context.Context, *clientv3.Client, *store.Store, *leader.Term) {
	t.Helper()
	_, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	st := store.New(cli, prefix)
	st.Log = log
	term, err := leader.NewElector(cli, st.LeaderPrefix(), leader.Info{ID: "one"}, 5, log).Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return ctx, cli, st, term
}

var base = time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)

// record is the i-th record: created i seconds after base, finished (DONE) unless active.
func record(i int, node string, active bool) *coordv1.NodeFence {
	at := base.Add(time.Duration(i) * time.Second)
	f := &coordv1.NodeFence{Id: fmt.Sprintf("%s-%06d", node, i), Node: node, CreatedAt: timestamppb.New(at), Status: coordv1.FenceStatus_FENCE_STATUS_DONE}
	if active {
		f.Status = coordv1.FenceStatus_FENCE_STATUS_RUNNING
	} else {
		f.FinishedAt = timestamppb.New(at)
	}
	return f
}

func create(t *testing.T, ctx context.Context, st *store.Store, term *leader.Term, f *coordv1.NodeFence) {
	t.Helper()
	if _, _, created, err := st.CreateFence(ctx, term, f); err != nil || !created {
		t.Fatalf("create %s: created=%v err=%v", f.Id, created, err)
	}
}

// listAll pages through a listing and returns the ids in order and the corrupt ids.
func listAll(t *testing.T, ctx context.Context, st *store.Store, o store.ListOptions) (ids, corrupt []string, pages int) {
	t.Helper()
	for {
		p, err := st.ListFences(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		if len(p.Fences) > o.Limit {
			t.Fatalf("page of %d records, limit %d", len(p.Fences), o.Limit)
		}
		for _, f := range p.Fences {
			ids = append(ids, f.Id)
		}
		corrupt = append(corrupt, p.Corrupt...)
		if p.NextPageToken == "" {
			return ids, corrupt, pages
		}
		o.PageToken = p.NextPageToken
	}
}

// A corrupt record (here forged straight into etcd) is skipped and named; every listing, the
// resume list and the other records' watches keep working.
func TestCorruptRecordIsSkipped(t *testing.T) {
	ctx, cli, st, term := setup(t)
	for i := range 30 {
		create(t, ctx, st, term, record(i, fmt.Sprintf("n%d", i%3), false))
	}
	live := record(40, "live", true)
	create(t, ctx, st, term, live)
	bad := record(35, "bad", true)
	create(t, ctx, st, term, bad)
	if _, err := cli.Put(ctx, prefix+"/fences/"+bad.Id, `{"node": 42, "garbage`); err != nil {
		t.Fatal(err)
	}

	ids, corrupt, pages := listAll(t, ctx, st, store.ListOptions{Limit: 7})
	if len(ids) != 31 || ids[0] != live.Id || ids[len(ids)-1] != "n0-000000" {
		t.Fatalf("listing: %d ids %v", len(ids), ids)
	}
	if len(corrupt) != 1 || corrupt[0] != bad.Id || pages != 5 {
		t.Fatalf("corrupt = %v, pages = %d; want [%s], 5", corrupt, pages, bad.Id)
	}
	for i := 1; i < len(ids)-1; i++ {
		if ids[i] == ids[i+1] {
			t.Fatalf("%s listed twice", ids[i])
		}
	}
	if st.CorruptRecords() != 1 {
		t.Fatalf("CorruptRecords = %d after two reads of one corrupt version; want 1", st.CorruptRecords())
	}
	ids, _, _ = listAll(t, ctx, st, store.ListOptions{Node: "n1", Limit: 4})
	if len(ids) != 10 || ids[0] != "n1-000028" {
		t.Fatalf("node n1: %v", ids)
	}

	active, err := st.ActiveFences(ctx)
	if err != nil || len(active) != 1 || active[0].Id != live.Id {
		t.Fatalf("ActiveFences = %v, %v; want only %s", active, err, live.Id)
	}
	if _, err := st.GetFence(ctx, bad.Id); !errors.Is(err, store.ErrCorrupt) {
		t.Fatalf("GetFence of the corrupt record: %v", err)
	}

	// A watch outlives a corrupt version of its record and delivers the next good one.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	updates, errc := st.WatchFence(wctx, live.Id)
	if v := <-updates; v.Fence.GetId() != live.Id {
		t.Fatalf("first watch update %v", v)
	}
	if _, err := cli.Put(ctx, prefix+"/fences/"+live.Id, "not json"); err != nil {
		t.Fatal(err)
	}
	done := record(40, "live", false)
	rev, err := cli.Put(ctx, prefix+"/fences/"+live.Id, mustJSON(t, done))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case v, ok := <-updates:
		if !ok || v.Fence.GetFinishedAt() == nil || v.Revision != rev.Header.Revision {
			t.Fatalf("after the corrupt version: %v (open %v); errc %v", v, ok, len(errc))
		}
	case <-ctx.Done():
		t.Fatal("no update after the corrupt version")
	}
	if st.CorruptRecords() != 2 {
		t.Fatalf("CorruptRecords = %d; want 2", st.CorruptRecords())
	}
}

func TestListingIsBoundedAndPaged(t *testing.T) {
	ctx, _, st, term := setup(t)
	const n = 2100
	for i := range n {
		create(t, ctx, st, term, record(i, fmt.Sprintf("n%d", i%10), false))
	}
	// A filter that matches nothing stops after a bounded scan and hands back a token.
	p, err := st.ListFences(ctx, store.ListOptions{Node: "nobody", Limit: 100})
	if err != nil || len(p.Fences) != 0 || p.NextPageToken == "" {
		t.Fatalf("first page of an empty filter: %d records, token %q, %v", len(p.Fences), p.NextPageToken, err)
	}
	p, err = st.ListFences(ctx, store.ListOptions{Node: "nobody", Limit: 100, PageToken: p.NextPageToken})
	if err != nil || len(p.Fences) != 0 || p.NextPageToken != "" {
		t.Fatalf("second page of an empty filter: %d records, token %q, %v", len(p.Fences), p.NextPageToken, err)
	}
	ids, _, pages := listAll(t, ctx, st, store.ListOptions{Limit: 1000})
	if len(ids) != n || pages != 3 || ids[0] != fmt.Sprintf("n9-%06d", n-1) {
		t.Fatalf("%d ids in %d pages, first %s", len(ids), pages, ids[0])
	}
	for _, tok := range []string{"x", "00000000000000000001", "0000000000000000000a/id", "00000000000000000001/a/b"} {
		if _, err := st.ListFences(ctx, store.ListOptions{Limit: 1, PageToken: tok}); !errors.As(err, new(fault.Invalid)) {
			t.Errorf("page token %q: err = %v, want Invalid", tok, err)
		}
	}
}

// Records written before the time index existed join it once, at IndexHistory.
func TestIndexHistory(t *testing.T) {
	ctx, cli, st, term := setup(t)
	create(t, ctx, st, term, record(5, "a", false))
	old := record(1, "old", false)
	if _, err := cli.Put(ctx, prefix+"/fences/"+old.Id, mustJSON(t, old)); err != nil {
		t.Fatal(err)
	}
	if ids, _, _ := listAll(t, ctx, st, store.ListOptions{Limit: 10}); len(ids) != 1 {
		t.Fatalf("before indexing: %v", ids)
	}
	if n, err := st.IndexHistory(ctx, term); err != nil || n != 2 {
		t.Fatalf("IndexHistory = %d, %v", n, err)
	}
	if n, err := st.IndexHistory(ctx, term); err != nil || n != 0 {
		t.Fatalf("second IndexHistory = %d, %v; want 0 (done once)", n, err)
	}
	if ids, _, _ := listAll(t, ctx, st, store.ListOptions{Limit: 10}); len(ids) != 2 || ids[1] != old.Id {
		t.Fatalf("after indexing: %v", ids)
	}
}

func mustJSON(t *testing.T, f *coordv1.NodeFence) string {
	t.Helper()
	b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
