package engine

import (
	"strings"
	"testing"
	"time"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

// TestPodEvictionInputsBounded: candidates and reports with fields longer than Kubernetes allows
// are ignored, so an agent cannot make the coordinator keep (or write to the audit trail) more than
// a pod's names.
func TestPodEvictionInputsBounded(t *testing.T) {
	cfg := DefaultConfig()
	e := New(cfg)
	t0 := time.Unix(0, 0)
	e.Step(LeaderElected{At: t0})
	e.Step(Hello{Node: "a1", Zone: "a", BootID: "b", At: t0})
	long := strings.Repeat("x", 300)
	e.Step(Message{Node: "a1", At: t0, Msg: &agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Candidates{Candidates: &agentv1.EvictionCandidates{
		Signal: "memory.available", Candidates: []*agentv1.EvictionCandidate{{Namespace: "ns", Name: long, Uid: "u"}}}}}})
	e.Step(Message{Node: "a1", At: t0, Msg: &agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Eviction{Eviction: &agentv1.EvictionReport{
		Namespace: long, Name: "p", Uid: "u", Kind: agentv1.EvictionKind_EVICTION_KIND_HARD}}}})
	e.Tick(t0.Add(time.Second))
	z := e.Zones()[0]
	if z.PodCandidatesHeld != 0 || z.PodEvictionsGranted != 0 || z.PodEvictionsLocal != 0 || len(e.Ready().Grants) != 0 {
		t.Errorf("zone %v, grants %v; want the oversized inputs ignored", z, e.Ready().Grants)
	}
	for _, ev := range e.Ready().Events {
		if strings.Contains(ev.Text, long) {
			t.Errorf("event carries the oversized field: %.80s", ev.Text)
		}
	}
}
