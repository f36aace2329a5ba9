package engine

import "time"

// flap is what a node keeps of the not-ready episode it last came back from, for a node that goes
// silent again soon after (FenceConfig.FlapWindow): a flapping node keeps its earlier evidence
// instead of waiting the whole fence timeout again.
type flap struct {
	notReadySince time.Time // the earlier episode's start
	releasedAt    time.Time // its first release (zero if it was never released)
	back          time.Time // when the node came back (Ready)
	kept          bool      // the current episode kept this evidence; its next release takes it
}

// cameBack is what a node coming back at now keeps of the episode that ends.
func cameBack(n *node, now time.Time) flap {
	if n.notReadySince.IsZero() || n.fenceRequested || n.wouldFence {
		return flap{} // never not ready, or the episode ended with its fence: nothing to keep
	}
	f := flap{notReadySince: n.notReadySince, releasedAt: n.releasedAt, back: now}
	if n.flap.kept { // an episode that itself kept earlier evidence passes the first one on
		f.notReadySince = n.flap.notReadySince
		if !n.flap.releasedAt.IsZero() {
			f.releasedAt = n.flap.releasedAt
		}
	}
	return f
}

// flapped decides, as a node becomes not ready at now, whether it keeps the evidence of the episode
// it came back from: only when its last contact came within FlapWindow of coming back. It then
// moves the node's not-ready time back to that episode's.
func (e *Engine) flapped(n *node, now time.Time) bool {
	w := e.cfg.Fence.FlapWindow
	if w <= 0 || n.flap.back.IsZero() || n.lastContact.Sub(n.flap.back) > w || now.Before(n.flap.back) {
		n.flap = flap{}
		return false
	}
	n.flap.kept = true
	n.notReadySince = n.flap.notReadySince
	return true
}

// release is the release time of a node released at now: the earlier episode's first release when
// the node kept that episode's evidence.
func (f flap) release(now time.Time) time.Time {
	if f.kept && !f.releasedAt.IsZero() {
		return f.releasedAt
	}
	return now
}
