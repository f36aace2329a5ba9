package store_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/nodefence/nodefence/coordinator/leader"
	"github.com/nodefence/nodefence/coordinator/store"
	"github.com/nodefence/nodefence/testbed/etcdtest"
)

// One agent certificate reconnecting in a loop, a new boot id at every hello, changes its node's
// registration each time: only the node's burst is written, the rest is counted as held back,
// another node's registration is still written at once, and once the bucket refills the node's
// next hello writes its newest registration.
func TestRegistrationWritesBoundedPerNode(t *testing.T) {
	_, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st := store.New(cli, "/reg")
	term, err := leader.NewElector(cli, st.LeaderPrefix(), leader.Info{ID: "one"}, 5, slog.New(slog.DiscardHandler)).Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	index := func() uint64 {
		r, err := cli.Status(ctx, cli.Endpoints()[0])
		if err != nil {
			t.Fatal(err)
		}
		return r.RaftIndex
	}
	stored := func(node string) string {
		r, err := cli.Get(ctx, "/reg/nodes/"+node)
		if err != nil || len(r.Kvs) != 1 {
			t.Fatalf("registration of %s: %v %v", node, r, err)
		}
		return string(r.Kvs[0].Value)
	}
	const hellos = 50
	before := index()
	for i := range hellos {
		at := base.Add(time.Duration(i) * time.Millisecond)
		if err := st.PutNodeIfChanged(ctx, term, store.Registration{Name: "a", BootID: fmt.Sprintf("boot-%d", i), Zone: "z"}, at); err != nil {
			t.Fatal(err)
		}
	}
	flush := func() {
		t.Helper()
		if err := st.FlushRegistrations(ctx); err != nil {
			t.Fatal(err)
		}
	}
	flush()
	// The burst's writes may share a batch (the newest wins): at most the burst reach etcd.
	if got := index() - before; got < 1 || got > store.DefaultRegistrationBurst {
		t.Fatalf("%d hellos with new boot ids made %d etcd proposals, want 1 to the burst %d", hellos, got, store.DefaultRegistrationBurst)
	}
	if got := st.RegistrationsHeld(); got != hellos-store.DefaultRegistrationBurst {
		t.Fatalf("held back: %d, want %d", got, hellos-store.DefaultRegistrationBurst)
	}
	// Another node is not held back by a's loop.
	if err := st.PutNodeIfChanged(ctx, term, store.Registration{Name: "b", BootID: "boot-b", Zone: "z"}, base); err != nil {
		t.Fatal(err)
	}
	flush()
	if !strings.Contains(stored("b"), "boot-b") {
		t.Fatalf("b's registration: %s", stored("b"))
	}
	// a's newest is written by its next hello once a token is back.
	later := base.Add(time.Duration(float64(time.Second) / store.DefaultRegistrationRate))
	last := store.Registration{Name: "a", BootID: fmt.Sprintf("boot-%d", hellos-1), Zone: "z"}
	if err := st.PutNodeIfChanged(ctx, term, last, later); err != nil {
		t.Fatal(err)
	}
	flush()
	if !strings.Contains(stored("a"), `"boot-49"`) {
		t.Fatalf("a's registration after the bucket refilled: %s", stored("a"))
	}
	// An unchanged hello takes no token: a failover's hellos never count against a node.
	before = index()
	for range 10 {
		if err := st.PutNodeIfChanged(ctx, term, last, later); err != nil {
			t.Fatal(err)
		}
	}
	flush()
	if index() != before || st.RegistrationsHeld() != hellos-store.DefaultRegistrationBurst {
		t.Fatalf("unchanged hellos: raft index %d -> %d, held %d", before, index(), st.RegistrationsHeld())
	}
}

// A fleet saying hello at once (a new leader, a restarted coordinator) has its registrations
// written in batches: 500 nodes take a handful of etcd proposals, not 500, no hello waits for its
// write, and every registration is stored.
func TestRegistrationsAreBatched(t *testing.T) {
	_, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st := store.New(cli, "/batch")
	term, err := leader.NewElector(cli, st.LeaderPrefix(), leader.Info{ID: "one"}, 5, slog.New(slog.DiscardHandler)).Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	status, err := cli.Status(ctx, cli.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	before := status.RaftIndex
	const nodes = 500
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Go(func() {
			if err := st.PutNodeIfChanged(ctx, term, store.Registration{Name: fmt.Sprintf("n%03d", i), BootID: "b", Zone: "z"}, time.Now()); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if err := st.FlushRegistrations(ctx); err != nil {
		t.Fatal(err)
	}
	status, err = cli.Status(ctx, cli.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	if got := status.RaftIndex - before; got > nodes/20 {
		t.Errorf("%d registrations took %d etcd proposals, want at most %d", nodes, got, nodes/20)
	}
	r, err := cli.Get(ctx, "/batch/nodes/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || r.Count != nodes {
		t.Fatalf("stored registrations: %v (%v), want %d", r, err, nodes)
	}
	if st.RegistrationsFailed() != 0 {
		t.Fatalf("%d registration writes failed", st.RegistrationsFailed())
	}
}
