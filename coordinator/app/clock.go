package app

import (
	"time"

	"github.com/nodefence/nodefence/services/clock"
)

// One clock: every part the app wires reads Config.Now — the engine loop's ticks, the API's input
// stamps, the fence runner's decisions and record times, the proof checks, the kdump listener, the
// history's pruning, the audit trail and, in Kubernetes mode, the writer, witness and reconciler.
// A reading of the machine's clock elsewhere would judge a node by one clock and stamp its inputs
// by another (coordinator/clock_test.go keeps direct readings out). Waits go through the same
// clock (Config.After): the fence runner's, the job groups' timers, the election loop's retries.

// clock returns Config.Now, or the machine's clock when it is nil.
func (c *Config) clock() func() time.Time {
	if c.Now != nil {
		return c.Now
	}
	return time.Now
}

// now reads the app's clock.
func (a *App) now() time.Time { return a.cfg.clock()() }

// clock is the app's clock, to read and to wait on.
func (a *App) clock() clock.Clock { return clock.Of(a.cfg.Now, a.cfg.After) }
