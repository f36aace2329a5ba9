package engine

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

// nodeWrites are the node records among the engine's pending writes, the latest per node.
func nodeWrites(e *Engine) map[string]NodeRecord {
	out := map[string]NodeRecord{}
	for _, w := range e.Ready().Writes {
		if w.Node != nil {
			out[w.Node.Name] = *w.Node
		}
	}
	return out
}

// A node's last watchdog report and its pill's safe time survive a failover (issue 24): the term
// that heard it writes them with the node's record whenever they change, and a new leader that never hears the node's agent
// (a dark node whose watchdog fence it takes over) restores it: armed with its timeout, or —
// after a clean stop's "disarmed" — not armed, so it is never proven off by time. An agent heard
// in the new term keeps its own report; a restored timeout out of the timing rule's range is none.
func TestWatchdogReportSurvivesFailover(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	armed := &agentv1.WatchdogState{Armed: true, Timeout: durationpb.New(15 * time.Second)}
	old := New(DefaultConfig())
	old.Step(LeaderElected{At: start})
	old.Step(Configured{Node: "dark", Zone: "z", Fenceable: true, At: start})
	old.Step(Configured{Node: "stopped", Zone: "z", Fenceable: true, At: start})
	old.Step(Hello{Node: "dark", Zone: "z", BootID: "b1", At: start, Watchdog: armed})
	old.Step(Hello{Node: "stopped", Zone: "z", BootID: "b2", At: start, Watchdog: armed})
	old.Step(Message{Node: "stopped", At: start.Add(time.Second), Msg: &agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Watchdog{Watchdog: &agentv1.WatchdogState{}}}})
	bound := start.Add(40 * time.Second) // the pill's safe time
	old.Step(WatchdogBound{Node: "dark", NotBefore: bound})
	old.Step(WatchdogBound{Node: "dark", NotBefore: bound.Add(-time.Second)}) // an earlier one never lowers it
	recs := nodeWrites(old)
	if r := recs["dark"]; !r.WatchdogArmed || r.WatchdogTimeout != 15*time.Second || !r.WatchdogNotBefore.Equal(bound) {
		t.Fatalf("the armed report was written as %+v", r)
	}
	if r, ok := recs["stopped"]; !ok || r.WatchdogArmed {
		t.Fatalf("the disarmed report was written as %+v (written: %v)", r, ok)
	}

	later := start.Add(time.Minute)
	e := New(DefaultConfig())
	e.Step(LeaderElected{At: later})
	e.Step(Hello{Node: "back", Zone: "z", BootID: "b3", At: later}) // heard in this term, without a watchdog
	e.Step(Restored{Nodes: []NodeRecord{recs["dark"], recs["stopped"],
		{Name: "back", Zone: "z", WatchdogArmed: true, WatchdogTimeout: 15 * time.Second},
		{Name: "huge", Zone: "z", WatchdogArmed: true, WatchdogTimeout: time.Hour}}})
	if n := e.Node("dark"); !n.GetWatchdogArmed() || n.GetWatchdogTimeout().AsDuration() != 15*time.Second {
		t.Errorf("the new leader restored dark's watchdog as armed=%v timeout=%v", n.GetWatchdogArmed(), n.GetWatchdogTimeout().AsDuration())
	}
	if got := e.WatchdogNotBefore("dark"); !got.Equal(bound) {
		t.Errorf("the new leader restored dark's pill bound as %v, want %v", got, bound)
	}
	for _, name := range []string{"stopped", "back", "huge"} {
		if e.Node(name).GetWatchdogArmed() {
			t.Errorf("%s restored as armed", name)
		}
	}
}
