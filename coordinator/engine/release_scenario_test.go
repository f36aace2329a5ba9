package engine

import (
	"fmt"
	"time"

	"github.com/nodefence/nodefence/coordinator/fencing"
	"github.com/nodefence/nodefence/coordinator/release"
)

// handleRelease is one pass of the release reconciler (coordinator/kube) over the node, with the
// rule it applies (coordinator/release: State.Witnesses, Decide) fed from the engine: the node's
// newest record, whether it runs, the engine's view of the node and its proof. What the pass reads
// from the Node besides is given: its out-of-service taint (tainted=true) and its Ready condition
// (node-ready=<how long it has been True>). For "would release" the pass writes the record's next
// version (fencing.WouldRelease), as coordinator/app does; nothing else is applied.
//
//	release a1 [tainted=true] [node-ready=1m] [healthy-delay=1m]
func (h *harness) handleRelease(pos []string, args map[string]string) []string {
	node := h.one("release", pos)
	latest := h.flow().records[node]
	st := release.State{Fence: latest, Running: latest != nil && latest.FinishedAt == nil, Tainted: args["tainted"] == "true"}
	if latest != nil {
		st.Proof.Fence, st.Proof.Verdict, st.Proof.Spoke = h.e.Proof(node)
	}
	st.Witnesses(h.e.Node(node))
	if d := args["node-ready"]; d != "" {
		st.NodeReady, st.ReadySince = true, h.now.Add(-h.dur(d))
	}
	delay := time.Minute
	if d := args["healthy-delay"]; d != "" {
		delay = h.dur(d)
	}
	action, after, why := release.Decide(st, h.now, delay)
	line := fmt.Sprintf("%s: release %s", node, action)
	if after > 0 {
		line += fmt.Sprintf(" (again in %s)", after)
	}
	out := []string{line}
	if why != "" {
		out[0] += ": " + h.relative(why)
	}
	if action == release.Would {
		if next := fencing.WouldRelease(latest, h.now, h.fence.epoch); next != nil {
			h.keep(next)
			out = append(out, h.summary(next)+" would-release")
		}
	}
	return out
}
