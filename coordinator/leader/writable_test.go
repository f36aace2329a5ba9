package leader_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/nodefence/nodefence/coordinator/leader"
	"github.com/nodefence/nodefence/testbed/etcdtest"
)

// TestLeaderResignsWhenEtcdIsOutOfSpace: a real etcd with a small quota is filled by another
// client until it raises NOSPACE. The leader, whose lease etcd keeps alive without a write, must
// not hold on to leadership it cannot use: its first refused write ends the term, the election key
// is gone (so nobody waits behind it) and the alarm hears "nospace".
func TestLeaderResignsWhenEtcdIsOutOfSpace(t *testing.T) {
	endpoint, cli := etcdtest.StartQuota(t, 4<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	alarms := make(chan string, 4)
	el := leader.NewElector(etcdtest.Client(t, endpoint), "/test/leader", leader.Info{ID: "a", Address: "a:1"}, 5, slog.New(slog.DiscardHandler))
	el.OnUnwritable = func(reason string) { alarms <- reason }
	term, err := el.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fill(t, ctx, cli)
	_, err = term.Txn(ctx, nil, clientv3.OpPut("/test/fence", "record"))
	if !leader.NoSpace(err) {
		t.Fatalf("leader write on a full etcd: %v; want NOSPACE", err)
	}
	select {
	case reason := <-alarms:
		if reason != leader.UnwritableNoSpace {
			t.Fatalf("alarm %q, want %q", reason, leader.UnwritableNoSpace)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no alarm 10 s after etcd refused the leader's write for lack of space")
	}
	select {
	case <-term.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the term goes on after etcd ran out of space")
	}
	// The term's context ends first; the resignation (deleting the key, which etcd allows when
	// out of space) follows.
	for i := 0; ; i++ {
		_, _, ok, err := leader.Current(ctx, cli, "/test/leader")
		if err == nil && !ok {
			break
		}
		if i == 50 {
			t.Fatalf("election key 5 s after the term ended: leading=%v err=%v; want none", ok, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := term.Txn(ctx, nil, clientv3.OpPut("/test/fence", "x")); !errors.Is(err, leader.ErrDeposed) && err == nil {
		t.Fatal("a write under the resigned term succeeded")
	}
}

// fill writes until etcd refuses for lack of space.
func fill(t *testing.T, ctx context.Context, cli *clientv3.Client) {
	t.Helper()
	v := strings.Repeat("x", 256<<10)
	for i := range 1000 {
		_, err := cli.Put(ctx, fmt.Sprintf("/filler/%d", i), v)
		if leader.NoSpace(err) {
			return
		}
		if err != nil {
			t.Fatalf("fill: %v", err)
		}
	}
	t.Fatal("etcd took 250 MiB under a 4 MiB quota")
}
