package term

import (
	"slices"
	"time"

	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/coordinator/fenceconfig"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// KindHeldBack is the audit kind of a request the fencing policy held back.
const KindHeldBack = "fence-held-back"

// Policy is the Kubernetes fencing policy's verdict on a node (--fence-policy), asked for a request
// that NeedsPolicy in Kubernetes mode. The zero Policy is "not asked" (standalone mode).
type Policy struct {
	// Asked is set when the verdict was asked for.
	Asked bool
	// Needed is set when the node is worth fencing; Why says why (the node's stateful pods, which
	// join the request's evidence) or why not.
	Needed bool
	Why    string
}

// Admission is what becomes of one automatic fence request: the record to create, or the audit
// entry's text (kind KindHeldBack) when the policy holds it back.
type Admission struct {
	Record *coordv1.NodeFence
	Held   string
}

// NeedsPolicy says whether a request waits for the fencing policy's verdict: every request but an
// enforced power cycle, which repairs the node (the stateful-pods policy is about releases). A
// power cycle decided in observe mode is recorded as would fence, as any observed decision is.
func NeedsPolicy(req engine.FenceRequest) bool {
	return req.Observe || req.Action != coordv1.FenceAction_FENCE_ACTION_REBOOT
}

// Admit applies the admission rule to an automatic fence request of the engine's Ready: a request
// the policy found not worth fencing is held back; otherwise the policy's reason joins the
// request's evidence and the request's record is created (engine.FenceRequest.Record): after delay
// (the node's configured delay with its random part drawn by the caller; an observed record has
// none),
// under epoch, at now. plan is the node's configured steps. req is not modified.
func Admit(req engine.FenceRequest, p Policy, plan func(string) ([]fenceconfig.Resolved, error), delay time.Duration, epoch int64, now time.Time) Admission {
	if p.Asked && NeedsPolicy(req) {
		if !p.Needed {
			held := "automatic fencing not needed: "
			if req.Observe {
				held = "observe mode: would not fence: "
			}
			return Admission{Held: held + p.Why}
		}
		if p.Why != "" {
			req.Evidence = append(slices.Clip(req.Evidence), p.Why)
		}
	}
	return Admission{Record: req.Record(plan, delay, epoch, now)}
}
