package engine

import (
	"fmt"
	"strings"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

// handleCandidate: candidate a1 pod=ns/p [signal=memory.available]
func (h *harness) handleCandidate(pos []string, args map[string]string) []string {
	ns, name, _ := strings.Cut(args["pod"], "/")
	signal := args["signal"]
	if signal == "" {
		signal = "memory.available"
	}
	for _, n := range h.expand(pos) {
		h.send(n, &agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Candidates{Candidates: &agentv1.EvictionCandidates{
			Signal: signal, Candidates: []*agentv1.EvictionCandidate{{Namespace: ns, Name: name, Uid: n + ":" + args["pod"]}}}}})
	}
	return h.drain()
}

// handleReport: report a1 pod=ns/p kind=granted|failed|declined|hard|fallback [uid-of=b1]
// (uid-of: the report names the uid of b1's candidate for that pod)
func (h *harness) handleReport(pos []string, args map[string]string) []string {
	ns, name, _ := strings.Cut(args["pod"], "/")
	kinds := map[string]agentv1.EvictionKind{
		"granted": agentv1.EvictionKind_EVICTION_KIND_GRANTED, "failed": agentv1.EvictionKind_EVICTION_KIND_FAILED,
		"declined": agentv1.EvictionKind_EVICTION_KIND_DECLINED, "hard": agentv1.EvictionKind_EVICTION_KIND_HARD,
		"fallback": agentv1.EvictionKind_EVICTION_KIND_FALLBACK,
	}
	kind, ok := kinds[args["kind"]]
	if !ok {
		h.t.Fatalf("report: unknown kind %q", args["kind"])
	}
	for _, n := range h.expand(pos) {
		uidOf := n
		if o, ok := args["uid-of"]; ok {
			uidOf = o
		}
		h.send(n, &agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Eviction{Eviction: &agentv1.EvictionReport{
			Namespace: ns, Name: name, Uid: uidOf + ":" + args["pod"], Signal: "memory.available", Kind: kind}}})
	}
	return h.drain()
}

// handlePodZones: pod-zones
func (h *harness) handlePodZones() []string {
	var out []string
	for _, z := range h.e.Zones() {
		out = append(out, fmt.Sprintf("zone %s: pod-rate=%g in-flight=%d/%d held=%d granted=%d local=%d fallbacks=%d",
			z.Key, z.PodEvictionRate, z.PodEvictionsInFlight, z.PodEvictionsMaxInFlight, z.PodCandidatesHeld, z.PodEvictionsGranted, z.PodEvictionsLocal, z.PodEvictionFallbacks))
	}
	return out
}
