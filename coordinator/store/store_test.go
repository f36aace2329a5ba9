package store_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
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
	// The corrupt record holds its node's active index; a new fence of the node replaces it.
	next := record(50, "bad", true)
	create(t, ctx, st, term, next)
	if cur, err := st.ActiveFence(ctx, "bad"); err != nil || cur.Fence.Id != next.Id {
		t.Fatalf("active fence of node bad after a new create: %v, %v", cur, err)
	}
	// And a live active record still wins over a create.
	if got, _, created, err := st.CreateFence(ctx, term, record(51, "bad", true)); err != nil || created || got.Id != next.Id {
		t.Fatalf("second create: %v created=%v %v; want the active %s", got, created, err, next.Id)
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

// Many records and audit entries: the old ones are pruned in bounded passes, records in progress
// are kept whatever their age, and the newest stay within the count bounds.
func TestPruneHistory(t *testing.T) {
	ctx, cli, st, term := setup(t)
	now := base.Add(100 * 24 * time.Hour)
	const old, recent = 1100, 150
	for i := range old {
		if i == 7 {
			create(t, ctx, st, term, record(i, "running", true)) // an old record still in progress
			continue
		}
		create(t, ctx, st, term, record(i, fmt.Sprintf("n%d", i%20), false))
	}
	for i := range recent {
		f := record(i, "new", false)
		f.Id = fmt.Sprintf("new-%06d", i)
		f.CreatedAt = timestamppb.New(now.Add(-time.Duration(recent-i) * time.Minute))
		create(t, ctx, st, term, f)
	}
	var audit []clientv3.Op
	for i := range 400 {
		at := base.Add(time.Duration(i) * time.Second)
		if i >= 300 {
			at = now.Add(-time.Duration(400-i) * time.Second)
		}
		audit = append(audit, st.AuditOp(at, term.Epoch, "n", "test", fmt.Sprintf("entry %d", i)))
		if len(audit) == 100 {
			if _, err := term.Txn(ctx, nil, audit...); err != nil {
				t.Fatal(err)
			}
			audit = nil
		}
	}
	r := store.Retention{FenceMaxAge: 30 * 24 * time.Hour, FenceMaxRecords: 100, AuditMaxAge: 30 * 24 * time.Hour, AuditMaxEntries: 60}
	p, err := st.Prune(ctx, term, now, r)
	if err != nil || p.Fences != 1000 || p.Audit != 340 {
		t.Fatalf("first pass = %+v, %v; want 1000 records (the pass bound) and 340 audit entries", p, err)
	}
	p, err = st.Prune(ctx, term, now, r)
	// 99 old finished records left, then 51 of the 150 recent ones beyond the 100-record bound
	// (the running old record counts but is kept).
	if err != nil || p.Fences != 99+51 || p.Audit != 0 {
		t.Fatalf("second pass = %+v, %v", p, err)
	}
	if p, err = st.Prune(ctx, term, now, r); err != nil || p != (store.Pruned{}) {
		t.Fatalf("third pass = %+v, %v; want nothing left to prune", p, err)
	}
	ids, _, _ := listAll(t, ctx, st, store.ListOptions{Limit: 1000})
	if len(ids) != 100 || ids[0] != "new-000149" || ids[98] != "new-000051" || ids[99] != "running-000007" {
		t.Fatalf("kept %d records: first %v last %v", len(ids), ids[:2], ids[len(ids)-2:])
	}
	for _, pfx := range []string{"/fences/", "/fences-by-time/"} {
		if r, err := cli.Get(ctx, prefix+pfx, clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || r.Count != 100 {
			t.Fatalf("%s keys left: %v, %v", pfx, r.Count, err)
		}
	}
	entries, err := st.ListAudit(ctx, "", 0, 1000)
	if err != nil || len(entries) != 60 || entries[0].Text != "entry 340" {
		t.Fatalf("audit left: %d entries, first %v, %v", len(entries), entries[0], err)
	}
}

// After a failover every agent says hello again: a registration that did not change costs no etcd
// proposal (the raft index stays put: an unchanged guarded Txn would still be one), a changed one is
// written, and a new term reads what is stored again rather than trusting the previous term's
// memory.
func TestUnchangedRegistrationIsNotWritten(t *testing.T) {
	_, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st := store.New(cli, "/reg")
	log := slog.New(slog.DiscardHandler)
	term, err := leader.NewElector(cli, st.LeaderPrefix(), leader.Info{ID: "one"}, 5, log).Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rev := func() uint64 {
		r, err := cli.Status(ctx, cli.Endpoints()[0])
		if err != nil {
			t.Fatal(err)
		}
		return r.RaftIndex
	}
	a := store.Registration{Name: "a", BootID: "boot-1", Zone: "z"}
	if err := st.PutNodeIfChanged(ctx, term, a, base); err != nil {
		t.Fatal(err)
	}
	if err := st.FlushRegistrations(ctx); err != nil {
		t.Fatal(err)
	}
	before := rev()
	for range 3 {
		if err := st.PutNodeIfChanged(ctx, term, a, base); err != nil {
			t.Fatal(err)
		}
	}
	if after := rev(); after != before {
		t.Fatalf("raft index %d -> %d: an unchanged registration went to etcd", before, after)
	}
	a.BootID = "boot-2"
	if err := st.PutNodeIfChanged(ctx, term, a, base); err != nil {
		t.Fatal(err)
	}
	if err := st.FlushRegistrations(ctx); err != nil {
		t.Fatal(err)
	}
	if after := rev(); after == before {
		t.Fatal("a changed registration was not written")
	}
	// Someone else changes the record; the next term must not trust its memory of it.
	if _, err := cli.Put(ctx, "/reg/nodes/a", `{"Name":"a"}`); err != nil {
		t.Fatal(err)
	}
	if err := term.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	term2, err := leader.NewElector(cli, st.LeaderPrefix(), leader.Info{ID: "two"}, 5, log).Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.PutNodeIfChanged(ctx, term2, a, base); err != nil {
		t.Fatal(err)
	}
	if err := st.FlushRegistrations(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := cli.Get(ctx, "/reg/nodes/a")
	if err != nil || len(got.Kvs) != 1 || !strings.Contains(string(got.Kvs[0].Value), "boot-2") {
		t.Fatalf("after the new term: %v %v", got, err)
	}
}

// A watch of a record older than etcd's compaction point (a quiet record under auto-compaction,
// or every record after a restore with --mark-compacted) starts from the revision it was read at
// and delivers the record's next version instead of failing.
func TestWatchOfRecordOlderThanCompaction(t *testing.T) {
	ctx, cli, st, term := setup(t)
	live := record(1, "quiet", true)
	create(t, ctx, st, term, live)
	var last int64
	for i := range 5 {
		r, err := cli.Put(ctx, fmt.Sprintf("/other/%d", i), "x")
		if err != nil {
			t.Fatal(err)
		}
		last = r.Header.Revision
	}
	if _, err := cli.Compact(ctx, last); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	updates, errc := st.WatchFence(wctx, live.Id)
	if v := <-updates; v.Fence.GetId() != live.Id {
		t.Fatalf("first watch update %v; err %v", v, <-errc)
	}
	done := record(1, "quiet", false)
	rev, err := cli.Put(ctx, prefix+"/fences/"+live.Id, mustJSON(t, done))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case v, ok := <-updates:
		if !ok || v.Fence.GetFinishedAt() == nil || v.Revision != rev.Header.Revision {
			var werr error
			if !ok {
				werr = <-errc
			}
			t.Fatalf("after compaction: %v (open %v); err %v", v, ok, werr)
		}
	case <-ctx.Done():
		t.Fatal("no update after compaction")
	}
}
