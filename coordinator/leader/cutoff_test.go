package leader_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nodefence/nodefence/coordinator/leader"
	"github.com/nodefence/nodefence/testbed/etcdtest"
	"github.com/nodefence/nodefence/testbed/tcpproxy"
)

// A leader cut off from etcd (every connection through its proxy closed, new ones refused) must end
// its term before etcd can expire its lease and another replica be elected: never two leaders.
// The other replica campaigns on a direct connection the whole time; it is elected only once the
// lease expired, and the cut-off term must have ended before that. Before the fix the step-down
// waited for a failing read of the election key to time out, and ended 1.0-1.6 s after the other
// replica was elected.
func TestCutOffLeaderStepsDownBeforeAnotherIsElected(t *testing.T) {
	endpoint, _ := etcdtest.Start(t)
	proxy, err := tcpproxy.Start(strings.TrimPrefix(endpoint, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	const ttl = 5
	cut, err := leader.NewElector(etcdtest.Client(t, "http://"+proxy.Addr()), "/cutoff/leader", leader.Info{ID: "cut"}, ttl, log).Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	elected := make(chan time.Time, 1)
	go func() {
		next, err := leader.NewElector(etcdtest.Client(t, endpoint), "/cutoff/leader", leader.Info{ID: "next"}, ttl, log).Campaign(ctx)
		if err == nil {
			elected <- time.Now()
			_ = next.Resign(context.Background())
		}
	}()
	time.Sleep(1500 * time.Millisecond) // a few successful reads first
	proxy.Cut()
	cutAt := time.Now()
	var ended time.Time
	select {
	case <-cut.Context().Done():
		ended = time.Now()
	case <-ctx.Done():
		t.Fatal("the cut-off leader never stepped down")
	}
	var next time.Time
	select {
	case next = <-elected:
	case <-ctx.Done():
		t.Fatal("no other replica was elected")
	}
	t.Logf("cut off at 0s; stepped down at %.2fs; the other replica elected at %.2fs", ended.Sub(cutAt).Seconds(), next.Sub(cutAt).Seconds())
	if !ended.Before(next) {
		t.Fatalf("two leaders for %s: the cut-off term ended %.2fs after the cut, the next was elected at %.2fs",
			ended.Sub(next).Round(time.Millisecond), ended.Sub(cutAt).Seconds(), next.Sub(cutAt).Seconds())
	}
}
