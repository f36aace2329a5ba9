package wdlease

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// The formula with the defaults, and with a lease long enough that the rate term exceeds the 2·T
// floor; the window; the restart guard; the quorums.
func TestFormula(t *testing.T) {
	b := Defaults(15 * time.Second)
	if err := b.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		got, want time.Duration
	}{
		{"safe time, defaults (the 2T floor)", b.SafeAfterGrant(), 30 * time.Second},
		// (4 s + 15 s)·1.01/0.99 = 19.383838384 s, + 2 s·1.01 = 2.02 s.
		{"rate term, defaults", b.slowest(b.Lease+b.Watchdog) + b.sched(), 21403838384},
		// (60 s + 15 s)·1.01/0.99 = 76.515151515 s, + 2.02 s: more than 30 s.
		{"safe time, 60 s lease", Bounds{Lease: time.Minute, Watchdog: 15 * time.Second, RatePPM: 10_000, Sched: 2 * time.Second}.SafeAfterGrant(), 78535151516},
		// (15 s + 2 s)·1.01/0.99 = 17.343434343 s, + 2.02 s.
		{"window, defaults", b.Window(), 19363434344},
		// 4 s·1.01/0.99 = 4.080808081 s.
		{"restart guard, defaults", b.NoLeaseGuard(), 4080808081},
		// 4 s·0.99/1.01 = 3.920792079 s, rounded down.
		{"held at least, defaults", b.heldAtLeast(b.Lease), 3920792079},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %s (%d), want %s", tc.name, tc.got, int64(tc.got), tc.want)
		}
	}
	for n, want := range map[int][2]int{1: {1, 1}, 2: {2, 2}, 3: {2, 2}, 4: {3, 3}, 5: {3, 3}, 10_000: {5001, 5001}} {
		if q, m := b.PeerQuorum(n), Majority(n); q != want[0] || m != want[1] {
			t.Errorf("cluster of %d: peer quorum %d, majority %d; want %v", n, q, m, want)
		}
	}
}

// Bounds out of range are refused, every one named.
func TestBoundsValidate(t *testing.T) {
	bad := Bounds{Lease: 0, Watchdog: time.Hour, RatePPM: 0, Sched: -1, PeerAge: 0, Liars: -1}
	err := bad.Validate()
	for _, name := range []string{"lease 0s", "watchdog timeout 1h0m0s", "clock rate bound (ppm) 0", "scheduling delay -1ns", "peer answer age 0s", "liars -1"} {
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("want %q in %v", name, err)
		}
	}
}

// The agent's side: a lease runs from the request's send time; refused grants; the restart guard;
// the peer path's quorum, age and distinct identities.
func TestAgentRule(t *testing.T) {
	b := Defaults(15 * time.Second)
	t0 := time.Unix(1000, 0)
	a := NewAgent(b, t0)
	if a.MayFeed(t0, "n0", 3, Confirmation{}) != Stop || a.AnswerNoLease(t0) {
		t.Fatal("a fresh agent with no lease and no peers feeds, or answers \"no lease\" within its guard")
	}
	for _, tc := range []struct {
		g    Grant
		sent time.Time
		want error
	}{
		{Grant{Epoch: 1, ID: 1, Duration: 5 * time.Second}, t0, ErrGrantDuration},
		{Grant{Epoch: 1, ID: 1, Duration: 0}, t0, ErrGrantDuration},
		{Grant{Epoch: 1, ID: 1, Duration: time.Second}, t0.Add(time.Second), ErrGrantTime},
	} {
		if err := a.Grant(tc.g, tc.sent, t0); !errors.Is(err, tc.want) {
			t.Errorf("grant %+v sent %s: %v, want %v", tc.g, tc.sent, err, tc.want)
		}
	}
	// A grant arriving 3 s after its request: the lease ends 4 s after the request, not the arrival.
	if err := a.Grant(Grant{Epoch: 2, ID: 7, Duration: 4 * time.Second}, t0, t0.Add(3*time.Second)); err != nil {
		t.Fatal(err)
	}
	if e, id := a.Echo(); e != 2 || id != 7 {
		t.Errorf("echo %d/%d", e, id)
	}
	if err := a.Grant(Grant{Epoch: 1, ID: 9, Duration: 4 * time.Second}, t0, t0.Add(3*time.Second)); !errors.Is(err, ErrGrantStale) {
		t.Errorf("an older epoch's grant: %v", err)
	}
	if a.MayFeed(t0.Add(3999*time.Millisecond), "n0", 3, Confirmation{}) != FeedLease || a.MayFeed(t0.Add(4*time.Second), "n0", 3, Confirmation{}) != Stop {
		t.Error("the lease does not end 4 s after its request was sent")
	}
	late := t0.Add(10 * time.Second)
	if !a.AnswerNoLease(late) {
		t.Error("no \"no lease\" answer after the lease and the restart guard")
	}
	q := late.Add(-time.Second)
	for _, tc := range []struct {
		name string
		n    int
		c    Confirmation
		want Decision
	}{
		{"both others of three", 3, Confirmation{q, []string{"n1", "n2"}}, FeedPeers},
		{"one other of three: a liar could be it", 3, Confirmation{q, []string{"n1"}}, Stop},
		{"the same peer twice", 3, Confirmation{q, []string{"n1", "n1"}}, Stop},
		{"itself counted", 3, Confirmation{q, []string{"n0", "n1"}}, Stop},
		{"too old", 3, Confirmation{late.Add(-3 * time.Second), []string{"n1", "n2"}}, Stop},
		{"from the future", 3, Confirmation{late.Add(time.Second), []string{"n1", "n2"}}, Stop},
		{"three of five", 5, Confirmation{q, []string{"n1", "n2", "n3"}}, FeedPeers},
		{"two of five", 5, Confirmation{q, []string{"n1", "n2"}}, Stop},
		{"a two-node cluster never", 2, Confirmation{q, []string{"n1"}}, Stop},
	} {
		if got := a.MayFeed(late, "n0", tc.n, tc.c); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}

// The leader's side: not armed, before the safe time, without a majority's proven leases, and
// allowed once all three hold; a new term counts from its start.
func TestLeaderRule(t *testing.T) {
	b := Defaults(15 * time.Second)
	t0 := time.Unix(5000, 0)
	l := NewLeader(b, 3, t0)
	wd := Watchdog{Armed: true, Timeout: 15 * time.Second}
	echo := map[string]uint64{}
	now := t0
	for range 30 { // 30 s of heartbeats from n1..n4; n0 sent one at the start only
		for _, n := range []string{"n1", "n2", "n3", "n4"} {
			echo[n] = l.Request(n, 3, echo[n], now).ID
		}
		if now == t0 {
			l.Request("n0", 0, 0, now)
		}
		now = now.Add(time.Second)
	}
	if ok, why := l.SelfFenced("n0", Watchdog{Armed: false, Timeout: 15 * time.Second}, 5, now); ok || why != NotArmed {
		t.Errorf("not armed: %v %s", ok, why)
	}
	if ok, why := l.SelfFenced("n0", wd, 5, t0.Add(29*time.Second)); ok || why != BeforeSafe {
		t.Errorf("29 s after its grant: %v %s", ok, why)
	}
	if ok, why := l.SelfFenced("n0", wd, 5, now); !ok {
		t.Errorf("30 s after its grant, four others holding: %s", why)
	}
	if ok, why := l.SelfFenced("n0", wd, 9, now); ok || why != NoMajority {
		t.Errorf("four of nine holding: %v %s", ok, why)
	}
	l2 := NewLeader(b, 4, now)
	if got := l2.SafeTime("n0", 15*time.Second); !got.Equal(now.Add(30 * time.Second)) {
		t.Errorf("a new term's safe time %s, want its start + 30 s", got.Sub(now))
	}
	if ok, why := l2.SelfFenced("n0", wd, 5, now.Add(31*time.Second)); ok || why != NoMajority {
		t.Errorf("a new term without proven leases: %v %s", ok, why)
	}
}
