package engine

import (
	"strings"
	"testing"
	"time"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

func conditionMsg(status agentv1.ConditionStatus, reason string) *agentv1.ConnectRequest {
	return &agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Condition{Condition: &agentv1.ConditionChange{
		Type: agentv1.ConditionType_CONDITION_TYPE_MEMORY_PRESSURE, Status: status, Reason: reason}}}
}

func shutdownMsg(p agentv1.ShutdownPhase) *agentv1.ConnectRequest {
	return &agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Shutdown{Shutdown: &agentv1.ShutdownEvent{Phase: p}}}
}

// drained is what the loop does with a Ready: take it and advance.
func drained(e *Engine) Ready {
	rd := e.Ready()
	e.Advance()
	return rd
}

// TestAgentFloodWritesAtTheLimitAndKeepsTheNewest: one agent flipping a condition, its shutdown
// announcement and reporting evictions as fast as it can causes at most Burst + Rate*elapsed writes
// (audit lines, node records, condition mirrors), whatever it sends; the engine still knows the
// newest condition and announcement at once, writes their newest values as soon as the bucket
// refills, counts every drop, and summarises them in one audit line per node per interval.
func TestAgentFloodWritesAtTheLimitAndKeepsTheNewest(t *testing.T) {
	cfg := DefaultConfig()
	cfg.AgentEvents = AgentEventConfig{Rate: 1, Burst: 5, Summary: 10 * time.Second}
	e := New(cfg)
	t0 := time.Unix(1_700_000_000, 0)
	e.Step(LeaderElected{At: t0})
	e.Step(Hello{Node: "n1", Zone: "z", BootID: "b", At: t0})
	e.Step(Hello{Node: "n2", Zone: "z", BootID: "b", At: t0})
	drained(e)

	var writes, conditions, events, dropped int
	var lastCondition ConditionChange
	count := func(rd Ready) {
		for _, w := range rd.Writes {
			if w.Node != nil && w.Node.Name == "n1" {
				writes++
			}
		}
		for _, c := range rd.Conditions {
			if c.Node == "n1" {
				conditions++
				lastCondition = c
			}
		}
		for _, ev := range rd.Events {
			if ev.Node == "n1" && ev.Kind != summaryKind {
				events++
			}
		}
		dropped += len(rd.Dropped)
	}
	const flips = 3000
	for i := range flips {
		at := t0.Add(time.Duration(i) * 300 * time.Microsecond) // 3,000 messages in 0.9 s
		var m *agentv1.ConnectRequest
		switch i % 3 {
		case 0:
			m = conditionMsg(agentv1.ConditionStatus(2-i%2), "flip")
		case 1:
			m = shutdownMsg(agentv1.ShutdownPhase_SHUTDOWN_PHASE_STARTED)
			if i%2 == 0 {
				m = shutdownMsg(agentv1.ShutdownPhase_SHUTDOWN_PHASE_CANCELLED)
			}
		default:
			m = &agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Eviction{Eviction: &agentv1.EvictionReport{
				Namespace: "ns", Name: "p", Uid: "u", Kind: agentv1.EvictionKind_EVICTION_KIND_HARD}}}
		}
		e.Step(Message{Node: "n1", At: at, Msg: m})
		count(drained(e))
	}
	// The last condition message (i = 2997) was TRUE; the last announcement (i = 2998) CANCELLED.
	v := e.Node("n1")
	if len(v.Conditions) != 1 || v.Conditions[0].Status != "True" {
		t.Fatalf("n1 conditions %v: want the newest, MemoryPressure=True, known at once", v.Conditions)
	}
	if v.ShuttingDown {
		t.Fatal("n1 shutting down: want the newest announcement (cancelled) known at once")
	}
	// Each write (a node record or a condition mirrored) comes with its audit line.
	if bound := 5 + 1; events > bound || writes+conditions > events {
		t.Fatalf("%d node records, %d condition mirrors, %d audit lines in 0.9 s: want at most burst+rate*elapsed = %d lines", writes, conditions, events, bound)
	}
	if dropped+events != flips {
		t.Errorf("%d written + %d counted as dropped; want every one of the %d events accounted for", events, dropped, flips)
	}

	// As the bucket refills the held-back writes go out: the node record first, then the newest
	// condition; nothing else.
	for s := 1; s <= 5; s++ {
		e.Tick(t0.Add(time.Duration(s) * time.Second))
		count(drained(e))
	}
	if lastCondition.Status != "True" || lastCondition.Type != "MemoryPressure" {
		t.Errorf("last condition mirrored %+v: want the newest, MemoryPressure=True", lastCondition)
	}
	var rec *NodeRecord
	e.Tick(t0.Add(6 * time.Second))
	for _, w := range drained(e).Writes {
		if w.Node != nil {
			rec = w.Node
		}
	}
	if rec != nil {
		t.Errorf("node record written again after the held one: %+v", rec)
	}

	// One summary after the interval, none before, none for the quiet node; then nothing.
	var summaries []string
	for s := 7; s <= 40; s++ {
		e.Tick(t0.Add(time.Duration(s) * time.Second))
		for _, ev := range drained(e).Events {
			if ev.Kind == summaryKind {
				if ev.Node != "n1" {
					t.Errorf("summary for %s, which sent nothing", ev.Node)
				}
				summaries = append(summaries, ev.Text)
			}
		}
	}
	if len(summaries) != 1 {
		t.Fatalf("summaries %q: want exactly one", summaries)
	}
	for _, want := range []string{"condition", "shutdown", "eviction-report", "over the limit of 1 a second"} {
		if !strings.Contains(summaries[0], want) {
			t.Errorf("summary %q does not mention %q", summaries[0], want)
		}
	}
	if len(e.limited) != 0 {
		t.Errorf("%d nodes still watched after the summary; want none", len(e.limited))
	}
}

// TestAgentEventsUnderTheLimitAreWrittenAtOnce: an agent within its limit sees every change
// written as before, with nothing held, dropped or summarised.
func TestAgentEventsUnderTheLimitAreWrittenAtOnce(t *testing.T) {
	e := New(DefaultConfig())
	t0 := time.Unix(1_700_000_000, 0)
	e.Step(LeaderElected{At: t0})
	e.Step(Hello{Node: "n1", Zone: "z", BootID: "b", At: t0})
	drained(e)
	e.Step(Message{Node: "n1", At: t0, Msg: conditionMsg(agentv1.ConditionStatus_CONDITION_STATUS_TRUE, "low")})
	e.Step(Message{Node: "n1", At: t0, Msg: shutdownMsg(agentv1.ShutdownPhase_SHUTDOWN_PHASE_STARTED)})
	rd := drained(e)
	if len(rd.Conditions) != 1 || len(rd.Writes) != 1 || len(rd.Events) != 2 || len(rd.Dropped) != 0 {
		t.Fatalf("ready %+v: want the condition mirrored, the record written, two audit lines, no drop", rd)
	}
	e.Tick(t0.Add(2 * DefaultAgentEventSummary))
	for _, ev := range drained(e).Events {
		if ev.Kind == summaryKind {
			t.Errorf("summary without drops: %s", ev.Text)
		}
	}
}
