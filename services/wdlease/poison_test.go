package wdlease

import (
	"errors"
	"testing"
	"time"
)

// A stop-feeding pill stops the feeding at once, whatever lease or peer answers the agent holds,
// for good; a deposed leader's pill (an epoch older than a grant taken) is refused and changes
// nothing.
func TestPoisonStopsFeeding(t *testing.T) {
	b := Defaults(15 * time.Second)
	t0 := time.Unix(1000, 0)
	a := NewAgent(b, t0)
	if err := a.Grant(Grant{Epoch: 5, ID: 1, Duration: b.Lease}, t0, t0); err != nil {
		t.Fatal(err)
	}
	if d := a.MayFeed(t0.Add(time.Second), "n1", 3, Confirmation{}); d != FeedLease {
		t.Fatalf("before the pill: %s, want lease", d)
	}
	if err := a.Poison(4); !errors.Is(err, ErrPillStale) {
		t.Fatalf("a pill of epoch 4 after a grant of epoch 5: %v, want ErrPillStale", err)
	}
	if d := a.MayFeed(t0.Add(time.Second), "n1", 3, Confirmation{}); d != FeedLease || a.Poisoned() {
		t.Fatalf("a stale pill changed the decision: %s", d)
	}
	if err := a.Poison(5); err != nil {
		t.Fatal(err)
	}
	peers := Confirmation{QueriedAt: t0.Add(time.Second), NoLease: []string{"n2", "n3", "n4"}}
	if d := a.MayFeed(t0.Add(time.Second), "n1", 5, peers); d != Stop {
		t.Fatalf("after the pill, holding a lease and a peer quorum: %s, want stop", d)
	}
	if err := a.Grant(Grant{Epoch: 6, ID: 1, Duration: b.Lease}, t0.Add(2*time.Second), t0.Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	if d := a.MayFeed(t0.Add(2*time.Second), "n1", 3, Confirmation{}); d != Stop {
		t.Fatalf("a later grant after the pill: %s, want stop", d)
	}
}
