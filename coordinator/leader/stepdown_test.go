package leader_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/nodefence/nodefence/coordinator/leader"
	"github.com/nodefence/nodefence/testbed/etcdtest"
	"github.com/nodefence/nodefence/testbed/tcpproxy"
)

// A leader whose path to etcd goes dark (every byte held back, as a blackholed route does: reads
// hang rather than fail) steps down within four fifths of its lease and a check period, before the
// lease could expire and another replica be elected — not a whole hung read later.
func TestLeaderCutFromEtcdStepsDownWithinFourFifths(t *testing.T) {
	endpoint, _ := etcdtest.Start(t)
	proxy, err := tcpproxy.StartDelayed("127.0.0.1:0", trimScheme(endpoint))
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const ttl = 5 // seconds: the coordinator's default --election-ttl
	term, err := leader.NewElector(etcdtest.Client(t, "http://"+proxy.Addr()), "/cut/leader", leader.Info{ID: "a"}, ttl, slog.New(slog.DiscardHandler)).Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // a few successful checks first
	cut := time.Now()
	proxy.SetDelay(time.Hour, time.Hour)
	select {
	case <-term.Context().Done():
	case <-ctx.Done():
		t.Fatal("the leader cut from etcd never stepped down")
	}
	took := time.Since(cut)
	// The last successful read came at most one check period (1 s) before the cut; the deadline is
	// four fifths of the lease after it, and the check that sees it passed comes within a period.
	if limit := ttl * time.Second * 4 / 5; took > limit+time.Second/2 {
		t.Fatalf("stepped down %s after the cut: later than four fifths of the %ds lease (%s) and half a check", took.Round(time.Millisecond), ttl, limit)
	}
	t.Logf("stepped down %s after etcd went dark", took.Round(time.Millisecond))
}

func trimScheme(endpoint string) string {
	for _, p := range []string{"http://", "https://"} {
		if len(endpoint) > len(p) && endpoint[:len(p)] == p {
			return endpoint[len(p):]
		}
	}
	return endpoint
}
