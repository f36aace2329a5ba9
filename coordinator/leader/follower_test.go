package leader_test

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/nodefence/nodefence/coordinator/leader"
	"github.com/nodefence/nodefence/testbed/etcdtest"
)

// A leader whose address refuses connections (its process is gone) is named to nobody, and its key
// is removed long before its 60 s lease would expire, so the replica waiting in line takes over; a
// leader whose address answers is named and kept.
func TestFollowerRemovesTheKeyOfADeadLeader(t *testing.T) {
	endpoint, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	log := slog.New(slog.DiscardHandler)

	live, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()

	first, err := leader.NewElector(etcdtest.Client(t, endpoint), "/f/leader", leader.Info{ID: "a", Address: live.Addr().String()}, 60, log).Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	f := leader.NewFollower(cli, "/f/leader", "b", log)
	go f.Run(ctx, 50*time.Millisecond)
	time.Sleep(time.Second) // many probes of a live leader
	if v := f.View(ctx); !v.Found || !v.Answers || v.Leader.ID != "a" || v.Epoch != first.Epoch {
		t.Fatalf("view of a live leader = %+v", v)
	}
	if first.Context().Err() != nil {
		t.Fatal("the live leader's term ended")
	}
	first.Abandon() // the process dies without resigning: its key stays for its 60 s lease
	live.Close()

	// The next leader's address is dead too: it is named to nobody, then removed in turn.
	second, err := leader.NewElector(etcdtest.Client(t, endpoint), "/f/leader", leader.Info{ID: "c", Address: deadAddr}, 60, log).Campaign(ctx)
	if err != nil {
		t.Fatal(err) // only possible once a's key is gone
	}
	if second.Epoch <= first.Epoch {
		t.Fatalf("second epoch %d <= first %d", second.Epoch, first.Epoch)
	}
	start := time.Now()
	for {
		v := f.View(ctx)
		if v.Found && v.Leader.ID == "c" && v.Answers {
			t.Fatalf("a leader whose address refuses connections is verified: %+v", v)
		}
		if second.Context().Err() != nil {
			break // its key was removed
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("the dead leader's key was not removed: %+v", v)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
