package pressure

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nodefence/nodefence/node-agent/eviction"
	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

// grants records what the monitor hands to the evictor.
type grants struct {
	mu  sync.Mutex
	got []string
}

func (g *grants) Grant(e *agentv1.EvictionGrant) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, p := range e.Pods {
		g.got = append(g.got, p.Name)
	}
}

// TestSoftThresholdWaitsForGrantThenFallsBack: past its grace period a soft threshold proposes one
// candidate to the coordinator and evicts nobody on its own; a grant for it goes to the evictor; a
// candidate with no grant within GrantTimeout is evicted locally with the soft grace period.
func TestSoftThresholdWaitsForGrantThenFallsBack(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := &reader{mem: 900 * mi, pid: 900}
	s := make(sender, 64)
	k := &killer{cleaned: true}
	g := &grants{}
	m, err := New(Config{
		Eviction: parse(t, eviction.Flags{HardSet: true, Hard: "memory.available<100Mi", Soft: "memory.available<1Gi",
			SoftGracePeriod: "memory.available=10s", MaxPodGracePeriod: 20, PressureTransitionPeriod: time.Minute}),
		HousekeepingInterval: time.Hour, FastInterval: -1, GrantTimeout: time.Minute, Log: slog.New(slog.DiscardHandler),
		Actions: Actions{Killer: k, Cleanup: k, Granted: g},
	}, r, s, memPods, nil)
	if err != nil {
		t.Fatal(err)
	}
	drain := func() []string {
		var out []string
		for len(s) > 0 {
			if d := describe(<-s); !strings.HasPrefix(d, "CONDITION") {
				out = append(out, d)
			}
		}
		return out
	}
	t0 := time.Unix(1000, 0)
	m.housekeeping(ctx, t0)                     // grace period starts
	m.housekeeping(ctx, t0.Add(10*time.Second)) // grace period over: propose
	m.housekeeping(ctx, t0.Add(20*time.Second)) // waiting for the grant
	if diff := cmp.Diff([]string{"candidates memory.available besteffort/20s"}, drain()); diff != "" {
		t.Errorf("proposal (-want +got):\n%s", diff)
	}
	// A grant for another pod is declined; the one for the candidate goes to the evictor.
	m.handleGrant(&agentv1.EvictionGrant{Signal: "memory.available", Pods: []*agentv1.EvictionCandidate{{Namespace: "a", Name: "guaranteed", Uid: "u1"}}}, t0.Add(21*time.Second))
	m.handleGrant(&agentv1.EvictionGrant{Signal: "memory.available", Pods: []*agentv1.EvictionCandidate{{Namespace: "a", Name: "besteffort", Uid: "u2"}}}, t0.Add(21*time.Second))
	if diff := cmp.Diff([]string{"eviction EVICTION_KIND_DECLINED a/guaranteed 0s"}, drain()); diff != "" {
		t.Errorf("decline (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"besteffort"}, g.got); diff != "" {
		t.Errorf("granted (-want +got):\n%s", diff)
	}
	if len(k.kills()) != 0 {
		t.Errorf("local kills %v with a grant", k.kills())
	}
	// Pressure remains: a new candidate, and no grant for a minute: local fallback.
	m.housekeeping(ctx, t0.Add(30*time.Second))
	m.housekeeping(ctx, t0.Add(89*time.Second))
	m.housekeeping(ctx, t0.Add(90*time.Second))
	if diff := cmp.Diff([]string{"candidates memory.available besteffort/20s", "eviction EVICTION_KIND_FALLBACK a/besteffort 20s"}, drain()); diff != "" {
		t.Errorf("fallback (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"besteffort/20s"}, k.kills()); diff != "" {
		t.Errorf("local kills (-want +got):\n%s", diff)
	}
}

// TestGrantAfterPressureGoneIsDeclined: a grant for the candidate that comes after the soft
// threshold stopped being met is declined, not carried out (kubelet would not evict then either).
func TestGrantAfterPressureGoneIsDeclined(t *testing.T) {
	ctx := context.Background()
	r := &reader{mem: 900 * mi, pid: 900}
	s := make(sender, 64)
	g := &grants{}
	k := &killer{cleaned: true}
	m, err := New(Config{
		Eviction: parse(t, eviction.Flags{HardSet: true, Hard: "memory.available<100Mi", Soft: "memory.available<1Gi",
			SoftGracePeriod: "memory.available=10s", PressureTransitionPeriod: time.Minute}),
		HousekeepingInterval: time.Hour, FastInterval: -1, Log: slog.New(slog.DiscardHandler),
		Actions: Actions{Killer: k, Cleanup: k, Granted: g},
	}, r, s, memPods, nil)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1000, 0)
	m.housekeeping(ctx, t0)
	m.housekeeping(ctx, t0.Add(10*time.Second)) // proposes besteffort
	r.set(4 * gi)
	m.housekeeping(ctx, t0.Add(20*time.Second)) // pressure gone
	m.handleGrant(&agentv1.EvictionGrant{Signal: "memory.available", Pods: []*agentv1.EvictionCandidate{{Namespace: "a", Name: "besteffort", Uid: "u2"}}}, t0.Add(21*time.Second))
	var got []string
	for len(s) > 0 {
		if d := describe(<-s); !strings.HasPrefix(d, "CONDITION") {
			got = append(got, d)
		}
	}
	if diff := cmp.Diff([]string{"candidates memory.available besteffort/0s", "eviction EVICTION_KIND_DECLINED a/besteffort 0s"}, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if len(g.got) != 0 || len(k.kills()) != 0 {
		t.Errorf("evicted after the pressure was gone: granted %v, killed %v", g.got, k.kills())
	}
}

// TestNewStreamReproposesWithoutRestartingTheTimeout: a pending candidate is proposed again on
// every new coordinator stream (a new leader never heard of it), with the same content; the grant
// timeout still counts from the first proposal, so the local fallback comes when it would have.
// Without a pending candidate a new stream sends nothing.
func TestNewStreamReproposesWithoutRestartingTheTimeout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := &reader{mem: 900 * mi, pid: 900}
	s := make(sender, 64)
	k := &killer{cleaned: true}
	m, err := New(Config{
		Eviction: parse(t, eviction.Flags{HardSet: true, Hard: "memory.available<100Mi", Soft: "memory.available<1Gi",
			SoftGracePeriod: "memory.available=10s", MaxPodGracePeriod: 20, PressureTransitionPeriod: time.Minute}),
		HousekeepingInterval: time.Hour, FastInterval: -1, GrantTimeout: time.Minute, Log: slog.New(slog.DiscardHandler),
		Actions: Actions{Killer: k, Cleanup: k, Granted: &grants{}},
	}, r, s, memPods, nil)
	if err != nil {
		t.Fatal(err)
	}
	drain := func() []string {
		var out []string
		for len(s) > 0 {
			if d := describe(<-s); !strings.HasPrefix(d, "CONDITION") {
				out = append(out, d)
			}
		}
		return out
	}
	m.repropose()
	if got := drain(); len(got) != 0 {
		t.Errorf("new stream without a candidate sent %v", got)
	}
	t0 := time.Unix(1000, 0)
	m.housekeeping(ctx, t0)
	m.housekeeping(ctx, t0.Add(10*time.Second)) // proposed
	m.Connected()
	m.Connected() // two streams in a row queue one re-proposal
	<-m.streams
	m.repropose()
	if len(m.streams) != 0 {
		t.Error("a second Connected queued a second re-proposal")
	}
	want := []string{"candidates memory.available besteffort/20s", "candidates memory.available besteffort/20s"}
	if diff := cmp.Diff(want, drain()); diff != "" {
		t.Errorf("proposal and re-proposal (-want +got):\n%s", diff)
	}
	m.housekeeping(ctx, t0.Add(69*time.Second))
	if len(k.kills()) != 0 {
		t.Errorf("local kills %v before the first proposal's timeout", k.kills())
	}
	m.housekeeping(ctx, t0.Add(70*time.Second))
	if diff := cmp.Diff([]string{"besteffort/20s"}, k.kills()); diff != "" {
		t.Errorf("fallback one grant timeout after the first proposal (-want +got):\n%s", diff)
	}
}
