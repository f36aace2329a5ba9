package agent

import "time"

// Backoff returns how long to wait before reconnect attempt n (0 for the first retry after a stream
// that worked, growing with each consecutive failure): d = minD·2ⁿ capped at maxD, then jittered
// uniformly into [d/2, d) by u, which must be in [0, 1). Half of d is kept so that many agents
// restarted together spread out without any of them hammering a coordinator.
func Backoff(n int, minD, maxD time.Duration, u float64) time.Duration {
	if minD <= 0 || maxD < minD {
		return minD
	}
	d := minD
	for i := 0; i < n && d < maxD; i++ {
		d *= 2
	}
	d = min(d, maxD)
	u = min(max(u, 0), 1)
	return d/2 + time.Duration(u*float64(d/2))
}
