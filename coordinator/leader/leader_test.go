package leader_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"

	"github.com/nodefence/nodefence/coordinator/leader"
	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/testbed/etcdtest"
)

type won struct {
	id   string
	term *leader.Term
}

// Three replicas campaign on one real etcd; the leader is killed (its session orphaned, as when the
// process dies); another takes over with a higher epoch; the deposed leader's writes are refused.
func TestFailoverRejectsDeposedLeaderWrites(t *testing.T) {
	endpoint, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	log := slog.New(slog.DiscardHandler)

	wins := make(chan won, 3)
	for _, id := range []string{"a", "b", "c"} {
		el := leader.NewElector(etcdtest.Client(t, endpoint), "/test/leader", leader.Info{ID: id, Address: id + ":1"}, 1, log)
		go func() {
			if term, err := el.Campaign(ctx); err == nil {
				wins <- won{id, term}
			}
		}()
	}
	first := await(t, ctx, wins)
	info, epoch, ok, err := leader.Current(ctx, cli, "/test/leader")
	if err != nil || !ok || info.ID != first.id || epoch != first.term.Epoch {
		t.Fatalf("Current = %+v %d %v %v, want leader %s epoch %d", info, epoch, ok, err, first.id, first.term.Epoch)
	}
	if _, err := first.term.Txn(ctx, nil, clientv3.OpPut("/test/data", "from-first")); err != nil {
		t.Fatalf("leader write: %v", err)
	}

	// Kill the leader: it stops renewing its lease, like a crashed process.
	first.term.Abandon()
	second := await(t, ctx, wins)
	if second.id == first.id || second.term.Epoch <= first.term.Epoch {
		t.Fatalf("second term %s epoch %d, first %s epoch %d: want another replica with a higher epoch",
			second.id, second.term.Epoch, first.id, first.term.Epoch)
	}
	if _, err := first.term.Txn(ctx, nil, clientv3.OpPut("/test/data", "from-deposed")); !errors.Is(err, leader.ErrDeposed) {
		t.Fatalf("deposed leader write: err = %v, want ErrDeposed", err)
	}
	if _, err := second.term.Txn(ctx, nil, clientv3.OpPut("/test/data", "from-second")); err != nil {
		t.Fatalf("new leader write: %v", err)
	}
	got, err := cli.Get(ctx, "/test/data")
	if err != nil || len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "from-second" {
		t.Fatalf("data = %v %v, want from-second", got, err)
	}
	// A failed extra comparison is a conflict, not a deposition.
	_, err = second.term.Txn(ctx, []clientv3.Cmp{clientv3.Compare(clientv3.Value("/test/data"), "=", "nope")}, clientv3.OpPut("/test/data", "x"))
	if !errors.Is(err, leader.ErrConflict) {
		t.Fatalf("failed compare: err = %v, want ErrConflict", err)
	}
	if second.term.Context().Err() != nil {
		t.Fatal("a conflict must not end the term")
	}
	select {
	case w := <-wins:
		t.Fatalf("a third replica %s became leader while %s leads", w.id, second.id)
	default:
	}
}

func await(t *testing.T, ctx context.Context, wins <-chan won) won {
	t.Helper()
	select {
	case w := <-wins:
		return w
	case <-ctx.Done():
		t.Fatal("no leader elected")
		return won{}
	}
}

// Two parts of the coordinator may resign one term at once (the engine loop failing while the
// process shuts down): the term is resigned once, both see the same result, and the key is gone.
func TestConcurrentResign(t *testing.T) {
	_, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	term, err := leader.NewElector(cli, "/resign/leader", leader.Info{ID: "a"}, 5, slog.New(slog.DiscardHandler)).Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 4)
	for range 4 {
		go func() { errs <- term.Resign(ctx) }()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Errorf("Resign: %v", err)
		}
	}
	select {
	case <-term.Context().Done():
	default:
		t.Error("the term's context is still live after Resign")
	}
	if _, _, ok, err := leader.Current(ctx, cli, "/resign/leader"); err != nil || ok {
		t.Errorf("after Resign a leader is still recorded (ok=%v, err=%v)", ok, err)
	}
}

// A replica whose election key vanishes while it waits in the campaign (its lease expired during
// an etcd outage) must not become leader when the older key goes: the campaign checks its key.
func TestCampaignChecksItsKeyAfterWinning(t *testing.T) {
	endpoint, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	first, err := leader.NewElector(etcdtest.Client(t, endpoint), "/test/leader", leader.Info{ID: "a"}, 5, log).Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	result := make(chan error, 1)
	go func() {
		term, err := leader.NewElector(etcdtest.Client(t, endpoint), "/test/leader", leader.Info{ID: "b"}, 5, log).Campaign(ctx)
		if err == nil {
			err = errors.New("became leader")
			t.Logf("b became leader with epoch %d, key %s", term.Epoch, term.Key)
		}
		result <- err
	}()
	var bKey string
	for bKey == "" {
		r, err := cli.Get(ctx, "/test/leader/", clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range r.Kvs {
			if string(kv.Key) != first.Key {
				bKey = string(kv.Key)
			}
		}
		if ctx.Err() != nil {
			t.Fatal("b never campaigned")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := cli.Delete(ctx, bKey); err != nil { // as its lease expiring would
		t.Fatal(err)
	}
	if err := first.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-result; !errors.Is(err, leader.ErrKeyLost) {
		t.Fatalf("b's campaign after its key vanished: %v, want ErrKeyLost", err)
	}
}

// A lost compare-and-swap is a conflict the caller may retry (Aborted); a deposed leader's write is
// a stale epoch (FailedPrecondition).
func TestErrorCodes(t *testing.T) {
	if got := fault.Code(fmt.Errorf("put: %w", leader.ErrConflict)); got != codes.Aborted {
		t.Errorf("ErrConflict maps to %s, want Aborted", got)
	}
	if got := fault.Code(fmt.Errorf("put: %w", leader.ErrDeposed)); got != codes.FailedPrecondition {
		t.Errorf("ErrDeposed maps to %s, want FailedPrecondition", got)
	}
}

// TestTermThatEndsItselfGivesUpItsLease: when a term ends by itself (here: its election key is
// deleted), its lease is revoked at once rather than kept alive by the session: a lease kept alive
// would keep the election key of a stale term, behind which every later campaign would wait for
// ever (seen on the real cluster when etcd's leader died and a leader's watch ended).
func TestTermThatEndsItselfGivesUpItsLease(t *testing.T) {
	endpoint, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	term, err := leader.NewElector(etcdtest.Client(t, endpoint), "/ends/leader", leader.Info{ID: "a"}, 5, log).Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got, err := cli.Get(ctx, term.Key)
	if err != nil || len(got.Kvs) != 1 {
		t.Fatalf("election key: %v %v", got, err)
	}
	lease := clientv3.LeaseID(got.Kvs[0].Lease)
	if _, err := cli.Delete(ctx, term.Key); err != nil {
		t.Fatal(err)
	}
	select {
	case <-term.Context().Done():
	case <-ctx.Done():
		t.Fatal("the term did not end when its key was deleted")
	}
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		ttl, err := cli.TimeToLive(ctx, lease)
		if err != nil {
			t.Fatal(err)
		}
		if ttl.TTL == -1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the ended term's lease is still alive (TTL %d s): its session keeps it", ttl.TTL)
		}
	}
	// The same replica leads again at once.
	cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
	defer ccancel()
	if _, err := leader.NewElector(etcdtest.Client(t, endpoint), "/ends/leader", leader.Info{ID: "a"}, 5, log).Campaign(cctx); err != nil {
		t.Fatalf("campaign after the term ended: %v", err)
	}
}
